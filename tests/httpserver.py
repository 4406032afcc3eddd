"""A real HTTP server on 127.0.0.1 that serves files with Range support and injects faults.

    with FaultServer() as server:
        server.add("/2.37.0.250724/v2.37.0.250724.zip", data)
        server.fail("/2.37.0.250724/v2.37.0.250724.zip", Fault.status(503), Fault.drop_after(1000))
        url = server.url("/2.37.0.250724/v2.37.0.250724.zip")

Faults queued for a path are used one per request, in order; after that the file is served
normally. Every request is recorded (method, path, headers) for assertions, and so is every
answer's body, in the order the answers began (`served_for`: status, ranges, bytes sent).

Range requests are answered as RFC 9110 says: one range (`bytes=a-b`, `bytes=a-`, the suffix
`bytes=-n`) with 206, several with a multipart/byteranges body, none satisfiable with 416.
`ignore_ranges = True` makes the server answer every Range request with 200 and the whole
file, as some servers do; `rate` (bytes per second, shared by every connection) slows it down
like a network. A file's ETag is strong unless `weak_etags` is set; `last_modified` (an HTTP
date) is sent with every file when set, and `etag_enabled = False` leaves the ETag out.

`FaultServer(tls=self_signed_certificate(folder))` serves HTTPS with a certificate made for
127.0.0.1 at test time; `connections` counts the connections it accepted, handshakes that
failed included.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import defaultdict, deque
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Fault:
    kind: str
    arg: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def status(cls, code: int, retry_after: str | None = None, reason: str | None = None) -> Fault:
        """Answer with this status and an empty body (503, 429, 404, 416, 500...); with `reason`,
        that reason phrase on the status line rather than the usual one."""
        return cls("status", code if reason is None else (code, reason),
                   {"Retry-After": retry_after} if retry_after is not None else {})

    @classmethod
    def raw(cls, answer: bytes) -> Fault:
        """Answer with `answer` as it is, status line and all (or none), then close."""
        return cls("raw", answer)

    @classmethod
    def drop_after(cls, nbytes: int) -> Fault:
        """Promise the whole body, send `nbytes` of it, then close the connection."""
        return cls("drop", nbytes)

    @classmethod
    def ignore_range(cls) -> Fault:
        """Answer a Range request with 200 and the whole file."""
        return cls("ignore_range")

    @classmethod
    def misplaced_range(cls, shift: int) -> Fault:
        """Answer a Range request with 206 and the file from `shift` bytes after the offset asked
        for (before it when negative, never before 0), with a Content-Range that says so."""
        return cls("misplaced_range", shift)

    @classmethod
    def backwards_range(cls, by: int, body: bytes = b"") -> Fault:
        """Answer a Range request with 206, a Content-Range that ends `by` bytes before it starts
        (0: `bytes S-(S-1)/SIZE`, empty) and `body`: an answer that moves nothing forward."""
        return cls("backwards_range", (by, body))

    @classmethod
    def short_range(cls, nbytes: int) -> Fault:
        """Answer a Range request with 206 and only its first `nbytes`, with a Content-Range
        that says so."""
        return cls("short_range", nbytes)

    @classmethod
    def overlong_range(cls, extra: bytes) -> Fault:
        """Answer a Range request with 206 and the Content-Range asked for, but with `extra`
        after the range in the body (and in its Content-Length): more than the range says."""
        return cls("overlong_range", extra)

    @classmethod
    def truncated_range(cls, nbytes: int) -> Fault:
        """Answer a Range request with 206 and the Content-Range asked for, but with only its
        first `nbytes` in the body (and in its Content-Length): an answer that ends, cleanly,
        short of what it says it holds."""
        return cls("truncated_range", nbytes)

    @classmethod
    def html(cls) -> Fault:
        """A login page served with 200."""
        return cls("html")

    @classmethod
    def html_untyped(cls) -> Fault:
        """An HTML page with 200 and a binary Content-Type."""
        return cls("html_untyped")

    @classmethod
    def stall(cls, seconds: float) -> Fault:
        """Wait before answering (to hold a download open)."""
        return cls("stall", seconds)

    @classmethod
    def claim_length(cls, nbytes: int) -> Fault:
        """Announce a Content-Length of `nbytes` (say, more than the disk holds), send the file, close."""
        return cls("claim_length", nbytes)

    @classmethod
    def gate(cls, opened: threading.Event) -> Fault:
        """Hold the answer until the test sets `opened` (to keep a download open on cue)."""
        return cls("gate", opened)

    @classmethod
    def pause(cls, at: int, resume: threading.Event) -> Fault:
        """Send the body's first `at` bytes, then the rest once the test sets `resume`."""
        return cls("pause", (at, resume))

    @classmethod
    def slow(cls, bytes_per_chunk: int, delay: float) -> Fault:
        """Serve the body in small chunks with a delay between them."""
        return cls("slow", (bytes_per_chunk, delay))

    @classmethod
    def unasked_206(cls) -> Fault:
        """Answer a request without Range with 206 and the whole file, as a broken proxy might."""
        return cls("unasked_206")

    @classmethod
    def bare(cls) -> Fault:
        """Send the file with neither Content-Type nor Content-Length: it ends where the
        connection closes."""
        return cls("bare")

    @classmethod
    def endless(cls, block: bytes, limit: int = 64 << 20, status: int = 200,
                headers: dict[str, str] | None = None) -> Fault:
        """Answer `status` (200) with `headers`, no Content-Length and `block` over and over, as a
        server that never stops would; it stops by itself after `limit` bytes, or when the client goes."""
        return cls("endless", (block, limit, status), headers or {})

    @classmethod
    def none(cls) -> Fault:
        """Serve this request normally (to aim a later fault at a later request)."""
        return cls("none")


@dataclass(frozen=True)
class Request:
    method: str
    path: str  # without the query
    # Looked up as a server reads them: a header's name is the same in any case (RFC 9110 5.1);
    # one the request did not send is None.
    headers: Message
    target: str = ""  # as sent: the path with its query


@dataclass(frozen=True)
class Served:
    """One answer: its status, the byte ranges its body held (end exclusive), the bytes sent."""

    path: str
    status: int
    ranges: tuple[tuple[int, int], ...]
    sent: int


def parse_ranges(header: str, size: int) -> list[tuple[int, int]] | None:
    """The satisfiable ranges of a Range header, end exclusive; None when it is not one to
    honour (another unit, a malformed spec: the whole file is sent), [] when none can be."""
    if not header.startswith("bytes="):
        return None
    ranges: list[tuple[int, int]] = []
    for spec in header[6:].split(","):
        first, dash, last = spec.strip().partition("-")
        if not dash or not (first or last) or not (first.isdigit() or not first) or not (last.isdigit() or not last):
            return None
        if not first:  # the last n bytes
            if int(last) > 0 and size > 0:
                ranges.append((max(0, size - int(last)), size))
            continue
        start = int(first)
        if last and int(last) < start:
            return None
        if start < size:
            ranges.append((start, min(int(last) + 1, size) if last else size))
    return ranges


@dataclass(frozen=True)
class Certificate:
    cert: Path  # also the CA bundle that trusts it (REQUESTS_CA_BUNDLE)
    key: Path


def self_signed_certificate(folder: Path) -> Certificate:
    """A self-signed certificate for 127.0.0.1 (its subjectAltName), made with openssl."""
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )
    return Certificate(cert, key)


class _QuietServer(ThreadingHTTPServer):
    tls: ssl.SSLContext | None = None
    connections = 0

    def get_request(self) -> tuple[Any, Any]:
        sock, address = self.socket.accept()
        self.connections += 1
        if self.tls is None:
            return sock, address
        # A failed handshake (a client that does not trust the certificate) raises an
        # OSError here, which the server takes as "no request".
        sock.settimeout(10)
        wrapped = self.tls.wrap_socket(sock, server_side=True)
        wrapped.settimeout(None)
        return wrapped, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that hangs up (a killed qnnctl, a dropped keep-alive) is part of the tests.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class FaultServer:
    def __init__(self, tls: Certificate | None = None) -> None:
        self.files: dict[str, bytes] = {}
        self.content_types: dict[str, str] = {}
        self.faults: dict[str, deque[Fault]] = defaultdict(deque)
        self.requests: list[Request] = []
        self._answers: list[Served | None] = []  # in the order begun; None while being sent
        self._sent: dict[str, int] = defaultdict(int)  # body bytes sent so far, answers in flight included
        self.lock = threading.Lock()
        self._answered = threading.Condition(self.lock)  # notified as each answer is recorded
        self._in_flight: dict[str, int] = defaultdict(int)  # answers begun and not yet recorded
        self.etag_enabled = True
        self.weak_etags = False
        self.last_modified: str | None = None
        self.ignore_ranges = False
        self.rate: float | None = None  # bytes per second for all connections together
        self._next_send = 0.0  # when the shared allowance lets the next block go
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                server._handle(self, head=True)

            def do_GET(self) -> None:
                server._handle(self, head=False)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(tls.cert, tls.key)
            self.httpd.tls = context
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                       daemon=True)

    # -- setup ---------------------------------------------------------------------------

    def __enter__(self) -> FaultServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    @property
    def base(self) -> str:
        host, port = self.httpd.server_address[:2]
        scheme = "https" if self.httpd.tls is not None else "http"
        return f"{scheme}://{host!s}:{port}"

    @property
    def connections(self) -> int:
        return self.httpd.connections

    def url(self, path: str) -> str:
        return self.base + path

    def add(self, path: str, data: bytes, content_type: str = "application/zip") -> str:
        with self.lock:
            self.files[path] = data
            self.content_types[path] = content_type
        return self.url(path)

    def fail(self, path: str, *faults: Fault) -> None:
        with self.lock:
            self.faults[path].extend(faults)

    def requests_for(self, path: str, method: str = "GET") -> list[Request]:
        with self.lock:
            return [r for r in self.requests if r.path == path and r.method == method]

    def bytes_served(self, path: str) -> int:
        """The body bytes sent for `path` so far, answers still being sent included."""
        with self.lock:
            return self._sent[path]

    def served_for(self, path: str, timeout: float = 30) -> list[Served]:
        """The answers for `path`, once those begun are recorded: a client can read a whole body
        before the server thread that sent it records it."""
        with self._answered:
            self._answered.wait_for(lambda: self._in_flight[path] == 0, timeout)
            return [s for s in self._answers if s is not None and s.path == path]

    # -- serving -------------------------------------------------------------------------

    def _handle(self, h: BaseHTTPRequestHandler, head: bool) -> None:
        path = h.path.split("?", 1)[0]
        with self.lock:
            self.requests.append(Request(h.command, path, h.headers, h.path))
            fault = self.faults[path].popleft() if self.faults[path] else None
            data = self.files.get(path)
            ctype = self.content_types.get(path, "application/octet-stream")
        if fault is not None and fault.kind == "stall":
            time.sleep(float(fault.arg))
            fault = None
        if fault is not None and fault.kind == "gate":
            fault.arg.wait(timeout=120)
            fault = None
        if fault is not None and fault.kind == "raw":
            h.close_connection = True
            with contextlib.suppress(OSError):
                h.wfile.write(fault.arg)
            return
        if fault is not None and fault.kind == "status":
            code, reason = fault.arg if isinstance(fault.arg, tuple) else (fault.arg, None)
            self._send_empty(h, int(code), fault.headers, reason)
            return
        if fault is not None and fault.kind in ("html", "html_untyped"):
            body = b"<!DOCTYPE html><html><body>Please log in</body></html>"
            h.send_response(200)
            h.send_header("Content-Type", "text/html; charset=utf-8" if fault.kind == "html"
                          else "application/octet-stream")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            if not head:
                h.wfile.write(body)
            return
        if fault is not None and fault.kind == "endless":
            block, limit, status = fault.arg
            h.send_response(status)
            h.send_header("Content-Type", "application/json")
            for name, value in fault.headers.items():
                h.send_header(name, value)
            h.end_headers()
            h.close_connection = True
            sent = 0
            with contextlib.suppress(OSError):
                while not head and sent < limit:
                    h.wfile.write(block)
                    sent += len(block)
                    self._count(path, len(block))  # what bytes_served says, as for any answer
            return
        if data is None:
            self._send_empty(h, 404, {})
            return
        etag = f'"{hash(data) & 0xFFFFFFFF:x}-{len(data)}"'
        if self.weak_etags:
            etag = "W/" + etag
        start, end = 0, len(data)
        status = 200
        range_header = h.headers.get("Range")
        if_range = h.headers.get("If-Range")
        honour_range = range_header is not None and not (fault is not None and fault.kind == "ignore_range") \
            and not self.ignore_ranges
        if honour_range and if_range is not None and self.etag_enabled and if_range != etag:
            honour_range = False  # the file changed: send all of it
        spans = parse_ranges(range_header, len(data)) if honour_range and range_header is not None else None
        if spans == []:
            self._record(self._begin(path), path, 416, (), 0)  # before the client can see it
            self._send_empty(h, 416, {"Content-Range": f"bytes */{len(data)}"})
            return
        if spans and fault is not None and fault.kind == "backwards_range":
            by, body = fault.arg
            first = spans[0][0]
            self._record(self._begin(path), path, 206, (), len(body))
            h.send_response(206)
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(len(body)))
            h.send_header("Content-Range", f"bytes {first}-{first - 1 - by}/{len(data)}")
            h.end_headers()
            if not head:
                h.wfile.write(body)
            return
        if spans is not None and len(spans) > 1:
            self._send_multipart(h, path, data, spans, ctype, etag, head)
            return
        if spans is not None:
            (start, end), = spans
            if fault is not None and fault.kind == "misplaced_range":
                start = min(max(0, start + int(fault.arg)), end)
            if fault is not None and fault.kind == "short_range":
                end = min(end, start + int(fault.arg))
            status = 206
        if spans is None and fault is not None and fault.kind == "unasked_206":
            status = 206
        body = data[start:end]
        if status == 206 and fault is not None and fault.kind == "overlong_range":
            body += bytes(fault.arg)
        if status == 206 and fault is not None and fault.kind == "truncated_range":
            body = body[: int(fault.arg)]
        claimed = int(fault.arg) if fault is not None and fault.kind == "claim_length" else len(body)
        slot = -1 if head else self._begin(path)
        bare = fault is not None and fault.kind == "bare"
        h.send_response(status)
        if not bare:
            h.send_header("Content-Type", ctype)
            h.send_header("Content-Length", str(claimed))
        h.send_header("Accept-Ranges", "bytes")
        if self.etag_enabled:
            h.send_header("ETag", etag)
        if self.last_modified is not None:
            h.send_header("Last-Modified", self.last_modified)
        if status == 206:
            h.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        h.end_headers()
        if head:
            return
        sent = 0
        try:
            if fault is not None and fault.kind == "drop":
                h.wfile.write(body[: int(fault.arg)])
                sent = min(len(body), int(fault.arg))
                h.wfile.flush()
                h.close_connection = True
                # Abort the socket so the client sees a short body, not a clean close.
                h.connection.shutdown(socket.SHUT_RDWR)
                return
            if bare or (fault is not None and fault.kind == "claim_length"):
                h.wfile.write(body)
                sent = len(body)
                h.wfile.flush()
                h.close_connection = True
                return
            if fault is not None and fault.kind == "pause":
                at, resume = fault.arg
                for part in (body[:at], body[at:]):
                    h.wfile.write(part)
                    sent += len(part)
                    h.wfile.flush()
                    resume.wait(timeout=120)
                return
            if fault is not None and fault.kind == "slow":
                chunk, delay = fault.arg
                for i in range(0, len(body), chunk):
                    h.wfile.write(body[i : i + chunk])
                    sent += len(body[i : i + chunk])
                    h.wfile.flush()
                    time.sleep(delay)
                return
            view = memoryview(body)
            block = 1 << 20 if self.rate is None else 64 << 10
            for i in range(0, len(body), block):
                piece = view[i : i + block]
                self._throttle(len(piece))
                h.wfile.write(piece)
                sent += len(piece)
                self._count(path, len(piece))
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            counted = sent if (fault is None or fault.kind not in ("drop", "claim_length", "slow", "pause")) else 0
            self._record(slot, path, status, ((start, start + sent),) if sent else (), sent, counted)

    def _record(self, slot: int, path: str, status: int, ranges: tuple[tuple[int, int], ...], sent: int,
                counted: int | None = None) -> None:
        """The answer begun in `slot` is done; `counted` of its `sent` bytes were counted as
        they went."""
        with self._answered:
            self._answers[slot] = Served(path, status, ranges, sent)
            self._sent[path] += sent - (counted if counted is not None else 0)
            self._in_flight[path] -= 1
            self._answered.notify_all()

    def _begin(self, path: str) -> int:
        """An answer with a body starts: its slot keeps the answers in the order they began
        (the client may send its next request before this one is recorded), and served_for
        waits for its record."""
        with self.lock:
            self._in_flight[path] += 1
            self._answers.append(None)
            return len(self._answers) - 1

    def _count(self, path: str, size: int) -> None:
        with self.lock:
            self._sent[path] += size

    def _throttle(self, size: int) -> None:
        """Wait until `size` more bytes fit in the rate shared by every connection."""
        if self.rate is None:
            return
        with self.lock:
            now = time.monotonic()
            due = max(self._next_send, now)
            self._next_send = due + size / self.rate
        if due > now:
            time.sleep(due - now)

    def _send_multipart(self, h: BaseHTTPRequestHandler, path: str, data: bytes, spans: list[tuple[int, int]],
                        ctype: str, etag: str, head: bool) -> None:
        """Several ranges in one multipart/byteranges body (RFC 9110, section 14.6)."""
        boundary = "qnnctl-test-boundary"
        parts = []
        for start, end in spans:
            head_lines = (f"--{boundary}\r\nContent-Type: {ctype}\r\n"
                          f"Content-Range: bytes {start}-{end - 1}/{len(data)}\r\n\r\n")
            parts.append(head_lines.encode() + data[start:end] + b"\r\n")
        body = b"".join(parts) + f"--{boundary}--\r\n".encode()
        slot = -1 if head else self._begin(path)
        h.send_response(206)
        h.send_header("Content-Type", f"multipart/byteranges; boundary={boundary}")
        h.send_header("Content-Length", str(len(body)))
        h.send_header("Accept-Ranges", "bytes")
        if self.etag_enabled:
            h.send_header("ETag", etag)
        h.end_headers()
        if head:
            return
        sent = 0
        try:
            h.wfile.write(body)
            sent = len(body)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            self._record(slot, path, 206, tuple(spans), sent)

    def _send_empty(self, h: BaseHTTPRequestHandler, status: int, headers: dict[str, str],
                    reason: str | None = None) -> None:
        h.send_response(status, reason)
        for key, value in headers.items():
            h.send_header(key, value)
        h.send_header("Content-Length", "0")
        h.end_headers()
