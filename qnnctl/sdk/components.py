"""The parts of an SDK that can be installed on their own: path rules over the archive's members.

A QAIRT archive holds far more than a host needs: Android and embedded-Linux builds, Windows
builds, DSP libraries for every Hexagon generation, documentation and examples. Lowering a
model on an x86_64 Linux host needs the host libraries alone, and pushing to one phone the
Android libraries and one Hexagon generation. `install --components` fetches only those.

The rules are data (`qnnctl.sdk.members.RULES`), matched against each member's path below the SDK root. A member
that no rule claims belongs to `all` only. `host` is part of every install: every qnnctl
command needs the host libraries, and an SDK folder without them is no SDK (`missing_layout`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import PurePosixPath

from qnnctl.errors import UsageError
from qnnctl.records import TYPE_CHECKING

if TYPE_CHECKING:
    from typing import Any

ALL = "all"
HOST = "host"
ANDROID = "android"
DOCS = "docs"
HEXAGON = "hexagon-v{gen}"  # one component per DSP generation found in the archive
# The members no rule claims, as a lock's and an index's digests name them: installed with `all`.
OTHER = "other"


_NAMED = (HOST, ANDROID, DOCS, ALL)
_HEXAGON_NAME = re.compile(r"hexagon-v\d+")


def parse_components(spec: str | Iterable[str], where: str = "--components") -> tuple[str, ...]:
    """`host,android,hexagon-v75` as a sorted tuple of component names, `host` always in it;
    ("all",) for everything. UsageError (exit 2) for a name that is not a component."""
    words = [spec] if isinstance(spec, str) else list(spec)
    names = {part.strip().lower() for word in words for part in re.split(r"[,\s]+", word) if part.strip()}
    if not names:
        raise UsageError(f"{where} names no component", hint=f"give some of: {known_names()}")
    unknown = sorted(n for n in names if n not in _NAMED and not _HEXAGON_NAME.fullmatch(n))
    if unknown:
        verb = "is not a component" if len(unknown) == 1 else "are not components"
        meant = [guess for n in unknown if (guess := _meant(n)) is not None]
        guess = f"did you mean {', '.join(dict.fromkeys(meant))}? " if meant else ""
        raise UsageError(f"{where}: {', '.join(unknown)} {verb}", hint=f"{guess}the components are {known_names()}")
    if ALL in names:
        return (ALL,)
    return canonical(names | {HOST})


def _meant(name: str) -> str | None:
    """The component a mistyped name most likely meant (`andriod`: android; `hexagon75`,
    `hvx-v75`: hexagon-v75), or None."""
    generation = re.fullmatch(r"h\w*?[-_]?v?(\d{2,3})", name)
    if generation is not None:
        return HEXAGON.format(gen=int(generation.group(1)))
    import difflib  # lazy: for a misspelt name only; `qnnctl env` reads components on every start-up

    close = difflib.get_close_matches(name, _NAMED, n=1, cutoff=0.6)
    return close[0] if close else None


def known_names() -> str:
    return "host, android, hexagon-vNN (one per DSP generation, e.g. hexagon-v75), docs, all"


def canonical(names: Iterable[str]) -> tuple[str, ...]:
    """Sorted as people read them: host first, then android, the DSP generations, docs."""
    order = {HOST: 0, ANDROID: 1, DOCS: 3}

    def key(name: str) -> tuple[int, int, str]:
        if name.startswith("hexagon-v") and name[9:].isdigit():
            return (2, int(name[9:]), name)
        return (order.get(name, 4), 0, name)

    unique = set(names)
    return (ALL,) if ALL in unique else tuple(sorted(unique, key=key))


def covers(present: Collection[str], wanted: Collection[str]) -> bool:
    """Whether an SDK with the components `present` has everything `wanted` names."""
    return ALL in present or (ALL not in wanted and set(wanted) <= set(present))


def missing(present: Collection[str], wanted: Collection[str]) -> tuple[str, ...]:
    """What of `wanted` an SDK with `present` lacks."""
    if ALL in present:
        return ()
    if ALL in wanted:
        return (ALL,)
    return canonical(set(wanted) - set(present))


def installed_components(manifest: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The components an SDK holds, from its manifest: all of them for a manifest that does
    not say (a whole-archive install, or one made before components existed), and for an SDK
    without a manifest (ExecuTorch's cache, a store: unpacked whole)."""
    recorded = (manifest or {}).get("components")
    if isinstance(recorded, list) and recorded and all(isinstance(c, str) for c in recorded):
        return canonical(recorded)
    return (ALL,)


def install_command(version: str, components: Iterable[str]) -> str:
    """The command that adds `components` to SDK `version`."""
    return f"qnnctl install {version} --components {','.join(canonical(components))}"


# -- choosing members -----------------------------------------------------------------------


def complete(ctx: Any, param: Any, incomplete: str) -> list[str]:
    """Shell completion of `--components`: the names after the last comma."""
    done, _, last = incomplete.rpartition(",")
    prefix = f"{done}," if done else ""
    names = [HOST, ANDROID, "hexagon-v68", "hexagon-v69", "hexagon-v73", "hexagon-v75", "hexagon-v79",
             DOCS, ALL]
    taken = set(done.split(",")) if done else set()
    return [prefix + n for n in names if n.startswith(last) and n not in taken]


MemberFilter = Callable[[PurePosixPath], bool]


# -- what a lock pins of each component -------------------------------------------------------
#
# A component's digest is the sha256 over one line per file and link of it (folders, which
# archivers write or leave out as they please, are not in it): its path below the SDK root,
# its kind, whether it is executable, a link's target, its size and the sha256 of its content.
# The same digest comes from an archive (when a lock or an index is written) and from an SDK
# folder (as installed, or as found on disk), so that an install by parts is checked as
# strictly as a whole one, by sha256 rather than by the archive's CRC-32s.


