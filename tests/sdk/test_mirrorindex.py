"""A mirror's index.json read in the tests' own process from the loopback server, with its limits:
a size cap, a deadline for the whole body and a nesting limit, each refused with a message before
anything is parsed or fetched; and the nesting measured without parsing (test_fleet reads honest
indexes, test_door runs `qnnctl install` against an endless and a deep one)."""

from __future__ import annotations

import json
import logging

import pytest

from qnnctl.errors import DownloadError, IntegrityError
from qnnctl.sdk import mirrorindex
from qnnctl.sdk.limits import nesting_depth as json_depth
from qnnctl.sdk.mirrorindex import INDEX_MAX_BYTES, INDEX_MAX_DEPTH, MirrorIndex, read_index
from tests.httpserver import Fault, FaultServer

SHA = "a" * 64
HINT = "write the index again with `qnnctl mirror DIR VERSION`, or check QNNCTL_MIRROR"


@pytest.mark.parametrize(("text", "depth"), [
    ("", 0), ("1", 0), ("{}", 1), ("[]", 1), ("[[]]", 2), ("[][][]", 1), ('{"a": [1, {"b": []}]}', 4),
    ("[[[]]][[]]", 3), ("]]]][", 1), ("]][[[]]]", 3),  # a stray closing bracket takes nothing off what follows
    ('"[[["', 0), ('["{{{"]', 1), ('"a\\"[[" [', 1),  # brackets in strings, an escaped quote among them
    ('"\\\\" [[', 2), ('"\\\\\\"[" [', 1),  # an escaped backslash escapes not the quote after it
    ('"abc', 0), ('"ab\\', 0), ('[ "ab\\', 1),  # strings without end
    ('["]", [', 2), ('{"k}": {"v{": []}}', 3),
])
def test_the_depth_of_json_is_measured_without_parsing_it(text: str, depth: int) -> None:
    assert json_depth(text) == depth


def test_a_depth_is_that_of_the_deepest_branch() -> None:
    assert json_depth("[" * 40 + "]" * 40 + "[[]]") == 40
    assert json_depth('{"a": ' + "[" * 5 + "]" * 5 + ', "b": [[[]]]}') == 6


def _index(padding: str = "", versions: dict[str, object] | None = None, nested: object = None) -> bytes:
    data: dict[str, object] = {"schema": 1, "versions": versions or {"2.37.0.250724": {"sha256": SHA}}}
    if padding:
        data["pad"] = padding
    if nested is not None:
        data["nested"] = nested
    return json.dumps(data).encode()


def _nested(levels: int) -> object:
    value: object = []
    for _ in range(levels - 1):
        value = [value]
    return value


def test_an_index_as_deep_as_the_limit_is_read(server: FaultServer) -> None:
    server.add("/index.json", _index(nested=_nested(INDEX_MAX_DEPTH - 1)), content_type="application/json")
    assert json_depth(_index(nested=_nested(INDEX_MAX_DEPTH - 1)).decode()) == INDEX_MAX_DEPTH == 16
    assert read_index(server.base) == {"2.37.0.250724": {"sha256": SHA}}


def test_an_index_deeper_than_the_limit_is_refused(server: FaultServer) -> None:
    server.add("/index.json", _index(nested=_nested(INDEX_MAX_DEPTH)), content_type="application/json")
    with pytest.raises(IntegrityError) as raised:
        read_index(server.base)
    assert str(raised.value) == (f"the mirror's {server.base}/index.json nests deeper than 16 levels, which no index "
                                 "qnnctl writes does; nothing was fetched")
    assert raised.value.hint == HINT


def test_brackets_in_an_index_strings_nest_nothing(server: FaultServer) -> None:
    server.add("/index.json", _index(padding="[" * 1000), content_type="application/json")
    assert read_index(server.base) == {"2.37.0.250724": {"sha256": SHA}}


def _padded(total: int) -> bytes:
    body = _index(padding="x")
    return _index(padding="x" * (total - len(body) + 1))


def test_an_index_of_the_size_cap_is_read(server: FaultServer) -> None:
    body = _padded(INDEX_MAX_BYTES)
    assert len(body) == INDEX_MAX_BYTES == 8 << 20
    server.add("/index.json", body, content_type="application/json")
    assert read_index(server.base) == {"2.37.0.250724": {"sha256": SHA}}


@pytest.mark.parametrize("endless", [False, True])
def test_an_index_larger_than_the_cap_is_refused_once_it_is_read_that_far(server: FaultServer,
                                                                        endless: bool) -> None:
    if endless:
        server.add("/index.json", b"")
        server.fail("/index.json", Fault.endless(b'{"schema": 1, "versions": {' + b" " * 65536))
    else:
        server.add("/index.json", _padded(INDEX_MAX_BYTES + 1), content_type="application/json")
    with pytest.raises(IntegrityError) as raised:
        read_index(server.base)
    assert str(raised.value) == (f"the mirror's {server.base}/index.json is larger than 8 MiB, which no index "
                                 "qnnctl writes is; nothing was fetched")
    assert raised.value.hint == HINT
    assert server.bytes_served("/index.json") < INDEX_MAX_BYTES + (8 << 20)  # it stopped reading


def test_an_index_that_does_not_arrive_in_time_is_refused(server: FaultServer,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mirrorindex, "INDEX_DEADLINE", 1.0)
    server.add("/index.json", _index(padding="x" * 400), content_type="application/json")
    server.fail("/index.json", Fault.slow(20, 0.1))  # about 2.5 s for the whole body
    with pytest.raises(DownloadError) as raised:
        read_index(server.base)
    assert str(raised.value) == (f"the mirror's {server.base}/index.json did not arrive whole within 1 s; "
                                 "nothing was fetched")
    assert raised.value.hint == "check the mirror's server, or QNNCTL_MIRROR"


def test_a_slow_index_within_the_deadline_is_read(server: FaultServer) -> None:
    server.add("/index.json", _index(), content_type="application/json")
    server.fail("/index.json", Fault.slow(20, 0.02))
    assert read_index(server.base) == {"2.37.0.250724": {"sha256": SHA}}


def test_an_index_that_is_not_utf8_is_not_used(server: FaultServer, caplog: pytest.LogCaptureFixture) -> None:
    server.add("/index.json", _index(padding="x").replace(b"x", b"\xff"), content_type="application/json")
    with caplog.at_level(logging.WARNING):
        assert read_index(server.base) is None
    assert any("the archive is not checked against it" in m for m in caplog.messages)


def test_a_mirror_without_an_index_is_asked_for_it_once(server: FaultServer) -> None:
    index = MirrorIndex(server.base)
    assert index.versions() is None
    assert index.expected("2.37.0.250724") is None
    assert index.expected("2.37.0.250724") is None
    assert len(server.requests_for("/index.json")) == 1
    assert index.where == f"{server.base}/index.json"
