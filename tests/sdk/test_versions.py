"""Version strings: parsing, prefixes, known releases and archive URLs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from qnnctl.errors import EXIT_USAGE, UsageError
from qnnctl.sdk.versions import (
    DEFAULT_BASE_URL,
    DEFAULT_VERSION,
    KNOWN_RELEASES,
    KNOWN_VERSIONS,
    LEGACY_BASE_URL,
    Version,
    archive_urls,
    is_full_version,
    is_version_prefix,
    matches_prefix,
    parse_version,
    resolve_version,
    version_in,
)


def test_parse_full_version() -> None:
    assert parse_version("2.37.0.250724") == Version(2, 37, 0, 250724)
    assert str(parse_version(" 2.48.40.260702 ")) == "2.48.40.260702"
    assert parse_version("2.48.40.260702") > parse_version("2.48.0.260626")


@pytest.mark.parametrize("text", ["", "2.37", "2.37.0", "2.37.0.25072", "v2.37.0.250724", "2.37.0.250724x",
                                  "latest", "2.37.0.250724.1"])
def test_parse_rejects_anything_else(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_version(text)
    assert caught.value.exit_code == EXIT_USAGE
    assert "2.37.0.250724" in (caught.value.hint or "")


def test_known_versions_are_full_sorted_and_hold_the_default() -> None:
    assert all(is_full_version(v) for v in KNOWN_VERSIONS)
    assert list(KNOWN_VERSIONS) == sorted(KNOWN_VERSIONS, key=parse_version)
    assert DEFAULT_VERSION == "2.37.0.250724"
    assert DEFAULT_VERSION in KNOWN_VERSIONS


@pytest.mark.parametrize(("spec", "expected"), [
    ("2.37", "2.37.0.250724"),
    ("2.28", "2.28.2.241116"),  # the newest of two 2.28 releases
    ("2.28.0", "2.28.0.241029"),
    ("2.48", "2.48.40.260702"),  # 40 > 0 as numbers, not as text
    ("2", "2.51.0.260929"),
    ("2.51", "2.51.0.260929"),
    ("2.37.0.250724", "2.37.0.250724"),
    ("v2.51.0.260929", "2.51.0.260929"),  # as Qualcomm names its archives (v2.51.0.260929.zip)
    ("v2.37", "2.37.0.250724"),
    (" V2.34 ", "2.34.0.250424"),
    ("2.99.0.990101", "2.99.0.990101"),  # a full version need not be known
    (" 2.34 ", "2.34.0.250424"),
])
def test_resolve_version(spec: str, expected: str) -> None:
    assert resolve_version(spec) == expected


@pytest.mark.parametrize("spec", ["2.99", "2.3", "3", "banana", "2.37.x", "", "2..37", "v", "vv2.37", "v 2.37"])
def test_resolve_version_rejects(spec: str) -> None:
    with pytest.raises(UsageError):
        resolve_version(spec)


def test_known_releases_cite_their_source() -> None:
    assert KNOWN_VERSIONS == tuple(release.version for release in KNOWN_RELEASES)
    assert all(release.source for release in KNOWN_RELEASES)
    # The genuine builds the tests run on are releases the table knows.
    assert {"2.47.0.260601", "2.51.0.260929"} <= set(KNOWN_VERSIONS)


def test_a_prefix_is_looked_up_in_each_pool_before_the_known_releases() -> None:
    installed = ("installed", {"2.51.0.260929", "2.52.1.261101", "2.52.0.261001"})
    mirrored = ("the mirror's index.json", ["2.53.0.261201", "2.37.0.250101"])
    assert resolve_version("2.52", [installed, mirrored]) == "2.52.1.261101"
    assert resolve_version("v2.53", [installed, mirrored]) == "2.53.0.261201"
    # The first pool with a match decides, even over a newer known release.
    assert resolve_version("2.37", [installed, mirrored]) == "2.37.0.250101"
    assert resolve_version("2.51", [installed, mirrored]) == "2.51.0.260929"
    assert resolve_version("2.48", [installed, mirrored]) == "2.48.40.260702"


def test_pools_are_read_only_as_far_as_needed() -> None:
    read: list[str] = []

    def pools() -> Iterator[tuple[str, list[str]]]:
        read.append("installed")
        yield "installed", ["2.52.0.261001"]
        read.append("mirror")
        yield "the mirror", ["2.53.0.261201"]

    assert resolve_version("2.52", pools()) == "2.52.0.261001"
    assert read == ["installed"]
    assert resolve_version("2.37.0.250724", pools()) == "2.37.0.250724"
    assert read == ["installed"]  # a full version reads none


def test_an_unknown_prefix_names_every_pool_looked_in() -> None:
    with pytest.raises(UsageError) as caught:
        resolve_version("2.99", [("installed", {"2.52.0.261001"}), ("the mirror's index.json", []),
                                 ("stores", {"not-a-version"})])
    hint = caught.value.hint or ""
    assert "installed: 2.52.0.261001 | known releases: 2.51.0.260929, " in hint
    assert "mirror" not in hint  # nothing there to name
    assert "stores" not in hint
    assert "installed by its full version" in hint


def test_prefix_matches_whole_components() -> None:
    assert matches_prefix("2.37.0.250724", "2.37")
    assert matches_prefix("2.37.0.250724", "2.37.0.250724")
    assert not matches_prefix("2.37.0.250724", "2.3")
    assert not matches_prefix("2.37.0.250724", "2.37.0.2")
    assert is_version_prefix("2.37")
    assert is_version_prefix("2")
    assert is_version_prefix("v2.51")
    assert matches_prefix("2.51.0.260929", "v2.51")
    assert not is_version_prefix("2.37.")
    assert not is_version_prefix("abc")


def test_archive_urls() -> None:
    assert archive_urls("2.37.0.250724") == [f"{DEFAULT_BASE_URL}/2.37.0.250724/v2.37.0.250724.zip"]
    assert DEFAULT_BASE_URL.startswith("https://softwarecenter.qualcomm.com/api/download/software/sdks/")
    # Releases up to 2.28 were also published under the older path.
    assert archive_urls("2.28.2.241116") == [
        f"{DEFAULT_BASE_URL}/2.28.2.241116/v2.28.2.241116.zip",
        f"{LEGACY_BASE_URL}/v2.28.2.241116.zip",
    ]
    assert archive_urls("2.37.0.250724", "http://127.0.0.1:9/m/") == [
        "http://127.0.0.1:9/m/2.37.0.250724/v2.37.0.250724.zip"
    ]


def test_version_in() -> None:
    assert version_in("v2.37.0.250724.zip") == "2.37.0.250724"
    assert version_in("qairt/2.34.0.250424") == "2.34.0.250424"
    assert version_in("sdk-2.28.2.241116") == "2.28.2.241116"
    assert version_in("qairt-latest.zip") is None


def test_the_hint_of_an_unknown_prefix_is_short() -> None:
    """The newest releases in full, the older ones as the prefixes that name them: not every
    version in one wall of text."""
    from qnnctl.sdk.versions import known_releases, resolve_version

    assert known_releases(("2.37.0.250724", "2.36.1.250708", "2.48.0.260626", "2.48.40.260702", "2.28.0.241029",
                           "2.28.2.241116"), shown=2) == "2.48.40.260702, 2.48.0.260626; older: 2.37, 2.36, 2.28"
    assert known_releases(("2.37.0.250724",)) == "2.37.0.250724"
    with pytest.raises(UsageError) as caught:
        resolve_version("2.99")
    assert caught.value.hint is not None
    assert caught.value.hint.startswith("give a full version such as 2.37.0.250724 (a release newer than qnnctl "
                                        "knows is installed by its full version), or a prefix of one of these: "
                                        "known releases: ")
    assert "; older: " in caught.value.hint
    assert len(caught.value.hint) < 340
