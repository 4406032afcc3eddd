"""The EPContext nodes of an ONNX model, read as ONNX Runtime reads them, from a memory map.

ONNX Runtime's QNN execution provider writes the context binary into the node
(`embed_mode=1`: the bytes of its `ep_cache_context` attribute) or beside the model
(`embed_mode=0`: `ep_cache_context` names a file, relative to the model's folder, that may not
lead out of it). A node with `main_context=0` shares another node's binary. ONNX Runtime refuses a
node whose `ep_cache_context` is empty.

The protobuf is walked by hand (qnnctl does not depend on `onnx`), on the mapped file, and each
bytes field is kept as a place in the file (offset, length): an embedded binary of gigabytes is
never copied. ModelProto: ir_version 1, graph 7. GraphProto: node 1. NodeProto: name 3,
op_type 4, attribute 5. AttributeProto: name 1, i 3, s 4.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

# Bounds on what a model may cost to read, whoever made it: the fields walked in all (a second
# or two here; ONNX Runtime's own EPContext models have dozens) and the EPContext nodes kept
# (ONNX Runtime writes one for each part of a graph the QNN execution provider takes; each binary
# is then read by the SDK's library in a process of its own).
MAX_FIELDS = 1 << 20
MAX_NODES = 256


@dataclass(frozen=True)
class Span:
    """A bytes field: where it sits in the file."""

    offset: int
    length: int


@dataclass(frozen=True)
class Node:
    """One EPContext node: its name, and its attributes (ints, or spans of the file)."""

    name: str
    attributes: dict[str, int | Span]


def _varint(data: mmap.mmap | bytes, at: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= end or shift > 63:
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


class TooManyNodes(Exception):
    """The model holds more EPContext nodes than MAX_NODES."""


class _Budget:
    """The fields left to walk in one model."""

    def __init__(self) -> None:
        self.left = MAX_FIELDS


def _fields(data: mmap.mmap | bytes, start: int, end: int, budget: _Budget) -> Iterator[tuple[int, int | Span]]:
    """(field number, value) of the message at data[start:end]: ints for varints, spans for bytes."""
    at = start
    while at < end:
        budget.left -= 1
        if budget.left < 0:
            raise ValueError("too many fields")
        key, at = _varint(data, at, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at, end)
            yield number, value
        elif wire == 2:
            length, at = _varint(data, at, end)
            if at + length > end:
                raise ValueError("a field runs past the end")
            yield number, Span(at, length)
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
            if at > end:
                raise ValueError("a field runs past the end")
        else:
            raise ValueError(f"wire type {wire} is not protobuf's")


def _text(data: mmap.mmap | bytes, span: Span, limit: int = 4096) -> str:
    return bytes(data[span.offset:span.offset + min(span.length, limit)]).decode("utf-8", "replace")


def epcontext_nodes(data: mmap.mmap | bytes) -> list[Node] | None:
    """Each EPContext node of the ONNX model in `data`; None when `data` is no ONNX model.
    TooManyNodes past MAX_NODES."""
    budget = _Budget()
    nodes: list[Node] = []
    ir_version = False
    try:
        # Walked as it is read, never listed whole: a file of small fields costs no memory.
        for number, value in _fields(data, 0, len(data), budget):
            if number == 1 and isinstance(value, int):
                ir_version = True
            elif number == 7 and isinstance(value, Span):
                nodes.extend(_graph_nodes(data, value, budget, MAX_NODES - len(nodes)))
    except ValueError:
        return None
    return nodes if ir_version else None


def _graph_nodes(data: mmap.mmap | bytes, graph: Span, budget: _Budget, room: int) -> Iterator[Node]:
    """The EPContext nodes of one GraphProto; TooManyNodes past `room` of them."""
    for number, node in _fields(data, graph.offset, graph.offset + graph.length, budget):
        if number != 1 or not isinstance(node, Span):
            continue
        parts = list(_fields(data, node.offset, node.offset + node.length, budget))
        op_types = [_text(data, v) for n, v in parts if n == 4 and isinstance(v, Span) and v.length < 64]
        if op_types != ["EPContext"]:
            continue
        room -= 1
        if room < 0:
            raise TooManyNodes
        name = next((_text(data, v) for n, v in parts if n == 3 and isinstance(v, Span)), "")
        attributes: dict[str, int | Span] = {}
        for number, attribute in parts:
            if number != 5 or not isinstance(attribute, Span):
                continue
            named = dict(_fields(data, attribute.offset, attribute.offset + attribute.length, budget))
            key = named.get(1)
            value = named.get(4, named.get(3))
            if isinstance(key, Span) and value is not None:
                attributes[_text(data, key)] = value
        yield Node(name, attributes)


def open_map(path: Path) -> mmap.mmap | None:
    """`path` memory-mapped for reading; None for an empty file."""
    with open(path, "rb") as handle:
        if os.fstat(handle.fileno()).st_size == 0:
            return None
        return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ)


def external_path(model: Path, name: str) -> Path | None:
    """The file an `embed_mode=0` node names, as ONNX Runtime finds it: relative to the model's
    folder, and not leading out of it by its own words (an absolute name or `..`); a symbolic
    link inside the folder is followed wherever it points. None when the name leads out."""
    relative = Path(name)
    if relative.is_absolute() or not name or ".." in relative.parts:
        return None
    return model.parent / os.path.normpath(relative)
