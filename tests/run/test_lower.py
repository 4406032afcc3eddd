"""`qnnctl lower`: the pipeline runs in a fresh process that starts with the SDK in place."""

from __future__ import annotations

import json
import os
import py_compile
import re
import shlex
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from qnnctl.host.staged import LOADER_GUARD
from qnnctl.run.api import FORCE_VENDOR_VARIABLE
from qnnctl.run.bootstrap import GUARD_VARIABLE
from qnnctl.run.lower import (
    COMMAND,
    MODULE,
    SCRIPT,
    LowerOptions,
    StagedLoader,
    Target,
    bootstrap_path,
    guard_plan,
    parse_target,
    plan_lower,
    python_invocation,
    python_options,
    site_folder,
    under_loader,
)
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.lockfile import LockedSdk, write_lock
from qnnctl.shell.render import quote_posix
from tests.conftest import with_default_sigint
from tests.httpserver import FaultServer
from tests.lowerkit import PROBE, direct, last_json, lower, other_python, write
from tests.sdkfactory import VERSION, install_tree_into_cache

PY = sys.executable
# Arguments of the pipeline that qnnctl would take for its own if it parsed them.
LOOKALIKES = ("--sdk", "x", "-v", "--dry-run", "--no-install", "--", "-m", "y", "--help")


@pytest.fixture(autouse=True)
def amd_guard_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard armed in every pipeline here, without py-cpuinfo's second per run.

    The vendor itself is read for real in test_guard.py; here the armed guard must change
    nothing that a pipeline which does not use torch can see.
    """
    monkeypatch.setenv(FORCE_VENDOR_VARIABLE, "AuthenticAMD")
    # As if this suite itself were not started by `qnnctl lower`.
    monkeypatch.delenv(GUARD_VARIABLE, raising=False)
    monkeypatch.delenv(LOADER_GUARD, raising=False)
    kept = [e for e in os.environ.get("PYTHONPATH", "").split(":") if e and e != site_folder()]
    if kept:
        monkeypatch.setenv("PYTHONPATH", ":".join(kept))
    else:
        monkeypatch.delenv("PYTHONPATH", raising=False)


@pytest.fixture
def sdk(cache_dir: Path) -> Path:
    return install_tree_into_cache(cache_dir)


def with_guard(pythonpath: str | None) -> str:
    """PYTHONPATH as `qnnctl lower` gives it to a guarded pipeline: qnnctl's site folder first."""
    return ":".join([site_folder(), *([pythonpath] if pythonpath else [])])


def lib_dir(root: Path) -> str:
    return str(root / "lib" / "x86_64-linux-clang")


# -- pass-through ----------------------------------------------------------------------


# `qnnctl lower ARGS` in a fresh interpreter whose exec prints, instead of exec'ing, what the process
# had imported and which processes it had started, as JSON.
_IMPORTS_AT_EXEC = r"""
import json, os, subprocess, sys
started = []
real_popen = subprocess.Popen
class Recorded(real_popen):
    def __init__(self, args, *rest, **kwargs):
        started.append(args)
        super().__init__(args, *rest, **kwargs)
subprocess.Popen = Recorded
before = set(sys.modules)
def report(file, argv, env):
    print(json.dumps({"modules": sorted(set(sys.modules) - before), "started": [str(a) for a in started],
                      "argv": argv}))
    sys.stdout.flush()
    os._exit(0)
os.execvpe = report
sys.argv = ["qnnctl", *sys.argv[1:]]
from qnnctl.launch import main
main()
"""
# What `lower` pays for only when it installs or stages: downloads, archives, package readers,
# pyelftools; and py-cpuinfo, whose probe is a second's subprocess.
INSTALL_ONLY = ("requests", "urllib3", "elftools", "debian", "arpy", "rpmfile", "isal", "tqdm", "rich",
                "filelock", "cpuinfo", "qnnctl.install", "qnnctl.host.runtime", "qnnctl.host.packages",
                "qnnctl.net.download", "qnnctl.sdk.vouchers", "qnnctl.sdk.lockfile", "qnnctl.sdk.mirrorindex")


def test_lower_with_its_sdk_installed_imports_nothing_it_does_not_use(sdk: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A lowering with its SDK installed (the usual run) costs a Python start-up: the vendor read
    from /proc/cpuinfo, the SDK's ELF files read without pyelftools, nothing installed or staged."""
    monkeypatch.delenv(FORCE_VENDOR_VARIABLE)
    proc = subprocess.run([PY, "-c", _IMPORTS_AT_EXEC, "lower", "--", PY, "-c", "pass"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["argv"] == [PY, "-c", "pass"]  # the probe saw the exec
    assert "qnnctl.run.lower" in report["modules"]
    assert [m for m in report["modules"] if any(m == name or m.startswith(name + ".") for name in INSTALL_ONLY)] == []
    assert report["started"] == []
    # Its usual command line is parsed without click (qnnctl.commands.leanlower).
    assert [m for m in report["modules"] if m == "click" or m.startswith("click.")] == []


@pytest.mark.parametrize("how", ["--sdk VERSION", "--no-install", "--sdk PATH", "QNN_SDK_ROOT"])
def test_an_installed_sdk_is_checked_against_the_projects_lock_before_it_is_used(sdk: Path, tmp_path: Path,
                                                                                  how: str) -> None:
    """The usual run uses an installed SDK without the install pipeline, but not one a lock pins:
    that is checked as `install` checks it, and refused when it disagrees; so is an SDK named by
    its folder or QNN_SDK_ROOT, or used under --no-install, none of which goes through `install`."""
    manifest = sdk / ".qnnctl.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "sha256": "a" * 64, "size": 1}))
    project = tmp_path / "project"
    project.mkdir()
    env = None
    args = {"--sdk VERSION": ["--sdk", VERSION], "--no-install": ["--no-install", "--sdk", VERSION],
            "--sdk PATH": ["--sdk", str(sdk)], "QNN_SDK_ROOT": []}[how]
    if how == "QNN_SDK_ROOT":
        env = {**os.environ, "QNN_SDK_ROOT": str(sdk)}
    ran = project / "ran"
    command = ["--", "sh", "-c", f'touch "{ran}"']
    assert lower(*args, *command, env=env, cwd=project).returncode == 0
    assert ran.exists()
    ran.unlink()
    path = project / "qnnctl.lock"
    write_lock(path, LockedSdk(path=path, version=VERSION, sha256="0" * 64, size=1, build_id=None,
                               urls=("https://example.com/old.zip",), locked_at="2026-01-01T00:00:00Z"), "Old.")
    refused = lower(*args, *command, env=env, cwd=project)
    assert refused.returncode == 4, refused.stderr
    assert f"qnnctl.lock pins {'0' * 64}" in refused.stderr
    assert not ran.exists()  # the pipeline never started




@pytest.mark.stdlib
def test_exit_code_passes_through(sdk: Path) -> None:
    script = write(Path("exit7.py"), "import sys\nsys.exit(7)\n")
    result = lower("--python", PY, str(script))
    assert (result.returncode, result.stdout, result.stderr) == (7, "", "")
    command = lower("--", "sh", "-c", "exit 7")
    assert (command.returncode, command.stdout, command.stderr) == (7, "", "")


@pytest.mark.stdlib
def test_signal_passes_through(sdk: Path) -> None:
    script = write(Path("term.py"), "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    assert direct(PY, str(script)).returncode == -signal.SIGTERM
    result = lower("--python", PY, str(script))
    assert result.returncode == -signal.SIGTERM, result.stderr
    command = lower("--", "sh", "-c", "kill -TERM $$")
    assert command.returncode == -signal.SIGTERM


@pytest.mark.stdlib
def test_standard_streams_pass_through(sdk: Path) -> None:
    script = write(Path("streams.py"), """\
        import sys
        data = sys.stdin.read()
        sys.stdout.write(data.upper())
        sys.stderr.write("to stderr: %d bytes\\n" % len(data))
    """)
    text = "first line\nsecond line\n"
    direct_run = direct(PY, str(script), input=text)
    result = lower("--python", PY, str(script), input=text)
    assert result.returncode == 0
    assert (result.stdout, result.stderr) == (direct_run.stdout, direct_run.stderr)
    assert result.stdout == text.upper()


@pytest.mark.stdlib
def test_ignored_signals_are_not_inherited(sdk: Path) -> None:
    # Python ignores SIGPIPE and SIGXFSZ at startup; a command exec'd from it must not inherit that.
    # Only the signals Python can set count: 3.13.0 started by another Python's subprocess starts
    # with glibc's own two (32 and 33) ignored, out of any Python program's reach.
    def ignored(stdout: str) -> set[int]:
        match = re.search(r"^SigIgn:\s*(\S+)$", stdout, re.M)
        assert match is not None
        mask = int(match.group(1), 16)
        return {int(signum) for signum in signal.valid_signals() if mask >> (signum - 1) & 1}

    expected = ignored(direct("cat", "/proc/self/status").stdout)
    result = lower("--", "cat", "/proc/self/status")
    assert result.returncode == 0
    assert ignored(result.stdout) == expected
    assert signal.SIGPIPE not in expected


# -- the three forms -------------------------------------------------------------------


def _forms(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (qnnctl lower arguments, the direct command), each ending in the look-alikes."""
    write(tmp / "pkg" / "__init__.py", "")
    write(tmp / "pkg" / "probe_mod.py", PROBE)
    write(tmp / "probe.py", PROBE)
    write(tmp / "probedir" / "__main__.py", PROBE)
    with zipfile.ZipFile(tmp / "probe.zip", "w") as app:
        app.writestr("__main__.py", PROBE)
    py_compile.compile(str(tmp / "probe.py"), cfile=str(tmp / "probe.pyc"), doraise=True)
    args = list(LOOKALIKES)
    return {
        "script": (["--python", PY, "probe.py", *args], [PY, "probe.py", *args]),
        "module": (["--python", PY, "-m", "pkg.probe_mod", *args], [PY, "-m", "pkg.probe_mod", *args]),
        "module-joined": (["--python", PY, "-mpkg.probe_mod", *args], [PY, "-mpkg.probe_mod", *args]),
        "command-script": (["--", PY, "-X", "utf8", "-B", "probe.py", *args],
                           [PY, "-X", "utf8", "-B", "probe.py", *args]),
        "command-module": (["--", PY, "-Bm", "pkg.probe_mod", *args], [PY, "-Bm", "pkg.probe_mod", *args]),
        "command-code": (["--", PY, "-c", PROBE, *args], [PY, "-c", PROBE, *args]),
        # Through the bootstrap: these interpreters never import qnnctl's sitecustomize.
        "isolated-script": (["--", PY, "-I", "probe.py", *args], [PY, "-I", "probe.py", *args]),
        "no-site-module": (["--", PY, "-S", "-m", "pkg.probe_mod", *args], [PY, "-S", "-m", "pkg.probe_mod", *args]),
        "no-env-code": (["--", PY, "-E", "-c", PROBE, *args], [PY, "-E", "-c", PROBE, *args]),
        # -E keeps the script's folder (or the working folder) first on sys.path, as -I does not.
        "no-env-script": (["--", PY, "-E", "probe.py", *args], [PY, "-E", "probe.py", *args]),
        "no-env-module": (["--", PY, "-E", "-m", "pkg.probe_mod", *args], [PY, "-E", "-m", "pkg.probe_mod", *args]),
        # What runpy runs: a folder or a zip file with a __main__.py, compiled code.
        "isolated-folder": (["--", PY, "-I", "probedir", *args], [PY, "-I", "probedir", *args]),
        "isolated-zipapp": (["--", PY, "-I", "probe.zip", *args], [PY, "-I", "probe.zip", *args]),
        "no-env-compiled": (["--", PY, "-E", "probe.pyc", *args], [PY, "-E", "probe.pyc", *args]),
    }


@pytest.mark.parametrize("form", ["script", "module", "module-joined", "command-script", "command-module",
                                  "command-code", "isolated-script",
                                  pytest.param("no-site-module", marks=pytest.mark.no_mutated_bootstrap),
                                  "no-env-code", "no-env-script", "no-env-module", "isolated-folder",
                                  "isolated-zipapp", "no-env-compiled"])
def test_forms_look_as_if_run_directly(sdk: Path, form: str) -> None:
    work = Path.cwd()
    lower_args, direct_argv = _forms(work)[form]
    expected = last_json(direct(*direct_argv).stdout)
    result = lower(*lower_args)
    assert result.returncode == 0, result.stderr
    seen = last_json(result.stdout)
    assert seen.pop("env") == {
        "QNN_SDK_ROOT": str(sdk),
        "LD_LIBRARY_PATH": lib_dir(sdk),
        GUARD_VARIABLE: None,  # the bootstrap's private channel is gone before the pipeline runs
    }
    # sys.path (in `seen`) is the direct run's; PYTHONPATH keeps the guard for the pipeline's children.
    assert seen.pop("pythonpath") == with_guard(expected.pop("pythonpath"))
    expected.pop("env")
    assert seen == expected
    assert seen["argv"][-len(LOOKALIKES):] == list(LOOKALIKES)
    assert seen["name"] == "__main__"
    assert seen["main_is_this"]


def test_command_gets_its_arguments_verbatim(sdk: Path) -> None:
    result = lower("--", "printf", "%s\\n", *LOOKALIKES)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == list(LOOKALIKES)


def _their_own(stderr: str) -> str:
    """stderr without qnnctl's own lines (what it says before the exec)."""
    return "".join(line for line in stderr.splitlines(keepends=True) if not line.startswith("qnnctl: "))


# The pipeline's command, directly; the bootstrap forms start interpreters that skip the sitecustomize.
_FORMS = {
    "script": ["crash.py"], "module": ["-m", "crashmod"], "code": ["-c", "import crashmod"],
    "bootstrap-script": ["-I", "crash.py"], "bootstrap-module": ["-E", "-m", "crashmod"],
    "bootstrap-code": ["-S", "-c", "import crashmod"],
}


@pytest.mark.stdlib
@pytest.mark.no_mutated_bootstrap
@pytest.mark.parametrize("form", list(_FORMS))
def test_traceback_looks_as_if_run_directly(sdk: Path, form: str) -> None:
    source = "def inner():\n    raise ValueError('boom')\n\ndef outer():\n    inner()\n\nouter()\n"
    write(Path("crash.py"), source)
    write(Path("crashmod.py"), source)
    expected = direct(PY, *_FORMS[form])
    result = lower("--", PY, *_FORMS[form])
    assert expected.returncode == 1
    assert "boom" in expected.stderr
    assert (result.returncode, _their_own(result.stderr)) == (1, expected.stderr)
    assert "bootstrap.py" not in result.stderr
    if form in ("script", "module"):
        assert lower("--python", PY, *_FORMS[form]).stderr == expected.stderr


# Prints "ready", then waits for Ctrl-C in a function of its own, a frame below the module's.
SLEEPER = """\
import time
import zipfile

def wait():
    print("ready", flush=True)
    time.sleep(60)

wait()
"""


def interrupted(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `argv`, press Ctrl-C once it sleeps: its exit status and stderr."""
    proc = subprocess.Popen(with_default_sigint(list(argv)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n", proc.communicate(timeout=60)
        # In the sleep, not just after the print: the traceback names the line the signal landed on.
        deadline = time.monotonic() + 30
        while Path(f"/proc/{proc.pid}/stat").read_text().rpartition(")")[2].split()[0] != "S":
            assert time.monotonic() < deadline, "the pipeline never went to sleep"
            time.sleep(0.01)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return proc.returncode, err


@pytest.mark.no_mutated_bootstrap
@pytest.mark.parametrize("form", [("sleeper.py",), ("-I", "sleeper.py"), ("-E", "-m", "sleeper"),
                                  ("-S", "-c", "import sleeper")])
@pytest.mark.stdlib
def test_ctrl_c_traceback_looks_as_if_run_directly(sdk: Path, form: tuple[str, ...]) -> None:
    write(Path("sleeper.py"), SLEEPER)
    code, err = interrupted(PY, *form)
    assert code == -signal.SIGINT, err
    assert err.startswith("Traceback"), err
    assert err.endswith("KeyboardInterrupt\n"), err
    lowered, lowered_err = interrupted(PY, "-m", "qnnctl", "lower", "--", PY, *form)
    assert (lowered, _their_own(lowered_err)) == (code, err)


@pytest.mark.no_mutated_bootstrap
def test_ctrl_c_while_the_guard_waits_for_torch_looks_as_if_run_directly(sdk: Path, tmp_path: Path) -> None:
    """Ctrl-C in the second `import torch` takes: the guard's hook is armed then, and shows no frame."""
    fake = tmp_path / "fake"
    write(fake / "torch" / "__init__.py", SLEEPER)
    write(Path("pipeline.py"), "import torch\n")
    env = {**os.environ, "PYTHONPATH": str(fake)}
    code, err = interrupted(PY, "pipeline.py", env=env)
    assert code == -signal.SIGINT, err
    assert interrupted(PY, "-m", "qnnctl", "lower", "--python", PY, "pipeline.py", env=env) == (code, err)


def test_missing_module_reported_as_python_does(sdk: Path) -> None:
    expected = direct(PY, "-m", "no_such_module_here")
    result = lower("--python", PY, "-m", "no_such_module_here")
    assert (result.returncode, result.stderr) == (expected.returncode, expected.stderr)


# -- the environment, from process start ----------------------------------------------


def test_pipeline_dlopens_sdk_library_by_bare_name(sdk: Path) -> None:
    # The first line reads the environment the process was started with (/proc/self/environ):
    # LD_LIBRARY_PATH was there before any pipeline code ran, which is what the loader needs.
    script = write(Path("dlopen.py"), """\
        start = dict(e.split("=", 1) for e in open("/proc/self/environ").read().split("\\0") if "=" in e)
        import ctypes
        lib = ctypes.CDLL("libQnnHtp.so")
        print(start.get("LD_LIBRARY_PATH"), start.get("QNN_SDK_ROOT"), lib.qnn_qnnhtp_version())
    """)
    alone = direct(PY, str(script))
    assert alone.returncode != 0
    assert "libQnnHtp.so" in alone.stderr
    result = lower("--python", PY, str(script))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [lib_dir(sdk), str(sdk), "42"]


def test_caller_environment_kept_around_sdk_changes(sdk: Path) -> None:
    env = {**os.environ, "LD_LIBRARY_PATH": "/opt/mine", "KEEP_ME": "1"}
    write(Path("env.py"), "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    result = lower("--python", PY, "env.py", env=env)
    assert result.returncode == 0, result.stderr
    seen = last_json(result.stdout)
    assert seen["LD_LIBRARY_PATH"] == f"{lib_dir(sdk)}:/opt/mine"
    assert seen["PATH"].split(":")[0] == str(sdk / "bin" / "x86_64-linux-clang")
    assert seen["QNN_SDK_ROOT"] == str(sdk)
    unchanged = {k: v for k, v in env.items() if k not in ("LD_LIBRARY_PATH", "PATH", "QNN_SDK_ROOT", "PYTHONPATH")}
    assert {k: v for k, v in seen.items() if k in unchanged} == unchanged


def test_empty_sdk_root_passes_environment_through_untouched(mirror: FaultServer) -> None:
    env = {**os.environ, "QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": "/opt/callers/lib:/opt/other"}
    write(Path("env.py"), "import json, os\nprint(json.dumps(dict(os.environ)))\n")
    result = lower("--python", PY, "env.py", env=env)
    assert result.returncode == 0, result.stderr
    # The AMD guard's folder on PYTHONPATH is the one addition (it is not about the SDK).
    guarded = {**env, "PYTHONPATH": with_guard(env.get("PYTHONPATH"))}
    assert last_json(result.stdout) == guarded
    assert "empty" in result.stderr
    assert "''" not in result.stderr
    command = lower("--", "env", "-0", env=env)
    assert command.returncode == 0, command.stderr
    assert dict(e.split("=", 1) for e in command.stdout.split("\0") if e) == guarded
    # Not "missing" either: --no-install has nothing to refuse.
    no_install = lower("--no-install", "--python", PY, "env.py", env=env)
    assert no_install.returncode == 0, no_install.stderr
    assert last_json(no_install.stdout) == guarded
    assert mirror.requests == []


# -- resolution and installation -------------------------------------------------------


def test_installs_a_missing_sdk_then_runs(mirror: FaultServer, cache_dir: Path) -> None:
    write(Path("probe.py"), PROBE)
    result = lower("--python", PY, "probe.py")
    assert result.returncode == 0, result.stderr
    assert last_json(result.stdout)["env"]["QNN_SDK_ROOT"] == str(cache_dir / "sdks" / VERSION)
    assert len(mirror.requests_for(f"/{VERSION}/v{VERSION}.zip")) == 1


def test_no_install_exits_1_with_the_install_command(mirror: FaultServer) -> None:
    write(Path("touch.py"), "open('ran', 'w').close()\n")
    result = lower("--no-install", "--python", PY, "touch.py")
    assert result.returncode == 1
    assert f"qnnctl install {VERSION}" in result.stderr
    assert not Path("ran").exists()
    assert mirror.requests == []


def test_sdk_option_takes_a_path(tmp_path: Path) -> None:
    from tests.sdkfactory import build_sdk_tree

    root = build_sdk_tree(tmp_path / "elsewhere" / "my-sdk")
    write(Path("probe.py"), PROBE)
    result = lower("--sdk", str(root), "--python", PY, "probe.py")
    assert result.returncode == 0, result.stderr
    assert last_json(result.stdout)["env"]["QNN_SDK_ROOT"] == str(root)


# -- --dry-run --------------------------------------------------------------------------


def test_dry_run_prints_the_plan_and_runs_nothing(sdk: Path) -> None:
    write(Path("touch.py"), "import os\nopen('ran', 'w').close()\nprint(os.environ['QNN_SDK_ROOT'])\n")
    result = lower("--dry-run", "--python", PY, "touch.py", "--sdk", "a b")
    assert result.returncode == 0, result.stderr
    assert not Path("ran").exists()
    lines = result.stdout.splitlines()
    assert f"export QNN_SDK_ROOT={quote_posix(str(sdk))}" in lines
    assert any(line.startswith("export LD_LIBRARY_PATH=") for line in lines)
    assert f"export PYTHONPATH={quote_posix(with_guard(os.environ.get('PYTHONPATH')))}" in lines  # the guard's way
    assert shlex.split(lines[-1]) == [PY, "touch.py", "--sdk", "a b"]
    # The plan is sh: running it does what lower would have done.
    ran = subprocess.run(["sh", "-c", result.stdout], capture_output=True, text=True, timeout=60)
    assert (ran.returncode, ran.stdout) == (0, f"{sdk}\n")
    assert Path("ran").exists()


def test_dry_run_shows_a_plain_command_as_is(sdk: Path) -> None:
    result = lower("--dry-run", "--", "env", "-0")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "env -0"
    assert GUARD_VARIABLE not in result.stdout  # no bootstrap
    # The guard still reaches any Python that env would start.
    assert f"export PYTHONPATH={quote_posix(with_guard(os.environ.get('PYTHONPATH')))}" in result.stdout.splitlines()


# -- which Python ----------------------------------------------------------------------


def _planned_python(*args: str, env: dict[str, str]) -> str:
    result = lower("--dry-run", *args, "probe.py", env=env)
    assert result.returncode == 0, result.stderr
    return shlex.split(result.stdout.splitlines()[-1])[0]


def test_python_choice_order(sdk: Path, tmp_path: Path) -> None:
    write(Path("probe.py"), PROBE)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to(PY)
    on_path = tmp_path / "onpath"
    on_path.mkdir()
    (on_path / "python3").symlink_to(PY)
    empty = tmp_path / "empty"
    empty.mkdir()
    base = dict(os.environ)
    explicit = _planned_python("--python", PY, env={**base, "VIRTUAL_ENV": str(venv)})
    assert explicit == PY
    assert _planned_python(env={**base, "VIRTUAL_ENV": str(venv), "PATH": str(on_path)}) == str(venv / "bin" / "python")
    assert _planned_python(env={**base, "PATH": str(on_path)}) == str(on_path / "python3")
    assert _planned_python(env={**base, "PATH": str(empty)}) == PY  # qnnctl's own as the last resort
    # The chosen interpreter really runs the pipeline.
    result = lower("probe.py", env={**base, "PATH": f"{on_path}:{base['PATH']}"})
    assert result.returncode == 0, result.stderr


def test_python_invocation_rewrites_interpreters_only() -> None:
    b = "/b/bootstrap.py"
    assert python_invocation(["python3", "s.py", "-v"], b) == ["python3", b, "script", "s.py", "-v"]
    assert python_invocation(["/usr/bin/python3.11", "-u", "-X", "dev", "-Wignore", "s.py"], b) == [
        "/usr/bin/python3.11", "-u", "-X", "dev", "-Wignore", b, "script", "s.py"]
    assert python_invocation(["python", "-m", "pkg.mod", "-c", "x"], b) == ["python", b, "module", "pkg.mod", "-c", "x"]
    assert python_invocation(["python", "-Bm", "mod", "a"], b) == ["python", "-B", b, "module", "mod", "a"]
    assert python_invocation(["python3.13t", "-mmod"], b) == ["python3.13t", b, "module", "mod"]
    assert python_invocation(["python", "-c", "print(1)", "-m"], b) == ["python", b, "code", "print(1)", "-m"]
    assert python_invocation(["python", "-OO", "--", "-s.py"], b) == ["python", "-OO", b, "script", "-s.py"]
    assert python_invocation(["python", "--check-hash-based-pycs", "always", "s.py"], b) == [
        "python", "--check-hash-based-pycs", "always", b, "script", "s.py"]
    # Not an interpreter, or nothing the bootstrap can stand in front of: run as it is.
    for argv in (["env", "python3", "s.py"], ["pythonista", "s.py"], ["python3"], ["python3", "-"],
                 ["python3", "-i", "s.py"], ["python3", "-x", "s.py"], ["python3", "--version"],
                 ["python3", "-V"], ["python3", "-c"], ["python3", "-W"]):
        assert python_invocation(argv, b) is None, argv


def test_python_options_reads_the_interpreters_own_letters() -> None:
    assert python_options(["python3", "-I", "s.py", "-E"]) == "I"
    assert python_options(["python3", "-sE", "-X", "dev", "-Wignore", "-OO", "s.py"]) == "sEOO"
    assert python_options(["python3", "-Ic", "-S"]) == "I"  # -c ends the options
    assert python_options(["python3", "-m", "mod", "-I"]) == ""
    assert python_options(["python3", "--check-hash-based-pycs", "always", "-S", "s.py"]) == "S"
    assert python_options(["python3", "--", "-I.py"]) == ""
    assert python_options(["env", "python3", "-I"]) is None


# -- how the guard reaches the pipeline's Python processes ------------------------------


def _guarded(argv: list[str], environ: dict[str, str], wanted: bool = True) -> tuple[list[str], dict[str, str | None]]:
    return guard_plan(argv, wanted, {"PATH": os.defpath, **environ})


def test_guard_plan_puts_the_site_folder_first_and_keeps_the_callers_entries() -> None:
    site = site_folder()
    run = [PY, "s.py"]
    assert _guarded(run, {}) == (run, {"PYTHONPATH": site})
    assert _guarded(run, {"PYTHONPATH": "/a:/b"}) == (run, {"PYTHONPATH": f"{site}:/a:/b"})
    # Empty means no entry; a trailing empty entry means the current folder, and stays.
    assert _guarded(run, {"PYTHONPATH": ""}) == (run, {"PYTHONPATH": site})
    assert _guarded(run, {"PYTHONPATH": "/a:"}) == (run, {"PYTHONPATH": f"{site}:/a:"})
    # Inside a guarded pipeline: nothing to add, and never twice.
    assert _guarded(run, {"PYTHONPATH": f"{site}:/a"}) == (run, {})
    assert _guarded(run, {"PYTHONPATH": f"/a:{site}"}) == (run, {"PYTHONPATH": f"{site}:/a"})


def test_guard_plan_takes_an_inherited_guard_out_when_not_wanted(tmp_path: Path) -> None:
    site = site_folder()
    run = [PY, "s.py"]
    assert _guarded(run, {}, wanted=False) == (run, {})
    assert _guarded(run, {"PYTHONPATH": "/a"}, wanted=False) == (run, {})
    # --keep-mkldnn (or a non-AMD verdict) in a pipeline started by a guarding `qnnctl lower`.
    assert _guarded(run, {"PYTHONPATH": f"{site}:/a"}, wanted=False) == (run, {"PYTHONPATH": "/a"})
    assert _guarded(run, {"PYTHONPATH": site}, wanted=False) == (run, {"PYTHONPATH": None})
    # Another qnnctl install's folder is recognised too; a folder of the user's named _site is not.
    other = tmp_path / "venv2" / "site-packages" / "qnnctl" / "_site"
    write(other / "sitecustomize.py", "")
    theirs = tmp_path / "mine" / "_site"
    theirs.mkdir(parents=True)
    environ = {"PYTHONPATH": f"{other}:{theirs}"}
    assert _guarded(run, environ, wanted=False) == (run, {"PYTHONPATH": str(theirs)})
    assert _guarded(run, environ) == (run, {"PYTHONPATH": f"{site}:{theirs}"})


def test_guard_plan_starts_interpreters_that_skip_the_site_folder_through_the_bootstrap(
        caplog: pytest.LogCaptureFixture) -> None:
    site = site_folder()
    b = bootstrap_path()
    for option in ("-I", "-E", "-S"):
        caplog.clear()
        argv, changes = _guarded([PY, option, "s.py"], {})
        assert argv == [PY, option, b, "script", "s.py"]
        # PYTHONPATH still reaches the Python processes it starts without the option.
        assert changes == {GUARD_VARIABLE: "1", "PYTHONPATH": site}
        assert f"`{Path(PY).name} {option}`" in caplog.text
        assert "multiprocessing workers" in caplog.text
    # Options the bootstrap cannot stand behind: as it is, said so; under -S alone qnnctl's folder
    # would stay on the interpreter's sys.path, with no sitecustomize run to take it off.
    caplog.clear()
    assert _guarded([PY, "-S", "-i", "s.py"], {}) == ([PY, "-S", "-i", "s.py"], {})
    assert "cannot reach" in caplog.text
    assert _guarded([PY, "-I", "-i", "s.py"], {}) == ([PY, "-I", "-i", "s.py"], {"PYTHONPATH": site})
    # Not wanted: nothing to say, nothing changed.
    caplog.clear()
    assert _guarded([PY, "-I", "s.py"], {}, wanted=False) == ([PY, "-I", "s.py"], {})
    assert caplog.text == ""


def test_guard_plan_reads_a_scripts_interpreter_from_its_shebang(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    site = site_folder()
    console = write(tmp_path / "my-export", f"#!{PY}\nprint('hi')\n")
    isolated = write(tmp_path / "isolated-export", f"#!{PY} -I\nprint('hi')\n")
    shell = write(tmp_path / "run.sh", "#!/bin/sh\nexec python3 \"$@\"\n")
    for script in (console, isolated, shell):
        script.chmod(0o755)
    assert _guarded([str(console)], {}) == ([str(console)], {"PYTHONPATH": site})
    # Found on PATH, as the shell would.
    assert _guarded(["my-export"], {"PATH": str(tmp_path)}) == (["my-export"], {"PYTHONPATH": site})
    assert _guarded([str(shell)], {}) == ([str(shell)], {"PYTHONPATH": site})
    assert caplog.text == ""
    assert _guarded([str(isolated)], {}) == ([str(isolated)], {"PYTHONPATH": site})
    assert f"cannot reach {isolated}: its #! line runs `{PY} -I`" in caplog.text
    assert f"qnnctl lower --python {PY} {isolated}" in caplog.text


def test_parse_target() -> None:
    assert parse_target(["s.py", "-m", "x"]) == Target(SCRIPT, "s.py", ("-m", "x"))
    assert parse_target(["-m", "mod", "--", "a"]) == Target(MODULE, "mod", ("--", "a"))
    assert parse_target(["-mmod"]) == Target(MODULE, "mod", ())
    assert parse_target(["--", "cmd", "--", "-v"]) == Target(COMMAND, "cmd", ("--", "-v"))


@pytest.mark.parametrize(("args", "code", "text"), [
    ((), 2, "nothing to run"),
    (("--",), 2, "nothing to run"),
    (("-m",), 2, "module"),
    (("missing.py",), 2, "no such script"),
    (("--python", PY, "--", "true"), 2, "--python"),
    (("--python", "/no/such/python", "x.py"), 2, "no such interpreter"),
    (("--bogus", "x.py"), 2, "--bogus"),
    (("--", "no-such-command-anywhere"), 127, "not found"),
])
def test_usage_errors(sdk: Path, args: tuple[str, ...], code: int, text: str) -> None:
    write(Path("x.py"), "")
    result = lower(*args)
    assert result.returncode == code, result.stderr
    assert text in result.stderr


# -- the staged-loader hook -------------------------------------------------------------


def test_staged_loader_wraps_the_command_once(sdk: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The host's own loader stands in for a staged one: the wrapping is what is tested here.
    host_loader = Path("/lib64/ld-linux-x86-64.so.2")
    if not host_loader.exists():
        pytest.skip("no x86-64 glibc loader at the usual path")
    staged = StagedLoader(host_loader, (lib_dir(sdk),))
    import qnnctl.run.lower

    monkeypatch.setattr(qnnctl.run.lower, "staged_loader", lambda sdk, cache: staged)
    write(Path("probe.py"), PROBE)
    environ = dict(os.environ)
    plan = plan_lower(Target(SCRIPT, "probe.py", ("a",)), LowerOptions(python=PY), environ, Path.cwd(),
                      Cache.from_env(environ))
    assert plan.argv[:4] == [str(host_loader), "--library-path", lib_dir(sdk), PY]
    assert plan.changes[LOADER_GUARD] == str(host_loader)
    ran = subprocess.run(plan.argv, env=plan.environ, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    assert last_json(ran.stdout)["argv"] == ["probe.py", "a"]
    # A child that already runs under the staged loader is not wrapped again.
    again = plan_lower(Target(SCRIPT, "probe.py"), LowerOptions(python=PY), plan.environ, Path.cwd(),
                       Cache.from_env(environ))
    assert again.argv[0] == PY
    assert under_loader(["x"], {LOADER_GUARD: "1"}, staged) == (["x"], {LOADER_GUARD: "1"})


@pytest.mark.parametrize("argv", [[], ["script"], ["exec", "probe.py"]])
def test_the_bootstrap_refuses_a_command_it_was_not_given_by_qnnctl(argv: list[str]) -> None:
    result = direct(PY, "-I", bootstrap_path(), *argv)
    assert (result.returncode, result.stdout, result.stderr) == \
        (2, "", "usage: bootstrap.py {script|module|code} TARGET [ARGS]...\n")


@pytest.mark.no_mutated_bootstrap
@pytest.mark.parametrize("name", ["python3.8", "python3.9", "python3.12"])
def test_a_zip_file_looks_as_if_run_directly_in_other_pythons(sdk: Path, name: str) -> None:
    """The path first on sys.path is given as it is before 3.9, and made absolute from 3.9 on."""
    python = other_python(name)
    _forms(Path.cwd())
    expected = last_json(direct(python, "-I", "probe.zip").stdout)
    result = lower("--", python, "-I", "probe.zip")
    assert result.returncode == 0, result.stderr
    seen = last_json(result.stdout)
    assert seen.pop("pythonpath") == with_guard(expected.pop("pythonpath"))
    seen.pop("env")
    expected.pop("env")
    assert seen == expected
    assert seen["path"][0] == ("probe.zip" if name == "python3.8" else str(Path.cwd() / "probe.zip"))


def test_the_bootstrap_runs_without_the_guard_variable() -> None:
    assert GUARD_VARIABLE not in os.environ
    assert direct(PY, "-I", bootstrap_path(), "code", "print('ran')").stdout == "ran\n"
