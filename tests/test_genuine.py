"""qnnctl on Qualcomm's own QAIRT libraries (2.51 and 2.47), taken from onnxruntime-qnn wheels.

tests/genuine.py builds the SDK archives and explains where the wheels come from. On a
workstation without them these tests skip, saying how to fetch them; in CI they fail.

The host here has no libc++: qnnctl must stage Debian's trio, which a loopback server offers in
the layout of LLVM's release archive (apt-get is a shim that fails, so nothing leaves the
machine). Each test checks the SDK through the real QNN C API, called by a script of the test's
own (not by qnnctl's code).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests import genuine
from tests.conftest import IN_CI, run_qnnctl
from tests.httpserver import FaultServer

LLVM_TOP = "clang+llvm-14.0.0-x86_64-linux-gnu-ubuntu-18.04"
LLVM_PATH = f"/llvmorg-14.0.0/{LLVM_TOP}.tar.xz"
# Where .ci/run puts a Python with ExecuTorch 1.5.1 (kept apart: an ExecuTorch visible to the
# tests' own Python would change which SDK every other test selects).
EXECUTORCH_PYTHON = "QNNCTL_TEST_EXECUTORCH_PYTHON"

# What each build's libraries report (read once with a C program against QAIRT's headers'
# struct layout; QnnInterface.h's QNN_BACKEND_ID_HTP is 6).
PROVIDERS = {
    genuine.QAIRT_2_51.qairt: {"name": "HTP_QTI_AISW", "backend_id": 6, "core": "2.40.0", "backend": "5.51.0"},
    genuine.QAIRT_2_47.qairt: {"name": "HTP_QTI_AISW", "backend_id": 6, "core": "2.36.0", "backend": "5.47.0"},
}

# The test's own QNN API client: QnnInterface_getProviders on libQnnHtp.so, opened by bare
# name as ExecuTorch opens it, so the loader's search decides which file that is.
PROVIDERS_SCRIPT = r"""
import ctypes, json, sys

class ApiVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class Interface(ctypes.Structure):  # QnnInterface_t, up to its version fields
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("core", ApiVersion), ("backend", ApiVersion)]

def dotted(v):
    return f"{v.major}.{v.minor}.{v.patch}"

if len(sys.argv) > 1 and sys.argv[1] == "setup":
    import qnnctl
    qnnctl.setup_sdk(sys.argv[2])
lib = ctypes.CDLL("libQnnHtp.so")
get = lib.QnnInterface_getProviders
get.restype = ctypes.c_uint64
found = ctypes.POINTER(ctypes.POINTER(Interface))()
count = ctypes.c_uint32()
status = get(ctypes.byref(found), ctypes.byref(count))
providers = [{"name": found[i].contents.name.decode(), "backend_id": found[i].contents.backend_id,
              "core": dotted(found[i].contents.core), "backend": dotted(found[i].contents.backend)}
             for i in range(count.value)]
path = next(line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith("/libQnnHtp.so"))
print("@@" + json.dumps({"status": status, "providers": providers, "path": path}))
"""

TINY_LOWERING = """
import torch
from executorch.backends.qualcomm.utils.utils import (
    generate_htp_compiler_spec, generate_qnn_executorch_compiler_spec,
    get_soc_to_chipset_map, to_edge_transform_and_lower_to_qnn,
)

class Tiny(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x + 1.0)

specs = generate_qnn_executorch_compiler_spec(
    soc_model=get_soc_to_chipset_map()["SM8650"],
    backend_options=generate_htp_compiler_spec(use_fp16=True),
)
to_edge_transform_and_lower_to_qnn(Tiny().eval(), (torch.randn(1, 8),), specs)
print("LOWERED")
"""

WHEELS = [pytest.param(w, id=f"qairt-{w.qairt}") for w in genuine.WHEELS]


def require(found: object, what: str) -> None:
    if not found:
        message = genuine.missing_message(what)
        if IN_CI:
            pytest.fail(message + "; .ci/run fetches it")
        pytest.skip(message)


@pytest.fixture
def archive(request: pytest.FixtureRequest) -> Path:
    wheel: genuine.Wheel = request.param
    require(genuine.wheel_path(wheel), wheel.file_name)
    return genuine.cached_archive(wheel)


@pytest.fixture
def no_apt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """apt-get fails (and logs its calls), as on a host without Debian's package lists."""
    shims = tmp_path / "shims"
    shims.mkdir()
    log = tmp_path / "apt-get.log"
    (shims / "apt-get").write_text(f"#!/bin/sh\necho \"$*\" >> {shlex.quote(str(log))}\nexit 100\n")
    (shims / "apt-get").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shims}{os.pathsep}{os.environ['PATH']}")
    return log


@pytest.fixture
def llvm(server: FaultServer, no_apt: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """Debian's libc++ trio, served on 127.0.0.1 as LLVM's release archive holds it."""
    require(genuine.debian_trio_debs(), "the libc++ trio's Debian packages")
    built = genuine.CACHE / "built" / f"llvm-layout-r{genuine.LAYOUT_REVISION}.tar.xz"
    if not built.is_file():
        genuine.llvm_layout_archive(built, LLVM_TOP)
    url = server.add(LLVM_PATH, built.read_bytes(), "application/x-xz")
    monkeypatch.setenv("QNNCTL_LLVM_URL", url)
    return url


def host_has_libcxx() -> bool:
    """True where the host has libc++ itself: then nothing is staged, and the staging tests
    cannot show anything (a skip on a workstation; in CI, where they must run, a failure)."""
    from qnnctl.host.runtime import missing_host_libraries
    from qnnctl.host.staged import TRIO

    present = not missing_host_libraries(TRIO, [])
    if present and IN_CI:
        pytest.fail("this CI host has libc++ installed: the libc++ staging tests need a host without it")
    return present


def qairt(archive: Path) -> str:
    return archive.name.removeprefix("v").split("-r", 1)[0]


def install(archive: Path, cache_dir: Path) -> Path:
    proc = run_qnnctl("install", "--file", str(archive))
    assert proc.returncode == 0, proc.stderr
    root = cache_dir / "sdks" / qairt(archive)
    assert proc.stdout == f"{root}\n"
    return root


def call_providers(command: list[str], env: dict[str, str] | None = None) -> dict[str, object]:
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120,
                          env=os.environ.copy() if env is None else env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    result: dict[str, object] = json.loads(line[2:])
    return result


def checks(*args: str, env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    proc = run_qnnctl("doctor", "--json", "--offline", *args, env=env)
    report = json.loads(proc.stdout)
    assert proc.returncode == (0 if report["ok"] else 1)
    return {c["id"]: c for c in report["checks"]}


# -- install, env, doctor ------------------------------------------------------------------------


@pytest.mark.parametrize("archive", WHEELS, indirect=True)
def test_install_stages_libcxx_then_env_loads_the_real_htp_backend(archive: Path, llvm: str, no_apt: Path,
                                                                    cache_dir: Path, tmp_path: Path) -> None:
    if host_has_libcxx():
        pytest.skip("this host has libc++ already: nothing to stage")
    version = qairt(archive)
    root = install(archive, cache_dir)
    staged = cache_dir / "runtime" / "libcxx-14.0.0" / "lib"
    assert sorted(p.name for p in staged.iterdir()) == ["libc++.so.1", "libc++abi.so.1", "libunwind.so.1"]
    assert "download libc++1-14" in no_apt.read_text()  # apt-get first, then the archive

    # eval "$(qnnctl env)" in a real shell, then a Python child calls the C API.
    script = tmp_path / "providers.py"
    script.write_text(PROVIDERS_SCRIPT)
    shell = f'eval "$(qnnctl env {version} --shell bash)" && exec {shlex.quote(sys.executable)} {script}'
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    answer = call_providers(["bash", "-c", shell], env)
    assert answer["status"] == 0
    assert answer["providers"] == [PROVIDERS[version]]
    assert answer["path"] == str(root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so")

    # doctor, in the shell env set up: every check ok, or an honest warn or skip.
    exported = run_qnnctl("env", version, "--shell", "json")
    shell_env = {**os.environ, **json.loads(exported.stdout)}
    found = checks("--sdk", version, env=shell_env)
    failed = {k: v for k, v in found.items() if v["status"] not in ("ok", "warn", "skip")}
    assert not failed, failed
    expected = PROVIDERS[version]
    assert (f"libQnnHtp.so: HTP_QTI_AISW (backend 6, core API {expected['core']}, "
            f"backend API {expected['backend']})") in found["load"]["detail"]
    assert "SYSTEM_QTI_AISW (system API" in found["load"]["detail"]
    assert found["sdk.layout"]["status"] == "ok"
    assert "enough for lowering" in found["sdk.layout"]["detail"]
    assert found["environment"]["status"] == "ok", found["environment"]
    # env puts no tool folder that this SDK lacks on PATH.
    assert "bin/x86_64-linux-clang" not in json.loads(exported.stdout).get("PATH", "")


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_lower_loads_the_real_backend_without_env(archive: Path, llvm: str, cache_dir: Path,
                                                  tmp_path: Path) -> None:
    version = qairt(archive)
    root = install(archive, cache_dir)
    script = tmp_path / "providers.py"
    script.write_text(PROVIDERS_SCRIPT)
    answer = call_providers([sys.executable, "-m", "qnnctl", "lower", "--sdk", version, "--",
                             sys.executable, str(script)])
    assert answer["providers"] == [PROVIDERS[version]]
    assert answer["path"] == str(root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so")


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_setup_sdk_stages_and_preloads_libcxx_in_a_fresh_process(archive: Path, llvm: str, cache_dir: Path,
                                                                 tmp_path: Path, server: FaultServer) -> None:
    if host_has_libcxx():
        pytest.skip("this host has libc++ already: nothing to stage")
    version = qairt(archive)
    install(archive, cache_dir)
    shutil.rmtree(cache_dir / "runtime")
    script = tmp_path / "providers.py"
    script.write_text(PROVIDERS_SCRIPT)
    # Nothing staged: setup_sdk() stages the trio, then loads it before the SDK's libraries.
    answer = call_providers([sys.executable, str(script), "setup", version])
    assert answer["providers"] == [PROVIDERS[version]]
    assert (cache_dir / "runtime" / "libcxx-14.0.0" / "lib" / "libc++.so.1").is_file()
    assert len(server.requests_for(LLVM_PATH)) == 2  # once by install, once by setup_sdk
    # Staged already: a fresh process whose loader never saw LD_LIBRARY_PATH still loads it.
    again = call_providers([sys.executable, str(script), "setup", version])
    assert again["providers"] == [PROVIDERS[version]]
    assert len(server.requests_for(LLVM_PATH)) == 2


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_doctor_names_what_fails_to_load_and_install_runtime_repairs_it(archive: Path, llvm: str,
                                                                      cache_dir: Path) -> None:
    if host_has_libcxx():
        pytest.skip("this host has libc++ already: nothing can go missing")
    version = qairt(archive)
    install(archive, cache_dir)
    shutil.rmtree(cache_dir / "runtime")
    broken = checks("--sdk", version)
    assert broken["load"]["status"] == "fail"
    assert "libQnnHtp.so needs libc++.so.1, which the loader cannot find" in broken["load"]["detail"]
    assert "libQnnSystem.so needs libc++.so.1" in broken["load"]["detail"]
    assert "qnnctl install --runtime" in (broken["load"]["hint"] or "")
    assert broken["libraries"]["status"] == "fail"
    assert "libc++.so.1 not found (needed by" in broken["libraries"]["detail"]

    repaired = run_qnnctl("install", "--runtime", version)
    assert repaired.returncode == 0, repaired.stderr
    fixed = checks("--sdk", version)
    assert fixed["load"]["status"] == "ok", fixed["load"]
    assert fixed["libraries"]["status"] == "ok", fixed["libraries"]


# -- ExecuTorch ------------------------------------------------------------------------------------


@pytest.mark.parametrize("archive", WHEELS, indirect=True)
def test_executorch_lowering_reaches_qnn_device_creation(archive: Path, llvm: str, cache_dir: Path,
                                                         tmp_path: Path) -> None:
    """ExecuTorch 1.5.1 (built for QAIRT 2.37) finds and loads the genuine libraries through
    `qnnctl lower`; on 2.47 and 2.51 it then fails to create the HTP device (error 14001), as it
    does in the field: the HTP device config struct changed layout."""
    python = os.environ.get(EXECUTORCH_PYTHON)
    require(python and Path(python).is_file(), f"a Python with ExecuTorch 1.5.1 (set {EXECUTORCH_PYTHON})")
    assert python is not None
    version = qairt(archive)
    root = install(archive, cache_dir)
    script = tmp_path / "lower_tiny.py"
    script.write_text(TINY_LOWERING)
    proc = subprocess.run([sys.executable, "-m", "qnnctl", "lower", "--sdk", version, "--python", python,
                           str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path)
    output = proc.stdout + proc.stderr
    assert f"Using QNN SDK at {root} (from QNN_SDK_ROOT)" in output
    assert "Creating new backend bundle" in output  # the QNN backend library loaded
    assert "Failed to create device_handle for Backend ID 6, error=14001" in output, output[-3000:]
    assert "LOWERED" not in output
    assert proc.returncode == 1


# -- identity: the build id in the libraries -------------------------------------------------------


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_an_archive_that_claims_another_version_is_refused(archive: Path, llvm: str, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    wheel = genuine.QAIRT_2_51
    liar = genuine.build_archive(wheel, tmp_path / "v2.37.0.250724.zip", top="qairt/2.37.0.250724",
                                 label="2.37.0.250724")
    proc = run_qnnctl("install", "--file", str(liar))
    assert proc.returncode == 4, proc.stderr
    assert ("says it is SDK 2.37.0.250724 (its top folder and its sdk.yaml), but its libraries are build "
            f"{wheel.build_id[1:]}: SDK {wheel.qairt}") in proc.stderr
    assert not (cache_dir / "sdks").exists() or not list((cache_dir / "sdks").iterdir())
    # Named for what its libraries are, it installs, and doctor sees the labels disagree.
    named = run_qnnctl("install", wheel.qairt, "--file", str(liar))
    assert named.returncode == 0, named.stderr
    found = checks("--sdk", wheel.qairt)
    assert found["sdk.version"]["status"] == "fail"
    assert (f"its libraries are build {wheel.build_id[1:]} (SDK {wheel.qairt}), but sdk.yaml says "
            "2.37.0.250724") in found["sdk.version"]["detail"]
    assert "the archive's name says 2.37.0.250724" in found["sdk.version"]["detail"]


@pytest.mark.parametrize("archive", WHEELS, indirect=True)
def test_the_build_id_names_an_archive_that_names_no_version(archive: Path, llvm: str, cache_dir: Path,
                                                              tmp_path: Path) -> None:
    wheel = next(w for w in genuine.WHEELS if w.qairt == qairt(archive))
    anonymous = genuine.build_archive(wheel, tmp_path / "sdk.zip", top="sdk", label="")
    proc = run_qnnctl("install", "--file", str(anonymous))
    assert proc.returncode == 0, proc.stderr
    root = cache_dir / "sdks" / wheel.qairt
    assert proc.stdout == f"{root}\n"
    manifest = json.loads((root / ".qnnctl.json").read_text())
    assert manifest["build_id"] == wheel.build_id[1:]
    (row,) = json.loads(run_qnnctl("list", "--json").stdout)["sdks"]
    assert (row["version"], row["build_id"]) == (wheel.qairt, wheel.build_id[1:])
    listed = run_qnnctl("list").stdout
    assert re.search(rf"\b{re.escape(wheel.qairt)} +{re.escape(wheel.build_id[1:])} ", listed), listed
    found = checks("--sdk", wheel.qairt)
    assert found["sdk.version"]["status"] == "ok", found["sdk.version"]
    assert found["sdk.version"]["detail"].startswith(f"{wheel.qairt}: its libraries are build {wheel.build_id[1:]}")


@pytest.mark.parametrize("archive", WHEELS, indirect=True)
def test_build_id_read_from_the_genuine_libraries_quickly(archive: Path, tmp_path: Path) -> None:
    from qnnctl.sdk.identity import build_id

    wheel = next(w for w in genuine.WHEELS if w.qairt == qairt(archive))
    root = genuine.build_sdk_tree(wheel, tmp_path / "sdk")
    assert build_id(root / "lib" / "x86_64-linux-clang" / "libQnnHtp.so") == wheel.build_id[1:]


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_after_installing_251_into_an_empty_cache_every_command_chooses_it(archive: Path, llvm: str,
                                                                          cache_dir: Path, mirror: FaultServer) -> None:
    version = qairt(archive)
    root = install(archive, cache_dir)
    exported = json.loads(run_qnnctl("env", "--shell", "json").stdout)
    assert exported["QNN_SDK_ROOT"] == str(root)
    found = checks()
    assert found["sdk.selection"]["detail"].startswith(f"installed: the newest SDK already installed; {version}")
    assert found["sdk.version"]["status"] == "ok"
    planned = run_qnnctl("lower", "--dry-run", "--", "true")
    assert planned.returncode == 0, planned.stderr
    assert f"export QNN_SDK_ROOT='{root}'" in planned.stdout
    # For real: the commands that would download when they chose the default.
    lowered = run_qnnctl("lower", "--", "sh", "-c", 'echo "ROOT=$QNN_SDK_ROOT"')
    assert lowered.returncode == 0, lowered.stderr
    assert lowered.stdout == f"ROOT={root}\n"
    installed = run_qnnctl("install")
    assert installed.returncode == 0, installed.stderr
    assert installed.stdout == f"{root}\n"
    assert run_qnnctl("which", "libc++.so.1").stdout.startswith(str(cache_dir / "runtime"))
    # The default, 2.37, is never fetched (the same server also serves the libc++ trio).
    assert [r.path for r in mirror.requests if r.path.endswith(".zip")] == []


# -- a real lowering: ONNX Runtime's QNN execution provider ---------------------------------------

# Compiles a tiny float model (Conv, Relu, MatMul; two inputs) into an HTP context binary for
# SM8650 with the SDK's own libQnnHtp.so, loads the result back, runs it (the library's x86_64
# emulation of the HTP) and compares it with ONNX Runtime's CPU provider. `load` only loads and
# runs an EPContext model made earlier. Prints one `@@` JSON line.
ORT_LOWERING = r"""
import json, os, sys
import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnx import TensorProto, helper, numpy_helper

mode, folder, *flags = sys.argv[1:]
if "verbose" in flags:
    ort.set_default_logger_severity(0)  # QNN's own log lines come through at this level only
rng = np.random.default_rng(7)
x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
m = (rng.standard_normal((8, 8)) * 0.3).astype(np.float32)
source = os.path.join(folder, "tiny.onnx")
context = os.path.join(folder, "tiny_ctx.onnx")
if mode == "compile":
    weight = (rng.standard_normal((4, 3, 3, 3)) * 0.3).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["r"]),
         helper.make_node("MatMul", ["r", "m"], ["y"])],
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8]),
         helper.make_tensor_value_info("m", TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(weight, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    onnx.save(model, source)

ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
options = {"backend_path": os.path.join(os.environ["QNN_SDK_ROOT"], "lib", "x86_64-linux-clang", "libQnnHtp.so"),
           "soc_model": "57"}
if "skip-version-check" in flags:
    options["skip_qnn_version_check"] = "1"

def session(path, compile_to=None):
    config = ort.SessionOptions()
    config.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if compile_to:
        config.add_session_config_entry("ep.context_enable", "1")
        config.add_session_config_entry("ep.context_file_path", compile_to)
        config.add_session_config_entry("ep.context_embed_mode", "1" if "embed" in flags else "0")
    config.add_provider_for_devices(devices, options)
    return ort.InferenceSession(path, sess_options=config)

if mode == "compile":
    session(source, context)
got = session(context).run(None, {"x": x, "m": m})[0]
want = ort.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, {"x": x, "m": m})[0]
mapped = sorted({line.split()[-1] for line in open("/proc/self/maps")
                 if "libQnn" in line or "libc++" in line})
print("@@" + json.dumps({"diff": float(np.abs(got - want).max()), "scale": float(np.abs(want).max()),
                         "mapped": mapped, "files": sorted(os.listdir(folder))}))
"""
# ONNX Runtime's CPU provider against the HTP emulation, float32 in and out: 3e-5 to 0.004 seen.
TOLERANCE = 0.02


def onnxruntime_python() -> str:
    """The stripped ONNX Runtime's Python (tests/genuine.py makes it); skips without one."""
    python = os.environ.get(genuine.ONNXRUNTIME_PYTHON)
    if not (python and Path(python).is_file()):
        message = (f"no Python with onnxruntime-qnn 2.7.0: set {genuine.ONNXRUNTIME_PYTHON} to one made by "
                   "`python -m tests.genuine onnxruntime .venv-onnxruntime`")
        if IN_CI:
            pytest.fail(message + "; .ci/run makes it")
        pytest.skip(message)
    assert python is not None
    # Stripped: no QAIRT library of the wheel's own can stand in for the SDK's.
    listing = subprocess.run([python, "-c", "import os, onnxruntime_qnn as q; d = os.path.dirname(q.__file__); "
                              "print(sorted(f for f in os.listdir(d) if '.so' in f)); "
                              "print(os.path.isdir(d + '.libs'))"],
                             capture_output=True, text=True, timeout=120)
    assert listing.stdout.split("\n")[:2] == [f"['{genuine.EP_PROVIDER_LIBRARY}']", "False"], (
        f"{python}'s onnxruntime-qnn still holds Qualcomm's libraries: tests.genuine.strip_execution_provider")
    return python


def ort_lower(python: str, version: str | None, mode: str, folder: Path,
              *flags: str) -> subprocess.CompletedProcess[str]:
    """The ORT pipeline run through the real `qnnctl lower` with SDK `version` (None: the SDK
    qnnctl selects in the folder above `folder`)."""
    folder.mkdir(exist_ok=True)
    script = folder.parent / "ort_lowering.py"
    script.write_text(ORT_LOWERING)
    sdk = ["--sdk", version] if version else []
    return subprocess.run([sys.executable, "-m", "qnnctl", "lower", *sdk, "--python", python,
                           str(script), mode, str(folder), *flags],
                          capture_output=True, text=True, timeout=600, cwd=folder.parent)


def answer(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("@@"))
    found: dict[str, Any] = json.loads(line[2:])
    return found


def inspected(path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    proc = run_qnnctl("inspect", "--json", str(path), *args)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def version_check_flags(wheel: genuine.Wheel) -> tuple[str, ...]:
    # onnxruntime-qnn 2.7.0 wants QNN API 2.40 (QAIRT 2.51); 2.47's is 2.36.
    return () if wheel is genuine.QAIRT_2_51 else ("skip-version-check",)


@pytest.mark.parametrize("archive", WHEELS, indirect=True)
def test_onnxruntime_lowers_with_the_sdk_qnnctl_installed(archive: Path, llvm: str, cache_dir: Path,
                                                          tmp_path: Path) -> None:
    python = onnxruntime_python()
    wheel = next(w for w in genuine.WHEELS if w.qairt == qairt(archive))
    root = install(archive, cache_dir)
    lib_dir = root / "lib" / "x86_64-linux-clang"
    out = tmp_path / "out"
    lowered = answer(ort_lower(python, wheel.qairt, "compile", out, *version_check_flags(wheel)))

    # Only the selected SDK's QAIRT (and the staged or host libc++) is in the process.
    qnn = [p for p in lowered["mapped"] if "libQnn" in p]
    assert qnn == [str(lib_dir / "libQnnHtp.so"), str(lib_dir / "libQnnSystem.so")]
    assert lowered["diff"] <= TOLERANCE, lowered
    assert lowered["scale"] > 0.5  # not a run of zeros
    binary = out / "tiny_ctx_qnn.bin"
    assert lowered["files"] == ["tiny.onnx", "tiny_ctx.onnx", "tiny_ctx_qnn.bin"]
    # Built by the SDK qnnctl chose: its build, for the SoC asked for.
    data = binary.read_bytes()
    assert wheel.build_id.encode() in data
    assert b"soc_type=SM8650;arch=75;" in data

    # inspect, through that SDK's libQnnSystem.so, on the binary and on the model that names it.
    for path in (binary, out / "tiny_ctx.onnx"):
        code, report = inspected(path, "--sdk", wheel.qairt)
        assert code == 0, report
        [found] = report["binaries"]
        assert found["origin"] == str(binary)
        assert found["size"] == len(data)
        assert found["read_with"] == str(lib_dir / "libQnnSystem.so")
        assert found["error"] is None
        assert (found["build"], found["qairt"]) == (wheel.build_id[1:], wheel.qairt)
        assert (found["backend"], found["htp_arch"], found["soc"], found["soc_model"]) == ("HTP", 75, "SM8650", 57)
        assert (found["core_api"], found["backend_api"]) == (PROVIDERS[wheel.qairt]["core"],
                                                             PROVIDERS[wheel.qairt]["backend"])
        assert found["build_disagrees"] is None
        [graph] = found["graphs"]
        assert graph["inputs"] == [{"name": "x", "dtype": "float32", "shape": [1, 3, 8, 8], "quantization": None},
                                   {"name": "m", "dtype": "float32", "shape": [8, 8], "quantization": None}]
        assert graph["outputs"] == [{"name": "y", "dtype": "float32", "shape": [1, 4, 8, 8], "quantization": None}]
        assert report["sdk"]["loads"] is True
        assert (report["sdk"]["core_api"], report["sdk"]["backend_api"]) == (found["core_api"], found["backend_api"])
    # Without an SDK installed nothing reads it, and nothing is said from its text.
    shutil.rmtree(cache_dir / "sdks")
    proc = run_qnnctl("inspect", "--json", str(binary))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "is not installed" in proc.stderr


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_onnxruntime_embeds_the_binary_in_the_model(archive: Path, llvm: str, cache_dir: Path,
                                                    tmp_path: Path) -> None:
    python = onnxruntime_python()
    install(archive, cache_dir)
    out = tmp_path / "out"
    lowered = answer(ort_lower(python, genuine.QAIRT_2_51.qairt, "compile", out, "embed"))
    assert lowered["files"] == ["tiny.onnx", "tiny_ctx.onnx"]
    assert lowered["diff"] <= TOLERANCE
    code, report = inspected(out / "tiny_ctx.onnx")
    assert code == 0
    [found] = report["binaries"]
    assert found["origin"].startswith(f"{out / 'tiny_ctx.onnx'} (embedded in the EPContext node '")
    assert found["build"] == genuine.QAIRT_2_51.build_id[1:]
    assert [t["name"] for t in found["graphs"][0]["inputs"]] == ["x", "m"]


def test_a_binary_loads_on_its_own_build_and_later_ones_only(llvm: str, cache_dir: Path, tmp_path: Path) -> None:
    """inspect's verdict is what the runtime does: a 2.51 binary fails on 2.47 (error 5000), a
    2.47 one runs on 2.51."""
    python = onnxruntime_python()
    for wheel in genuine.WHEELS:
        require(genuine.wheel_path(wheel), wheel.file_name)
        install(genuine.cached_archive(wheel), cache_dir)
    new, old = genuine.QAIRT_2_51, genuine.QAIRT_2_47
    skip = "skip-version-check"
    answer(ort_lower(python, new.qairt, "compile", tmp_path / "new"))
    # The older one by the project's pin: the build in the binary shows qnnctl's choice.
    assert run_qnnctl("use", old.qairt, cwd=tmp_path).returncode == 0
    answer(ort_lower(python, None, "compile", tmp_path / "old", skip))
    assert old.build_id.encode() in (tmp_path / "old" / "tiny_ctx_qnn.bin").read_bytes()
    assert new.build_id.encode() not in (tmp_path / "old" / "tiny_ctx_qnn.bin").read_bytes()

    refused = ort_lower(python, old.qairt, "load", tmp_path / "new", skip, "verbose")
    assert refused.returncode != 0
    assert "<E> Using newer context binary on old SDK" in refused.stderr
    assert "<E> Fail to get context blob with err 5000" in refused.stderr
    proc = run_qnnctl("inspect", str(tmp_path / "new" / "tiny_ctx.onnx"), "--sdk", old.qairt)
    assert proc.returncode == 1
    assert (f"SDK {old.qairt} (core API {PROVIDERS[old.qairt]['core']}, backend API {PROVIDERS[old.qairt]['backend']})"
            f" cannot load {tmp_path / 'new' / 'tiny_ctx_qnn.bin'}: its core and backend API") in proc.stderr
    assert "error 5000" in proc.stderr
    assert "\nloads: " not in proc.stdout

    loaded = answer(ort_lower(python, new.qairt, "load", tmp_path / "old"))
    assert loaded["diff"] <= TOLERANCE
    code, report = inspected(tmp_path / "old" / "tiny_ctx.onnx", "--sdk", new.qairt)
    assert code == 0
    assert report["sdk"]["loads"] is True


@pytest.mark.parametrize("archive", WHEELS[1:], indirect=True)
def test_the_ep_refuses_an_older_qnn_api_unless_told_to_skip_the_check(archive: Path, llvm: str, cache_dir: Path,
                                                                        tmp_path: Path) -> None:
    """The evidence for doctor's row: onnxruntime-qnn 2.7.0 wants QNN API 2.40; 2.47 has 2.36."""
    python = onnxruntime_python()
    install(archive, cache_dir)
    refused = ort_lower(python, genuine.QAIRT_2_47.qairt, "compile", tmp_path / "out")
    assert refused.returncode != 0
    assert "Unable to find a valid interface" in refused.stdout + refused.stderr
    assert not (tmp_path / "out" / "tiny_ctx.onnx").exists()
    # doctor says so beforehand, from the EP's own dist-info and the SDK's own libQnnHtp.so.
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    found = checks("--sdk", genuine.QAIRT_2_47.qairt, env={**os.environ, "PYTHONPATH": site})["onnxruntime"]
    assert found["status"] == "warn"
    assert found["detail"].startswith("onnxruntime-qnn 2.7.0 needs QNN core API 2.40 (QAIRT 2.51), the selected "
                                      "SDK's libQnnHtp.so offers core API 2.36.0")
    # The same, asked of the lowering's own Python rather than through PYTHONPATH.
    theirs = checks("--sdk", genuine.QAIRT_2_47.qairt, "--python", python)["onnxruntime"]
    assert (theirs["status"], theirs["detail"]) == (found["status"], found["detail"])


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_without_libcxx_the_lowering_fails_naming_it(archive: Path, llvm: str, server: FaultServer, cache_dir: Path,
                                                     tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if host_has_libcxx():
        pytest.skip("this host has libc++ already: nothing can go missing")
    python = onnxruntime_python()
    wheel = genuine.QAIRT_2_51
    root = install(archive, cache_dir)
    answer(ort_lower(python, wheel.qairt, "compile", tmp_path / "before"))
    shutil.rmtree(cache_dir / "runtime")
    # Nowhere to stage it from: apt-get fails (no_apt) and the LLVM archive is gone.
    monkeypatch.setenv("QNNCTL_LLVM_URL", server.url("/gone/llvm.tar.xz"))
    proc = ort_lower(python, wheel.qairt, "compile", tmp_path / "out")
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "qnnctl: warning: could not stage the host runtime" in output
    assert "libc++.so.1: cannot open shared object file" in output, output[-3000:]
    assert not (tmp_path / "out" / "tiny_ctx.onnx").exists()
    # inspect cannot use the SDK's libQnnSystem.so either: it says why, and gives no verdict.
    code, report = inspected(tmp_path / "before" / "tiny_ctx_qnn.bin", "--sdk", wheel.qairt)
    assert code == 1
    [found] = report["binaries"]
    assert (found["build"], found["core_api"]) == (None, None)
    assert found["error"].startswith("libQnnSystem.so needs libc++.so.1, which the loader cannot find"), found
    assert report["sdk"]["root"] == str(root)
    assert (report["sdk"]["loads"], report["ok"]) == (False, False)


# -- the install gate, on Qualcomm's own archive --------------------------------------------------


@pytest.mark.parametrize("archive", [pytest.param(genuine.QAIRT_2_51, id="qairt-2.51.0.260929")], indirect=True)
@pytest.mark.parametrize("attack", ["crc-kept", "two-readings", "range-ignored", "lock-without-parts"])
def test_the_walk_arounds_are_refused_on_the_genuine_archive(archive: Path, llvm: str, server: FaultServer,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             attack: str) -> None:
    """The genuine 2.51 archive (its libQnnHtp.so stored, as an archiver may store it), locked
    from a whole install, then each way around the lock an install of the host component under
    --locked was once open to: a trojan of the same size put in its place with its CRC-32 kept;
    a second directory hidden in the end record's comment; a server that ignores Range, so the
    whole archive is fetched; a lock that pins no component (schema 1). Each is refused, nothing
    is installed, and the trojan's constructor never runs."""
    from tests.sdk.test_gate import crc_kept, stored, trojan_library, two_readings

    version = qairt(archive)
    member = f"qairt/{version}/lib/x86_64-linux-clang/libQnnHtp.so"
    path = f"/{version}/v{version}.zip"
    data = stored(archive.read_bytes(), {member})
    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        size = zf.getinfo(member).file_size
    mark = tmp_path / "trojan-ran"
    trojan = trojan_library(tmp_path, mark).ljust(size, b"\0")
    server.add(path, data)
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    assert run_qnnctl("install", version).returncode == 0
    made = run_qnnctl("lock", version)
    assert made.returncode == 0, made.stderr
    monkeypatch.setenv("QNNCTL_CACHE_DIR", str(tmp_path / "victim"))
    served = two_readings(data, trojan, member) if attack == "two-readings" else crc_kept(data, member, trojan)
    server.add(path, served)
    said = {"crc-kept": ["the digest of its component host is"],
            "two-readings": ["more than one end of central directory record"],
            "range-ignored": [f"its sha256 is {hashlib.sha256(served).hexdigest()}, the lock pins"],
            "lock-without-parts": ["pins the whole archive's sha256 and no component's: downloading the whole archive",
                                   f"its sha256 is {hashlib.sha256(served).hexdigest()}, the lock pins"]}[attack]
    if attack == "range-ignored":
        server.ignore_ranges = True
    if attack == "lock-without-parts":
        lock = Path.cwd() / "qnnctl.lock"
        lines = [line for line in lock.read_text().splitlines() if not line.startswith("central_directory_sha256")]
        lines = lines[:lines.index("[sdk.component_sha256]")]
        lock.write_text("\n".join(lines).replace("schema = 2", "schema = 1") + "\n")
    refused = run_qnnctl("install", version, "--locked", "--components", "host")
    assert (refused.returncode, refused.stdout) == (4, ""), refused.stderr
    for words in said:
        assert words in refused.stderr
    assert not (tmp_path / "victim" / "sdks" / version).exists()
    assert run_qnnctl("doctor", "--sdk", version, "--offline").returncode != 0
    assert not mark.exists()


# -- inspect's verdicts against real loads ---------------------------------------------------------

# A QDQ model whose graph input and output are uint8 (scale 0.05, zero point 128; scale 0.1, zero
# point 3), compiled for SM8750 with a VTCM of 2 MB and the finalization optimization mode 3: what
# the library reports of each is known from what was asked.
QDQ_LOWERING = r"""
import json, os, sys
import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnx import TensorProto, helper, numpy_helper

folder = sys.argv[1]
os.makedirs(folder, exist_ok=True)
source, context = os.path.join(folder, "q.onnx"), os.path.join(folder, "q_ctx.onnx")
init = [numpy_helper.from_array(np.array(0.05, np.float32), "s_in"),
        numpy_helper.from_array(np.array(128, np.uint8), "z_in"),
        numpy_helper.from_array(np.array(0.1, np.float32), "s_out"),
        numpy_helper.from_array(np.array(3, np.uint8), "z_out")]
graph = helper.make_graph(
    [helper.make_node("DequantizeLinear", ["x", "s_in", "z_in"], ["xf"]), helper.make_node("Relu", ["xf"], ["r"]),
     helper.make_node("QuantizeLinear", ["r", "s_out", "z_out"], ["y"])],
    "qdq", [helper.make_tensor_value_info("x", TensorProto.UINT8, [1, 16])],
    [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, 16])], init)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 10
onnx.save(model, source)
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
options = {"backend_path": os.path.join(os.environ["QNN_SDK_ROOT"], "lib", "x86_64-linux-clang", "libQnnHtp.so"),
           "soc_model": "69", "vtcm_mb": "2", "htp_graph_finalization_optimization_mode": "3"}
config = ort.SessionOptions()
config.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
config.add_session_config_entry("ep.context_enable", "1")
config.add_session_config_entry("ep.context_file_path", context)
config.add_session_config_entry("ep.context_embed_mode", "0")
config.add_provider_for_devices(devices, options)
ort.InferenceSession(source, sess_options=config)
x = np.arange(16, dtype=np.uint8).reshape(1, 16) * 16
config = ort.SessionOptions()
config.add_provider_for_devices(devices, options)
got = ort.InferenceSession(context, sess_options=config).run(None, {"x": x})[0]
print("@@" + json.dumps({"y": got.tolist()}))
"""


def copy_lowering(source: Path, dest: Path, binary: bytes | None = None) -> Path:
    """The ONNX Runtime lowering in `source` (tiny.onnx, tiny_ctx.onnx, tiny_ctx_qnn.bin) copied to
    `dest`, its context binary replaced by `binary`; the binary's path."""
    dest.mkdir()
    for name in ("tiny.onnx", "tiny_ctx.onnx", "tiny_ctx_qnn.bin"):
        shutil.copyfile(source / name, dest / name)
    if binary is not None:
        (dest / "tiny_ctx_qnn.bin").write_bytes(binary)
    return dest / "tiny_ctx_qnn.bin"


def relabelled(data: bytes, old: str, new: str) -> bytes:
    assert len(old) == len(new)
    assert old.encode() in data
    return data.replace(old.encode(), new.encode())


@pytest.fixture
def both_sdks(llvm: str, cache_dir: Path) -> None:
    for wheel in genuine.WHEELS:
        require(genuine.wheel_path(wheel), wheel.file_name)
        install(genuine.cached_archive(wheel), cache_dir)


def test_inspect_says_loads_only_where_a_real_load_succeeds(both_sdks: None, tmp_path: Path) -> None:
    """Files that are not what they seem, each loaded by ONNX Runtime on the runtime inspect
    judges for, and each inspected: the library's reading decides, never the text in the file."""
    python = onnxruntime_python()
    new, old = genuine.QAIRT_2_51, genuine.QAIRT_2_47
    skip = "skip-version-check"
    answer(ort_lower(python, new.qairt, "compile", tmp_path / "new"))
    answer(ort_lower(python, old.qairt, "compile", tmp_path / "old", skip))
    data = (tmp_path / "new" / "tiny_ctx_qnn.bin").read_bytes()
    changed = bytearray(data)
    changed[3] ^= 0xFF  # the format's version byte
    sparse = copy_lowering(tmp_path / "new", tmp_path / "padded")
    with open(sparse, "r+b") as handle:
        handle.truncate(1 << 30)  # the genuine binary, then 1 GB of zeros (a sparse file)
    unreadable = {
        "half": copy_lowering(tmp_path / "new", tmp_path / "half", data[: len(data) // 2]),
        "1k": copy_lowering(tmp_path / "new", tmp_path / "1k", data[:1024]),
        "header": copy_lowering(tmp_path / "new", tmp_path / "header", bytes(changed)),
        "padded": sparse,
        "text": copy_lowering(tmp_path / "new", tmp_path / "text",
                              new.build_id.encode() + b"\0soc_type=SM8650;arch=75;min_arch=75;\0\0\0"),
    }
    for case, binary in unreadable.items():
        refused = ort_lower(python, new.qairt, "load", binary.parent)
        assert refused.returncode != 0, case
        assert "Failed to get context binary info" in refused.stdout + refused.stderr, (case, refused.stderr[-2000:])
        proc = run_qnnctl("inspect", "--json", str(binary), "--sdk", new.qairt)
        assert proc.returncode == 1, case
        report = json.loads(proc.stdout)
        assert (report["ok"], report["sdk"]["loads"]) == (False, False), case
        assert report["sdk"]["reason"].startswith(f"SDK {new.qairt}'s libQnnSystem.so could not read {binary}, "
                                                  "so no runtime loads it")
        [found] = report["binaries"]
        assert found["error"].endswith("QnnSystemContext_getBinaryInfo returned 30010 (a malformed context binary)")
        assert found["build"] is None  # nothing taken from the text in it
        assert f"{binary} cannot be read by the SDK's library" in proc.stderr
        human = run_qnnctl("inspect", str(binary.parent / "tiny_ctx.onnx"), "--sdk", new.qairt)
        assert human.returncode == 1
        assert "\nloads: " not in human.stdout
        assert human.stderr.count("30010") == 1  # said once, on stderr

    # A 2.51 binary whose build string says 2.46: its APIs are 2.51's, and 2.47 refuses it.
    low = copy_lowering(tmp_path / "new", tmp_path / "low",
                        relabelled(data, new.build_id, "v2.46.0.260424181845"))
    refused = ort_lower(python, old.qairt, "load", low.parent, skip, "verbose")
    assert refused.returncode != 0
    assert "Fail to get context blob with err 5000" in refused.stderr
    code, report = inspected(low, "--sdk", old.qairt)
    assert code == 1
    [found] = report["binaries"]
    assert (found["build"], found["backend_api"]) == ("2.46.0.260424181845", PROVIDERS[new.qairt]["backend"])
    assert found["build_disagrees"] == ("its build string names QAIRT 2.46, but its HTP backend API 5.51.0 is "
                                        "QAIRT 2.51's: the API versions decide")
    assert report["sdk"]["loads"] is False
    assert "build string 2.46.0.260424181845) is newer than this runtime's" in report["sdk"]["reason"]
    # Loaded on this host with 2.47's own x86_64 backend library: refused, as ONNX Runtime was.
    code, report = inspected(low, "--sdk", old.qairt, "--load")
    assert code == 1
    assert (report["sdk"]["loads"], report["sdk"]["checked"]) == (False, "loaded")
    assert report["sdk"]["reason"] == (
        f"SDK {old.qairt}: libQnnHtp.so refused {low} on this host: contextCreateFromBinary returned 5000 "
        "(`Using newer context binary on old SDK`), as the API versions predict")
    # A 2.47 binary whose build string says 2.52: its APIs are 2.47's, and 2.51 loads it.
    old_data = (tmp_path / "old" / "tiny_ctx_qnn.bin").read_bytes()
    high = copy_lowering(tmp_path / "old", tmp_path / "high",
                         relabelled(old_data, old.build_id, "v2.52.0.261030120000"))
    loaded = answer(ort_lower(python, new.qairt, "load", high.parent))
    assert loaded["diff"] <= TOLERANCE
    code, report = inspected(high, "--sdk", new.qairt)
    assert code == 0, report
    assert report["sdk"]["loads"] is True
    assert report["binaries"][0]["build_disagrees"].startswith("its build string names QAIRT 2.52, but its HTP")
    code, report = inspected(high, "--sdk", new.qairt, "--load")
    assert code == 0, report
    assert (report["sdk"]["loads"], report["sdk"]["checked"]) == (True, "loaded")
    assert report["sdk"]["reason"] == (f"SDK {new.qairt}: {high} loaded on this host (contextCreateFromBinary "
                                       "returned 0), as the API versions predict")

    # The external binary reached through a symbolic link inside the model's folder: ONNX Runtime
    # loads it, and so does inspect read it.
    linked = tmp_path / "linked"
    copy_lowering(tmp_path / "new", linked)
    (tmp_path / "elsewhere.bin").write_bytes(data)
    (linked / "tiny_ctx_qnn.bin").unlink()
    (linked / "tiny_ctx_qnn.bin").symlink_to(tmp_path / "elsewhere.bin")
    assert answer(ort_lower(python, new.qairt, "load", linked))["diff"] <= TOLERANCE
    code, report = inspected(linked / "tiny_ctx.onnx", "--sdk", new.qairt)
    assert code == 0, report
    assert report["binaries"][0]["origin"] == str(linked / "tiny_ctx_qnn.bin")


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_inspect_shows_the_graphs_htp_settings_and_the_quantization(archive: Path, llvm: str, cache_dir: Path,
                                                                     tmp_path: Path) -> None:
    """What the library reports is what the lowering asked for: SM8750 (soc_model 69, HTP V79),
    a VTCM of 2 MB, optimization mode 3, and the model's own scales and zero points (QNN's offset
    is the negated zero point)."""
    python = onnxruntime_python()
    install(archive, cache_dir)
    script = tmp_path / "qdq.py"
    script.write_text(QDQ_LOWERING)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "qnnctl", "lower", "--sdk", genuine.QAIRT_2_51.qairt, "--python",
                           python, str(script), str(out)], capture_output=True, text=True, timeout=600)
    ran = answer(proc)
    # The compiled graph computes what the model says: relu((x - 128) * 0.05) / 0.1 + 3, in uint8.
    x = [16 * i for i in range(16)]
    assert ran["y"] == [[min(255, round(max(0.0, (v - 128) * 0.05) / 0.1) + 3) for v in x]]
    code, report = inspected(out / "q_ctx.onnx")
    assert code == 0, report
    [found] = report["binaries"]
    assert (found["soc"], found["soc_model"], found["htp_arch"]) == ("SM8750", 69, 79)
    [graph] = found["graphs"]
    htp = graph["htp"]
    assert (htp["vtcm_size"], htp["optimization_level"]) == (2 << 20, 3)
    assert htp["spill_fill_size"] == 0
    assert htp["const_size"] > 0
    assert htp["io_tensor_size"] >= 32
    [x_in] = graph["inputs"]
    [y_out] = graph["outputs"]
    assert (x_in["dtype"], x_in["shape"], y_out["dtype"]) == ("ufixed8", [1, 16], "ufixed8")
    assert x_in["quantization"] == {"encoding": "scale_offset", "scale": pytest.approx(0.05), "offset": -128}
    assert y_out["quantization"] == {"encoding": "scale_offset", "scale": pytest.approx(0.1), "offset": -3}
    human = run_qnnctl("inspect", str(out / "q_ctx.onnx"))
    assert "  target      HTP, V79, SM8750, soc_model=69\n" in human.stdout
    assert "VTCM 2.0 MiB, spill-fill 0 B, O3, HVX threads 0\n" in human.stdout
    assert "    input    x ufixed8[1, 16] scale_offset scale=0.05 offset=-128\n" in human.stdout


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_the_device_checks_compare_the_binarys_architecture_and_api_with_the_phones(
        archive: Path, llvm: str, cache_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A binary compiled for SM8650 (HTP V75), as the 2.51 host library reads it, on stand-in
    phones of two architectures: it passes on the SM8650 and fails on the SM8750 (V79), naming
    both; on a phone whose own runtime is 2.47 it fails by its API versions (error 5000)."""
    from tests.phones import BUILD_2_47, add_device_side, fake_library, standin

    python = onnxruntime_python()
    root = install(archive, cache_dir)
    add_device_side(root)  # the device files of the same build (the tests' own stand-ins)
    wheel = genuine.QAIRT_2_51
    answer(ort_lower(python, wheel.qairt, "compile", tmp_path / "out"))
    model = tmp_path / "out" / "tiny_ctx.onnx"
    binary = tmp_path / "out" / "tiny_ctx_qnn.bin"
    phones = standin(tmp_path, monkeypatch)
    v75 = phones.add("V75PHONE", soc="SM8650")
    phones.add("V79PHONE", soc="SM8750")

    def model_check(serial: str) -> dict[str, Any]:
        proc = run_qnnctl("doctor", "--sdk", wheel.qairt, "--json", "--offline", "--device", serial, "--model",
                          str(model))
        checks = json.loads(proc.stdout)["checks"]
        assert checks[-1]["id"] == "device.model"
        assert proc.returncode == (1 if checks[-1]["status"] == "fail" else proc.returncode)
        found: dict[str, Any] = checks[-1]
        return found

    # The phone's own runtime is 2.47: the binary's APIs (2.51's) are newer.
    (v75 / "vendor" / "lib64" / "libQnnHtp.so").write_bytes(fake_library("libQnnHtp.so", BUILD_2_47))
    vendor = model_check("V75PHONE")
    assert vendor["status"] == "fail"
    assert vendor["detail"] == (
        f"{binary} needs the runtime of QAIRT 2.51 or newer (its API: core 2.40.0, backend 5.51.0; build string "
        f"{wheel.build_id[1:]}), and the device's own V75PHONE:/vendor/lib64/libQnnHtp.so is build "
        f"{BUILD_2_47[1:]}: it fails to load with error 5000 (`Using newer context binary on old SDK`)")
    dest = f"/data/local/tmp/qnnctl/{wheel.qairt}"
    for serial in ("V75PHONE", "V79PHONE"):
        pushed = run_qnnctl("device", "push", "--sdk", wheel.qairt, "--serial", serial)
        assert pushed.returncode == 0, pushed.stderr
    same = model_check("V75PHONE")
    assert (same["status"], same["detail"]) == (
        "ok", f"the runtime pushed to V75PHONE:{dest} (build {wheel.build_id[1:]}, SM8650, HTP V75) loads {binary} "
        "(HTP V75, API 2.40.0/5.51.0)")
    other = model_check("V79PHONE")
    assert other["status"] == "fail"
    assert other["detail"] == (f"{binary} was compiled for HTP V75 (SM8650), the device's SM8750 is HTP V79: it "
                               "does not load there; lower it again for SM8750")
    # device push says the same before it sends the model.
    plan = run_qnnctl("device", "push", "--sdk", wheel.qairt, "--soc", "SM8750", "--dry-run", "--json", str(model))
    assert plan.returncode == 0, plan.stderr
    assert other["detail"] in json.loads(plan.stdout)["warnings"]
    assert f"qnnctl: warning: {other['detail']}" in plan.stderr
    fits = run_qnnctl("device", "push", "--sdk", wheel.qairt, "--soc", "SM8650", "--dry-run", "--json", str(model))
    assert not [w for w in json.loads(fits.stdout)["warnings"] if str(binary) in w]


# Two models compiled into one context binary with shared weights (`ep.share_ep_contexts`,
# `enable_htp_weight_sharing`): two graphs in one binary. `load` loads the first model's EPContext
# model back and prints LOADED when it ran.
TWO_GRAPHS = r"""
import os, sys
import numpy as np
import onnx
import onnxruntime as ort
import onnxruntime_qnn
from onnx import TensorProto, helper, numpy_helper

mode, folder = sys.argv[1:]
ort.register_execution_provider_library("QNNExecutionProvider", onnxruntime_qnn.get_library_path())
devices = [d for d in ort.get_ep_devices() if d.ep_name == "QNNExecutionProvider"]
options = {"backend_path": os.path.join(os.environ["QNN_SDK_ROOT"], "lib", "x86_64-linux-clang", "libQnnHtp.so"),
           "soc_model": "57", "enable_htp_weight_sharing": "1"}
if mode == "compile":
    os.makedirs(folder, exist_ok=True)
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "w")
    for i, op in enumerate(("Relu", "Sigmoid")):
        graph = helper.make_graph(
            [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node(op, ["m"], ["y"])], f"g{i}",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8])],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])], [w])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 10
        onnx.save(model, os.path.join(folder, f"m{i}.onnx"))
    for i in range(2):
        config = ort.SessionOptions()
        config.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        config.add_session_config_entry("ep.context_enable", "1")
        config.add_session_config_entry("ep.context_embed_mode", "0")
        config.add_session_config_entry("ep.share_ep_contexts", "1")
        if i == 1:
            config.add_session_config_entry("ep.stop_share_ep_contexts", "1")
        config.add_provider_for_devices(devices, options)
        ort.InferenceSession(os.path.join(folder, f"m{i}.onnx"), sess_options=config)
    print("COMPILED", sorted(os.listdir(folder)))
else:
    config = ort.SessionOptions()
    config.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    config.add_provider_for_devices(devices, options)
    session = ort.InferenceSession(os.path.join(folder, "m0_ctx.onnx"), sess_options=config)
    print("LOADED", session.run(None, {"x": np.ones((1, 8), np.float32)})[0].tolist())
"""


@pytest.mark.parametrize("archive", WHEELS[:1], indirect=True)
def test_two_graphs_in_one_binary_and_a_load_this_host_cannot_do(archive: Path, llvm: str, cache_dir: Path,
                                                                   tmp_path: Path) -> None:
    """Both graphs are listed, each with its HTP settings; the binary's API versions say a 2.51
    runtime loads it, but on this host neither ONNX Runtime nor --load can (the x86_64 library has
    no shared weights buffer): --load does not say "loads"."""
    python = onnxruntime_python()
    install(archive, cache_dir)
    script = tmp_path / "two.py"
    script.write_text(TWO_GRAPHS)
    out = tmp_path / "out"

    def run(mode: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "qnnctl", "lower", "--sdk", genuine.QAIRT_2_51.qairt, "--python",
                               python, str(script), mode, str(out)], capture_output=True, text=True, timeout=600)

    compiled = run("compile")
    assert "COMPILED ['m0.onnx', 'm0_ctx.onnx', 'm0_qnn.bin', 'm1.onnx', 'm1_ctx.onnx']" in compiled.stdout, (
        compiled.stderr[-2000:])
    for model in ("m0_ctx.onnx", "m1_ctx.onnx"):
        code, report = inspected(out / model)
        assert code == 0, report
        [found] = report["binaries"]
        assert found["origin"] == str(out / "m0_qnn.bin")
        graphs = found["graphs"]
        assert len(graphs) == 2
        assert len({g["name"] for g in graphs}) == 2
        for graph in graphs:
            assert [t["shape"] for t in graph["inputs"] + graph["outputs"]] == [[1, 8], [1, 8]]
            assert graph["htp"]["vtcm_size"] > 0
    loaded = run("load")
    assert loaded.returncode != 0
    assert "LOADED" not in loaded.stdout
    code, report = inspected(out / "m0_ctx.onnx", "--load")
    assert code == 1
    assert (report["sdk"]["loads"], report["sdk"]["checked"]) == (False, "loaded")
    assert "though the API versions predict otherwise" in report["sdk"]["reason"]
