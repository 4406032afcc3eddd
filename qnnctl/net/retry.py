"""What a failed request means: whether trying again can help, and what happened, in words.

`Policy` decides what is tried again, how often, and how long to wait first: the session
(qnnctl.net.http) asks it of each request, and the downloader again after a body breaks off.
qnnctl.net.download declares the policy's numbers.
"""

from __future__ import annotations

import dataclasses
import email.utils
import http.client
import logging
import socket
import ssl
import time
from collections.abc import Callable
from email.message import Message
from typing import Any, Protocol

from qnnctl.net.failures import BodyBroke, NoConnection, RequestError
from qnnctl.net.urls import redact_text
from qnnctl.words import printable

log = logging.getLogger("qnnctl.net.download")

# getaddrinfo's answers for a name that does not exist. EAI_AGAIN ("temporary failure in
# name resolution", a resolver that cannot be reached right now) is worth another try.
_NO_SUCH_HOST = frozenset(
    code for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)


class Answer(Protocol):
    """What the policy reads of an answer (qnnctl.net.http.Response)."""

    @property
    def status(self) -> int: ...

    @property
    def reason(self) -> str: ...

    @property
    def headers(self) -> Message: ...


class GaveUp(RequestError):
    """The policy's last word: `attempts` requests were made (one: retrying cannot help)."""

    def __init__(self, attempts: int) -> None:
        super().__init__(f"gave up after {attempts} attempt{'s' if attempts != 1 else ''}")
        self.attempts = attempts


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """What is tried again, and when: a failure before an answer, or an answer whose status is
    in `statuses`, to a request whose method is in `methods`, while `total` retries are left
    (and, for a connection that could not be made, `connect` of them, when it is set).

    - a failure that the next attempt would meet again (a name that does not resolve, a
      certificate that is not trusted) ends it at once;
    - the wait before retry n is `backoff_factor * 2**(n-1)`, at most `backoff_max`;
    - a Retry-After is honoured, 0 included, up to `backoff_max` (a request, not an order);
    - the wait goes through `sleeper`, and each retry is logged in words, naming `shown`.

    A policy is a value: `increment` returns the one for the next attempt.
    """

    total: int
    statuses: frozenset[int]
    methods: frozenset[str]
    backoff_factor: float
    backoff_max: float
    sleeper: Callable[[float], None]
    shown: str  # the URL, redacted, for messages
    connect: int | None = None
    failures: int = 0  # attempts that failed so far

    def new(self, **changes: Any) -> Policy:
        return dataclasses.replace(self, **changes)

    def start(self, shown: str) -> Policy:
        """This policy from its first attempt, for requests of the URL shown as `shown` (asked of
        the policy as declared, it is the whole budget)."""
        return self.new(failures=0, shown=shown)

    @property
    def attempts(self) -> int:
        """The number of the attempt this policy is used for (1 for the first)."""
        return self.failures + 1

    def is_retry(self, method: str, status: int) -> bool:
        """Whether an answer with `status` to `method` is worth another request."""
        return method in self.methods and status in self.statuses

    def get_backoff_time(self) -> float:
        if self.failures == 0:
            return 0.0
        return float(min(self.backoff_max, self.backoff_factor * 2 ** (self.failures - 1)))

    def wait(self, response: Answer | None = None) -> float:
        if response is not None:
            asked = retry_after(response.headers.get("Retry-After"))
            if asked is not None:
                return float(min(asked, self.backoff_max))
        return self.get_backoff_time()

    def sleep(self, response: Answer | None = None) -> None:
        self.sleeper(self.wait(response))

    def increment(self, response: Answer | None = None, error: BaseException | None = None) -> Policy:
        """The policy for the next attempt after this one failed (`error`) or was answered with a
        status worth retrying (`response`); GaveUp when no attempt is left or none can help."""
        if error is not None and not worth_retrying(error):
            raise GaveUp(self.attempts) from error
        # What a failure like this one has left: the total, and for a connection not made, `connect` too.
        connect, left = self.connect, self.total - 1
        if isinstance(error, NoConnection) and connect is not None:
            connect -= 1
            left = min(left, connect)
        if left < 0:
            raise GaveUp(self.attempts) from error
        new = self.new(total=self.total - 1, failures=self.failures + 1, connect=connect)
        log.warning("%s; retrying in %.1fs (attempt %d of %d)", self.failure(response, error),
                    new.wait(response), new.attempts, new.attempts + left)
        return new

    def failure(self, response: Answer | None, error: BaseException | None) -> str:
        """What went wrong with one attempt, in words."""
        if isinstance(error, BodyBroke):
            return str(error)
        if error is not None:
            return f"cannot reach {self.shown}: {describe(error)}"
        if response is not None:
            return f"{self.shown} answered {answered(response.status, response.reason)}"
        return f"the request for {self.shown} failed"


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or an HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    now = time.time() if now is None else now
    return max(0.0, when.timestamp() - now)


def answered(status: int, reason: str | None) -> str:
    """`HTTP 403 Forbidden`: a status with the reason phrase the server sent, escaped (its words
    reach a terminal); the status alone when there is none (an unregistered code)."""
    return f"HTTP {status} {printable(reason or '')}".rstrip()


def causes(exc: BaseException) -> list[BaseException]:
    """`exc` and what it was raised from, outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__
    return chain


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
    rather than the layers of messages wrapped around it.
    URLs in it are redacted, and control characters escaped: a line the server sent in place of
    HTTP's (http.client's BadStatusLine) is the server's text."""
    chain = causes(error)
    inner = chain[-1]
    text = str(inner).strip()
    if isinstance(inner, ssl.SSLCertVerificationError):
        words = f"the server's certificate is not trusted: {text}"
    elif isinstance(inner, ssl.SSLError):
        words = f"TLS failed: {text}"
    elif isinstance(inner, socket.gaierror):
        host = next((link.host for link in chain if isinstance(link, RequestError) and link.host), None)
        words = f"the host name {host} cannot be resolved ({text})" if host else \
            f"a host name cannot be resolved ({text})"
    elif isinstance(inner, ConnectionRefusedError):
        words = f"the connection was refused ({text})"
    elif isinstance(inner, http.client.RemoteDisconnected):  # a ConnectionResetError too
        words = "the server closed the connection without answering"
    elif isinstance(inner, ConnectionResetError):
        words = f"the connection was reset ({text})"
    elif isinstance(inner, http.client.IncompleteRead):
        short = f"{inner.expected} bytes " if inner.expected is not None else ""
        words = f"the server closed the connection {short}before the end it announced"
    elif isinstance(inner, TimeoutError):
        words = f"no answer in time ({text})" if text else "no answer in time"
    else:
        words = text or type(inner).__name__
    return printable(redact_text(" ".join(words.split())))
