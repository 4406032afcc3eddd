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
    data = built.read_bytes()
    url = server.add(LLVM_PATH, data, "application/x-xz")
    monkeypatch.setenv("QNNCTL_LLVM_URL", url)
    # Not LLVM's own archive, so it is vouched for as a mirror of another one would be.
    monkeypatch.setenv("QNNCTL_LLVM_SHA256", hashlib.sha256(data).hexdigest())
    return url


def host_has_libcxx() -> bool:
    """True where the host has libc++ itself: then nothing is staged, and the staging tests
    cannot show anything (a skip on a workstation; in CI, where they must run, a failure)."""
    from qnnctl.host.needs import missing_host_libraries
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
            # The lock pins the archive's size too, and the attack is longer: refused from the probe.
            "two-readings": [f"is longer than {len(data)} bytes, the size {made.stdout.strip()} pins (it says "
                             f"the file is {len(served)} bytes)"],
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
