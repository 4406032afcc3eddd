"""What a lowered model needs: the QAIRT build that made its QNN context binary, and whether an
SDK can load it.

A context binary is what a QNN lowering produces (`qnn-context-binary-generator`, ONNX Runtime's
QNN execution provider, ExecuTorch's QNN delegate). It records the build of the QAIRT that
compiled it, and a runtime older than that build refuses it: `Using newer context binary on old
SDK`, `Fail to get context blob with err 5000`, the failure people meet on a phone whose runtime
is older than the SDK that lowered the model. An older binary loads.

Two ways to read one:
- with an installed SDK, its own `libQnnSystem.so` parses it (`QnnSystemContext_getBinaryInfo`,
  reached through the library's provider table) in a fresh process, as doctor's load check
  loads libraries: never in qnnctl's own process, whose loader has not seen the SDK's folders;
- without one, the bytes themselves: the build string (`v2.51.0.260929181845`) and the HTP
  compiler's target (`soc_type=SM8650;arch=75`) sit in the binary as text.

An ONNX model lowered by ONNX Runtime holds the binary in an `EPContext` node: inside the node
(`embed_mode=1`) or in a file beside the model that the node names (`ep_cache_context`). The
ONNX file is read with a protobuf reader of a few lines: qnnctl does not depend on `onnx`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qnnctl.errors import NotInstalledError, QnnctlError, UsageError
from qnnctl.run.environment import resolve_sdk
from qnnctl.run.envplan import environment_for
from qnnctl.run.probe import explain_load_error
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk, read_build_id
from qnnctl.sdk.select import BY_ENV
from qnnctl.shell.exports import apply

log = logging.getLogger("qnnctl.run.inspect")

INSPECT_TIMEOUT = 60.0
SCHEMA = 1
# QnnCommon.h's backend ids.
BACKENDS = {2: "CPU", 4: "GPU", 5: "DSP", 6: "HTP", 8: "HTA", 14: "LPAI"}
# QnnTypes.h's Qnn_DataType_t values, by name.
DATA_TYPES = {
    0x0008: "int8", 0x0016: "int16", 0x0032: "int32", 0x0064: "int64",
    0x0108: "uint8", 0x0116: "uint16", 0x0132: "uint32", 0x0164: "uint64",
    0x0216: "float16", 0x0232: "float32", 0x0264: "float64",
    0x0304: "sfixed4", 0x0308: "sfixed8", 0x0316: "sfixed16", 0x0332: "sfixed32",
    0x0404: "ufixed4", 0x0408: "ufixed8", 0x0416: "ufixed16", 0x0432: "ufixed32",
    0x0508: "bool8", 0x0608: "string",
}
# QNN's `soc_model` numbers (ONNX Runtime's QNN provider option, QnnSystemContext's socModel),
# by SoC. Source: onnxruntime-qnn 2.7.0's documented soc_model values, each compiled here with
# QAIRT 2.51's libQnnHtp.so (the binary then names the same SoC as `soc_type`); read 2026-12-04.
SOC_MODELS = {36: "SM8450", 43: "SM8550", 57: "SM8650", 60: "SC8380XP", 69: "SM8750"}

# The build string as the binary carries it, and the HTP compiler's target.
_BUILD = re.compile(rb"v(\d{1,3}\.\d{1,3}\.\d{1,3}\.\d{12})(?![0-9])")
_TARGET = re.compile(rb"soc_type=([A-Za-z0-9_]{1,32});arch=(\d{2,3});")
_MIN_ARCH = re.compile(rb";min_arch=(\d{2,3});")
# An ExecuTorch program: a flatbuffer whose identifier (bytes 4 to 8) is `ET` and two digits.
_PTE = re.compile(rb"ET\d\d")

# Runs as `python -I -c _READER report.json LIBQNNSYSTEM BINARY` in an environment where the
# SDK's libraries load (its folder and the staged libc++ on LD_LIBRARY_PATH). The standard
# library only. The structs are those of QnnSystemInterface.h, QnnSystemContext.h and
# QnnTypes.h on x86_64; only the first two functions of the provider's table are called
# (create, getBinaryInfo), which every system API version has in that order.
_READER = r"""
import ctypes, json, sys

class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class SystemApi(ctypes.Structure):
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p), ("version", Version),
                ("create", ctypes.c_void_p), ("get_binary_info", ctypes.c_void_p)]

HEAD = [("backend_id", ctypes.c_uint32), ("build_id", ctypes.c_char_p), ("core", Version),
        ("backend", Version), ("soc_version", ctypes.c_char_p)]

class InfoV1(ctypes.Structure):  # QnnSystemContext_BinaryInfoV1_t and V2 (which only adds at the end)
    _fields_ = HEAD + [("hw_blob_version", Version), ("blob_version", Version),
                       ("hw_blob_size", ctypes.c_uint32), ("hw_blob", ctypes.c_void_p),
                       ("blob_size", ctypes.c_uint64), ("num_tensors", ctypes.c_uint32),
                       ("tensors", ctypes.c_void_p), ("num_graphs", ctypes.c_uint32), ("graphs", ctypes.c_void_p)]

class InfoV3(ctypes.Structure):  # QnnSystemContext_BinaryInfoV3_t
    _fields_ = HEAD + [("blob_version", Version), ("blob_size", ctypes.c_uint64),
                       ("num_tensors", ctypes.c_uint32), ("tensors", ctypes.c_void_p),
                       ("num_graphs", ctypes.c_uint32), ("graphs", ctypes.c_void_p),
                       ("platform", ctypes.c_void_p), ("metadata_size", ctypes.c_uint32),
                       ("metadata", ctypes.c_void_p), ("soc_model", ctypes.c_uint32)]

class Graph(ctypes.Structure):  # QnnSystemContext_GraphInfoV1_t's fields, shared by V2 and V3
    _fields_ = [("name", ctypes.c_char_p), ("num_inputs", ctypes.c_uint32), ("inputs", ctypes.c_void_p),
                ("num_outputs", ctypes.c_uint32), ("outputs", ctypes.c_void_p)]

class Tensor(ctypes.Structure):  # Qnn_TensorV1_t's fields up to dimensions, shared by V2
    _fields_ = [("id", ctypes.c_uint32), ("name", ctypes.c_char_p), ("type", ctypes.c_uint32),
                ("format", ctypes.c_uint32), ("data_type", ctypes.c_uint32),
                ("quantize", ctypes.c_uint64 * 5), ("rank", ctypes.c_uint32),
                ("dimensions", ctypes.POINTER(ctypes.c_uint32))]

GRAPH_SIZE = 88  # sizeof(QnnSystemContext_GraphInfo_t): the version, then the V3 struct
TENSOR_SIZE = 144  # sizeof(Qnn_Tensor_t): the version, then the V2 struct
LIMIT = 4096

def text(p):
    return (p or b"").decode("utf-8", "replace")

def dotted(v):
    return "%d.%d.%d" % (v.major, v.minor, v.patch)

def tensors(base, count):
    found = []
    for i in range(min(count, LIMIT)):
        t = Tensor.from_address(base + i * TENSOR_SIZE + 8)
        shape = [t.dimensions[k] for k in range(min(t.rank, 16))] if t.dimensions else []
        found.append({"name": text(t.name), "data_type": t.data_type, "shape": shape})
    return found

def read():
    lib = ctypes.CDLL(sys.argv[2])
    get = lib.QnnSystemInterface_getProviders
    get.restype = ctypes.c_uint64
    found = ctypes.POINTER(ctypes.POINTER(SystemApi))()
    count = ctypes.c_uint32()
    status = get(ctypes.byref(found), ctypes.byref(count))
    if status or not count.value:
        return {"ok": False, "error": "QnnSystemInterface_getProviders returned %d with %d providers"
                % (status, count.value)}
    api = found[0].contents
    handle = ctypes.c_void_p()
    create = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p))(api.create)
    status = create(ctypes.byref(handle))
    if status:
        return {"ok": False, "error": "QnnSystemContext_create returned %d" % status}
    data = open(sys.argv[3], "rb").read()
    buffer = ctypes.create_string_buffer(data, len(data))
    info = ctypes.c_void_p()
    size = ctypes.c_uint64()
    get_info = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64))(api.get_binary_info)
    status = get_info(handle, buffer, len(data), ctypes.byref(info), ctypes.byref(size))
    if status or not info.value:
        return {"ok": False, "error": "QnnSystemContext_getBinaryInfo returned %d" % status}
    version = ctypes.c_uint32.from_address(info.value).value
    body = (InfoV3 if version >= 3 else InfoV1).from_address(info.value + 8)
    graphs = []
    for i in range(min(body.num_graphs, LIMIT)):
        g = Graph.from_address(body.graphs + i * GRAPH_SIZE + 8)
        graphs.append({"name": text(g.name), "inputs": tensors(g.inputs, g.num_inputs),
                       "outputs": tensors(g.outputs, g.num_outputs)})
    return {"ok": True, "system_api": dotted(api.version), "info_version": version,
            "backend_id": body.backend_id, "build_id": text(body.build_id), "core_api": dotted(body.core),
            "backend_api": dotted(body.backend), "soc_version": text(body.soc_version),
            "soc_model": getattr(body, "soc_model", 0), "graphs": graphs}

try:
    report = read()
except OSError as exc:
    report = {"ok": False, "error": str(exc)}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


class NotAModelError(QnnctlError):
    """The file holds no QNN context binary qnnctl can read."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path} {why}",
                         hint="give a QNN context binary (`.bin`) or an ONNX model with an EPContext node")


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: list[int]


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: list[Tensor]
    outputs: list[Tensor]


@dataclass
class Binary:
    """What one context binary says of itself."""

    origin: str  # where it was found: the file itself, an ONNX node, a file an ONNX node names
    size: int
    build: str | None  # `2.51.0.260929181845`
    backend: str | None
    htp_arch: int | None
    soc: str | None
    soc_model: int | None
    core_api: str | None = None
    backend_api: str | None = None
    read_with: str = "bytes"  # or the path of the libQnnSystem.so that read it
    graphs: list[Graph] = field(default_factory=list)
    note: str | None = None  # why the SDK's library did not read it, when it did not

    @property
    def qairt(self) -> str | None:
        """The SDK version that built it (`2.51.0.260929`)."""
        return self.build[: -6] if self.build else None


@dataclass
class Verdict:
    """Whether an SDK's runtime can load the binaries."""

    version: str
    root: str
    build: str | None
    loads: bool
    reason: str


@dataclass
class Report:
    file: str
    format: str  # "qnn-context-binary" or "onnx-epcontext"
    binaries: list[Binary]
    sdk: Verdict | None = None

    @property
    def ok(self) -> bool:
        return self.sdk is None or self.sdk.loads

    def as_dict(self) -> dict[str, Any]:
        binaries = [{**asdict(b), "qairt": b.qairt} for b in self.binaries]
        return {"schema": SCHEMA, "file": self.file, "format": self.format, "binaries": binaries,
                "sdk": asdict(self.sdk) if self.sdk else None, "ok": self.ok}


# -- reading the bytes ------------------------------------------------------------------------


def from_bytes(data: bytes, origin: str) -> Binary:
    """What a context binary carries as text: its build and the HTP compiler's target."""
    build = _BUILD.search(data)
    target = _TARGET.search(data)
    min_arch = _MIN_ARCH.search(data)
    arch = int(target.group(2)) if target else (int(min_arch.group(1)) if min_arch else None)
    return Binary(origin, len(data), build.group(1).decode() if build else None,
                  "HTP" if target or min_arch else None, arch,
                  target.group(1).decode() if target else None, None)


def read_with_sdk(data: bytes, system_lib: Path, environ: Mapping[str, str], origin: str,
                  timeout: float = INSPECT_TIMEOUT) -> Binary:
    """The binary as the SDK's own libQnnSystem.so reads it, in a fresh process; what the bytes
    say fills in the HTP target, which the library's answer does not carry."""
    carried = from_bytes(data, origin)
    with tempfile.TemporaryDirectory(prefix="qnnctl-inspect-") as folder:
        blob = os.path.join(folder, "context.bin")
        with open(blob, "wb") as out:
            out.write(data)
        report_path = os.path.join(folder, "report.json")
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", _READER, report_path, str(system_lib), blob],
                                  env=dict(environ), capture_output=True, text=True, errors="replace",
                                  timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            carried.note = f"{system_lib} did not answer within {timeout:.0f}s"
            return carried
        try:
            with open(report_path, encoding="utf-8") as handle:
                answer: dict[str, Any] = json.load(handle)
        except (OSError, ValueError):
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            how = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
                   else f"exited with {proc.returncode}")
            answer = {"ok": False, "error": f"the reading process {how} {tail}".rstrip()}
    if not answer.get("ok"):
        error = str(answer.get("error", ""))
        carried.note = (explain_load_error(system_lib.name, error) if "shared object" in error
                        or "not found" in error else f"{system_lib} could not read it: {error}")
        return carried
    soc_model = int(answer.get("soc_model") or 0) or None
    graphs = [Graph(str(g["name"]), _tensors(g["inputs"]), _tensors(g["outputs"])) for g in answer["graphs"]]
    backend_id = int(answer["backend_id"])
    return Binary(
        origin, len(data), str(answer["build_id"]).removeprefix("v") or carried.build,
        BACKENDS.get(backend_id, f"backend {backend_id}"), carried.htp_arch,
        carried.soc or SOC_MODELS.get(soc_model or -1) or (answer.get("soc_version") or None), soc_model,
        str(answer["core_api"]), str(answer["backend_api"]), str(system_lib), graphs,
    )


def _tensors(listed: list[dict[str, Any]]) -> list[Tensor]:
    return [Tensor(str(t["name"]), DATA_TYPES.get(int(t["data_type"]), hex(int(t["data_type"]))),
                   [int(d) for d in t["shape"]]) for t in listed]


# -- ONNX EPContext models --------------------------------------------------------------------


def _varint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint runs past the end")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, at


def _fields(data: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of one protobuf message: ints for varints, bytes for the rest."""
    at = 0
    while at < len(data):
        key, at = _varint(data, at)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, at = _varint(data, at)
            yield number, value
        elif wire == 2:
            length, at = _varint(data, at)
            if at + length > len(data):
                raise ValueError("a field runs past the end")
            yield number, data[at:at + length]
            at += length
        elif wire in (1, 5):
            at += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire} is not protobuf's")


def epcontext_nodes(data: bytes) -> list[dict[str, int | bytes]] | None:
    """The attributes of each EPContext node of an ONNX model; None when `data` is no ONNX model
    (ModelProto: ir_version is field 1, graph 7; GraphProto: node 1; NodeProto: op_type 4,
    attribute 5; AttributeProto: name 1, i 3, s 4)."""
    try:
        model = list(_fields(data))
        if not any(n == 1 and isinstance(v, int) for n, v in model):
            return None
        nodes = []
        for number, graph in model:
            if number != 7 or not isinstance(graph, bytes):
                continue
            for number, node in _fields(graph):
                if number != 1 or not isinstance(node, bytes):
                    continue
                parts = list(_fields(node))
                if (4, b"EPContext") not in parts:
                    continue
                attributes: dict[str, int | bytes] = {}
                for number, attribute in parts:
                    if number == 5 and isinstance(attribute, bytes):
                        named = dict(_fields(attribute))
                        name = named.get(1)
                        value = named.get(4, named.get(3))
                        if isinstance(name, bytes) and value is not None:
                            attributes[name.decode("utf-8", "replace")] = value
                nodes.append(attributes)
        return nodes
    except ValueError:
        return None


# -- one file -----------------------------------------------------------------------------------


def binaries_of(path: Path) -> tuple[str, list[tuple[str, bytes]]]:
    """The file's format and each context binary it holds or names, with where it was found."""
    data = path.read_bytes()
    if data[:4] == b"\x7fELF":
        raise NotAModelError(path, "is an ELF library, not a lowered model")
    if len(data) >= 8 and _PTE.fullmatch(data[4:8]):
        raise NotAModelError(path, "is an ExecuTorch program (.pte), which qnnctl inspect does not read yet")
    nodes = epcontext_nodes(data) if path.suffix == ".onnx" or data[:1] == b"\x08" else None
    if nodes is None:
        return "qnn-context-binary", [(str(path), data)]
    found: list[tuple[str, bytes]] = []
    for node in nodes:
        if node.get("main_context", 1) == 0:
            continue  # shares the binary of another node
        context = node.get("ep_cache_context")
        if not isinstance(context, bytes):
            continue
        if node.get("embed_mode", 1) == 1:
            found.append((f"{path} (embedded in an EPContext node)", context))
            continue
        beside = (path.parent / context.decode("utf-8", "replace")).resolve()
        if not beside.is_relative_to(path.parent.resolve()):
            raise NotAModelError(path, f"names a context binary outside its folder: {beside}")
        if not beside.is_file():
            raise NotAModelError(path, f"names the context binary {beside}, which does not exist")
        found.append((str(beside), beside.read_bytes()))
    if not found:
        raise NotAModelError(path, "is an ONNX model without an EPContext node holding a context binary")
    return "onnx-epcontext", found


def version_key(build: str) -> tuple[int, int, int]:
    parts = build.split(".")
    return int(parts[0]), int(parts[1]), int(parts[2])


def newer_than(build: str, runtime: str) -> bool:
    """Whether a binary of QAIRT `build` is newer than a runtime of `runtime` (builds or versions),
    so that the runtime refuses it (error 5000). The time of day and the date do not count."""
    return version_key(build) > version_key(runtime)


def carried_builds(path: Path) -> list[tuple[str, str]]:
    """(where, build) of each context binary `path` holds or names, as its bytes say; [] for a
    file that is no lowered model qnnctl reads (a library, a program, data)."""
    try:
        with open(path, "rb") as handle:
            if handle.read(4) == b"\x7fELF":
                return []
        _, found = binaries_of(path)
    except (OSError, NotAModelError):
        return []
    return [(origin, build) for origin, data in found if (build := from_bytes(data, origin).build)]


def newer_binary_warning(origin: str, build: str, runtime: str, where: str) -> str:
    """What to say before a binary newer than the runtime `where` (build `runtime`) is run."""
    return (f"{origin} was built by QAIRT {build}, newer than {where} (build {runtime}): it will fail to "
            f"load with error 5000 (`Using newer context binary on old SDK`); lower it with an SDK no newer "
            f"than {runtime}, or run it with a runtime of QAIRT {build[:-6]} or newer")


def verdict(binaries: list[Binary], version: str, root: Path, sdk_build: str | None) -> Verdict:
    """Whether SDK `version` (whose libraries are build `sdk_build`) loads every binary: one that
    a newer QAIRT built fails with error 5000; an older one loads."""
    runtime = sdk_build or version
    newer = [b for b in binaries if b.build and newer_than(b.build, runtime)]
    unknown = [b for b in binaries if not b.build]
    if newer:
        b = newer[0]
        reason = (f"SDK {version} (build {runtime}) cannot load {b.origin}: it was built by QAIRT {b.build}, "
                  "newer than this runtime (error 5000, `Using newer context binary on old SDK`)")
        return Verdict(version, str(root), sdk_build, False, reason)
    if unknown:
        return Verdict(version, str(root), sdk_build, False,
                       f"{unknown[0].origin} carries no QAIRT build, so whether SDK {version} loads it is unknown")
    builds = ", ".join(sorted({b.build for b in binaries if b.build}))
    return Verdict(version, str(root), sdk_build, True,
                   f"SDK {version} (build {runtime}) loads binaries of build {builds}: not newer than it")


def inspect(path: Path, sdk: Sdk | None, environ: Mapping[str, str] | None) -> Report:
    """Read the lowered model at `path`; with `sdk` (an installed `Sdk`) and the environment its
    libraries load in, through its libQnnSystem.so, and say whether it loads the binaries."""
    fmt, found = binaries_of(path)
    binaries = []
    for origin, data in found:
        system_lib = sdk.lib_dir / "libQnnSystem.so" if sdk is not None else None
        if system_lib is not None and environ is not None and system_lib.is_file():
            binary = read_with_sdk(data, system_lib, environ, origin)
        else:
            binary = from_bytes(data, origin)
        if binary.build is None and binary.read_with == "bytes" and binary.backend is None:
            raise NotAModelError(Path(origin), "holds no QNN context binary: no QAIRT build and no HTP target in it")
        binaries.append(binary)
    report = Report(str(path), fmt, binaries)
    if sdk is not None:
        report.sdk = verdict(binaries, sdk.version, sdk.root, read_build_id(sdk.root))
    return report


def shown(text: str) -> str:
    """Text read from a model (names, paths it gives), with control characters escaped for a terminal."""
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


def render(report: Report) -> str:
    """The report for people."""
    lines = [f"{shown(report.file)}: {report.format}"]
    for b in report.binaries:
        lines.append(f"context binary {shown(b.origin)} ({b.size} bytes)")
        lines.append(f"  built by    QAIRT {b.build or 'unknown'}")
        target = ", ".join(x for x in (
            b.backend, f"arch={b.htp_arch}" if b.htp_arch else None, f"soc={b.soc}" if b.soc else None,
            f"soc_model={b.soc_model}" if b.soc_model else None) if x)
        lines.append(f"  target      {target or 'unknown'}")
        if b.core_api:
            lines.append(f"  APIs        core {b.core_api}, backend {b.backend_api}")
        lines.append(f"  read with   {b.read_with}")
        if b.note:
            lines.append(f"  note        {shown(b.note)}")
        for g in b.graphs:
            lines.append(f"  graph {shown(g.name)}")
            for kind, tensors in (("input", g.inputs), ("output", g.outputs)):
                for t in tensors:
                    lines.append(f"    {kind:6} {shown(t.name)} {t.dtype}{list(t.shape)}")
    if report.sdk is not None:
        lines.append(f"{'loads' if report.sdk.loads else 'does not load'}: {shown(report.sdk.reason)}")
    return "\n".join(lines) + "\n"


def inspect_file(path: Path, spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache) -> Report:
    """`qnnctl inspect`: the SDK `spec` selects (never installing one) reads the file; when no
    spec is given and the SDK qnnctl would choose is not installed, the file's own bytes do."""
    if not path.is_file():
        # Not there, or a folder: how the file was named, a usage error (exit 2) either way.
        raise UsageError(f"{path} {'is a folder, not a file' if path.is_dir() else 'does not exist'}",
                         hint="give a QNN context binary (`.bin`) or an ONNX model with an EPContext node")
    try:
        selection, sdk = resolve_sdk(spec, environ, cwd, cache, allow_install=False)
    except NotInstalledError as exc:
        if spec is not None:
            raise
        log.info(
            "%s; reading what the binary carries itself (`qnnctl install` for the SDK's own reading)", exc.message)
        return inspect(path, None, None)
    if sdk is None:
        return inspect(path, None, None)
    child = apply(environ, environment_for(sdk, environ, cache, owns_root=selection.reason != BY_ENV))
    return inspect(path, sdk, child)
