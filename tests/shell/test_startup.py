"""A fresh interpreter running the CLI: what it imports, and what `env` may not do.

`run_probe` runs the real entry point in a new interpreter whose process-starting calls
raise (and are recorded), and which reports `sys.modules` as it exits.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.sdkfactory import VERSION, build_sdk_tree, install_tree_into_cache

HEAVY = ("requests", "rich", "tqdm", "cpuinfo", "elftools", "torch", "filelock", "urllib3")
PROBE_TAG = "QNNCTL-PROBE "

_PROBE = r"""
import atexit, json, os, sys

started = []

def _forbidden(name):
    def refuse(*args, **kwargs):
        started.append(name)
        raise RuntimeError(f"qnnctl env called {name}")
    return refuse

import subprocess, _posixsubprocess
subprocess.Popen = _forbidden("subprocess.Popen")
_posixsubprocess.fork_exec = _forbidden("_posixsubprocess.fork_exec")
for _name in ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "popen",
              "execv", "execve", "execvp", "execvpe", "spawnv", "spawnve"):
    if hasattr(os, _name):
        setattr(os, _name, _forbidden("os." + _name))
# The probe itself imported subprocess; what qnnctl imports is what matters.
_before = set(sys.modules) - {"subprocess", "_posixsubprocess"}

def _report():
    loaded = sorted(set(sys.modules) - _before)
    sys.stderr.write("QNNCTL-PROBE " + json.dumps({"modules": loaded, "started": started}) + "\n")
    sys.stderr.flush()

atexit.register(_report)
sys.argv = ["qnnctl", *sys.argv[1:]]
from qnnctl.launch import main
main()
"""


@dataclass(frozen=True)
class Probe:
    returncode: int
    stdout: str
    stderr: str  # without the probe's own line
    modules: list[str]
    started: list[str]


def run_probe(*args: str, env: dict[str, str] | None = None) -> Probe:
    """Run `qnnctl ARGS` in a fresh interpreter that may not start a process."""
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *args],
        env=os.environ.copy() if env is None else env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = proc.stderr.splitlines(keepends=True)
    tagged = [line for line in lines if line.startswith(PROBE_TAG)]
    assert len(tagged) == 1, proc.stderr
    report = json.loads(tagged[0].removeprefix(PROBE_TAG))
    rest = "".join(line for line in lines if not line.startswith(PROBE_TAG))
    return Probe(proc.returncode, proc.stdout, rest, report["modules"], report["started"])


def _lean(modules: list[str]) -> list[str]:
    """What `qnnctl env`'s lean path may not import: the heavy libraries, click, the command line
    and its table, the full `env` command, qnnctl.net (URLs, downloads), and typing (a third of
    Python's start-up; qnnctl.records types its records without it)."""
    return [m for m in modules if m.split(".")[0] in (*HEAVY, "click", "typing")
            or m in ("qnnctl.cli", "qnnctl.commands.env", "qnnctl.commands.common")
            or m == "qnnctl.net" or m.startswith("qnnctl.net.")]


def _fresh_modules(code: str) -> list[str]:
    """sys.modules after `code` in a fresh interpreter, less what Python itself had loaded."""
    probe = f"import json, sys; before = set(sys.modules); {code}; print(json.dumps(sorted(set(sys.modules) - before)))"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    return list(json.loads(proc.stdout.splitlines()[-1]))


def test_importing_the_entry_point_imports_nothing_but_itself() -> None:
    """Which path a command takes is decided before either is imported: `qnnctl --version`
    pays for neither the lean `env` nor anything it imports."""
    loaded = [m for m in _fresh_modules("import qnnctl.launch") if m.startswith("qnnctl")]
    assert sorted(loaded) == ["qnnctl", "qnnctl.errors", "qnnctl.launch", "qnnctl.records", "qnnctl.version"]


@pytest.mark.parametrize("args", [["--version"], ["-V"], ["--version", "--help"], ["-V", "env"]])
def test_the_version_is_answered_as_the_full_command_line_answers_it(args: list[str], tmp_path: Path) -> None:
    lean, full = _both(args, dict(os.environ), tmp_path)
    assert lean == full
    assert lean[0] == 0
    if args in (["--version"], ["-V"]):
        probe = run_probe(*args)
        assert probe.stdout == full[1]
        assert [m for m in probe.modules if m.startswith("qnnctl")] == [
            "qnnctl", "qnnctl.errors", "qnnctl.launch", "qnnctl.records", "qnnctl.version"]


def test_the_lean_env_path_imported_alone_stays_lean() -> None:
    loaded = _fresh_modules("import qnnctl.commands.leanenv")
    assert "qnnctl.run.envplan" in loaded  # the probe saw the path load
    assert _lean(loaded) == []


def test_the_version_is_a_leaf_read_from_there() -> None:
    """qnnctl.version imports nothing; every module, and pyproject, reads the version there, never
    through the package (whose __init__ would be imported for it)."""
    import ast

    import qnnctl
    from qnnctl.version import __version__

    package = Path(qnnctl.__file__).parent
    leaf = ast.parse((package / "version.py").read_text())
    assert not [node for node in ast.walk(leaf) if isinstance(node, (ast.Import, ast.ImportFrom))]
    through_package = [str(path.relative_to(package)) for path in package.rglob("*.py")
                       for node in ast.walk(ast.parse(path.read_text()))
                       if isinstance(node, ast.ImportFrom) and node.module == "qnnctl"
                       and any(alias.name == "__version__" for alias in node.names)]
    assert through_package == []
    assert qnnctl.__version__ == __version__
    pyproject = (package.parent / "pyproject.toml").read_text()
    assert 'version = { attr = "qnnctl.version.__version__" }' in pyproject


@pytest.mark.parametrize("shell", ["sh", "bash", "zsh", "fish", "powershell", "nu", "json", "dotenv"])
def test_env_imports_nothing_heavy_and_starts_no_process(shell: str, cache_dir: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    probe = run_probe("env", VERSION, "--shell", shell)
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout
    assert probe.started == []
    assert _lean(probe.modules) == []
    assert "qnnctl.run.envplan" in probe.modules  # the probe saw the env path run


def test_env_with_a_staged_runtime_stays_light(cache_dir: Path) -> None:
    """On a host without libc++ the trio is staged: env puts it on LD_LIBRARY_PATH, reading the
    staging record, without the module that stages it (ELF parsing, downloads)."""
    install_tree_into_cache(cache_dir, VERSION)
    staged = cache_dir / "runtime" / "libcxx-14.0.6"
    (staged / "lib").mkdir(parents=True)
    (staged / ".qnnctl.json").write_text(json.dumps({"kind": "libcxx", "staged_ns": 1}))
    probe = run_probe("env", VERSION, "--shell", "json")
    assert probe.returncode == 0, probe.stderr
    assert str(staged / "lib") in json.loads(probe.stdout)["LD_LIBRARY_PATH"].split(":")
    assert _lean(probe.modules) == []
    assert "qnnctl.host.runtime" not in probe.modules


def test_env_default_selection_and_unset_stay_light(cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The paths that read the default cache folder, the pin and ExecuTorch's files."""
    monkeypatch.delenv("QNNCTL_CACHE_DIR")
    probe = run_probe("env", "--unset")
    assert probe.returncode == 0
    assert probe.started == []
    assert _lean(probe.modules) == []
    # Nothing installed in the default cache: the error is the full command line's to report.
    probe = run_probe("env", "--shell", "json")
    assert probe.returncode == 1
    assert "is not installed" in probe.stderr
    assert probe.started == []
    # Everything else is the full command line's, which imports what its commands need.
    probe = run_probe("--help")
    assert probe.returncode == 0
    assert probe.started == []
    assert "qnnctl.cli" in probe.modules


_LEAN = "from qnnctl.launch import main; main()"
_FULL = "from qnnctl.cli import main; main()"


def _both(args: list[str], env: dict[str, str], cwd: Path) -> tuple[tuple[int, str, str], tuple[int, str, str]]:
    """(exit code, stdout, stderr) of `qnnctl ARGS` through the entry point and through the full
    command line alone."""
    answers = []
    for code in (_LEAN, _FULL):
        proc = subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True,
                              text=True, timeout=120)
        answers.append((proc.returncode, proc.stdout, proc.stderr))
    return answers[0], answers[1]


@pytest.mark.parametrize("args", [
    ["env", "--shell", "bash"],
    ["env", "--shell=json"],
    ["env", VERSION, "--shell", "fish"],
    ["env", "--unset", "--shell", "zsh"],
    ["env", "--unset", "--unset"],
    ["env", "--shell", "fish", "--shell", "json"],
    ["env"],
    ["env", "2.37", "--shell", "nu"],
    ["env", "9.9.9.999999"],
    ["env", "--shell", "tcsh"],
    ["env", "--shell"],
    ["env", "--bogus"],
    ["env", VERSION, "--unset"],
    ["env", "--sdk", "nowhere"],
    ["env", "-v", "--shell", "sh"],
    ["env", "--help"],
])
def test_the_lean_env_prints_what_the_full_command_line_prints(args: list[str], cache_dir: Path,
                                                              tmp_path: Path) -> None:
    install_tree_into_cache(cache_dir, VERSION)
    env = {**os.environ, "SHELL": "/bin/bash", "QNNCTL_SDK": "", "LD_LIBRARY_PATH": "/opt/lib"}
    lean, full = _both(args, env, tmp_path)
    assert lean == full


def test_the_lean_env_hands_warnings_and_relative_caches_to_the_full_command_line(cache_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """A pin naming components the SDK lacks is a warning on stderr; a relative cache folder is
    said on stderr too: both are the full command line's to print, and are printed alike."""
    root = install_tree_into_cache(cache_dir, VERSION)
    manifest = json.loads((root / ".qnnctl.json").read_text())
    (root / ".qnnctl.json").write_text(json.dumps({**manifest, "components": ["host"]}))
    project = tmp_path / "project"
    project.mkdir()
    (project / ".qnn-version").write_text(f"{VERSION}\nhost,android\n")
    env = {**os.environ, "SHELL": "/bin/bash"}
    lean, full = _both(["env"], env, project)
    assert lean == full
    assert "android" in lean[2]
    assert lean[1]
    relative = os.path.relpath(cache_dir, project)
    lean, full = _both(["env", "--shell", "json"], {**env, "QNNCTL_CACHE_DIR": relative}, project)
    assert lean == full
    assert "relative" in lean[2]


def test_the_lean_env_hands_an_unexportable_path_to_the_full_command_line(tmp_path: Path) -> None:
    """A cache whose path holds a newline cannot be exported: the full command line refuses it
    with its message and exit code, through the entry point as well."""
    cache = tmp_path / "ca\nche"
    install_tree_into_cache(cache, VERSION)
    env = {**os.environ, "QNNCTL_CACHE_DIR": str(cache), "SHELL": "/bin/bash"}
    lean, full = _both(["env", "--shell", "bash"], env, tmp_path)
    assert lean == full
    assert lean[0] == 2
    assert "Traceback" not in lean[2]


def test_the_lean_env_hands_store_warnings_to_the_full_command_line(cache_dir: Path, tmp_path: Path) -> None:
    """A store anyone can write to is warned about: said once, in qnnctl's words, whichever path
    answers. A linked SDK is exported alike too."""
    install_tree_into_cache(cache_dir, VERSION)
    store = tmp_path / "store"
    build_sdk_tree(store / "2.38.0.250901")
    store.chmod(0o777)
    env = {**os.environ, "SHELL": "/bin/bash", "QNNCTL_STORES": str(store)}
    lean, full = _both(["env", "--shell", "json"], env, tmp_path)
    assert lean == full
    assert lean[2].count("is not used") == 1
    assert "qnnctl: warning:" in lean[2]
    elsewhere = build_sdk_tree(tmp_path / "elsewhere" / VERSION)
    env = {**os.environ, "SHELL": "/bin/bash"}
    linked = subprocess.run([sys.executable, "-c", _FULL, "link", str(elsewhere)], env=env, cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert linked.returncode == 0, linked.stderr
    lean, full = _both(["env", VERSION, "--shell", "json"], env, tmp_path)
    assert lean == full


def test_the_lean_env_writes_what_stdout_takes_as_the_full_command_line_does(tmp_path: Path) -> None:
    """An ASCII-only stdout and a path it cannot carry; a closed stdout: the same answer, never
    a traceback."""
    cache = tmp_path / "cach\u00e9"
    install_tree_into_cache(cache, VERSION)
    env = {**os.environ, "SHELL": "/bin/bash", "QNNCTL_CACHE_DIR": str(cache), "PYTHONIOENCODING": "ascii"}
    lean, full = _both(["env", "--shell", "bash"], env, tmp_path)
    assert lean == full
    assert "Traceback" not in lean[2]
    closed = []
    for code in (_LEAN, _FULL):
        proc = subprocess.run(["bash", "-c", 'exec "$@" >&-', "bash", sys.executable, "-c", code, "env"],
                              env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        closed.append((proc.returncode, proc.stderr))
    assert closed[0] == closed[1]
    assert "Traceback" not in closed[0][1]


def test_probe_sees_a_process_being_started() -> None:
    """The probe itself: a command that does start a process is caught."""
    proc = subprocess.run([sys.executable, "-c", _PROBE.replace("main()\n", "subprocess.run(['true'])\n")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert '"started": ["subprocess.Popen"]' in proc.stderr
