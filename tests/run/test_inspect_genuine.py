"""qnnctl inspect, doctor --device --model and device push on genuine context binaries: ONNX
Runtime's QNN execution provider compiles them with Qualcomm's own QAIRT libraries (2.51 and 2.47,
from onnxruntime-qnn wheels; tests/genuine.py), and each of inspect's verdicts is checked against a
real load by ONNX Runtime. Without the wheels or the lowering's Python these tests skip on a
workstation, saying how to get them, and fail in CI (tests/test_genuine.py's helpers).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests import genuine
from tests.conftest import run_qnnctl
from tests.test_genuine import (
    PROVIDERS,
    TOLERANCE,
    WHEELS,
    answer,
    inspected,
    install,
    onnxruntime_python,
    ort_lower,
    require,
)

# The fixtures of tests/test_genuine.py, by name.
from tests.test_genuine import archive as archive
from tests.test_genuine import llvm as llvm
from tests.test_genuine import no_apt as no_apt

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
