"""SDK version strings: parsing, prefixes, the known releases and where each one is published."""

from __future__ import annotations

import itertools
import re
from collections.abc import Collection, Iterable

from qnnctl.errors import UsageError
from qnnctl.records import Record

DEFAULT_VERSION = "2.37.0.250724"


class Release(Record):
    """A published QAIRT release and where it was seen."""

    version: str
    source: str


# Where most rows were seen: the archive at DEFAULT_BASE_URL/<version>/v<version>.zip.
_SOFTWARE_CENTER = "Qualcomm's software center, Qualcomm_AI_Runtime_Community/All/<version>"

# Published QAIRT releases, oldest first. A full version not listed here is still accepted,
# and a prefix (`2.37`) is resolved against what is installed and what the mirror's index
# lists before this table (see `resolve_version`): a release newer than the table is one row,
# and needs no row to be installed by its full version.
KNOWN_RELEASES: tuple[Release, ...] = (
    Release("2.23.0.240624", _SOFTWARE_CENTER),
    Release("2.25.0.240728", _SOFTWARE_CENTER),
    Release("2.26.0.240828", _SOFTWARE_CENTER),
    Release("2.28.0.241029", _SOFTWARE_CENTER + "; also qualcomm_neural_processing_sdk/v<version>.zip"),
    Release("2.28.2.241116", _SOFTWARE_CENTER + "; also qualcomm_neural_processing_sdk/v<version>.zip"),
    Release("2.31.0.250130", _SOFTWARE_CENTER),
    Release("2.32.0.250228", _SOFTWARE_CENTER),
    Release("2.34.0.250424", _SOFTWARE_CENTER + "; pinned by ExecuTorch releases before 1.5"),
    Release("2.36.1.250708", _SOFTWARE_CENTER),
    Release("2.37.0.250724", _SOFTWARE_CENTER + "; pinned by ExecuTorch 1.5 (backends/qualcomm/scripts)"),
    Release("2.38.0.250901", _SOFTWARE_CENTER),
    Release("2.39.0.250926", _SOFTWARE_CENTER),
    Release("2.40.0.251030", _SOFTWARE_CENTER),
    Release("2.42.0.251225", _SOFTWARE_CENTER + "; 1,543,955,191 bytes, 10,910 entries"),
    Release("2.43.0.260128", _SOFTWARE_CENTER),
    Release("2.44.0.260225", _SOFTWARE_CENTER),
    Release("2.45.0.260326", _SOFTWARE_CENTER + "; AI Hub's build 2.45.0.260326154327"),
    Release("2.46.0.260424", _SOFTWARE_CENTER),
    Release("2.47.0.260601", _SOFTWARE_CENTER + "; build 2.47.0.260601114230 in onnxruntime-qnn 2.3.0's "
            "libraries (tests/genuine.py)"),
    Release("2.48.0.260626", _SOFTWARE_CENTER),
    Release("2.48.40.260702", _SOFTWARE_CENTER),
    Release("2.49.0.260730", _SOFTWARE_CENTER),
    Release("2.50.0.260828", _SOFTWARE_CENTER),
    Release("2.51.0.260929", _SOFTWARE_CENTER + "; build 2.51.0.260929181845 in onnxruntime-qnn 2.7.0's "
            "libraries (tests/genuine.py)"),
)
KNOWN_VERSIONS: tuple[str, ...] = tuple(release.version for release in KNOWN_RELEASES)

DEFAULT_BASE_URL = (
    "https://softwarecenter.qualcomm.com/api/download/software/sdks/"
    "Qualcomm_AI_Runtime_Community/All"
)
# Releases up to 2.28 were also published under this older path.
LEGACY_BASE_URL = (
    "https://softwarecenter.qualcomm.com/api/download/software/qualcomm_neural_processing_sdk"
)

_FULL = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d{6})$")
_PREFIX = re.compile(r"^\d+(\.\d+){0,3}$")


class Version(Record):
    major: int
    minor: int
    patch: int
    build: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}.{self.patch}.{self.build:06d}"

    @property
    def major_minor(self) -> tuple[int, int]:
        return (self.major, self.minor)


def parse_version(text: str) -> Version:
    """Parse a full version (`2.37.0.250724`); raise UsageError for anything else."""
    match = _FULL.match(text.strip())
    if match is None:
        raise UsageError(
            f"{text!r} is not an SDK version",
            hint="versions look like 2.37.0.250724 (major.minor.patch.yymmdd); "
            "a prefix such as 2.37 picks the newest release installed or known",
        )
    major, minor, patch, build = match.groups()
    return Version(int(major), int(minor), int(patch), int(build))


def as_typed(spec: str) -> str:
    """A version as a person types it, made plain: spaces around it and a leading `v` dropped
    (`v2.51.0.260929` is how Qualcomm names its archives, and how nvm and others take it)."""
    spec = spec.strip()
    if spec[:1] in ("v", "V") and spec[1:2].isdigit():
        return spec[1:]
    return spec


def is_full_version(text: str) -> bool:
    return _FULL.match(text.strip()) is not None


def is_version_prefix(text: str) -> bool:
    """True for a full version or a prefix of one (`2`, `2.37`, `v2.37.0`)."""
    return _PREFIX.match(as_typed(text)) is not None


def matches_prefix(version: str, prefix: str) -> bool:
    """True when `prefix` names `version` whole components at a time (`2.3` is not `2.37`)."""
    wanted = as_typed(prefix).split(".")
    return version.split(".")[: len(wanted)] == wanted


def resolve_version(spec: str, pools: Iterable[tuple[str, Collection[str]]] = ()) -> str:
    """A full version as given, or the newest release that a prefix (`2.37`) names.

    A prefix is looked up in each of `pools` in turn ((what they are, their versions): what
    is installed, what a mirror holds; read only as far as needed), then in the known
    releases; the first that holds a match decides.
    """
    spec = as_typed(spec)
    if is_full_version(spec):
        return str(parse_version(spec))
    if not _PREFIX.match(spec):
        parse_version(spec)  # raises with the standard message
    looked: list[str] = []
    for what, versions in itertools.chain(pools, [("known releases", KNOWN_VERSIONS)]):
        full = sorted(filter(is_full_version, versions), key=parse_version)
        matches = [v for v in full if matches_prefix(v, spec)]
        if matches:
            return matches[-1]
        if full:
            looked.append(f"{what}: {known_releases(tuple(full)) if versions is KNOWN_VERSIONS else ', '.join(full)}")
    raise UsageError(
        f"no SDK version matches {spec!r}",
        hint="give a full version such as 2.37.0.250724 (a release newer than qnnctl knows is installed by "
        "its full version), or a prefix of one of these: " + " | ".join(looked),
    )


def known_releases(versions: tuple[str, ...], shown: int = 3) -> str:
    """The releases for a hint, short: the newest `shown` in full, then the older release lines
    as the prefixes that name them (`2.48.40.260702, 2.48.0.260626, 2.47.0.260601; older: 2.46,
    2.45, ...`), instead of every version in one wall of text."""
    def line(version: str) -> str:
        return ".".join(version.split(".")[:2])

    ordered = sorted(set(versions), key=parse_version, reverse=True)
    newest = ordered[:shown]
    older = [p for p in dict.fromkeys(line(v) for v in ordered[shown:]) if p not in {line(v) for v in newest}]
    return ", ".join(newest) + (f"; older: {', '.join(older)}" if older else "")


def archive_name(version: str) -> str:
    return f"v{version}.zip"


def archive_urls(version: str, mirror: str | None = None) -> list[str]:
    """Where the archive of `version` is published, in the order to try them."""
    name = archive_name(version)
    if mirror:
        return [f"{mirror.rstrip('/')}/{version}/{name}"]
    urls = [f"{DEFAULT_BASE_URL}/{version}/{name}"]
    if parse_version(version).major_minor <= (2, 28):
        urls.append(f"{LEGACY_BASE_URL}/{name}")
    return urls


_VERSION_IN_TEXT = re.compile(r"(\d+\.\d+\.\d+\.\d{6})")


def version_in(text: str) -> str | None:
    """The first full version that appears in a file name, URL or folder name."""
    match = _VERSION_IN_TEXT.search(text)
    return match.group(1) if match else None
