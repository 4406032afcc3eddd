"""What a lowered model needs, as the SDK's own library reads it: the QAIRT build and QNN API
versions of its context binaries, their HTP architecture and SoC, their graphs; and whether an
SDK's runtime loads them.

A context binary is what a QNN lowering produces (`qnn-context-binary-generator`, ONNX Runtime's
QNN execution provider, ExecuTorch's QNN delegate). A runtime older than the QNN API a binary was
built against refuses it: `Using newer context binary on old SDK`, `Fail to get context blob
with err 5000`; an older binary loads.

Only the SDK's `libQnnSystem.so` reads a binary (`QnnSystemContext_getBinaryInfo`, in a fresh
process: qnnctl.run.binaryinfo). Whatever text a file carries (a build string, a target), it
decides nothing: a file the library cannot read gets no verdict, and the verdict compares the
QNN core and backend API versions the library reports with those of the runtime's own backend
library, not the build string, which is shown beside them.

An ONNX model lowered by ONNX Runtime holds the binary in an `EPContext` node or names a file
beside it (qnnctl.run.epcontext).
"""

from __future__ import annotations

import logging
import mmap
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from qnnctl.errors import QnnctlError
from qnnctl.run.binaryinfo import ReadFailure, load_binary, read_binary_info
from qnnctl.run.environment import resolve_sdk
from qnnctl.run.envplan import environment_for
from qnnctl.run.epcontext import MAX_NODES, Node, Span, TooManyNodes, epcontext_nodes, external_path, open_map
from qnnctl.run.probe import Provider, explain_load_error, probe
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.layout import Sdk, read_build_id
from qnnctl.sdk.select import BY_ENV
from qnnctl.shell.exports import apply
from qnnctl.words import printable

log = logging.getLogger("qnnctl.run.inspect")

SCHEMA = 2
# QnnCommon.h's backend ids, and the library of each that loads a binary.
BACKENDS = {2: "CPU", 4: "GPU", 5: "DSP", 6: "HTP", 8: "HTA", 14: "LPAI"}
BACKEND_LIBS = {2: "libQnnCpu.so", 4: "libQnnGpu.so", 6: "libQnnHtp.so"}
HTP = 6
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
# QAIRT 2.51's libQnnHtp.so (the library then reports the same number); read 2026-12-04.
SOC_MODELS = {36: "SM8450", 43: "SM8550", 57: "SM8650", 60: "SC8380XP", 69: "SM8750"}
# QnnSystemContext.h's QNN_SYSTEM_CONTEXT_ERROR_MALFORMED_BINARY.
MALFORMED = 30010


class NotAModelError(QnnctlError):
    """The file holds no QNN context binary qnnctl can read."""

    def __init__(self, path: Path | str, why: str) -> None:
        super().__init__(f"{printable(str(path))} {why}",
                         hint="give a QNN context binary (`.bin`) or an ONNX model with an EPContext node")


class UnreadableError(QnnctlError):
    """The SDK's library could not read a context binary: no verdict is given."""


@dataclass(frozen=True)
class Place:
    """Where one context binary is: `length` bytes of `path` from `offset`."""

    origin: str
    path: Path
    offset: int
    length: int


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: list[int]
    quantization: dict[str, Any] | None = None


@dataclass(frozen=True)
class Graph:
    name: str
    inputs: list[Tensor]
    outputs: list[Tensor]
    htp: dict[str, Any] | None = None  # VTCM, spill-fill, optimization level, HVX threads, sizes


@dataclass
class Binary:
    """One context binary as the SDK's libQnnSystem.so read it; `error` when it could not."""

    origin: str
    size: int
    read_with: str | None
    error: str | None = None
    build: str | None = None  # the build string the library reports: `2.51.0.260929181845`
    backend: str | None = None
    backend_id: int | None = None
    core_api: str | None = None
    backend_api: str | None = None
    htp_arch: int | None = None
    soc: str | None = None
    soc_model: int | None = None
    info_version: int | None = None
    blob_version: str | None = None
    blob_size: int | None = None
    context_tensors: int | None = None
    spill_fill_size: int | None = None  # per context, from binaries of info V1 and V2
    build_disagrees: str | None = None  # the build string against the API versions, when they disagree
    graphs: list[Graph] = field(default_factory=list)

    @property
    def qairt(self) -> str | None:
        """The SDK version its build string names (`2.51.0.260929`)."""
        return self.build[:-6] if self.build and len(self.build.split(".")[-1]) == 12 else self.build


@dataclass
class Verdict:
    """Whether an SDK's runtime loads the binaries, from the API versions the libraries report."""

    version: str
    root: str
    build: str | None
    core_api: str | None
    backend_api: str | None
    loads: bool
    reason: str
    # How: "api-versions" (the versions the libraries report, compared) or "loaded" (the SDK's
    # backend library created a context from each binary on this host).
    checked: str = "api-versions"


@dataclass
class Report:
    file: str
    format: str  # "qnn-context-binary" or "onnx-epcontext"
    binaries: list[Binary]
    sdk: Verdict | None = None

    @property
    def ok(self) -> bool:
        return all(b.error is None for b in self.binaries) and (self.sdk is None or self.sdk.loads)

    def as_dict(self) -> dict[str, Any]:
        binaries = [{**asdict(b), "qairt": b.qairt} for b in self.binaries]
        return {"schema": SCHEMA, "file": self.file, "format": self.format, "binaries": binaries,
                "sdk": asdict(self.sdk) if self.sdk else None, "ok": self.ok}


# -- finding the binaries ----------------------------------------------------------------------


def binaries_of(path: Path) -> tuple[str, list[Place]]:
    """The file's format and the place of each context binary it holds or names."""
    if path.is_dir():
        raise NotAModelError(path, "is a folder: give the lowered model inside it (a `.bin`, or the "
                             "`_ctx.onnx` ONNX Runtime wrote)")
    if not path.is_file():
        raise NotAModelError(path, "is not a file")
    with open(path, "rb") as handle:
        head = handle.read(8)
    if head[:4] == b"\x7fELF":
        raise NotAModelError(path, "is an ELF library, not a lowered model")
    if len(head) == 8 and head[4:6] == b"ET" and head[6:8].isdigit():
        raise NotAModelError(path, "is an ExecuTorch program (.pte), which qnnctl inspect does not read yet")
    size = path.stat().st_size
    if size == 0:
        raise NotAModelError(path, "is empty")
    if path.suffix != ".onnx" and head[:1] != b"\x08":
        return "qnn-context-binary", [Place(str(path), path, 0, size)]
    mapped = open_map(path)
    if mapped is None:
        raise NotAModelError(path, "is empty")
    try:
        try:
            nodes = epcontext_nodes(mapped)
        except TooManyNodes:
            raise NotAModelError(path, f"has more than {MAX_NODES} EPContext nodes, which qnnctl inspect does not "
                                 "read (ONNX Runtime writes one for each part of the graph the QNN execution "
                                 "provider takes)") from None
        if nodes is None:
            return "qnn-context-binary", [Place(str(path), path, 0, size)]
        return "onnx-epcontext", _places(path, mapped, nodes)
    finally:
        mapped.close()


def _places(path: Path, mapped: mmap.mmap, nodes: list[Node]) -> list[Place]:
    found: list[Place] = []
    for node in nodes:
        attributes = node.attributes
        if attributes.get("main_context", 1) == 0:
            continue  # shares the binary of another node
        named = f"the EPContext node '{printable(node.name)}'"
        context = attributes.get("ep_cache_context")
        if not isinstance(context, Span) or context.length == 0:
            raise NotAModelError(path, f"has {named} with an empty ep_cache_context, which ONNX Runtime refuses")
        if attributes.get("embed_mode", 1) == 1:
            found.append(Place(f"{path} (embedded in the EPContext node '{node.name}')", path,
                               context.offset, context.length))
            continue
        name = bytes(mapped[context.offset:context.offset + min(context.length, 4096)]).decode("utf-8", "replace")
        beside = external_path(path, name)
        if beside is None:
            raise NotAModelError(path, f"has {named} naming '{printable(name)}', which leads out of the model's "
                                 "folder: ONNX Runtime refuses it")
        if beside.is_dir():
            raise NotAModelError(path, f"has {named} naming {printable(str(beside))}, which is a folder")
        if not beside.is_file():
            raise NotAModelError(path, f"has {named} naming the context binary {printable(str(beside))}, "
                                 "which does not exist")
        size = beside.stat().st_size
        if all((place.path, place.offset, place.length) != (beside, 0, size) for place in found):
            found.append(Place(str(beside), beside, 0, size))  # nodes naming one file: it is read once
    if not found:
        raise NotAModelError(path, "is an ONNX model without an EPContext node holding a context binary")
    return found


# -- reading them with the SDK's library -------------------------------------------------------


def _why(system_lib: Path, answer: Mapping[str, Any]) -> str:
    error = str(answer.get("error", ""))
    if "shared object" in error or "not found" in error:
        return explain_load_error(system_lib.name, error)
    if answer.get("status") == MALFORMED:
        return f"{system_lib} could not read it: {error} (a malformed context binary)"
    return f"{system_lib} could not read it: {error}"


def _tensors(listed: list[dict[str, Any]]) -> list[Tensor]:
    return [Tensor(str(t["name"]), DATA_TYPES.get(int(t["data_type"]), hex(int(t["data_type"]))),
                   [int(d) for d in t["shape"]], t.get("quantization")) for t in listed]


def _api_minor(api: str | None) -> int | None:
    try:
        return int(api.split(".")[1]) if api else None
    except (IndexError, ValueError):
        return None


def build_disagreement(build: str | None, backend_id: int, backend_api: str | None) -> str | None:
    """Where the build string names another QAIRT release than the HTP backend API version the
    library reports: QAIRT 2.N's HTP backend API is 5.N (2.47: 5.47.0, 2.51: 5.51.0)."""
    minor = _api_minor(backend_api)
    if backend_id != HTP or minor is None or not build or not backend_api or not backend_api.startswith("5."):
        return None
    parts = build.split(".")
    if len(parts) >= 2 and parts[0] == "2" and parts[1].isdigit() and int(parts[1]) != minor:
        return (f"its build string names QAIRT {'.'.join(parts[:2])}, but its HTP backend API {backend_api} "
                f"is QAIRT 2.{minor}'s: the API versions decide")
    return None


def read_place(place: Place, system_lib: Path, environ: Mapping[str, str]) -> Binary:
    """One context binary as `system_lib` reads it."""
    try:
        answer = read_binary_info(system_lib, place.path, place.offset, place.length, environ)
    except ReadFailure as exc:
        return Binary(place.origin, place.length, str(system_lib), error=str(exc))
    if not answer.get("ok"):
        return Binary(place.origin, place.length, str(system_lib), error=_why(system_lib, answer))
    backend_id = int(answer["backend_id"])
    soc_model = answer.get("soc_model")
    build = str(answer["build_id"]).removeprefix("v") or None
    graphs = [Graph(str(g["name"]), _tensors(g["inputs"]), _tensors(g["outputs"]), g.get("htp"))
              for g in answer["graphs"]]
    return Binary(
        place.origin, place.length, str(system_lib), None, build, BACKENDS.get(backend_id, f"backend {backend_id}"),
        backend_id, str(answer["core_api"]), str(answer["backend_api"]), answer.get("dsp_arch"),
        SOC_MODELS.get(soc_model or -1) or (answer.get("soc_version") or None), soc_model,
        answer.get("info_version"), answer.get("blob_version"), answer.get("blob_size"),
        answer.get("context_tensors"), answer.get("spill_fill_size"),
        build_disagreement(build, backend_id, str(answer["backend_api"])), graphs,
    )


def read_model(path: Path, sdk: Sdk, environ: Mapping[str, str]) -> tuple[str, list[Binary]]:
    """The format of the model at `path` and its binaries, as `sdk`'s libQnnSystem.so reads them
    in a process started with `environ` (where the SDK's libraries load)."""
    fmt, places = binaries_of(path)
    return fmt, _read_places(places, sdk, environ)


def _read_places(places: list[Place], sdk: Sdk, environ: Mapping[str, str]) -> list[Binary]:
    system_lib = sdk.lib_dir / "libQnnSystem.so"
    if not system_lib.is_file():
        raise QnnctlError(
            f"SDK {sdk.version} has no {system_lib.name}, which reads context binaries",
            hint=f"reinstall it with its host libraries: qnnctl install {sdk.version} --force")
    return [read_place(place, system_lib, environ) for place in places]


# -- the verdict -------------------------------------------------------------------------------


def _key(api: str | None) -> tuple[int, int] | None:
    try:
        parts = [int(p) for p in (api or "").split(".")]
    except ValueError:
        return None
    return (parts[0], parts[1]) if len(parts) >= 2 else None


def runtime_providers(environ: Mapping[str, str], backend_ids: set[int]) -> dict[int, Provider | str]:
    """The interface each backend library offers in a process started with `environ`, by backend
    id: its core and backend API versions, or why it did not load."""
    found: dict[int, Provider | str] = {}
    names = {i: BACKEND_LIBS[i] for i in backend_ids if i in BACKEND_LIBS}
    if not names:
        return found
    loaded = {entry.name: entry for entry in probe(sorted(set(names.values())), environ)}
    for backend_id, name in names.items():
        entry = loaded[name]
        provider = next((p for p in entry.providers if p.backend_id == backend_id), None)
        found[backend_id] = provider if entry.ok and provider else (
            entry.failure if not entry.ok else f"{name} offers no interface for backend {backend_id}")
    return found


def verdict(binaries: list[Binary], version: str, root: Path, sdk_build: str | None,
            providers: Mapping[int, Provider | str]) -> Verdict:
    """Whether SDK `version` loads every binary: never for one its library could not read; for
    the rest, a binary whose QNN core or backend API (major.minor) is newer than the runtime's is
    refused (error 5000), an older or equal one loads."""
    runtime = next((p for p in providers.values() if isinstance(p, Provider)), None)

    def made(loads: bool, reason: str) -> Verdict:
        return Verdict(version, str(root), sdk_build, runtime.core_api if runtime else None,
                       runtime.backend_api if runtime else None, loads, reason)

    unread = [b for b in binaries if b.error is not None]
    if unread:
        b = unread[0]
        return made(False, f"SDK {version}'s libQnnSystem.so could not read {printable(b.origin)}, so no runtime "
                    f"loads it ({printable(b.error or '')})")
    for b in binaries:
        provider = providers.get(b.backend_id or -1)
        if provider is None:
            return made(False, f"{printable(b.origin)} is a {b.backend} binary, and SDK {version} has no library of "
                        "that backend to load it with")
        if isinstance(provider, str):
            return made(False, f"whether SDK {version} loads {printable(b.origin)} is unknown: {provider}")
        built = (_key(b.core_api), _key(b.backend_api))
        have = (_key(provider.core_api), _key(provider.backend_api))
        if None in built or None in have:
            return made(False, f"whether SDK {version} loads {printable(b.origin)} is unknown: API versions "
                        f"{b.core_api}/{b.backend_api} against {provider.core_api}/{provider.backend_api}")
        newer = [what for what, mine, theirs in (("core", built[0], have[0]), ("backend", built[1], have[1]))
                 if mine is not None and theirs is not None and mine > theirs]
        if newer:
            return made(False, (
                f"SDK {version} (core API {provider.core_api}, backend API {provider.backend_api}) cannot load "
                f"{printable(b.origin)}: its {' and '.join(newer)} API ({b.core_api}, {b.backend_api}; build string "
                f"{printable(b.build or 'none')}) is newer than this runtime's (error 5000, `Using newer context "
                "binary on old SDK`)"))
    apis = ", ".join(sorted({f"core {b.core_api}, backend {b.backend_api}" for b in binaries}))
    runtime_apis = f"core {runtime.core_api}, backend {runtime.backend_api}" if runtime else "unknown"
    return made(True, f"SDK {version} ({runtime_apis}) loads binaries of API {apis}: not newer than it")


def real_load(places: list[Place], binaries: list[Binary], environ: Mapping[str, str]) -> tuple[bool, str]:
    """Whether the SDK's backend library, in a process started with `environ`, creates a context
    from each binary on this host (as ONNX Runtime's QNN provider does); and what happened."""
    done = []
    for place, b in zip(places, binaries, strict=True):
        library = BACKEND_LIBS.get(b.backend_id or -1)
        if library is None:
            return False, f"no {b.backend} library to load {printable(b.origin)} with on this host"
        try:
            answer = load_binary(library, place.path, place.offset, place.length, environ)
        except ReadFailure as exc:
            return False, f"loading {printable(b.origin)} gave no answer: {exc}"
        if not answer.get("ok"):
            why = explain_load_error(library, str(answer["error"]))
            return False, f"{library} could not try {printable(b.origin)}: {why}"
        status = int(answer["status"])
        if status:
            why = " (`Using newer context binary on old SDK`)" if status == 5000 else ""
            return False, (f"{library} refused {printable(b.origin)} on this host: contextCreateFromBinary returned "
                           f"{status}{why}")
        done.append(printable(b.origin))
    return True, f"{', '.join(done)} loaded on this host (contextCreateFromBinary returned 0)"


def inspect(path: Path, sdk: Sdk, environ: Mapping[str, str], load: bool = False) -> Report:
    """Read the lowered model at `path` with `sdk`'s libQnnSystem.so in a process started with
    `environ`, and say whether its runtime loads the binaries: from the API versions, or with
    `load`, by creating a context from each one with the SDK's backend library."""
    fmt, places = binaries_of(path)
    binaries = _read_places(places, sdk, environ)
    report = Report(str(path), fmt, binaries)
    ids = {b.backend_id for b in binaries if b.error is None and b.backend_id is not None}
    providers = runtime_providers(environ, ids) if ids else {}
    predicted = verdict(binaries, sdk.version, sdk.root, read_build_id(sdk.root), providers)
    report.sdk = predicted
    if load and all(b.error is None for b in binaries):
        loaded, what = real_load(places, binaries, environ)
        agrees = ("as the API versions predict" if loaded == predicted.loads
                  else f"though the API versions predict otherwise: {predicted.reason}")
        report.sdk = Verdict(predicted.version, predicted.root, predicted.build, predicted.core_api,
                             predicted.backend_api, loaded, f"SDK {sdk.version}: {what}, {agrees}", "loaded")
    return report


def _size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def _quant(q: Mapping[str, Any] | None) -> str:
    if not q:
        return ""
    if "scale" in q:
        return f" {q['encoding']} scale={q['scale']:.6g} offset={q['offset']}"
    return f" {q['encoding']} axis={q.get('axis')} ({q.get('count')} scales)"


def render(report: Report) -> str:
    """The report for people (the verdict is said on stderr when it is negative)."""
    lines = [f"{printable(report.file)}: {report.format}"]
    for b in report.binaries:
        lines.append(f"context binary {printable(b.origin)} ({_size(b.size)})")
        lines.append(f"  read with   {printable(b.read_with or '-')}")
        if b.error is not None:
            lines.append("  unreadable  by the SDK's library (the error says why)")
            continue
        lines.append(f"  APIs        core {b.core_api}, backend {b.backend_api} "
                     f"(build string {printable(b.build or '-')})")
        if b.build_disagrees:
            lines.append(f"  mismatch    {printable(b.build_disagrees)}")
        target = ", ".join(x for x in (b.backend, f"V{b.htp_arch}" if b.htp_arch else None,
                                       b.soc, f"soc_model={b.soc_model}" if b.soc_model else None) if x)
        lines.append(f"  target      {target}")
        lines.append(f"  blob        version {b.blob_version}, {_size(b.blob_size)}")
        for g in b.graphs:
            lines.append(f"  graph {printable(g.name)}")
            if g.htp:
                h = g.htp
                lines.append(f"    htp      VTCM {_size(h.get('vtcm_size'))}, "
                             f"spill-fill {_size(h.get('spill_fill_size'))}, "
                             f"O{h.get('optimization_level')}, HVX threads {h.get('hvx_threads')}")
                if "const_size" in h:
                    lines.append(f"    memory   const {_size(h['const_size'])}, op data {_size(h['op_data_size'])}, "
                                 f"I/O {_size(h['io_tensor_size'])}, DDR {_size(h['ddr_tensor_size'])}, "
                                 f"shared weights {_size(h['shared_weights_size'])}")
            for kind, tensors in (("input", g.inputs), ("output", g.outputs)):
                for t in tensors:
                    lines.append(f"    {kind:6}   {printable(t.name)} {t.dtype}{list(t.shape)}{_quant(t.quantization)}")
    if report.sdk is not None and report.ok:
        lines.append(f"loads: {printable(report.sdk.reason)}")
    return "\n".join(lines) + "\n"


def inspect_file(path: Path, spec: str | None, environ: Mapping[str, str], cwd: Path, cache: Cache,
                 load: bool = False) -> Report:
    """`qnnctl inspect`: the SDK `spec` selects (never installing one) reads the file with its
    own library. Without an installed SDK nothing can read it, and that is an error."""
    binaries_of(path)  # a file that is no model is refused before an SDK is looked for
    selection, sdk = resolve_sdk(spec, environ, cwd, cache, allow_install=False)
    if sdk is None:
        raise QnnctlError(f"no SDK to read {printable(str(path))} with: QNN_SDK_ROOT is set but empty, so the "
                          "caller manages the SDK", hint="give one with --sdk VERSION|PATH")
    child = apply(environ, environment_for(sdk, environ, cache, owns_root=selection.reason != BY_ENV))
    return inspect(path, sdk, child, load)


def api_release(binary: Binary) -> tuple[int, int] | None:
    """The QAIRT release (major, minor) whose runtime a binary's API versions need, for HTP
    binaries: QAIRT 2.N's HTP backend API is 5.N. None when the library did not read it."""
    key = _key(binary.backend_api)
    if binary.error is not None or binary.backend_id != HTP or key is None or key[0] != 5:
        return None
    return (2, key[1])
