"""What can go wrong with a request, as qnnctl.net.http raises it and qnnctl.net.retry weighs it:
each raised from its cause (`raise NoAnswer(...) from exc`), which `reason` gives back.
"""

from __future__ import annotations


class RequestError(Exception):
    """A request that brought no answer, or a body that broke off, raised from its cause; `host`
    is the host it was for (to name in words a name that does not resolve)."""

    def __init__(self, message: str, host: str | None = None) -> None:
        super().__init__(message)
        self.host = host

    @property
    def reason(self) -> BaseException | None:
        """What went wrong underneath: the exception this one was raised from."""
        return self.__cause__


class NoConnection(RequestError):
    """No connection: the name, the address, the proxy or TLS failed before anything was sent."""


class NoAnswer(RequestError):
    """The request went out and no answer came: the connection closed, reset or timed out."""


class ProxyFailed(NoConnection):
    """The proxy could not be reached, or refused to open the tunnel."""


class BodyBroke(RequestError):
    """An answer's body stopped short; the message says where and why, in words."""


class BadRequest(RequestError):
    """No request can be made of this URL (a scheme, a host, too many redirects): not retried."""


class UnusableBundle(BadRequest):
    """The CA bundle the environment names cannot be read as certificates."""
