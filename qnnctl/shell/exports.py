"""Environment changes as data: the variables an SDK needs, their undoing, the shell's record.

`sdk_environment` computes the final values of the variables qnnctl manages, starting
from an environment that may already carry an earlier `qnnctl env`; qnnctl.shell.render
turns those values into text that a shell can eval without running code or splitting words.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from qnnctl.errors import UsageError

MARKER = "QNNCTL_SDK"
PATH_VARS = ("LD_LIBRARY_PATH", "PATH")

# An environment change: variable name -> its final value, or None to unset it.
EnvValues = dict[str, "str | None"]


class Marker:
    """What an earlier `qnnctl env` changed, so that exactly that can be undone.

    A plain class: `qnnctl env` runs in shell start-up files, and generating a dataclass
    costs about a millisecond of import time.
    """

    __slots__ = ("added", "owns_root", "previous_root", "root", "was_unset")

    def __init__(
        self,
        root: str,
        owns_root: bool,
        added: dict[str, list[str]] | None = None,
        was_unset: list[str] | None = None,
        previous_root: str | None = None,
    ) -> None:
        self.root = root
        self.owns_root = owns_root
        self.added = {} if added is None else added
        self.was_unset = [] if was_unset is None else was_unset
        # The QNN_SDK_ROOT that qnnctl replaced (None: it was unset), put back by an undo.
        self.previous_root = previous_root

    def dumps(self) -> str:
        data = {"root": self.root, "owns_root": self.owns_root, "added": self.added,
                "was_unset": self.was_unset, "previous_root": self.previous_root}
        return json.dumps(data, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def read_marker(environ: Mapping[str, str]) -> Marker | None:
    raw = environ.get(MARKER)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        added = {str(k): [str(e) for e in v] for k, v in dict(data.get("added", {})).items()}
        previous = data.get("previous_root")
        return Marker(
            root=str(data["root"]),
            owns_root=bool(data.get("owns_root", False)),
            added={k: v for k, v in added.items() if k in PATH_VARS},
            was_unset=[str(n) for n in data.get("was_unset", []) if n in PATH_VARS],
            previous_root=None if previous is None else str(previous),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        # Not ours (or mangled): nothing can be undone safely, so nothing is.
        return None


def split_path(value: str | None) -> list[str]:
    return [] if not value else value.split(":")


def check_exportable(name: str, value: str) -> None:
    """Refuse a value no shell can carry faithfully (exit 2)."""
    if "\x00" in value or "\n" in value or "\r" in value:
        raise UsageError(
            f"cannot export {name}: the path {value!r} contains a newline or NUL",
            hint="move the SDK or the cache (QNNCTL_CACHE_DIR) to a path without one",
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        # Bytes the locale could not decode: no shell syntax below can carry them exactly.
        raise UsageError(
            f"cannot export {name}: the path {value!r} is not valid text in this locale",
            hint="move the SDK or the cache (QNNCTL_CACHE_DIR) to a path with a valid name",
        ) from None


def _check_path_entry(name: str, entry: str) -> None:
    check_exportable(name, entry)
    if ":" in entry:
        raise UsageError(
            f"cannot add {entry!r} to {name}: a path list cannot hold a ':'",
            hint="move the SDK or the cache (QNNCTL_CACHE_DIR) to a path without ':'",
        )


def check_cache_path(root: str) -> None:
    """Refuse (exit 2) a cache whose SDKs no path list could hold, before anything goes there.

    An SDK installed under a ':' or a newline would be refused by `qnnctl env` and `lower`
    only after a download of a gigabyte or two.
    """
    flaws = {":": "a ':'", "\n": "a newline", "\r": "a carriage return", "\x00": "a NUL"}
    what = next((flaw for char, flaw in flaws.items() if char in root), None)
    if what is None:
        try:
            root.encode("utf-8")
            return
        except UnicodeEncodeError:
            what = "bytes that are not valid text in this locale"
    raise UsageError(
        f"the cache {root!r} has {what} in its path: an SDK installed there could not be put on "
        "LD_LIBRARY_PATH and PATH",
        hint="point QNNCTL_CACHE_DIR at a folder whose path has no ':' and no newline",
    )


def _undo(values: dict[str, str | None], marker: Marker | None) -> None:
    if marker is None:
        return
    for name, entries in marker.added.items():
        value = values.get(name)
        if value is None:
            continue  # unset since: nothing of qnnctl's is left to remove
        current = split_path(value)
        for entry in entries:
            if entry in current:
                current.remove(entry)
        if current:
            values[name] = ":".join(current)
        else:
            # Nothing of the user's is left: back to unset, or to the empty value the user
            # had. Never ":" or a stray empty entry, which the loader reads as the cwd.
            values[name] = None if name in marker.was_unset else ""
    if marker.owns_root and values.get("QNN_SDK_ROOT") == marker.root:
        values["QNN_SDK_ROOT"] = marker.previous_root
    values[MARKER] = None


def sdk_environment(
    environ: Mapping[str, str],
    root: str,
    lib_dirs: Sequence[str],
    bin_dirs: Sequence[str],
    owns_root: bool = True,
) -> EnvValues:
    """Final values of the managed variables after `qnnctl env` for the SDK at `root`.

    Whatever an earlier `qnnctl env` added (named in the marker) is removed first; entries
    already present keep their place and are not added twice. With `owns_root` False the
    user's own `QNN_SDK_ROOT` is left as it is.
    """
    check_exportable("QNN_SDK_ROOT", root)
    managed = (*PATH_VARS, "QNN_SDK_ROOT", MARKER)
    values: dict[str, str | None] = {name: environ.get(name) for name in managed}
    _undo(values, read_marker(environ))
    added: dict[str, list[str]] = {}
    was_unset: list[str] = []
    for name, wanted in (("LD_LIBRARY_PATH", lib_dirs), ("PATH", bin_dirs)):
        current = split_path(values[name])
        new = []
        for entry in wanted:
            _check_path_entry(name, entry)
            if entry not in current and entry not in new:
                new.append(entry)
        if values[name] is None:
            was_unset.append(name)
        added[name] = new
        if new or values[name] is not None:
            values[name] = ":".join(new + current)
    previous_root = values["QNN_SDK_ROOT"] if owns_root else None
    if owns_root:
        values["QNN_SDK_ROOT"] = root
    values[MARKER] = Marker(root, owns_root, added, was_unset, previous_root).dumps()
    return {
        "QNN_SDK_ROOT": values["QNN_SDK_ROOT"],
        "LD_LIBRARY_PATH": values["LD_LIBRARY_PATH"],
        "PATH": values["PATH"],
        MARKER: values[MARKER],
    }


def unset_environment(environ: Mapping[str, str]) -> EnvValues:
    """The values that undo what `qnnctl env` changed, leaving everything of the user's."""
    marker = read_marker(environ)
    if marker is None:
        return {MARKER: None} if MARKER in environ else {}
    values: dict[str, str | None] = {
        name: environ.get(name) for name in (*PATH_VARS, "QNN_SDK_ROOT", MARKER)
    }
    _undo(values, marker)
    changed = set(marker.added) | {MARKER}
    if marker.owns_root:
        changed.add("QNN_SDK_ROOT")
    return {name: values[name] for name in ("QNN_SDK_ROOT", *PATH_VARS, MARKER) if name in changed}


def apply(environ: Mapping[str, str], values: EnvValues) -> dict[str, str]:
    """A copy of `environ` with the change applied (for a child process)."""
    result = dict(environ)
    for name, value in values.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = value
    return result
