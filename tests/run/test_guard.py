"""The AMD MKLDNN guard: in the pipeline's process (bootstrap) and in-process (the API)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnnctl.host.machine import is_amd, read_cpu_vendor, vendor_from_cpuinfo
from qnnctl.run.api import FORCE_VENDOR_VARIABLE
from tests.lowerkit import (
    AMD_CPUINFO,
    ARM_CPUINFO,
    TORCH_PROBE,
    host_is_amd,
    host_vendor,
    lower,
    make_foreign_venv,
    other_python,
    torch_site_packages,
    write,
    write_cpuinfo,
)
from tests.sdkfactory import install_tree_into_cache

PY = sys.executable
AMD = "AuthenticAMD"
INTEL = "GenuineIntel"


@pytest.fixture
def sdk(cache_dir: Path) -> Path:
    return install_tree_into_cache(cache_dir)


@pytest.fixture(scope="module")
def foreign_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An interpreter of another virtualenv: torch reachable, qnnctl and py-cpuinfo not."""
    return make_foreign_venv(tmp_path_factory.mktemp("foreign") / "venv", torch_site_packages())


def mkldnn_seen(result: subprocess.CompletedProcess[str]) -> bool:
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("mkldnn ")]
    assert len(lines) == 1, result.stdout
    return {"mkldnn True": True, "mkldnn False": False}[lines[0]]


def env_with(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


# -- in the pipeline's process ---------------------------------------------------------


# `qnnctl lower` in a fresh interpreter that reads the CPU vendor from the file named by argv[1]
# instead of /proc/cpuinfo, and has no py-cpuinfo: asking py-cpuinfo would warn and skip the guard.
LOWER_WITH_CPUINFO = """\
import sys
sys.modules["cpuinfo"] = None  # what an absent py-cpuinfo looks like to `import cpuinfo`
import qnnctl.host.machine
qnnctl.host.machine.CPUINFO = sys.argv.pop(1)
sys.argv[0] = "qnnctl"
from qnnctl.launch import main
main()
"""


def lower_reading(cpuinfo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`qnnctl lower ARGS` with `cpuinfo` in place of /proc/cpuinfo and no vendor forced."""
    env = {k: v for k, v in os.environ.items() if k != FORCE_VENDOR_VARIABLE}
    return subprocess.run([PY, "-c", LOWER_WITH_CPUINFO, str(cpuinfo), "lower", *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(("text", "enabled"), [(AMD_CPUINFO, False), (ARM_CPUINFO, True),
                                                (AMD_CPUINFO.replace("AuthenticAMD", INTEL), True)])
def test_guard_on_an_amd_host_read_from_proc_cpuinfo(sdk: Path, tmp_path: Path, text: str, enabled: bool) -> None:
    """The vendor as the kernel gives it, with real torch: MKLDNN off on AMD, and py-cpuinfo never asked."""
    torch_site_packages()
    write(Path("probe.py"), TORCH_PROBE)
    cpuinfo = write_cpuinfo(tmp_path / "proc", text)
    result = lower_reading(cpuinfo, "--python", PY, "probe.py")
    assert mkldnn_seen(result) is enabled
    assert "py-cpuinfo" not in result.stderr
    assert mkldnn_seen(lower_reading(cpuinfo, "--keep-mkldnn", "--python", PY, "probe.py")) is True


def test_the_vendor_read_from_proc_cpuinfo_is_py_cpuinfos() -> None:
    """On this host, /proc/cpuinfo's reading and py-cpuinfo's (both keys of its releases) agree."""
    import cpuinfo

    info = dict(cpuinfo.get_cpu_info())
    with open("/proc/cpuinfo", encoding="utf-8") as handle:
        ours = vendor_from_cpuinfo(handle.read())
    assert ours is not None
    assert ours == read_cpu_vendor(info)
    # An older release of py-cpuinfo named the key vendor_id; a newer one vendor_id_raw.
    raw = info.get("vendor_id_raw") or info.get("vendor_id")
    assert read_cpu_vendor({"vendor_id": raw}) == read_cpu_vendor({"vendor_id_raw": raw}) == ours


def test_the_vendor_is_read_from_each_architectures_cpuinfo() -> None:
    assert vendor_from_cpuinfo(AMD_CPUINFO) == AMD
    assert vendor_from_cpuinfo(ARM_CPUINFO) == "ARM implementer 0x41"
    assert vendor_from_cpuinfo(ARM_CPUINFO.replace("0x41", "0xc0")) == "Ampere implementer 0xc0"
    assert vendor_from_cpuinfo(ARM_CPUINFO.replace("0x41", "0x99")) == "unknown implementer 0x99"
    assert vendor_from_cpuinfo("processor\t: 0\nmodel name\t: AuthenticAMD lookalike\n") is None
    assert [is_amd(vendor_from_cpuinfo(text)) for text in (AMD_CPUINFO, ARM_CPUINFO)] == [True, False]


def test_guard_on_this_host_with_real_torch(sdk: Path) -> None:
    torch_site_packages()
    write(Path("probe.py"), TORCH_PROBE)
    # The host's real vendor (AuthenticAMD where this suite is developed): off on AMD only.
    assert mkldnn_seen(lower("--python", PY, "probe.py")) is (not host_is_amd())
    assert mkldnn_seen(lower("--keep-mkldnn", "--python", PY, "probe.py")) is True


@pytest.mark.parametrize(("vendor", "keep", "enabled"), [
    (AMD, False, False),
    (AMD, True, True),
    (INTEL, False, True),
])
def test_guard_follows_the_vendor(sdk: Path, vendor: str, keep: bool, enabled: bool) -> None:
    torch_site_packages()
    write(Path("probe.py"), TORCH_PROBE)
    args = ["--keep-mkldnn"] if keep else []
    result = lower(*args, "--python", PY, "probe.py", env=env_with(**{FORCE_VENDOR_VARIABLE: vendor}))
    assert mkldnn_seen(result) is enabled


@pytest.mark.no_mutated_bootstrap
def test_guard_reaches_an_interpreter_without_qnnctl_or_cpuinfo(sdk: Path, foreign_python: Path) -> None:
    checks = textwrap.dedent("""\
        import importlib.util, os
        # A mutation run (tools/mutation) puts its copy of qnnctl on every child's PYTHONPATH.
        mutation_run = "MUTANT_UNDER_TEST" in os.environ
        assert importlib.util.find_spec("qnnctl") is None or mutation_run, "qnnctl is importable"
        assert importlib.util.find_spec("cpuinfo") is None, "py-cpuinfo is importable"
    """)
    write(Path("probe.py"), checks + TORCH_PROBE)
    amd = env_with(**{FORCE_VENDOR_VARIABLE: AMD})
    assert mkldnn_seen(lower("--python", str(foreign_python), "probe.py", env=amd)) is False
    # The same interpreter named after `--` gets the bootstrap too.
    assert mkldnn_seen(lower("--", str(foreign_python), "probe.py", env=amd)) is False
    assert mkldnn_seen(lower("--keep-mkldnn", "--", str(foreign_python), "probe.py", env=amd)) is True
    # And without the guard, torch there starts with MKLDNN on: the decision is what changed it.
    assert mkldnn_seen(subprocess.run([str(foreign_python), "probe.py"], capture_output=True,
                                      text=True, timeout=120)) is True


def test_guard_is_armed_before_the_first_line_without_importing_torch(sdk: Path) -> None:
    torch_site_packages()
    # Line one looks for torch: not imported by the guard. Later lines import it: already off.
    write(Path("late.py"), """\
        import sys; print("torch imported early", "torch" in sys.modules)
        import os
        print("guard variable", os.environ.get("QNNCTL_DISABLE_MKLDNN"))
        import torch.nn
        print("mkldnn", torch.backends.mkldnn.enabled)
        print("loader", type(torch.__spec__.loader).__name__, torch.__loader__ is torch.__spec__.loader)
    """)
    result = lower("--python", PY, "late.py", env=env_with(**{FORCE_VENDOR_VARIABLE: AMD}))
    assert mkldnn_seen(result) is False
    lines = result.stdout.splitlines()
    assert "torch imported early False" in lines
    assert "guard variable None" in lines
    # torch keeps its own loader: the guard's wrapper hands it back.
    assert "loader SourceFileLoader True" in lines


def test_pipeline_that_never_imports_torch_never_loads_it(sdk: Path) -> None:
    write(Path("plain.py"), "import sys\nprint(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n")
    result = lower("--python", PY, "plain.py", env=env_with(**{FORCE_VENDOR_VARIABLE: AMD}))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "[]\n"


def test_guard_applies_at_once_when_torch_is_already_imported(sdk: Path, tmp_path: Path) -> None:
    torch_site_packages()
    site = tmp_path / "site"
    write(site / "sitecustomize.py", "import torch\n")
    write(Path("probe.py"), "import sys\nassert 'torch' in sys.modules\n" + TORCH_PROBE)
    env = env_with(**{FORCE_VENDOR_VARIABLE: AMD, "PYTHONPATH": str(site)})
    assert mkldnn_seen(lower("--python", PY, "probe.py", env=env)) is False


def test_guard_leaves_frozen_flags_alone_in_the_pipeline(sdk: Path, tmp_path: Path) -> None:
    torch_site_packages()
    site = tmp_path / "site"
    write(site / "sitecustomize.py", "import torch\ntorch.backends.disable_global_flags()\n")
    write(Path("probe.py"), TORCH_PROBE)
    env = env_with(**{FORCE_VENDOR_VARIABLE: AMD, "PYTHONPATH": str(site)})
    result = lower("--python", PY, "probe.py", env=env)
    assert mkldnn_seen(result) is True
    assert "qnnctl:" not in result.stderr  # no message of ours (the checkout path may hold the name)


# -- every Python process the pipeline starts -------------------------------------------

AMD_ENV = {FORCE_VENDOR_VARIABLE: AMD}


def test_guard_reaches_a_console_script(sdk: Path, tmp_path: Path) -> None:
    """`qnnctl lower -- ./my-export`: a script with a Python #! line, as pip and torchrun's are."""
    torch_site_packages()
    direct_script = write(Path("my-export"), f"#!{PY}\n" + TORCH_PROBE)
    bin_dir = tmp_path / "bin"
    by_env = write(bin_dir / "by-env-export", "#!/usr/bin/env python3\n" + TORCH_PROBE)
    for script in (direct_script, by_env):
        script.chmod(0o755)
    # python3 is the interpreter of this virtualenv, which has torch.
    env = env_with(**AMD_ENV, PATH=f"{bin_dir}:{Path(PY).parent}:{os.environ['PATH']}")
    assert mkldnn_seen(lower("--", "./my-export", env=env)) is False
    assert mkldnn_seen(lower("--", "by-env-export", env=env)) is False
    assert mkldnn_seen(lower("--keep-mkldnn", "--", "./my-export", env=env)) is True
    # The same script without qnnctl: MKLDNN is on, so the guard is what turned it off.
    assert mkldnn_seen(subprocess.run(["./my-export"], capture_output=True, text=True, timeout=120)) is True


def test_guard_reaches_multiprocessing_spawn_workers_and_launched_children(sdk: Path) -> None:
    torch_site_packages()
    # torch is imported only in the workers: each is guarded on its own, not by inheritance.
    write(Path("launch.py"), """\
        import multiprocessing, subprocess, sys

        def probe(queue):
            import torch
            queue.put(torch.backends.mkldnn.enabled)

        if __name__ == "__main__":
            context = multiprocessing.get_context("spawn")
            queue = context.Queue()
            worker = context.Process(target=probe, args=(queue,))
            worker.start()
            print("spawned mkldnn", queue.get(timeout=120), flush=True)
            worker.join()
            # What a launcher such as torchrun does: start the interpreter again on a script.
            subprocess.run([sys.executable, "child.py"], check=True)
    """)
    write(Path("child.py"), TORCH_PROBE)
    guarded = lower("--python", PY, "launch.py", env=env_with(**AMD_ENV))
    assert mkldnn_seen(guarded) is False
    assert "spawned mkldnn False" in guarded.stdout.splitlines()
    kept = lower("--keep-mkldnn", "--python", PY, "launch.py", env=env_with(**AMD_ENV))
    assert mkldnn_seen(kept) is True
    assert "spawned mkldnn True" in kept.stdout.splitlines()


SITE_PROBE = """\
import json, os, sys
sitecustomize = sys.modules.get("sitecustomize")
print(json.dumps({"path": sys.path, "ran": os.environ.get("USER_SITE_RAN"),
                  "sitecustomize": getattr(sitecustomize, "__file__", None)}))
"""


def test_guard_hands_over_to_the_pipelines_own_sitecustomize(sdk: Path, tmp_path: Path) -> None:
    torch_site_packages()
    site = tmp_path / "site"
    # The user's sitecustomize runs, sees no torch imported and no hook of qnnctl's yet.
    write(site / "sitecustomize.py", """\
        import os, sys
        os.environ["USER_SITE_RAN"] = str([type(f).__name__ for f in sys.meta_path].count("_TorchImportHook"))
    """)
    write(Path("probe.py"), SITE_PROBE + TORCH_PROBE)
    env = env_with(**AMD_ENV, PYTHONPATH=f"{site}:{tmp_path / 'other'}")
    result = lower("--python", PY, "probe.py", env=env)
    alone = subprocess.run([PY, "probe.py"], capture_output=True, text=True, timeout=120, env=env)
    assert mkldnn_seen(result) is False
    assert mkldnn_seen(alone) is True
    seen = json.loads(result.stdout.splitlines()[0])
    assert seen == json.loads(alone.stdout.splitlines()[0])  # sys.path and sys.modules as without qnnctl
    assert seen["sitecustomize"] == str(site / "sitecustomize.py")
    assert seen["ran"] == "0"


def test_a_failing_sitecustomize_of_the_pipeline_is_reported_as_python_does(sdk: Path, tmp_path: Path) -> None:
    torch_site_packages()
    site = tmp_path / "site"
    write(site / "sitecustomize.py", "import os\nraise RuntimeError('the user site is broken')\n")
    write(Path("probe.py"), SITE_PROBE + TORCH_PROBE)
    # Given to the pipeline only: qnnctl, a Python too, would report the error of its own start.
    result = lower("--", "sh", "-c", f'PYTHONPATH="$PYTHONPATH:{site}" exec "{PY}" probe.py', env=env_with(**AMD_ENV))
    # The pipeline's PYTHONPATH, qnnctl's own folder left out, is the test's (if any) and then `site`.
    alone = subprocess.run([PY, "probe.py"], capture_output=True, text=True, timeout=120,
                           env=env_with(PYTHONPATH=os.pathsep.join(filter(None, (os.environ.get("PYTHONPATH"),
                                                                                 str(site))))))
    assert "Error in sitecustomize" in alone.stderr
    assert result.stderr == alone.stderr
    assert result.stdout.splitlines()[0] == alone.stdout.splitlines()[0]
    assert mkldnn_seen(result) is False  # and the guard is armed all the same


OTHER_PYTHONS = ("python2.7", "python3.7", "python3.8", "python3.12", "python3.13")
@pytest.mark.parametrize("name", OTHER_PYTHONS)
def test_the_site_folder_is_harmless_in_any_interpreter_the_pipeline_starts(name: str, tmp_path: Path) -> None:
    """A pipeline may start any Python (a tool of the system's, an older virtualenv): each reads
    qnnctl's sitecustomize. It hands over and leaves sys.path alone in all of them, and guards
    the Python 3 ones (a stand-in torch: these interpreters have no real one)."""
    from qnnctl.run.lower import site_folder

    python = other_python(name)
    fake = tmp_path / "fake"
    write(fake / "torch" / "__init__.py", "import torch.backends.mkldnn\n")
    write(fake / "torch" / "backends" / "__init__.py", "def flags_frozen():\n    return False\n")
    write(fake / "torch" / "backends" / "mkldnn.py", "enabled = True\n")
    user = tmp_path / "user"
    write(user / "sitecustomize.py", "import sys\nsys.stderr.write('user sitecustomize\\n')\n")
    probe = ("import sys, torch\nprint(sys.path)\nprint(sys.modules['sitecustomize'].__file__)\n"
             "print(torch.backends.mkldnn.enabled)\n")
    # No bytecode written: Python 2 would load the user's sitecustomize from the .pyc the first
    # run leaves, and name that file the second time.
    alone = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60,
                           env=env_with(PYTHONPATH=f"{fake}:{user}", PYTHONDONTWRITEBYTECODE="1"))
    guarded = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60,
                             env=env_with(PYTHONPATH=f"{site_folder()}:{fake}:{user}", PYTHONDONTWRITEBYTECODE="1"))
    assert guarded.stderr == alone.stderr == "user sitecustomize\n"
    path, sitecustomize, enabled = guarded.stdout.splitlines()
    assert [path, sitecustomize] == alone.stdout.splitlines()[:2]
    assert enabled == ("True" if name.startswith("python2") else "False")


def test_guard_says_where_it_cannot_reach(sdk: Path) -> None:
    torch_site_packages()
    script = write(Path("isolated-export"), f"#!{PY} -I\n" + TORCH_PROBE)
    script.chmod(0o755)
    result = lower("--", "./isolated-export", env=env_with(**AMD_ENV))
    assert mkldnn_seen(result) is True
    assert "qnnctl: warning: the AMD MKLDNN guard cannot reach ./isolated-export" in result.stderr
    assert f"qnnctl lower --python {PY} ./isolated-export" in result.stderr
    # As it says, that runs it guarded.
    assert mkldnn_seen(lower("--python", PY, "./isolated-export", env=env_with(**AMD_ENV))) is False
    # An isolated interpreter named on the command line is started through the bootstrap instead.
    isolated = lower("--", PY, "-I", "isolated-export", env=env_with(**AMD_ENV))
    assert mkldnn_seen(isolated) is False
    assert "but not the Python processes it starts with -I" in isolated.stderr
    # Where nothing is to be guarded, nothing is said.
    kept = lower("--keep-mkldnn", "--", "./isolated-export", env=env_with(**AMD_ENV))
    assert mkldnn_seen(kept) is True
    assert "qnnctl:" not in kept.stderr


# -- in-process: disable_mkldnn_on_amd() ------------------------------------------------


@pytest.fixture
def torch_mkldnn() -> Iterator[object]:
    """torch.backends.mkldnn, turned back on after the test."""
    torch_site_packages()
    import importlib

    mkldnn = importlib.import_module("torch.backends.mkldnn")
    mkldnn.enabled = True  # type: ignore[attr-defined]
    yield mkldnn
    mkldnn.enabled = True  # type: ignore[attr-defined]


def test_api_turns_mkldnn_off_on_amd_on_every_call(torch_mkldnn: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl import disable_mkldnn_on_amd

    monkeypatch.setenv(FORCE_VENDOR_VARIABLE, AMD)
    assert disable_mkldnn_on_amd() is True
    assert torch_mkldnn.enabled is False  # type: ignore[attr-defined]
    torch_mkldnn.enabled = True  # type: ignore[attr-defined]  # a caller turns it back on
    assert disable_mkldnn_on_amd() is True
    assert torch_mkldnn.enabled is False  # type: ignore[attr-defined]


def test_api_leaves_mkldnn_alone_elsewhere(torch_mkldnn: object, monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl import disable_mkldnn_on_amd

    monkeypatch.setenv(FORCE_VENDOR_VARIABLE, INTEL)
    assert disable_mkldnn_on_amd() is False
    assert torch_mkldnn.enabled is True  # type: ignore[attr-defined]


def run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                          env=env_with() if env is None else env)


def test_api_imports_torch_only_on_amd() -> None:
    torch_site_packages()
    code = """\
        import sys, qnnctl
        print(qnnctl.disable_mkldnn_on_amd(), "torch" in sys.modules)
    """
    assert run_python(code, env_with(**{FORCE_VENDOR_VARIABLE: INTEL})).stdout.split() == ["False", "False"]
    assert run_python(code, env_with(**{FORCE_VENDOR_VARIABLE: AMD})).stdout.split() == ["True", "True"]


def test_api_leaves_frozen_flags_alone() -> None:
    torch_site_packages()
    result = run_python("""\
        import torch, qnnctl
        torch.backends.disable_global_flags()
        print(qnnctl.disable_mkldnn_on_amd(), torch.backends.mkldnn.enabled)
    """, env_with(**{FORCE_VENDOR_VARIABLE: AMD}))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]


def test_api_reads_the_vendor_once_per_process_from_proc_cpuinfo() -> None:
    result = run_python("""\
        import builtins, sys, qnnctl
        opened = []
        real_open = builtins.open
        def counting_open(file, *args, **kwargs):
            opened.append(file)
            return real_open(file, *args, **kwargs)
        builtins.open = counting_open
        for _ in range(3):
            qnnctl.disable_mkldnn_on_amd()
        print(opened.count("/proc/cpuinfo"), "cpuinfo" in sys.modules)
    """, {k: v for k, v in os.environ.items() if k != FORCE_VENDOR_VARIABLE})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["1", "False"]


def test_api_asks_py_cpuinfo_once_where_proc_cpuinfo_is_missing(tmp_path: Path) -> None:
    result = run_python(f"""\
        import cpuinfo, qnnctl, qnnctl.host.machine
        qnnctl.host.machine.CPUINFO = {str(tmp_path / "absent")!r}
        calls = []
        real = cpuinfo.get_cpu_info
        cpuinfo.get_cpu_info = lambda: calls.append(1) or real()
        for _ in range(3):
            qnnctl.disable_mkldnn_on_amd()
        print(len(calls), qnnctl.host.machine.cpu_vendor())
    """, {k: v for k, v in os.environ.items() if k != FORCE_VENDOR_VARIABLE})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-2:] == ["1", host_vendor()]


def test_api_without_cpuinfo_warns_once_and_carries_on(tmp_path: Path) -> None:
    result = run_python(f"""\
        import logging, sys
        sys.modules["cpuinfo"] = None  # what an absent py-cpuinfo looks like to `import cpuinfo`
        import qnnctl.host.machine
        qnnctl.host.machine.CPUINFO = {str(tmp_path / "absent")!r}  # and no /proc/cpuinfo
        logging.basicConfig(format="%(levelname)s %(name)s %(message)s")
        import qnnctl
        print([qnnctl.disable_mkldnn_on_amd() for _ in range(3)], "torch" in sys.modules)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[False, False, False] False"
    warnings = [line for line in result.stderr.splitlines() if line.startswith("WARNING qnnctl")]
    assert len(warnings) == 1, result.stderr
    assert "py-cpuinfo" in warnings[0]


def test_api_keeps_a_broken_cpuinfo_a_real_error(tmp_path: Path) -> None:
    # Present but failing inside: not "py-cpuinfo is missing", but the error itself.
    write(tmp_path / "broken" / "cpuinfo" / "__init__.py", "import qnnctl_absent_dependency\n")
    result = run_python(f"""\
        import qnnctl, qnnctl.host.machine
        qnnctl.host.machine.CPUINFO = {str(tmp_path / "absent")!r}
        try:
            qnnctl.disable_mkldnn_on_amd()
        except ModuleNotFoundError as exc:
            print("raised", exc.name)
    """, env_with(PYTHONPATH=str(tmp_path / "broken")))
    assert result.stdout.strip() == "raised qnnctl_absent_dependency", result.stderr


def test_api_reads_the_vendor_from_the_mapping_given(monkeypatch: pytest.MonkeyPatch) -> None:
    from qnnctl.run.api import amd_guard_needed

    monkeypatch.setenv(FORCE_VENDOR_VARIABLE, INTEL)
    assert amd_guard_needed({FORCE_VENDOR_VARIABLE: AMD}) is True
    monkeypatch.setenv(FORCE_VENDOR_VARIABLE, AMD)
    assert amd_guard_needed({FORCE_VENDOR_VARIABLE: INTEL}) is False
    assert amd_guard_needed() is True  # none given: this process' environment


def fake_torch(folder: Path, backends: str) -> dict[str, str]:
    """An environment whose Python finds a stand-in torch in `folder` before any real one:
    torch.backends with the source `backends`, and torch.backends.mkldnn with `enabled`."""
    write(folder / "torch" / "__init__.py", "")
    write(folder / "torch" / "backends" / "__init__.py", backends)
    write(folder / "torch" / "backends" / "mkldnn.py", "enabled = True\n")
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return env_with(PYTHONPATH=path, **{FORCE_VENDOR_VARIABLE: AMD})


GUARD_CALL = """\
    import sys, qnnctl
    try:
        print(qnnctl.disable_mkldnn_on_amd(), sys.modules["torch.backends.mkldnn"].enabled)
    except ModuleNotFoundError as exc:
        print("raised", exc.name)
"""


def test_api_on_amd_without_torch_says_no() -> None:
    result = run_python("""\
        import sys, qnnctl

        class NoTorch:  # torch is not installed, as far as this process can tell
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] == "torch":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)

        sys.meta_path.insert(0, NoTorch())
        print(qnnctl.disable_mkldnn_on_amd(), "torch" in sys.modules)
    """, env_with(**{FORCE_VENDOR_VARIABLE: AMD}))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]


def test_api_keeps_a_module_missing_inside_torch_a_real_error(tmp_path: Path) -> None:
    result = run_python(GUARD_CALL, fake_torch(tmp_path, "import qnnctl_absent_dependency\n"))
    assert result.stdout.strip() == "raised qnnctl_absent_dependency", result.stderr


def test_api_turns_mkldnn_off_where_torch_cannot_freeze_flags(tmp_path: Path) -> None:
    # A torch.backends without flags_frozen (as before torch 1.10): nothing can be frozen.
    result = run_python(GUARD_CALL, fake_torch(tmp_path, ""))
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False"]
