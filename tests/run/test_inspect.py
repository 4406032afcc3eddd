"""qnnctl inspect on files the tests make: ONNX EPContext models written with a protobuf encoder of
the test's own, read as ONNX Runtime reads them, and what inspect refuses before any SDK reads a
byte. tests/run/test_inspect_genuine.py has genuine binaries, read by the SDK's own library and checked
against real loads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_qnnctl
from tests.modelkit import context_binary, epcontext_model
from tests.sdkfactory import SdkSpec, build_sdk_tree

BUILD_47 = "2.47.0.260601114230"


@pytest.fixture
def sdk_2_47(cache_dir: Path) -> Path:
    """An installed SDK whose libraries are the tests' own (build 2.47.0.260601114230): its
    libQnnSystem.so lists a provider whose functions are not there, so the reading process dies."""
    version = "2.47.0.260601"
    root = cache_dir / "sdks" / version
    build_sdk_tree(root, SdkSpec(version=version, build_id=f"v{BUILD_47}"))
    (root / ".qnnctl.json").write_text(json.dumps({"schema": 1, "version": version, "files": {}}))
    return root


def test_what_the_library_cannot_read_gets_no_verdict_whatever_text_it_holds(tmp_path: Path,
                                                                              sdk_2_47: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary(BUILD_47))  # the build and target strings, as genuine ones carry
    proc = run_qnnctl("inspect", "--json", str(path), "--sdk", "2.47.0.260601")
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["schema"] == 2
    assert (report["ok"], report["sdk"]["loads"]) == (False, False)
    [binary] = report["binaries"]
    assert binary["error"] == (f"the process reading it with {sdk_2_47}/lib/x86_64-linux-clang/libQnnSystem.so "
                               "was killed by signal 11")
    assert (binary["build"], binary["htp_arch"], binary["soc"]) == (None, None, None)
    assert f"qnnctl: error: {path} cannot be read by the SDK's library" in proc.stderr


def test_without_an_installed_sdk_nothing_is_said_from_the_text(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary())
    proc = run_qnnctl("inspect", "--json", str(path))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert "is not installed" in proc.stderr


def test_an_empty_ep_cache_context_is_an_error_naming_the_node(tmp_path: Path, cache_dir: Path) -> None:
    for i, mode in enumerate((0, 1)):
        path = tmp_path / f"model{i}_ctx.onnx"
        path.write_bytes(epcontext_model({"embed_mode": mode, "ep_cache_context": ""}, name="QNN_ctx\x1b]0;T\x07"))
        proc = run_qnnctl("inspect", str(path))
        assert (proc.returncode, proc.stdout) == (1, "")
        assert (f"{path} has the EPContext node 'QNN_ctx\\x1b]0;T\\x07' with an empty ep_cache_context, which "
                "ONNX Runtime refuses") in proc.stderr
        assert "\x1b" not in proc.stderr


@pytest.mark.parametrize(("name", "message"), [
    pytest.param("gone.bin", "naming the context binary {folder}/gone.bin, which does not exist", id="missing"),
    pytest.param("../outside.bin", "naming '../outside.bin', which leads out of the model's folder", id="dotdot"),
    pytest.param("{tmp}/outside.bin", "naming '{tmp}/outside.bin', which leads out of the model's folder",
                 id="absolute"),
    pytest.param("sub", "naming {folder}/sub, which is a folder", id="folder"),
    pytest.param("a\x1b[2Jb.bin", "naming the context binary {folder}/a\\x1b[2Jb.bin, which does not exist",
                 id="escaped"),
])
def test_a_binary_the_model_names_is_found_as_onnx_runtime_finds_it(tmp_path: Path, cache_dir: Path, name: str,
                                                                    message: str) -> None:
    (tmp_path / "outside.bin").write_bytes(context_binary())
    folder = tmp_path / "model"
    (folder / "sub").mkdir(parents=True)
    path = folder / "model_ctx.onnx"
    path.write_bytes(epcontext_model({"embed_mode": 0, "ep_cache_context": name.format(tmp=tmp_path)}))
    proc = run_qnnctl("inspect", str(path))
    assert (proc.returncode, proc.stdout) == (1, "")
    assert message.format(folder=folder, tmp=tmp_path) in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr


def test_a_link_inside_the_folder_is_followed_and_read_by_the_library(tmp_path: Path, sdk_2_47: Path) -> None:
    (tmp_path / "elsewhere.bin").write_bytes(context_binary())
    folder = tmp_path / "model"
    folder.mkdir()
    os.symlink(tmp_path / "elsewhere.bin", folder / "model_ctx_qnn.bin")
    path = folder / "model_ctx.onnx"
    # A node that shares another's binary (main_context=0) is read once.
    path.write_bytes(epcontext_model({"embed_mode": 0, "ep_cache_context": "model_ctx_qnn.bin"},
                                     {"embed_mode": 0, "ep_cache_context": "model_ctx_qnn.bin", "main_context": 0}))
    proc = run_qnnctl("inspect", "--json", str(path), "--sdk", "2.47.0.260601")
    [binary] = json.loads(proc.stdout)["binaries"]
    # Found and handed to the library (which, being the tests' own, cannot read it).
    assert proc.returncode == 1
    assert binary["origin"] == str(folder / "model_ctx_qnn.bin")
    assert binary["size"] == len(context_binary())
    assert "libQnnSystem.so was killed by signal 11" in binary["error"]


def test_files_that_hold_no_context_binary_are_refused(tmp_path: Path, cache_dir: Path) -> None:
    plain = tmp_path / "plain.onnx"
    plain.write_bytes(epcontext_model({"alpha": 1}, op_type="Relu"))
    pte = tmp_path / "model.pte"
    pte.write_bytes(b"\x1c\x00\x00\x00ET12" + b"\0" * 64)
    empty = tmp_path / "empty.bin"
    empty.write_bytes(b"")
    expected = {
        plain: "ONNX model without an EPContext node",
        pte: "ExecuTorch program (.pte), which qnnctl inspect does not read yet",
        empty: "is empty",
        tmp_path / "absent.bin": "is not a file",
        tmp_path: "is a folder: give the lowered model inside it",
    }
    for path, message in expected.items():
        proc = run_qnnctl("inspect", str(path))
        assert proc.returncode == 1, path
        assert message in proc.stderr, proc.stderr
        assert "qnnctl: hint: give a QNN context binary" in proc.stderr


def test_an_sdk_named_but_not_installed_is_an_error(tmp_path: Path, cache_dir: Path) -> None:
    path = tmp_path / "model.bin"
    path.write_bytes(context_binary())
    proc = run_qnnctl("inspect", str(path), "--sdk", "2.47.0.260601")
    assert proc.returncode == 1
    assert "SDK 2.47.0.260601 is not installed" in proc.stderr
    assert proc.stdout == ""


def test_names_the_library_reports_are_escaped_in_the_text_view() -> None:
    """Graph and tensor names come from the model through the library: shown escaped."""
    from qnnctl.run.inspect import Binary, Graph, Report, Tensor, render

    evil = "a\x1b]0;T\x07b"
    binary = Binary(f"/m/{evil}.bin", 10, "/sdk/libQnnSystem.so", build="2.51.0.260929181845", backend="HTP",
                    backend_id=6, core_api="2.40.0", backend_api="5.51.0",
                    graphs=[Graph(evil, [Tensor(evil, "float32", [1])], [Tensor("y", "float32", [1])])])
    text = render(Report(f"/m/{evil}.onnx", "onnx-epcontext", [binary]))
    assert "\x1b" not in text
    assert "\x07" not in text
    assert "  graph a\\x1b]0;T\\x07b\n" in text
    assert "    input    a\\x1b]0;T\\x07b float32[1]\n" in text
    assert text.startswith("/m/a\\x1b]0;T\\x07b.onnx: onnx-epcontext\n")


# -- what a model may cost to read -------------------------------------------------------------


def test_a_file_of_countless_small_fields_is_walked_without_keeping_them() -> None:
    """A model is walked as it is read, within MAX_FIELDS fields: two million fields of two bytes
    each (a file of 4 MB, a second of walking) cost no memory, and past the bound the file is no
    ONNX model that inspect reads as one."""
    import tracemalloc

    from qnnctl.run.epcontext import MAX_FIELDS, epcontext_nodes

    data = b"\x08\x01" * (2 * MAX_FIELDS)
    tracemalloc.start()
    try:
        assert epcontext_nodes(data) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20, peak
    # Within the bound, the same fields before a graph are walked through to its node.
    model = b"\x08\x01" * (MAX_FIELDS // 2) + epcontext_model({"embed_mode": 1, "ep_cache_context": b"ctx"})
    [node] = epcontext_nodes(model) or []
    assert node.attributes["embed_mode"] == 1


def test_more_epcontext_nodes_than_inspect_reads_are_refused_before_any_is_read(tmp_path: Path,
                                                                               sdk_2_47: Path) -> None:
    """Each binary is read by the SDK's library in a process of its own: a model of countless
    EPContext nodes (a few bytes each) would start as many. Past MAX_NODES it is refused, and
    nothing is read."""
    from qnnctl.run.epcontext import MAX_NODES, TooManyNodes, epcontext_nodes

    node: dict[str, int | bytes | str] = {"embed_mode": 1, "ep_cache_context": b"\x01"}
    assert len(epcontext_nodes(epcontext_model(*[node] * MAX_NODES)) or []) == MAX_NODES
    with pytest.raises(TooManyNodes):
        epcontext_nodes(epcontext_model(*[node] * (MAX_NODES + 1)))
    path = tmp_path / "model_ctx.onnx"
    path.write_bytes(epcontext_model(*[node] * (MAX_NODES + 1)))
    proc = run_qnnctl("inspect", "--json", str(path), "--sdk", "2.47.0.260601")
    assert (proc.returncode, proc.stdout) == (1, "")
    assert f"{path} has more than {MAX_NODES} EPContext nodes, which qnnctl inspect does not read" in proc.stderr
    assert "libQnnSystem.so" not in proc.stderr  # no process read any of them


def test_nodes_that_name_one_file_have_it_read_once(tmp_path: Path, sdk_2_47: Path) -> None:
    (tmp_path / "model_ctx_qnn.bin").write_bytes(context_binary(BUILD_47))
    path = tmp_path / "model_ctx.onnx"
    node: dict[str, int | bytes | str] = {"embed_mode": 0, "ep_cache_context": "model_ctx_qnn.bin"}
    path.write_bytes(epcontext_model(node, node, node))
    proc = run_qnnctl("inspect", "--json", str(path), "--sdk", "2.47.0.260601")
    assert proc.returncode == 1
    [binary] = json.loads(proc.stdout)["binaries"]
    assert binary["origin"] == str(tmp_path / "model_ctx_qnn.bin")
