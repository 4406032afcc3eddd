"""What a failed request means: whether trying again can help, and what happened, in words.

`Policy` is urllib3's `Retry` (status lists, Retry-After, backoff, counting), mounted on the
download session so that urllib3 retries a request itself, and also asked by the downloader
after a body breaks off. qnnctl.net.download declares the policy's numbers.

Imported only when a request is made: it imports urllib3.
"""

from __future__ import annotations

import http.client
import logging
import re
import socket
import ssl
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Any

from urllib3.exceptions import (
    IncompleteRead,
    InvalidHeader,
    MaxRetryError,
    NameResolutionError,
    ProtocolError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout
from urllib3.util.retry import Retry

from qnnctl.net.urls import redact_text
from qnnctl.words import printable

if TYPE_CHECKING:
    from typing_extensions import Self
    from urllib3.connectionpool import ConnectionPool
    from urllib3.response import BaseHTTPResponse

log = logging.getLogger("qnnctl.net.download")

# getaddrinfo's answers for a name that does not exist. EAI_AGAIN ("temporary failure in
# name resolution", a resolver that cannot be reached right now) is worth another try.
_NO_SUCH_HOST = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)
# "<urllib3.connection.HTTPSConnection object at 0x7f..>: " and "HTTPSConnectionPool(host=
# 'h', port=443): ", which urllib3 puts before its messages.
_URLLIB3_PREFIX = re.compile(r"^(?:<[^>]*>|\w+ConnectionPool\([^)]*\)):\s*")


class GaveUp(MaxRetryError):
    """The policy's last word: `attempts` requests were made (one: retrying cannot help)."""

    def __init__(self, pool: ConnectionPool | None, url: str | None, reason: Exception,
                 attempts: int) -> None:
        super().__init__(pool, url, reason)  # type: ignore[arg-type]
        self.attempts = attempts


class BodyBroke(ProtocolError):
    """A response's body stopped short; the message says where and why, in words."""


class Policy(Retry):
    """urllib3's Retry, and the little qnnctl needs beyond it:

    - a failure that the next attempt would meet again (a name that does not resolve, a
      certificate that is not trusted) ends it at once, where urllib3 would retry it;
    - the wait before retry n is `backoff_factor * 2**(n-1)`: urllib3 retries the first
      failure at once, which a restarting mirror answers with the same 503;
    - a Retry-After is honoured, 0 included (urllib3 takes 0 for "none"), up to `backoff_max`;
    - the wait goes through `sleeper`, and each retry is logged in words, naming `shown`.
    """

    # Carried over by `new`, which urllib3 calls for every retry.
    sleeper: Callable[[float], None] = time.sleep
    shown: str = ""  # the URL, redacted, for messages

    def new(self, **kw: Any) -> Self:
        fresh = super().new(**kw)
        fresh.sleeper = self.sleeper
        fresh.shown = self.shown
        return fresh

    def start(self, shown: str) -> Policy:
        """The whole budget, for requests of the URL shown as `shown`."""
        fresh = self.new(history=())
        fresh.shown = shown
        return fresh

    @property
    def attempts(self) -> int:
        """The number of the attempt this policy is used for (1 for the first)."""
        return len(self.history) + 1

    def get_backoff_time(self) -> float:
        failures = len(self.history)
        if failures == 0:
            return 0.0
        return float(min(self.backoff_max, self.backoff_factor * 2 ** (failures - 1)))

    def wait(self, response: BaseHTTPResponse | None = None) -> float:
        if response is not None and self.respect_retry_after_header:
            try:
                asked = self.get_retry_after(response)
            except InvalidHeader:
                asked = None
            if asked is not None:
                # A server's Retry-After is a request, not an order.
                return float(min(asked, self.backoff_max))
        return self.get_backoff_time()

    def sleep(self, response: BaseHTTPResponse | None = None) -> None:
        self.sleeper(self.wait(response))

    def increment(
        self,
        method: str | None = None,
        url: str | None = None,
        response: BaseHTTPResponse | None = None,
        error: Exception | None = None,
        _pool: ConnectionPool | None = None,
        _stacktrace: TracebackType | None = None,
    ) -> Self:
        if error is not None and not worth_retrying(error):
            raise GaveUp(_pool, url, error, self.attempts) from error
        try:
            new = super().increment(method, url, response, error, _pool, _stacktrace)
        except MaxRetryError as exc:
            raise GaveUp(_pool, url, exc.reason or Exception("no more retries"), self.attempts) from exc
        left = new.left_for(response, error)
        of = f" of {new.attempts + left}" if left is not None else ""
        log.warning("%s; retrying in %.1fs (attempt %d%s)", self.failure(response, error),
                    new.wait(response), new.attempts, of)
        return new

    def left_for(self, response: BaseHTTPResponse | None, error: Exception | None) -> int | None:
        """How many more attempts a failure like this one may have: the fewest of the total and
        the budget of its kind (urllib3 counts connect, read, status and other failures apart);
        None when nothing limits them."""
        if error is None:
            kind = self.status
        elif self._is_connection_error(error):  # urllib3's own sorting, which increment() used
            kind = self.connect
        elif self._is_read_error(error):
            kind = self.read
        else:
            kind = self.other
        limits = [n for n in (self.total, kind) if isinstance(n, int) and not isinstance(n, bool)]
        return max(min(limits), 0) if limits else None

    def failure(self, response: BaseHTTPResponse | None, error: BaseException | None) -> str:
        """What went wrong with one attempt, in words."""
        if isinstance(error, BodyBroke):
            return str(error)
        if error is not None:
            return f"cannot reach {self.shown}: {describe(error)}"
        if response is not None:
            return f"{self.shown} answered {answered(response.status, response.reason)}"
        return f"the request for {self.shown} failed"


def answered(status: int, reason: str | None) -> str:
    """`HTTP 403 Forbidden`: a status with the reason phrase the server sent, escaped (its words
    reach a terminal); the status alone when there is none (an unregistered code)."""
    return f"HTTP {status} {printable(reason or '')}".rstrip()


class _OwnRetriesFilter(logging.Filter):
    """Drops urllib3's "Retrying (Policy(...)) after connection broken by '...': /path?query"
    for qnnctl's own requests: Policy.increment has said it in words, with the URL redacted."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        return not (isinstance(args, tuple) and args and isinstance(args[0], Policy))


_OWN_RETRIES = _OwnRetriesFilter()


def quiet_urllib3_retries() -> None:
    """Install the filter above (once); other users of urllib3 keep its messages."""
    pool_log = logging.getLogger("urllib3.connectionpool")
    if _OWN_RETRIES not in pool_log.filters:
        pool_log.addFilter(_OWN_RETRIES)


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it wraps, outermost first. requests and urllib3 nest the real cause in
    `args`, in `reason` and in `__cause__`."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = _wrapped(current)
    return chain


def _wrapped(exc: BaseException) -> BaseException | None:
    for candidate in (getattr(exc, "reason", None), getattr(exc, "original_error", None),
                      *exc.args, exc.__cause__):
        if isinstance(candidate, BaseException):
            return candidate
    return None


def worth_retrying(error: BaseException) -> bool:
    """False for a failure that the same request would meet again."""
    for link in causes(error):
        if isinstance(link, socket.gaierror) and link.errno in _NO_SUCH_HOST:
            return False
        if isinstance(link, ssl.SSLCertVerificationError):
            return False
    return True


def unknown_host(error: BaseException) -> bool:
    return any(isinstance(link, socket.gaierror) and link.errno in _NO_SUCH_HOST
               for link in causes(error))


def untrusted_certificate(error: BaseException) -> bool:
    return any(isinstance(link, ssl.SSLCertVerificationError) for link in causes(error))


def refused(error: BaseException) -> bool:
    """True when nothing listens at the address: a connection refused."""
    return any(isinstance(link, ConnectionRefusedError) for link in causes(error))


def attempts_made(error: BaseException) -> int:
    """How many requests the policy made before `error` ended them (1 when it was not asked)."""
    return next((link.attempts for link in causes(error) if isinstance(link, GaveUp)), 1)


def describe(error: BaseException) -> str:
    """The innermost cause of a failed request, whole and on one line, in words where the
    bare exception says little: `the connection was refused ([Errno 111] Connection refused)`
    rather than `HTTPConnectionPool(...): Max retries exceeded with url: ... (Caused by ...)`.
    URLs in it are redacted, and control characters escaped: a line the server sent in place of
    HTTP's (http.client's BadStatusLine) is the server's text."""
    chain = causes(error)
    inner = chain[-1]
    text = _URLLIB3_PREFIX.sub("", str(inner)).strip()
    if isinstance(inner, ssl.SSLCertVerificationError):
        words = f"the server's certificate is not trusted: {text}"
    elif isinstance(inner, ssl.SSLError):
        words = f"TLS failed: {text}"
    elif isinstance(inner, socket.gaierror):
        host = next((link._host for link in chain if isinstance(link, NameResolutionError)), None)
        words = f"the host name {host} cannot be resolved ({text})" if host else \
            f"a host name cannot be resolved ({text})"
    elif isinstance(inner, ConnectionRefusedError):
        words = f"the connection was refused ({text})"
    elif isinstance(inner, ConnectionResetError):
        words = f"the connection was reset ({text})"
    elif isinstance(inner, http.client.RemoteDisconnected):
        words = "the server closed the connection without answering"
    elif isinstance(inner, IncompleteRead):
        words = f"the server closed the connection {inner.expected} bytes before the end it announced"
    elif isinstance(inner, http.client.IncompleteRead):
        short = f"{inner.expected} bytes " if inner.expected is not None else ""
        words = f"the server closed the connection {short}before the end it announced"
    elif isinstance(inner, (Urllib3Timeout, TimeoutError)):
        words = f"no answer in time ({text})" if text else "no answer in time"
    else:
        words = text or type(inner).__name__
    return printable(redact_text(" ".join(words.split())))
