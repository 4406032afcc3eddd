"""SDK version strings: parsing, prefixes, the known releases and where each one is published."""

from __future__ import annotations

import re
from typing import NamedTuple

from qnnctl.errors import UsageError

DEFAULT_VERSION = "2.37.0.250724"

# Published QAIRT releases, oldest first. A full version not listed here is still accepted;
# this list is what a prefix such as `2.37` is resolved against.
KNOWN_VERSIONS: tuple[str, ...] = (
    "2.23.0.240624",
    "2.25.0.240728",
    "2.26.0.240828",
    "2.28.0.241029",
    "2.28.2.241116",
    "2.31.0.250130",
    "2.32.0.250228",
    "2.34.0.250424",
    "2.36.1.250708",
    "2.37.0.250724",
    "2.38.0.250901",
    "2.40.0.251030",
    "2.43.0.260128",
    "2.45.0.260326",
    "2.46.0.260424",
    "2.47.0.260601",
    "2.48.0.260626",
    "2.48.40.260702",
)

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


class Version(NamedTuple):
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
            "a prefix such as 2.37 picks the newest known release",
        )
    major, minor, patch, build = match.groups()
    return Version(int(major), int(minor), int(patch), int(build))


def is_full_version(text: str) -> bool:
    return _FULL.match(text.strip()) is not None


def is_version_prefix(text: str) -> bool:
    """True for a full version or a prefix of one (`2`, `2.37`, `2.37.0`)."""
    return _PREFIX.match(text.strip()) is not None


def matches_prefix(version: str, prefix: str) -> bool:
    """True when `prefix` names `version` whole components at a time (`2.3` is not `2.37`)."""
    wanted = prefix.strip().split(".")
    return version.split(".")[: len(wanted)] == wanted


def resolve_version(spec: str) -> str:
    """A full version as given, or the newest known release that a prefix (`2.37`) names."""
    spec = spec.strip()
    if is_full_version(spec):
        return str(parse_version(spec))
    if not _PREFIX.match(spec):
        parse_version(spec)  # raises with the standard message
    matches = [v for v in KNOWN_VERSIONS if matches_prefix(v, spec)]
    if not matches:
        raise UsageError(
            f"no known SDK version matches {spec!r}",
            hint="give a full version such as 2.37.0.250724, or a prefix of a known release: "
            + known_releases(KNOWN_VERSIONS),
        )
    return max(matches, key=parse_version)


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
