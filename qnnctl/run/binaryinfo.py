"""A context binary as the SDK's own libQnnSystem.so reads it (`QnnSystemContext_getBinaryInfo`),
in a fresh process that hands the library the file memory-mapped: no copy, whatever its size.

The child runs the standard library only and writes its answer to a file of its own (the
libraries print to stdout while they load). It reads the structs of QnnSystemContext.h
(`QnnSystemContext_BinaryInfo_t` V1 to V3, `QnnSystemContext_GraphInfo_t` V1 to V3),
QnnTypes.h (`Qnn_Tensor_t`, `Qnn_QuantizeParams_t`) and, for HTP binaries, the blobs
QnnHtpSystemContext.h describes (the context's DSP architecture, each graph's VTCM, spill-fill,
optimization level, HVX threads and memory sizes), at their x86_64 offsets. The offsets of the
HTP blobs were checked against what QAIRT 2.47's and 2.51's libraries return for binaries ONNX
Runtime compiled (tests/run/test_inspect_genuine.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

READ_TIMEOUT = 120.0

# Runs as `python -I -c _READER report.json LIBQNNSYSTEM FILE OFFSET LENGTH`: the binary is
# LENGTH bytes of FILE from OFFSET (a whole `.bin`, or the bytes of an ONNX node's attribute).
_READER = r"""
import ctypes, json, mmap, os, struct, sys

LIMIT = 4096  # graphs, tensors and per-channel encodings listed at most
HTP = 6
ENCODINGS = {0: "scale_offset", 1: "axis_scale_offset", 2: "bw_scale_offset", 3: "bw_axis_scale_offset",
             4: "block", 5: "blockwise_expansion", 6: "vector", 7: "float_block"}

class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class SystemApi(ctypes.Structure):  # QnnSystemInterface_t, up to the first two functions
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p), ("version", Version),
                ("create", ctypes.c_void_p), ("get_binary_info", ctypes.c_void_p)]

def u32(at): return ctypes.c_uint32.from_address(at).value
def i32(at): return ctypes.c_int32.from_address(at).value
def u64(at): return ctypes.c_uint64.from_address(at).value
def f32(at): return ctypes.c_float.from_address(at).value
def ptr(at): return ctypes.c_void_p.from_address(at).value or 0
def text(at):
    p = ptr(at)
    return ctypes.string_at(p).decode("utf-8", "replace") if p else ""
def version(at): return "%d.%d.%d" % (u32(at), u32(at + 4), u32(at + 8))

def quantization(q):
    # Qnn_QuantizeParams_t: encodingDefinition, quantizationEncoding, then the union at +8.
    if u32(q) != 1:  # QNN_DEFINITION_DEFINED
        return None
    kind = u32(q + 4)
    found = {"encoding": ENCODINGS.get(kind, "encoding %d" % kind)}
    u = q + 8
    if kind == 0:
        found.update(scale=f32(u), offset=i32(u + 4))
    elif kind == 1:
        count, pairs = u32(u + 4), ptr(u + 8)
        listed = range(min(count, LIMIT) if pairs else 0)
        found.update(axis=i32(u), count=count, scales=[f32(pairs + 8 * i) for i in listed],
                     offsets=[i32(pairs + 8 * i + 4) for i in listed])
    elif kind == 2:
        found.update(bitwidth=u32(u), scale=f32(u + 4), offset=i32(u + 8))
    elif kind == 3:
        count, scales, offsets = u32(u + 8), ptr(u + 16), ptr(u + 24)
        found.update(bitwidth=u32(u), axis=i32(u + 4), count=count,
                     scales=[f32(scales + 4 * i) for i in range(min(count, LIMIT))] if scales else [],
                     offsets=[i32(offsets + 4 * i) for i in range(min(count, LIMIT))] if offsets else [])
    return found

TENSOR_SIZE = 144  # sizeof(Qnn_Tensor_t): its version, then the V1/V2 union
def tensors(base, count):
    found = []
    for i in range(min(count, LIMIT) if base else 0):
        t = base + i * TENSOR_SIZE + 8  # Qnn_TensorV1_t's fields, shared by V2
        rank, dims = u32(t + 72), ptr(t + 80)
        found.append({"name": text(t + 8), "data_type": u32(t + 24),
                      "shape": [u32(dims + 4 * k) for k in range(min(rank, 16))] if dims else [],
                      "quantization": quantization(t + 32)})
    return found

def htp_graph_blob(blob, size):
    # QnnHtpSystemContext_GraphBlobInfo_t: version, then V1 at +8; a V2 (its own version first) may follow at +40.
    if not blob or size < 40 or u32(blob) != 1:
        return None
    found = {"spill_fill_size": u64(blob + 8), "vtcm_size": u32(blob + 16), "optimization_level": u32(blob + 20),
             "dlbc": ctypes.c_uint8.from_address(blob + 24).value, "hvx_threads": u64(blob + 32)}
    if size >= 112 and u32(blob + 40) == 2:
        found.update(native_k_channel_size=u64(blob + 48), native_v_channel_size=u64(blob + 56),
                     safe_share_io=bool(u32(blob + 64)), io_tensor_size=u64(blob + 72), op_data_size=u64(blob + 80),
                     const_size=u64(blob + 88), ddr_tensor_size=u64(blob + 96), shared_weights_size=u64(blob + 104))
    return found

GRAPH_SIZE = 88  # sizeof(QnnSystemContext_GraphInfo_t): the version, then the V3 struct
def graphs(base, count, backend):
    found = []
    for i in range(min(count, LIMIT) if base else 0):
        at = base + i * GRAPH_SIZE
        kind, g = u32(at), at + 8
        graph = {"info_version": kind, "name": text(g), "inputs": tensors(ptr(g + 16), u32(g + 8)),
                 "outputs": tensors(ptr(g + 32), u32(g + 24)), "htp": None}
        if kind >= 2:
            graph["updateable_tensors"] = u32(g + 40)
        if kind >= 3 and backend == HTP:
            graph["htp"] = htp_graph_blob(ptr(g + 64), u32(g + 56))
        found.append(graph)
    return found

def info(at):
    kind, b = u32(at), at + 8
    found = {"info_version": kind, "backend_id": u32(b), "build_id": text(b + 8), "core_api": version(b + 16),
             "backend_api": version(b + 28), "soc_version": text(b + 40), "soc_model": None, "dsp_arch": None,
             "hw_info_blob_version": None, "spill_fill_size": None}
    if kind >= 3:  # QnnSystemContext_BinaryInfoV3_t
        found.update(blob_version=version(b + 48), blob_size=u64(b + 64), context_tensors=u32(b + 72),
                     soc_model=u32(b + 128) or None, metadata_size=u32(b + 112))
        meta, size = ptr(b + 120), u32(b + 112)
        if found["backend_id"] == HTP and meta and size >= 8 and u32(meta) == 1:
            found["dsp_arch"] = u32(meta + 4)  # QnnHtpSystemContext_ContextBlobInfoV1_t
        found["graphs"] = graphs(ptr(b + 96), u32(b + 88), found["backend_id"])
    else:  # V1 and V2 (which only adds platformInfo at the end)
        found.update(hw_info_blob_version=version(b + 48), blob_version=version(b + 60), blob_size=u64(b + 88),
                     context_tensors=u32(b + 96))
        hw, size = ptr(b + 80), u32(b + 72)
        if found["backend_id"] == HTP and hw and size >= 24 and u32(hw) == 1:
            found["spill_fill_size"] = u64(hw + 16)  # QnnHtpSystemContext_HwBlobInfoV1_t
        found["graphs"] = graphs(ptr(b + 120), u32(b + 112), found["backend_id"])
    return found

def read(library, path, offset, length):
    lib = ctypes.CDLL(library)
    get = lib.QnnSystemInterface_getProviders
    get.restype = ctypes.c_uint64
    found = ctypes.POINTER(ctypes.POINTER(SystemApi))()
    count = ctypes.c_uint32()
    status = get(ctypes.byref(found), ctypes.byref(count))
    if status or not count.value:
        return {"ok": False,
                "error": "QnnSystemInterface_getProviders returned %d with %d providers" % (status, count.value)}
    api = found[0].contents
    handle = ctypes.c_void_p()
    status = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.POINTER(ctypes.c_void_p))(api.create)(ctypes.byref(handle))
    if status:
        return {"ok": False, "error": "QnnSystemContext_create returned %d" % status}
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    if length <= 0 or offset + length > size:
        return {"ok": False, "error": "the binary is %d bytes at %d of a file of %d bytes" % (length, offset, size)}
    # A private mapping: pages are read from the file as the library touches them, never copied whole.
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    window = (ctypes.c_char * size).from_buffer(mapped)
    os.close(fd)
    answer, answer_size = ctypes.c_void_p(), ctypes.c_uint64()
    get_info = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint64,
                                ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_uint64))(api.get_binary_info)
    start = ctypes.addressof(window) + offset
    status = get_info(handle, start, length, ctypes.byref(answer), ctypes.byref(answer_size))
    if status or not answer.value:
        return {"ok": False, "status": status, "error": "QnnSystemContext_getBinaryInfo returned %d" % status}
    report = info(answer.value)
    report.update(ok=True, system_api=version(ctypes.addressof(api.version)))
    return report

try:
    report = read(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
except OSError as exc:
    report = {"ok": False, "error": str(exc)}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


# Runs as `python -I -c _LOADER report.json BACKEND_LIBRARY FILE OFFSET LENGTH`: the backend
# library (opened by bare name, as a runtime opens it) creates a backend and a context from the
# mapped binary, as ONNX Runtime's QNN provider does, then frees both. The functions are those of
# QnnInterface.h's table, in its order (propertyHasCapability, backendCreate, ..., backendFree at
# 8, contextCreateFromBinary at 13, contextFree at 14), after the provider's backend id, name and
# two API versions.
_LOADER = r"""
import ctypes, json, mmap, os, sys

class Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class Interface(ctypes.Structure):
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p), ("core", Version),
                ("backend", Version), ("functions", ctypes.c_void_p * 15)]

P = ctypes.c_void_p
def call(address, *types):
    return ctypes.CFUNCTYPE(ctypes.c_uint64, *types)(address)

def load(library, path, offset, length):
    lib = ctypes.CDLL(library)
    get = lib.QnnInterface_getProviders
    get.restype = ctypes.c_uint64
    found = ctypes.POINTER(ctypes.POINTER(Interface))()
    count = ctypes.c_uint32()
    status = get(ctypes.byref(found), ctypes.byref(count))
    if status or not count.value:
        return {"ok": False, "error": "QnnInterface_getProviders returned %d with %d providers" % (status, count.value)}
    fns = found[0].contents.functions
    backend = P()
    status = call(fns[1], P, P, ctypes.POINTER(P))(None, None, ctypes.byref(backend))
    if status:
        return {"ok": False, "error": "QnnBackend_create returned %d" % status}
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    window = (ctypes.c_char * size).from_buffer(mapped)
    os.close(fd)
    context = P()
    status = call(fns[13], P, P, P, P, ctypes.c_uint64, ctypes.POINTER(P), P)(
        backend, None, None, ctypes.addressof(window) + offset, length, ctypes.byref(context), None)
    if not status:
        call(fns[14], P, P)(context, None)
    call(fns[8], P)(backend)
    return {"ok": True, "status": status}

try:
    report = load(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
except OSError as exc:
    report = {"ok": False, "error": str(exc)}
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


class ReadFailure(Exception):
    """The child could not give the library's answer: it timed out or died."""


def read_binary_info(system_lib: Path, path: Path, offset: int, length: int, environ: Mapping[str, str],
                     timeout: float = READ_TIMEOUT) -> dict[str, Any]:
    """What `system_lib` answers for `length` bytes of `path` from `offset`: {"ok": True, ...the
    binary info...} or {"ok": False, "error": ...}. Raises ReadFailure when no answer came."""
    return _run(_READER, str(system_lib), path, offset, length, environ, timeout)


def load_binary(backend_lib: str, path: Path, offset: int, length: int, environ: Mapping[str, str],
                timeout: float = READ_TIMEOUT) -> dict[str, Any]:
    """Whether the backend library `backend_lib` (a bare name, found as the loader finds it in a
    process started with `environ`) creates a context from the binary: {"ok": True, "status":
    what contextCreateFromBinary returned} or {"ok": False, "error": ...}. Raises ReadFailure when
    no answer came."""
    return _run(_LOADER, backend_lib, path, offset, length, environ, timeout)


def _run(script: str, system_lib: str, path: Path, offset: int, length: int, environ: Mapping[str, str],
         timeout: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="qnnctl-inspect-") as folder:
        report_path = os.path.join(folder, "report.json")
        try:
            proc = subprocess.run([sys.executable, "-I", "-c", script, report_path, system_lib, str(path),
                                   str(offset), str(length)],
                                  env=dict(environ), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True, errors="replace", timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            raise ReadFailure(f"{system_lib} did not answer within {timeout:.0f}s") from None
        try:
            with open(report_path, encoding="utf-8") as handle:
                answer: dict[str, Any] = json.load(handle)
        except (OSError, ValueError):
            tail = (proc.stderr.strip().splitlines() or [""])[-1]
            how = (f"was killed by signal {-proc.returncode}" if proc.returncode < 0
                   else f"exited with {proc.returncode}")
            raise ReadFailure(f"the process reading it with {system_lib} {how} {tail}".rstrip()) from None
    return answer
