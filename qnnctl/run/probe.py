"""Load the SDK's host libraries in a fresh process and ask them what they provide.

Never in qnnctl's own process: LD_LIBRARY_PATH is read when a process starts, and a library
that loads here would stay loaded. The child reports through a file of its own, because the
libraries print to stdout while they load (QAIRT 2.51's libQnnHtp.so writes a `# LIBNATIVE: ...`
line), and nothing they print may be taken for the answer.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from qnnctl.errors import QnnctlError
from qnnctl.records import Record

PROBE_TIMEOUT = 60.0
# QnnCommon.h's QNN_BACKEND_ID_HTP.
HTP_BACKEND_ID = 6
# Which provider list each library answers for; both return arrays of structs that start
# {uint32_t backendId; const char *providerName; version...} (QnnInterface.h, QnnSystemInterface.h).
PROVIDER_FUNCTIONS = ("QnnInterface_getProviders", "QnnSystemInterface_getProviders")

# Runs as `python -I -c PROBE report.json NAME...`: the standard library only, so it works in any
# Python. Each library is opened by bare name, as a lowering opens it, so the loader's search
# (LD_LIBRARY_PATH first) decides which file that is.
_PROBE = r"""
import ctypes, json, sys

class ApiVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("patch", ctypes.c_uint32)]

class Provider(ctypes.Structure):
    # QnnInterface_t: core then backend API version; QnnSystemInterface_t: its system API version.
    _fields_ = [("backend_id", ctypes.c_uint32), ("name", ctypes.c_char_p),
                ("first", ApiVersion), ("second", ApiVersion)]

def dotted(v):
    return "%d.%d.%d" % (v.major, v.minor, v.patch)

def providers(lib):
    for function in ("QnnInterface_getProviders", "QnnSystemInterface_getProviders"):
        try:
            get = getattr(lib, function)
        except AttributeError:
            continue
        get.restype = ctypes.c_uint64
        get.argtypes = [ctypes.POINTER(ctypes.POINTER(ctypes.POINTER(Provider))),
                        ctypes.POINTER(ctypes.c_uint32)]
        found = ctypes.POINTER(ctypes.POINTER(Provider))()
        count = ctypes.c_uint32()
        status = get(ctypes.byref(found), ctypes.byref(count))
        if status != 0:
            return {"function": function, "status": status, "providers": []}
        listed = []
        for i in range(min(count.value, 64)):
            if not found[i]:
                continue
            p = found[i].contents
            entry = {"name": (p.name or b"").decode("utf-8", "replace"), "backend_id": p.backend_id}
            if function == "QnnInterface_getProviders":
                entry.update(core_api=dotted(p.first), backend_api=dotted(p.second))
            else:
                entry.update(system_api=dotted(p.first))
            listed.append(entry)
        return {"function": function, "status": 0, "providers": listed}
    return {"function": None, "status": None, "providers": []}

report = {}
for name in sys.argv[2:]:
    try:
        lib = ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL)
    except OSError as exc:
        report[name] = {"ok": False, "error": str(exc)}
        continue
    report[name] = {"ok": True}
    report[name].update(providers(lib))
try:
    with open("/proc/self/maps") as maps:
        mapped = [line.split(None, 5)[-1].strip() for line in maps if len(line.split(None, 5)) == 6]
except OSError:
    mapped = []
for name, entry in report.items():
    if entry["ok"]:
        entry["path"] = next((p for p in mapped if p.rsplit("/", 1)[-1] == name), None)
with open(sys.argv[1], "w") as out:
    json.dump(report, out)
"""


class Provider(Record):
    """One interface provider a library offers, as its getProviders function lists it."""

    name: str
    backend_id: int
    core_api: str | None = None
    backend_api: str | None = None
    system_api: str | None = None

    def describe(self) -> str:
        if self.system_api is not None:
            return f"{self.name} (system API {self.system_api})"
        return f"{self.name} (backend {self.backend_id}, core API {self.core_api}, backend API {self.backend_api})"


class Loaded(Record):
    """What happened to one library in the child: loaded from `path`, or the loader's `error`."""

    name: str
    ok: bool
    error: str | None = None
    path: str | None = None
    function: str | None = None  # the getProviders function the library exports, if any
    status: int | None = None  # what that function returned (0 is success)
    providers: tuple[Provider, ...] = ()

    @property
    def failure(self) -> str:
        """The load error in words: which library, and what it lacks."""
        return explain_load_error(self.name, self.error or "")


# dlopen's words: "<file>: cannot open shared object file: ...", "<file>: undefined symbol: X",
# "<libc>: version `GLIBC_2.38' not found (required by <file>)".
_CANNOT_OPEN = re.compile(r"^(?P<file>[^:]+): cannot open shared object file: (?P<why>.*)$")
_VERSION = re.compile(r"^(?P<provider>[^:]+): version `(?P<version>[^']+)' not found \(required by (?P<by>[^)]+)\)")
_UNDEFINED = re.compile(r"^(?P<file>[^:]+): undefined symbol: (?P<symbol>\S+)")


def explain_load_error(name: str, error: str) -> str:
    """`name` and what it lacks, from the loader's message (which names only the missing file)."""
    error = error.strip()
    opened = _CANNOT_OPEN.match(error)
    if opened:
        missing = os.path.basename(opened.group("file"))
        if missing == name:
            return f"{name} cannot be found: no folder on the loader's path holds it"
        return f"{name} needs {missing}, which the loader cannot find ({opened.group('why')})"
    versioned = _VERSION.match(error)
    if versioned:
        by = os.path.basename(versioned.group("by"))
        provider = os.path.basename(versioned.group("provider"))
        return f"{name} does not load: {by} needs {versioned.group('version')}, which {provider} lacks"
    undefined = _UNDEFINED.match(error)
    if undefined:
        where = os.path.basename(undefined.group("file"))
        symbol = undefined.group("symbol")
        return f"{name} does not load: {where} needs the symbol {symbol}, which no loaded library defines"
    return f"{name} does not load: {error}"


def probe(names: Sequence[str], environ: Mapping[str, str], timeout: float = PROBE_TIMEOUT) -> list[Loaded]:
    """dlopen each library by bare name in a fresh process that starts with `environ`,
    and list the interface providers each one offers."""
    with tempfile.TemporaryDirectory(prefix="qnnctl-probe-") as folder:
        report_path = os.path.join(folder, "report.json")
        try:
            proc = subprocess.run(
                [sys.executable, "-I", "-c", _PROBE, report_path, *names],
                env=dict(environ), capture_output=True, text=True, errors="replace",
                timeout=timeout, check=False,
            )
        except subprocess.TimeoutExpired:
            raise QnnctlError(f"loading {', '.join(names)} did not finish within {timeout:.0f}s",
                              hint="a library constructor hangs; run `qnnctl doctor --verify`") from None
        try:
            with open(report_path, encoding="utf-8") as handle:
                report: dict[str, Any] = json.load(handle)
        except (OSError, ValueError):
            report = {}
    if proc.returncode != 0 or not report:
        how = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exited with {proc.returncode}")
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        raise QnnctlError(f"the process loading {', '.join(names)} {how} {tail[0]}".rstrip(),
                          hint="a library constructor crashed; run `qnnctl doctor --verify`")
    return [_loaded(name, report.get(name) or {"ok": False, "error": "not reported"}) for name in names]


def _loaded(name: str, entry: Mapping[str, Any]) -> Loaded:
    providers = tuple(
        Provider(str(p.get("name", "")), int(p.get("backend_id", 0)), p.get("core_api"),
                 p.get("backend_api"), p.get("system_api"))
        for p in entry.get("providers") or ()
        if isinstance(p, dict)
    )
    return Loaded(name, bool(entry.get("ok")), entry.get("error"), entry.get("path"),
                  entry.get("function"), entry.get("status"), providers)
