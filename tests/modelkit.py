"""Lowered models made by the tests: context binaries that carry a build and an HTP target as
text (as genuine ones do; tests/test_genuine.py makes genuine ones), and ONNX models with
EPContext nodes, written with a protobuf encoder of the tests' own."""

from __future__ import annotations

from collections.abc import Mapping

BUILD_51 = "2.51.0.260929181845"
BUILD_47 = "2.47.0.260601114230"


def context_binary(build: str | None = BUILD_51, target: str = "soc_type=SM8650;arch=75;") -> bytes:
    """Bytes laid out like the start of an HTP context binary, with the text genuine ones carry."""
    head = bytes.fromhex("0000000200000003000000000000000100000000")
    built = f"v{build}\0".encode() if build else b""
    return head + b"\0" * 64 + built + b"\0" * 32 + f"OpO=2;min_arch=75;{target}num_nsps=1;".encode() + b"\0" * 64


# -- a protobuf encoder, enough for an ONNX model with EPContext nodes --------------------------


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _field(number: int, value: int | bytes | str) -> bytes:
    if isinstance(value, int):
        return _varint(number << 3) + _varint(value)
    data = value.encode() if isinstance(value, str) else value
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _attribute(name: str, value: int | bytes | str) -> bytes:
    # AttributeProto: name 1, i 3, s 4, type 20 (INT 2, STRING 3).
    if isinstance(value, int):
        return _field(1, name) + _field(3, value) + _field(20, 2)
    return _field(1, name) + _field(4, value) + _field(20, 3)


def epcontext_model(*nodes: Mapping[str, int | bytes | str], op_type: str = "EPContext", name: str = "ctx") -> bytes:
    """ModelProto (ir_version 1, opset_import 8, graph 7) whose graph holds one node per dict."""
    graph = b""
    for attributes in nodes:
        # NodeProto: input 1, output 2, name 3, op_type 4, attribute 5, domain 7.
        node = _field(1, "x") + _field(2, "y") + _field(3, name) + _field(4, op_type) + _field(7, "com.microsoft")
        for name, value in attributes.items():
            node += _field(5, _attribute(name, value))
        graph += _field(1, node)
    graph += _field(2, "main_graph")
    return _field(1, 10) + _field(8, _field(2, 17)) + _field(7, graph)
