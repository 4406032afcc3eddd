"""HTTP/1.1 on the standard library: the one session every request of qnnctl goes through.

`http.client` and `ssl` are what a download needs, and all it loads: requests and urllib3 were
about 60 ms of every install's start from a cold page cache (bench/README.md), for a client that
asks for one file at a time. What they did for qnnctl is here, each in a few lines:

- proxies from the environment (`HTTPS_PROXY`, `HTTP_PROXY`, `ALL_PROXY`, lower case first, and
  `NO_PROXY`), an `https://` URL through a CONNECT tunnel, a proxy's password sent as Basic;
- the CA bundle from `REQUESTS_CA_BUNDLE` or `CURL_CA_BUNDLE` (a file or a folder), else
  certifi's, as requests chose;
- a URL's `user:password@` and `~/.netrc` (or `$NETRC`) as Basic, never sent on to another host
  a redirect names, nor in the clear after TLS;
- redirects followed (at most MAX_REDIRECTS), relative ones too;
- one kept-alive connection per session, reopened when the server has closed it; a body left
  unread closes it (what is left of it is never read as the next answer);
- a body held to its Content-Length;
- a connect timeout and a read timeout apart;
- each request retried by a `Policy` (qnnctl.net.retry): what failed before an answer came, and
  the statuses it lists; the last answer comes back when the policy is spent.

A failure is a `RequestError` (qnnctl.net.failures) raised from its cause; qnnctl.net.retry.describe
puts it in words.
Bodies are the bytes sent (`Accept-Encoding: identity`), never decoded here.
"""

from __future__ import annotations

import base64
import functools
import http.client
import ipaddress
import netrc
import os
import ssl
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, quote, unquote, urljoin, urlsplit

from qnnctl.net.failures import BadRequest, BodyBroke, NoAnswer, NoConnection, ProxyFailed, RequestError, UnusableBundle
from qnnctl.records import Record

if TYPE_CHECKING:
    from qnnctl.net.retry import Policy

CONNECT_TIMEOUT = 15.0  # seconds to connect (and, through a proxy, to open the tunnel)
READ_TIMEOUT = 60.0  # seconds for each read
MAX_REDIRECTS = 30  # what requests allowed
REDIRECTS = frozenset({301, 302, 303, 307, 308})
_SAFE = "!#$%&'()*+,/:;=?@[]~"  # what a URL's path and query keep as they are; the rest is %-quoted
# Proxy variables in the order they are looked up for a scheme: the scheme's own, then ALL_PROXY;
# of each, the lower-case name wins (as requests and curl read them).
_PROXY_NAMES = {"http": ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"),
                "https": ("https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY")}


class Target(Record):
    """Where one request goes: the URL's parts, and the proxy in between (None: directly)."""

    scheme: str
    host: str
    port: int
    path: str  # with its query
    auth: str | None  # the Authorization header the URL's userinfo or .netrc gives
    proxy: Proxy | None


class Proxy(Record):
    host: str
    port: int
    auth: str | None  # the Proxy-Authorization header


class Settings:
    """What the environment says about reaching a URL: proxies, NO_PROXY, the CA bundle, .netrc."""

    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        # The variable that names the CA bundle, if one does, to say which one when it cannot be used.
        self.ca_variable = next((name for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE") if environ.get(name)), None)
        self.ca_bundle = environ[self.ca_variable] if self.ca_variable is not None else None
        no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY")
        self.no_proxy = [entry.strip().lower() for entry in no_proxy.split(",") if entry.strip()] if no_proxy else []

    def proxy_url(self, url: str) -> str | None:
        """The proxy a request for `url` goes through, as the environment names it; None: directly."""
        return self._proxy_url(urlsplit(url))

    def _proxy_url(self, parts: SplitResult) -> str | None:
        host = parts.hostname  # in lower case
        for name in _PROXY_NAMES.get(parts.scheme.lower(), ()):
            value = self.environ.get(name)
            if value:
                return None if host is None or self.bypasses(host, parts.port) else value
        return None

    def bypasses(self, host: str, port: int | None) -> bool:
        """Whether NO_PROXY covers `host`: `*`, the name, a domain it is in (`.example.com` or
        `example.com`), `host:port`, or a network it is an address of (`10.0.0.0/8`)."""
        address = _address(host)
        for entry in self.no_proxy:
            if entry == "*":
                return True
            name = entry.removeprefix("*").removeprefix(".")
            if host == name or host.endswith("." + name) or (port is not None and f"{host}:{port}" == entry):
                return True
            if address is not None and "/" in entry:
                try:
                    if address in ipaddress.ip_network(entry, strict=False):
                        return True
                except ValueError:
                    continue
        return False

    def netrc_auth(self, host: str) -> str | None:
        """Basic credentials for `host` from $NETRC, else ~/.netrc; None when it names none, or
        cannot be read (as requests and curl treat it)."""
        found = self._netrc.authenticators(host) if self._netrc is not None else None
        if not found:
            return None
        login, _, password = found
        return _basic(login or "", password or "")

    @functools.cached_property
    def _netrc(self) -> netrc.netrc | None:
        """The .netrc file, read once for all the session's requests and redirects."""
        path = self.environ.get("NETRC") or str(Path(self.environ.get("HOME") or Path.home()) / ".netrc")
        try:
            return netrc.netrc(path)
        except (OSError, netrc.NetrcParseError):
            return None

    def target(self, url: str) -> Target:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https"):
            raise BadRequest(f"qnnctl speaks http:// and https://, not {scheme or 'a URL without a scheme'}")
        try:
            port = parts.port or (443 if scheme == "https" else 80)
        except ValueError:
            raise BadRequest(f"the URL's port {_port_text(parts.netloc)} is not a port number (0 to 65535)") from None
        host = parts.hostname
        if not host:
            raise BadRequest("the URL names no host")
        # Quoted as requests quoted it: a space typed as it is becomes %20, a %XX stays as it is.
        path = quote(parts.path or "/", safe=_SAFE) + (f"?{quote(parts.query, safe=_SAFE)}" if parts.query else "")
        auth = _userinfo_auth(parts)
        if auth is None:
            auth = self.netrc_auth(host)
        proxy_url = self._proxy_url(parts)
        return Target(scheme, host, port, path, auth, _proxy(proxy_url) if proxy_url is not None else None)


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)  # as urlsplit gives it: an IPv6 one without its brackets
    except ValueError:
        return None


def _port_text(netloc: str) -> str:
    """The port as a URL spells it: what follows the last colon (never a password, which an "@" ends)."""
    return netloc.rpartition(":")[2]


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _userinfo_auth(parts: SplitResult) -> str | None:
    """Basic credentials from a URL's `user:password@` (either part may be missing), or None."""
    if parts.username is None and parts.password is None:
        return None
    return _basic(unquote(parts.username or ""), unquote(parts.password or ""))


def _proxy(url: str) -> Proxy:
    parts = urlsplit(url if "://" in url else f"http://{url}")  # `proxy:3128` is a proxy too, as curl takes it
    if parts.scheme.lower() != "http":
        raise BadRequest(f"qnnctl reaches proxies over http://, not {parts.scheme}:// (the proxy named in the "
                         "environment)")
    try:
        port = parts.port or 80
    except ValueError:
        raise BadRequest(f"the proxy's port {_port_text(parts.netloc)} is not a port number (0 to 65535)") from None
    if not parts.hostname:
        raise BadRequest("the proxy named in the environment names no host")
    return Proxy(parts.hostname, port, _userinfo_auth(parts))


@functools.lru_cache(maxsize=8)
def tls_context(bundle: str | None) -> ssl.SSLContext:
    """A verifying context trusting `bundle` (a file or a folder of certificates), else certifi's."""
    if bundle is None:
        import certifi  # lazy: only an https:// URL pays for its 280 KB of certificates

        return ssl.create_default_context(cafile=certifi.where())
    if os.path.isdir(bundle):
        return ssl.create_default_context(capath=bundle)
    return ssl.create_default_context(cafile=bundle)


class Response:
    """An answer: its status, reason and headers, and its body read with `read1` as it arrives.

    Closing it before the body is read to its end closes the connection too: what is left of
    the body is not read (it may never end), and the connection cannot carry another request.
    """

    retries: Policy | None = None  # what is left of the policy after this request (the session sets it)

    def __init__(self, raw: http.client.HTTPResponse, session: Session, url: str) -> None:
        self.raw = raw
        self.session = session
        self.url = url  # the URL that answered, after any redirect
        self.status = raw.status
        self.reason = raw.reason
        self.headers = raw.headers

    def read1(self, size: int = -1) -> bytes:
        """What has arrived of the body, at most `size` bytes; b"" at its end. A body that ends
        before its Content-Length is BodyBroke (http.client's read1 would end it quietly)."""
        try:
            data = self.raw.read1(size)
        except (OSError, http.client.HTTPException) as exc:
            self.session.drop()
            raise BodyBroke(f"the body broke off: {exc!r}") from exc
        if not data and size != 0 and self.raw.length:  # (a HEAD's answer has a length of 0)
            short = http.client.IncompleteRead(b"", self.raw.length)
            raise BodyBroke(f"the body broke off: {short!r}") from short
        return data

    def close(self) -> None:
        # read1 leaves a body read to its Content-Length open (read would close it): it is complete.
        if not self.raw.isclosed() and self.raw.length != 0:  # the body was not read to its end
            self.session.drop()
        self.raw.close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class Session:
    """Requests of one thread, over one kept-alive connection at a time."""

    def __init__(self, user_agent: str, environ: Mapping[str, str] | None = None) -> None:
        self.settings = Settings(os.environ if environ is None else environ)
        # Ask for the bytes as stored: a transparently gzipped body would break Range offsets.
        self.headers = {"User-Agent": user_agent, "Accept-Encoding": "identity", "Accept": "*/*"}
        self._open: _Open | None = None

    def get(self, url: str, headers: Mapping[str, str] | None = None,
            timeout: tuple[float, float] = (CONNECT_TIMEOUT, READ_TIMEOUT), policy: Policy | None = None,
            redirects: bool = True) -> Response:
        return self.request("GET", url, headers, timeout, policy, redirects)

    def head(self, url: str, timeout: tuple[float, float] = (CONNECT_TIMEOUT, READ_TIMEOUT)) -> Response:
        return self.request("HEAD", url, None, timeout, None, redirects=False)

    def request(self, method: str, url: str, headers: Mapping[str, str] | None, timeout: tuple[float, float],
                policy: Policy | None, redirects: bool) -> Response:
        """The answer to `method url`, redirects followed, each hop retried by `policy`."""
        sent = dict(headers or {})
        target = self.settings.target(url)
        auth = target.auth
        for _ in range(MAX_REDIRECTS + 1):
            response = self._retried(method, url, target, auth, sent, timeout, policy)
            location = response.headers.get("Location")
            if not redirects or response.status not in REDIRECTS or not location:
                return response
            response.close()
            policy = response.retries
            following = urljoin(url, location.strip())
            nxt = self.settings.target(following)
            if (nxt.host, nxt.port) != (target.host, target.port) or (target.scheme, nxt.scheme) == ("https", "http"):
                # A password goes to the host it was given for, and never in the clear after TLS.
                auth = nxt.auth
            url, target = following, nxt
        raise BadRequest(f"more than {MAX_REDIRECTS} redirects")

    def _retried(self, method: str, url: str, target: Target, auth: str | None, headers: dict[str, str],
                 timeout: tuple[float, float], policy: Policy | None) -> Response:
        while True:
            try:
                response = self._once(method, url, target, auth, headers, timeout)
            except RequestError as exc:
                if policy is None or isinstance(exc, BadRequest):
                    raise
                policy = policy.increment(error=exc)  # GaveUp when spent
                policy.sleep()
                continue
            response.retries = policy
            if policy is None or not policy.is_retry(method, response.status):
                return response
            try:
                spent = policy.increment(response=response)
            except RequestError:  # spent: the last answer is the caller's to report
                return response
            response.close()
            spent.sleep(response)
            policy = spent

    def _once(self, method: str, url: str, target: Target, auth: str | None, headers: dict[str, str],
              timeout: tuple[float, float]) -> Response:
        sent = {**self.headers, **headers}
        if auth is not None:
            sent["Authorization"] = auth
        proxy = target.proxy
        tunnel = proxy is not None and target.scheme == "https"
        if proxy is not None and not tunnel:
            # Through a proxy, an http:// request names the whole URL (without its userinfo).
            path = f"http://{_netloc(target.host, target.port)}{target.path}"
            if proxy.auth is not None:
                sent["Proxy-Authorization"] = proxy.auth
        else:
            path = target.path
        opened = self._connect(target, timeout)
        reused = opened.used
        try:
            opened.connection.request(method, path, headers=sent)
            raw = opened.connection.getresponse()
        except (OSError, http.client.HTTPException, ValueError) as exc:  # ValueError: a header it will not send
            self.drop()
            if reused and isinstance(exc, (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError)):
                # A kept-alive connection the server closed while it idled: once more, on a new one.
                return self._once(method, url, target, auth, headers, timeout)
            if isinstance(exc, (http.client.InvalidURL, ValueError)):
                raise BadRequest(f"no request can be made of that URL: {exc}") from exc
            raise NoAnswer(f"no answer: {exc!r}") from exc
        opened.used = True
        return Response(raw, self, url)

    def _connect(self, target: Target, timeout: tuple[float, float]) -> _Open:
        """The connection to `target`: the one open, else a new one."""
        proxy = target.proxy
        key = (target.scheme, target.host, target.port, proxy)
        if self._open is not None and self._open.key == key and self._open.connection.sock is not None:
            return self._open
        self.drop()
        connect, read = timeout
        connection: http.client.HTTPConnection
        if target.scheme == "https":
            context = self._tls_context()
            if proxy is not None:
                connection = http.client.HTTPSConnection(proxy.host, proxy.port, timeout=connect, context=context)
                connection.set_tunnel(target.host, target.port,
                                      headers={"Proxy-Authorization": proxy.auth} if proxy.auth else None)
            else:
                connection = http.client.HTTPSConnection(target.host, target.port, timeout=connect, context=context)
        elif proxy is not None:
            connection = http.client.HTTPConnection(proxy.host, proxy.port, timeout=connect)
        else:
            connection = http.client.HTTPConnection(target.host, target.port, timeout=connect)
        try:
            connection.connect()
        except (OSError, http.client.HTTPException) as exc:
            connection.close()
            if proxy is not None and not isinstance(exc, ssl.SSLError):
                # The proxy's name is the one that did not resolve, its address the one that refused.
                raise ProxyFailed(f"cannot reach {target.host} through the proxy {proxy.host}:{proxy.port}: {exc!r}",
                                  proxy.host) from exc
            raise NoConnection(f"cannot connect to {target.host}: {exc!r}", target.host) from exc
        assert connection.sock is not None
        connection.sock.settimeout(read)
        self._open = _Open(connection, key)
        return self._open

    def _tls_context(self) -> ssl.SSLContext:
        bundle = self.settings.ca_bundle
        try:
            return tls_context(bundle)
        except OSError as exc:  # ssl.SSLError too: a file that holds no certificate
            if bundle is None:
                named = "certifi's CA bundle"
            else:
                named = f"the CA bundle {bundle} ({self.settings.ca_variable})"
            raise UnusableBundle(f"{named} cannot be used: {exc.strerror or exc}") from None

    def drop(self) -> None:
        """Close the connection: the next request opens another."""
        if self._open is not None:
            self._open.connection.close()
        self._open = None

    def close(self) -> None:
        self.drop()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class _Open:
    """A session's connection, where it leads, and whether it has carried an answer (then the
    server may have closed it since, while it idled)."""

    used = False

    def __init__(self, connection: http.client.HTTPConnection, key: tuple[object, ...]) -> None:
        self.connection = connection
        self.key = key


def _netloc(host: str, port: int) -> str:
    """`host:port` in an http:// URL: an IPv6 address in brackets, the default port left out."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 80 else f"{shown}:{port}"

