"""A mirror's index.json read in the tests' own process from the loopback server, with its limits:
a size cap, a deadline for the whole body and a nesting limit, each refused with a message before
anything is parsed or fetched; and the nesting measured without parsing (test_fleet reads honest
indexes, test_door runs `qnnctl install` against an endless and a deep one)."""

from __future__ import annotations

import gzip
import json
import logging
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


# -- an index sent encoded: decoded here, in bounded steps ---------------------------------------


class Encoded:
    """A loopback server whose /index.json is `body` with the Content-Encoding `encoding` (none
    when None), whatever the request asked; it records the Accept-Encoding each request sent."""

    def __init__(self) -> None:
        self.body = b""
        self.encoding: str | None = None
        self.asked: list[str | None] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                owner.asked.append(self.headers.get("Accept-Encoding"))
                self.send_response(200)
                if owner.encoding is not None:
                    self.send_header("Content-Encoding", owner.encoding)
                self.send_header("Content-Length", str(len(owner.body)))
                self.end_headers()
                try:
                    self.wfile.write(owner.body)
                except OSError:
                    pass  # the reader stopped early

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def serve(self, body: bytes, encoding: str | None) -> None:
        self.body, self.encoding = body, encoding


@pytest.fixture
def encoded() -> Iterator[Encoded]:
    srv = Encoded()
    threading.Thread(target=srv.httpd.serve_forever, daemon=True).start()
    try:
        yield srv
    finally:
        srv.httpd.shutdown()
        srv.httpd.server_close()


def _zlib(data: bytes) -> bytes:
    return zlib.compress(data, 9)


@pytest.mark.parametrize(("encoding", "encode"), [
    (None, bytes), ("identity", bytes), ("", bytes), (" Identity ", bytes),
    ("gzip", gzip.compress), ("x-gzip", gzip.compress), (" GZIP ", gzip.compress), ("deflate", _zlib),
    ("gzip", _zlib), ("deflate", gzip.compress),  # whichever header the server's bytes start with
])
def test_an_index_is_read_as_its_server_encoded_it(encoded: Encoded, encoding: str | None,
                                                  encode: Callable[[bytes], bytes]) -> None:
    body = _index(padding="x" * 200_000)  # a body of several blocks, encoded or not
    encoded.serve(encode(body), encoding)
    assert read_index(encoded.base) == {"2.37.0.250724": {"sha256": SHA}}
    assert encoded.asked == ["identity"]  # asked unencoded, and decoded whatever came


@pytest.mark.parametrize("encoding", ["br", "compress", "gzip, br", "zstd"])
def test_an_index_encoded_otherwise_than_qnnctl_reads_is_refused(encoded: Encoded, encoding: str) -> None:
    encoded.serve(_index(), encoding)
    with pytest.raises(IntegrityError) as raised:
        read_index(encoded.base)
    assert str(raised.value) == (f"the mirror's {encoded.base}/index.json came encoded as {encoding!r}, which qnnctl "
                                 "did not ask for; nothing was fetched")
    assert raised.value.hint == "serve index.json unencoded, or check QNNCTL_MIRROR"


@pytest.mark.parametrize("extra", [0, 1])
def test_an_encoded_index_is_capped_by_its_decoded_size(encoded: Encoded, extra: int) -> None:
    """An index that gzips to little is held to the cap by what it decodes to: read at the cap,
    refused one byte past it."""
    body = _padded(INDEX_MAX_BYTES + extra)
    assert len(body) == INDEX_MAX_BYTES + extra
    encoded.serve(gzip.compress(body), "gzip")
    if not extra:
        assert read_index(encoded.base) == {"2.37.0.250724": {"sha256": SHA}}
        return
    with pytest.raises(IntegrityError) as raised:
        read_index(encoded.base)
    assert str(raised.value) == (f"the mirror's {encoded.base}/index.json is larger than 8 MiB, which no index "
                                 "qnnctl writes is; nothing was fetched")
    assert raised.value.hint == HINT


def test_an_index_that_inflates_far_past_the_cap_is_refused_in_bounded_memory(encoded: Encoded) -> None:
    """About 100 KB of gzip that inflates to 96 MiB: each block is inflated only as far as the cap
    leaves room for, so that what this process holds stays near the cap (the first 64 KiB block
    inflated whole would be some 64 MiB; a gigabyte would be no different)."""
    bomb = gzip.compress(b'{"schema": 1, "versions": {' + b" " * (96 << 20), compresslevel=9)
    encoded.serve(bomb, "gzip")
    tracemalloc.start()
    try:
        with pytest.raises(IntegrityError) as raised:
            read_index(encoded.base)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert str(raised.value) == (f"the mirror's {encoded.base}/index.json is larger than 8 MiB, which no index "
                                 "qnnctl writes is; nothing was fetched")
    assert peak < 3 * INDEX_MAX_BYTES

