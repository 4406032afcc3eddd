"""The one door: wherever an SDK's bytes come from, what was observed of them meets everything
expected of them here, and only here (qnnctl.sdk.gate holds the rules).

Two moments, the same for every way in (a whole download, `--file`, by parts, the fallback from
parts to the whole archive, the archive `qnnctl lock` and `mirror` read):
- `admit_archive`: the whole archive's sha256 and size, as hashed while it arrived, before a
  byte of it is read as a zip, against whoever pins the whole archive;
- `admit_tree`: once it is extracted, each component's digest over exactly what was written
  (and the central directory's sha256), against everything expected; a source whose sha256
  matched but whose component digests do not contradicts itself, and is refused too.
The digests `admit_tree` computed are the ones the manifest then records: nothing is hashed twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from qnnctl.sdk.cache import MANIFEST_NAME
from qnnctl.sdk.gate import Expected, Observed, check
from qnnctl.sdk.members import tree_digests


def admit_archive(expected: Sequence[Expected], shown: str, sha256: str, size: int | None = None) -> None:
    """The whole archive, hashed as it arrived, against those that pin the whole archive;
    IntegrityError (exit 4) unless it matches."""
    check([e for e in expected if e.sha256 is not None], Observed(shown, sha256, size))


def observed_tree(root: Path, files: Mapping[str, str], shown: str, sha256: str | None = None,
                  size: int | None = None, directory: str | None = None) -> Observed:
    """What the gate sees of an extraction: each component's digest over what was written."""
    return Observed(shown, sha256, size, tree_digests(root, files, skip={MANIFEST_NAME}), directory)


def admit_tree(expected: Sequence[Expected], root: Path, files: Mapping[str, str], shown: str,
               sha256: str | None = None, size: int | None = None, directory: str | None = None) -> Observed:
    """An extraction (the tree at `root`, `files` the sha256 of each file as written) against
    everything expected of it; what was observed, for the manifest to record."""
    seen = observed_tree(root, files, shown, sha256, size, directory)
    check(expected, seen)
    return seen


def admit_listing(expected: Sequence[Expected], shown: str, sha256: str, size: int,
                  components: Mapping[str, str], directory: str | None) -> None:
    """An archive read whole without being installed (`qnnctl lock`, `qnnctl mirror`), its
    components' digests taken from its members: as an extraction would be checked."""
    check(expected, Observed(shown, sha256, size, components, directory))
