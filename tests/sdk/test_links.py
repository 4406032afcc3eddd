"""`qnnctl link`'s record of an SDK folder someone else unpacked, in the tests' own process: what
it is linked as, what it refuses and with which words (test_fleet.py has it through the command
line)."""

from __future__ import annotations

import calendar
import json
import logging
import re
import shutil
import time
from pathlib import Path

import pytest

import qnnctl
from qnnctl.errors import IntegrityError, UsageError
from qnnctl.sdk.cache import Cache
from qnnctl.sdk.stores import LINK_SCHEMA, Link, dangling_link_error, link_sdk, read_link
from tests.sdkfactory import OTHER_VERSION, VERSION, SdkSpec, build_sdk_tree

BUILD = f"v{VERSION}101010"


def test_a_folder_is_linked_as_what_its_libraries_say_and_a_second_link_replaces_the_first(
        tmp_path: Path, far_from_utc: None) -> None:
    cache = Cache(tmp_path / "cache")
    first = build_sdk_tree(tmp_path / "a" / "qairt", SdkSpec(build_id=BUILD))
    second = build_sdk_tree(tmp_path / "b" / "qairt", SdkSpec(build_id=BUILD))
    before = time.time()
    link, previous = link_sdk(first, None, cache, {})
    assert previous is None
    assert (link.version, link.root, link.build_id, link.record) == (
        VERSION, first, BUILD[1:], cache.root / "links" / f"{VERSION}.json")
    record = json.loads(link.record.read_text(encoding="utf-8"))
    assert record["schema"] == LINK_SCHEMA
    assert (record["version"], record["root"], record["build_id"]) == (VERSION, str(first), BUILD[1:])
    assert record["qnnctl_version"] == qnnctl.__version__
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["linked_at"]), record["linked_at"]
    stamped = calendar.timegm(time.strptime(record["linked_at"], "%Y-%m-%dT%H:%M:%SZ"))
    assert int(before) - 1 <= stamped <= time.time() + 1  # UTC, now
    assert link.linked_at == record["linked_at"]

    again, replaced = link_sdk(second, None, cache, {})
    assert replaced == Link(VERSION, first, BUILD[1:], link.record, link.linked_at)
    assert read_link(cache, VERSION) == again


def test_a_folder_in_the_cache_is_not_linked(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    inside = build_sdk_tree(cache.sdks / VERSION, SdkSpec(build_id=BUILD))
    with pytest.raises(UsageError) as caught:
        link_sdk(inside, None, cache, {})
    assert (caught.value.message, caught.value.hint) == (
        f"{inside} is in qnnctl's cache already; there is nothing to link", "`qnnctl list` shows what is installed")


def test_a_version_other_than_the_libraries_build_is_refused(tmp_path: Path) -> None:
    folder = build_sdk_tree(tmp_path / "qairt", SdkSpec(build_id=BUILD))
    with pytest.raises(IntegrityError) as caught:
        link_sdk(folder, OTHER_VERSION, Cache(tmp_path / "cache"), {})
    assert (caught.value.message, caught.value.hint) == (
        f"{folder} holds SDK {VERSION} (its libraries are build {BUILD[1:]}), not {OTHER_VERSION}",
        f"link it as what it is: `qnnctl link {folder} --version {VERSION}`, or without --version")


def test_labels_that_disagree_with_the_libraries_are_each_named(tmp_path: Path) -> None:
    """sdk.yaml and the folder's name both say another version than the libraries' build."""
    folder = build_sdk_tree(tmp_path / OTHER_VERSION, SdkSpec(version=OTHER_VERSION, build_id=BUILD))
    with pytest.raises(IntegrityError) as caught:
        link_sdk(folder, None, Cache(tmp_path / "cache"), {})
    assert (caught.value.message, caught.value.hint) == (
        f"{folder}: its libraries are build {BUILD[1:]} (SDK {VERSION}), but sdk.yaml says {OTHER_VERSION} and "
        f"the folder name says {OTHER_VERSION}",
        f"to link it as what its libraries are: `qnnctl link {folder} --version {VERSION}`")
    # Told what it is, it is linked as that.
    link, _ = link_sdk(folder, VERSION, Cache(tmp_path / "cache"), {})
    assert link.version == VERSION


def test_a_folder_that_names_no_version_anywhere_needs_one(tmp_path: Path) -> None:
    folder = build_sdk_tree(tmp_path / "qairt", SdkSpec(sdk_yaml=False))
    with pytest.raises(UsageError) as caught:
        link_sdk(folder, None, Cache(tmp_path / "cache"), {})
    assert (caught.value.message, caught.value.hint) == (
        f"cannot tell the SDK version of {folder}: its libraries carry no build id, and neither sdk.yaml nor the "
        "folder's name names one", f"give it: `qnnctl link {folder} --version VERSION`")
    link, _ = link_sdk(folder, VERSION, Cache(tmp_path / "cache"), {})
    assert (link.version, link.build_id) == (VERSION, None)


def test_a_version_also_in_the_cache_is_linked_and_said_to_wait_for_the_cache_copy(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cache = Cache(tmp_path / "cache")
    (build_sdk_tree(cache.sdks / VERSION, SdkSpec(build_id=BUILD)) / ".qnnctl.json").write_text("{}")
    folder = build_sdk_tree(tmp_path / "qairt", SdkSpec(build_id=BUILD))
    with caplog.at_level(logging.WARNING, logger="qnnctl.sdk.stores"):
        link, _ = link_sdk(folder, None, cache, {})
    assert link == read_link(cache, VERSION)
    assert [record.getMessage() for record in caplog.records] == [
        f"SDK {VERSION} is also in qnnctl's cache ({cache.sdks / VERSION}), which comes first; the link is used "
        "once that copy is uninstalled"]


def test_a_link_whose_folder_is_gone_is_an_error_that_says_what_to_do(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    folder = build_sdk_tree(tmp_path / "qairt", SdkSpec(build_id=BUILD))
    link_sdk(folder, None, cache, {})
    assert dangling_link_error(VERSION, cache) is None
    shutil.rmtree(folder / "lib")
    error = dangling_link_error(VERSION, cache)
    assert error is not None
    assert (error.version, error.message, error.hint, error.args) == (
        VERSION, f"SDK {VERSION} is linked to {folder}, which is gone (or is no SDK root any more)",
        f"link its new place with `qnnctl link PATH`, drop the link with `qnnctl uninstall {VERSION}`, or install "
        f"a copy: `qnnctl install {VERSION}`", (error.message,))
    assert dangling_link_error(OTHER_VERSION, cache) is None


@pytest.mark.parametrize("record", [
    {"version": "2.37", "root": "/opt/qairt"},
    {"version": 2.37, "root": "/opt/qairt"},
    {"root": "/opt/qairt"},
    {"version": VERSION, "root": 7},
    {"version": VERSION},
    [VERSION, "/opt/qairt"],
], ids=["a prefix", "a number", "no version", "a root that is no path", "no root", "no table"])
def test_a_record_that_names_no_full_version_and_folder_is_no_link(record: object, tmp_path: Path) -> None:
    cache = Cache(tmp_path / "cache")
    path = cache.root / "links" / f"{VERSION}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(record), encoding="utf-8")
    assert read_link(cache, VERSION) is None
    path.write_text(json.dumps({"version": VERSION, "root": "/opt/qairt", "build_id": 7, "linked_at": 3}),
                    encoding="utf-8")
    assert read_link(cache, VERSION) == Link(VERSION, Path("/opt/qairt"), None, path, None)  # what is no text: none
