"""The AMD MKLDNN guard: in the pipeline's process (bootstrap) and in-process (the API)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from qnnctl.api import FORCE_VENDOR_VARIABLE
from tests.lowerkit import TORCH_PROBE, host_is_amd, lower, make_foreign_venv, torch_site_packages, write
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


def test_guard_reaches_an_interpreter_without_qnnctl_or_cpuinfo(sdk: Path, foreign_python: Path) -> None:
    checks = textwrap.dedent("""\
        import importlib.util
        assert importlib.util.find_spec("qnnctl") is None, "qnnctl is importable"
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


def test_api_reads_the_vendor_once_per_process() -> None:
    result = run_python("""\
        import cpuinfo, qnnctl
        calls = []
        real = cpuinfo.get_cpu_info
        cpuinfo.get_cpu_info = lambda: calls.append(1) or real()
        for _ in range(3):
            qnnctl.disable_mkldnn_on_amd()
        print(len(calls))
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "1"


def test_api_without_cpuinfo_warns_once_and_carries_on() -> None:
    result = run_python("""\
        import logging, sys
        sys.modules["cpuinfo"] = None  # what an absent py-cpuinfo looks like to `import cpuinfo`
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
    result = run_python("""\
        import qnnctl
        try:
            qnnctl.disable_mkldnn_on_amd()
        except ModuleNotFoundError as exc:
            print("raised", exc.name)
    """, env_with(PYTHONPATH=str(tmp_path / "broken")))
    assert result.stdout.strip() == "raised qnnctl_absent_dependency", result.stderr
