"""qnnctl inspect on files the tests make: context binaries that carry a build and a target as
text (tests/modelkit.py; tests/test_genuine.py has genuine ones), ONNX EPContext models written
with a protobuf encoder of the test's own, and the SDK's verdict on them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import run_qnnctl
from tests.modelkit import BUILD_47, BUILD_51, context_binary, epcontext_model
from tests.sdkfactory import SdkSpec, build_sdk_tree


def inspect_json(*args: str) -> tuple[int, dict[str, Any], str]:
    proc = run_qnnctl("inspect", "--json", *args)
    return proc.returncode, json.loads(proc.stdout) if proc.stdout else {}, proc.stderr


# -- without an SDK: what the binary carries ------------------------------------------------------


def test_a_context_binary_names_its_build_and_target(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary())
    code, report, stderr = inspect_json(str(path))
    assert code == 0, stderr
    assert report["schema"] == 1
    assert report["format"] == "qnn-context-binary"
    assert report["ok"] is True
    assert report["sdk"] is None  # none installed: nothing to say about loading
    [binary] = report["binaries"]
    assert binary == {
        "origin": str(path), "size": path.stat().st_size, "build": BUILD_51, "qairt": "2.51.0.260929",
        "backend": "HTP", "htp_arch": 75, "soc": "SM8650", "soc_model": None, "core_api": None,
        "backend_api": None, "read_with": "bytes", "graphs": [], "note": None,
    }
    assert "is not installed; reading what the binary carries itself" in stderr
    human = run_qnnctl("inspect", str(path))
    assert human.returncode == 0
    assert f"built by    QAIRT {BUILD_51}\n" in human.stdout
    assert "target      HTP, arch=75, soc=SM8650\n" in human.stdout


def test_an_embedded_epcontext_binary_is_read_from_the_onnx_node(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "model_ctx.onnx"
    path.write_bytes(epcontext_model({"embed_mode": 1, "ep_cache_context": context_binary(BUILD_47),
                                      "source": "QNN", "main_context": 1}))
    code, report, stderr = inspect_json(str(path))
    assert code == 0, stderr
    assert report["format"] == "onnx-epcontext"
    [binary] = report["binaries"]
    assert binary["origin"] == f"{path} (embedded in an EPContext node)"
    assert binary["build"] == BUILD_47
    assert binary["size"] == len(context_binary(BUILD_47))


def test_an_epcontext_node_names_the_binary_beside_the_model(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "model_ctx_qnn.bin").write_bytes(context_binary())
    path = tmp_path / "model_ctx.onnx"
    # ONNX Runtime writes embed_mode=0 with the file name; a node that shares another's binary
    # (main_context=0) names it too, and is read once.
    path.write_bytes(epcontext_model({"embed_mode": 0, "ep_cache_context": "model_ctx_qnn.bin"},
                                     {"embed_mode": 0, "ep_cache_context": "model_ctx_qnn.bin", "main_context": 0}))
    code, report, stderr = inspect_json(str(path))
    assert code == 0, stderr
    [binary] = report["binaries"]
    assert binary["origin"] == str(tmp_path / "model_ctx_qnn.bin")
    assert binary["build"] == BUILD_51


def test_names_a_model_gives_are_shown_with_control_characters_escaped(tmp_path: Path, cache_dir: Path) -> None:
    (tmp_path / "a\x1b[2Jb.bin").write_bytes(context_binary())
    path = tmp_path / "model_ctx.onnx"
    path.write_bytes(epcontext_model({"embed_mode": 0, "ep_cache_context": "a\x1b[2Jb.bin"}))
    human = run_qnnctl("inspect", str(path))
    assert human.returncode == 0, human.stderr
    assert "\x1b" not in human.stdout
    assert f"context binary {tmp_path}/a\\x1b[2Jb.bin (" in human.stdout
    code, report, _ = inspect_json(str(path))
    assert code == 0
    assert report["binaries"][0]["origin"] == str(tmp_path / "a\x1b[2Jb.bin")  # JSON escapes it itself


@pytest.mark.parametrize(("model", "message"), [
    pytest.param({"embed_mode": 0, "ep_cache_context": "gone.bin"}, "names the context binary", id="missing"),
    pytest.param({"embed_mode": 0, "ep_cache_context": "../outside.bin"}, "outside its folder", id="outside"),
])
def test_a_binary_the_model_names_must_be_beside_it(tmp_path: Path, cache_dir: Path, model: dict[str, int | str],
                                                      message: str) -> None:
    (tmp_path / "outside.bin").write_bytes(context_binary())
    folder = tmp_path / "model"
    folder.mkdir()
    path = folder / "model_ctx.onnx"
    path.write_bytes(epcontext_model(model))
    proc = run_qnnctl("inspect", str(path))
    assert proc.returncode == 1
    assert message in proc.stderr
    assert proc.stdout == ""


def test_files_that_hold_no_context_binary_are_refused(tmp_path: Path, cache_dir: Path) -> None:
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(epcontext_model({"alpha": 1}, op_type="Relu"))
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"\x1c\x00\x00\x00ET12" + b"\0" * 64)
    text = tmp_path / "notes.bin"
    text.write_bytes(b"nothing to see here" * 10)
    expected = {
        plain: "ONNX model without an EPContext node",
        pte: "ExecuTorch program (.pte), which qnnctl inspect does not read yet",
        text: "holds no QNN context binary",
    }
    for path, message in expected.items():
        proc = run_qnnctl("inspect", str(path))
        assert proc.returncode == 1, path
        assert message in proc.stderr, proc.stderr
        assert "qnnctl: hint: give a QNN context binary" in proc.stderr
    # A file not there and a folder: both the way the file was named (exit 2), said alike.
    for named, said in (("absent.bin", "absent.bin does not exist"), (".", ". is a folder, not a file")):
        proc = run_qnnctl("inspect", named, cwd=tmp_path)
        assert (proc.returncode, proc.stdout) == (2, ""), proc.stderr
        assert proc.stderr == (f"qnnctl: error: {said}\nqnnctl: hint: give a QNN context binary (`.bin`) or an "
                               "ONNX model with an EPContext node\n")


# -- with an SDK: whether it loads ----------------------------------------------------------------


@pytest.fixture
def sdk_2_47(cache_dir: Path) -> Path:
    """An installed SDK whose libraries are build 2.47.0.260601114230 (compiled by the tests:
    their libQnnSystem.so cannot read a binary, so what the binary carries is used)."""
    version = "2.47.0.260601"
    root = cache_dir / "sdks" / version
    build_sdk_tree(root, SdkSpec(version=version, build_id=f"v{BUILD_47}"))
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": version, "files": {}}))
    return root


def test_a_binary_newer_than_the_sdk_does_not_load(tmp_path: Path, sdk_2_47: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary(BUILD_51))
    code, report, stderr = inspect_json(str(path), "--sdk", "2.47.0.260601")
    assert code == 1
    assert report["ok"] is False
    assert report["sdk"] == {
        "version": "2.47.0.260601", "root": str(sdk_2_47), "build": BUILD_47, "loads": False,
        "reason": (f"SDK 2.47.0.260601 (build {BUILD_47}) cannot load {path}: it was built by QAIRT {BUILD_51}, "
                   "newer than this runtime (error 5000, `Using newer context binary on old SDK`)"),
    }
    assert f"qnnctl: error: SDK 2.47.0.260601 (build {BUILD_47}) cannot load" in stderr
    assert "qnnctl: hint: run it with a runtime of QAIRT 2.51.0.260929 or newer" in stderr
    [binary] = report["binaries"]
    # The SDK's libQnnSystem.so was asked, and could not answer: the binary's own text is used.
    assert binary["read_with"] == "bytes"
    assert binary["build"] == BUILD_51
    assert binary["note"].startswith(f"{sdk_2_47}/lib/x86_64-linux-clang/libQnnSystem.so could not read it")


def test_a_reader_killed_by_a_signal_is_said_by_its_name(tmp_path: Path, sdk_2_47: Path) -> None:
    """The SDK's libQnnSystem.so crashing as it loads: SIGSEGV, not "exited with -11"."""
    source = tmp_path / "crash.c"
    source.write_text("#include <signal.h>\n__attribute__((constructor)) static void crash(void) { raise(SIGSEGV); }\n")
    system = sdk_2_47 / "lib" / "x86_64-linux-clang" / "libQnnSystem.so"
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(system), str(source)], check=True)
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary(BUILD_47))
    _, report, stderr = inspect_json(str(path), "--sdk", "2.47.0.260601")
    [binary] = report["binaries"]
    assert binary["note"] == f"{system} could not read it: the reading process was killed by SIGSEGV", stderr


def test_an_older_or_equal_binary_loads_and_the_selected_sdk_is_used(tmp_path: Path, sdk_2_47: Path) -> None:
    for build in (BUILD_47, "2.45.0.260326154327", "2.47.0.260601000000"):
        path = tmp_path / "model.bin"
        path.write_bytes(context_binary(build))
        # No --sdk: the SDK qnnctl selects (the newest installed) is asked.
        code, report, stderr = inspect_json(str(path))
        assert code == 0, stderr
        assert report["sdk"]["loads"] is True
        assert report["sdk"]["version"] == "2.47.0.260601"
    human = run_qnnctl("inspect", str(path))
    assert human.returncode == 0
    assert human.stdout.endswith(f"loads: SDK 2.47.0.260601 (build {BUILD_47}) loads binaries of build "
                                 "2.47.0.260601000000: not newer than it\n")


def test_a_binary_without_a_build_is_not_said_to_load(tmp_path: Path, sdk_2_47: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary(None))
    code, report, _ = inspect_json(str(path), "--sdk", "2.47.0.260601")
    assert code == 1
    assert "carries no QAIRT build, so whether SDK 2.47.0.260601 loads it is unknown" in report["sdk"]["reason"]


def test_an_sdk_named_but_not_installed_is_an_error(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary())
    proc = run_qnnctl("inspect", str(path), "--sdk", "2.47.0.260601")
    assert proc.returncode == 1
    assert "SDK 2.47.0.260601 is not installed" in proc.stderr
    assert proc.stdout == ""
