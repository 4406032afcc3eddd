"""qnnctl's HTTP session on real loopback servers: proxies and their tunnels, NO_PROXY, the CA
bundle, credentials and where they are sent, redirects, kept-alive connections, bodies held to
their length."""

from __future__ import annotations

import base64
import contextlib
import http.client
import os
import socket
import ssl
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest

from qnnctl.net.download import make_session, retry_policy
from qnnctl.net.failures import BadRequest, BodyBroke, NoAnswer, NoConnection, ProxyFailed, RequestError, UnusableBundle
from qnnctl.net.http import MAX_REDIRECTS, Session, Settings
from qnnctl.net.retry import GaveUp, causes, describe, refused
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer, self_signed_certificate

# http.client, ssl, netrc and urllib.parse are the standard library's, and differ between Pythons.
pytestmark = pytest.mark.stdlib

DATA = bytes(range(256)) * 64
E = TypeVar("E", bound=BaseException)
PATH = "/v.zip"


def caused(error: E, cause: BaseException) -> E:
    """`error` as `raise error from cause` leaves it."""
    error.__cause__ = cause
    return error


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def _get(session: Session, url: str, **kwargs: object) -> bytes:
    with session.get(url, **kwargs) as response:  # type: ignore[arg-type]
        assert response.status == 200, response.status
        body = bytearray()
        while piece := response.read1(1 << 16):
            body += piece
        return bytes(body)


@pytest.fixture
def direct(monkeypatch: pytest.MonkeyPatch) -> None:
    """No proxy, whatever the tests' environment sets up."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


class Loopback:
    """A server of its own on 127.0.0.1: each connection answered by `answer`, in a thread."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self.answer, args=(client,), daemon=True).start()

    def answer(self, client: socket.socket) -> None:
        raise NotImplementedError

    def close(self) -> None:
        self.listener.close()

    def __enter__(self) -> Loopback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class ConnectProxy(Loopback):
    """A proxy on 127.0.0.1 that opens CONNECT tunnels (and nothing else), as a corporate one
    does: it asks for `credentials` when given, and records each request line and its headers."""

    def __init__(self, credentials: str | None = None, refuse: bool = False) -> None:
        self.credentials = credentials
        self.refuse = refuse
        super().__init__()

    def answer(self, client: socket.socket) -> None:
        with client:
            line, headers = _request_head(client)
            self.seen.append((line, headers))
            method, target, _ = line.split(" ", 2)
            if self.refuse or method != "CONNECT":
                client.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
                return
            if self.credentials is not None and headers.get("Proxy-Authorization") != self.credentials:
                client.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nContent-Length: 0\r\n\r\n")
                return
            host, _, port = target.rpartition(":")
            with socket.create_connection((host, int(port))) as upstream:
                client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                pump = threading.Thread(target=_pump, args=(upstream, client), daemon=True)
                pump.start()
                _pump(client, upstream)
                pump.join(10)


def _request_head(connection: socket.socket) -> tuple[str, dict[str, str]]:
    """A request's first line and its headers, their names as sent, read off `connection`."""
    reader = connection.makefile("rb")
    line = reader.readline().decode("latin-1").strip()
    headers = {}
    while header := reader.readline().decode("latin-1").strip():
        name, _, value = header.partition(":")
        headers[name.strip()] = value.strip()  # as sent: qnnctl names its headers as curl does
    return line, headers


def _pump(source: socket.socket, sink: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := source.recv(1 << 16):
            sink.sendall(data)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[FaultServer, Path]]:
    certificate = self_signed_certificate(tmp_path / "tls")
    with FaultServer(tls=certificate) as server:
        server.add(PATH, DATA)
        yield server, certificate.cert


# -- proxies -------------------------------------------------------------------------------


def test_an_https_url_goes_through_the_proxys_tunnel_with_its_password(
        tls_server: tuple[FaultServer, Path], monkeypatch: pytest.MonkeyPatch, direct: None) -> None:
    server, bundle = tls_server
    with ConnectProxy(credentials=_basic("proxy user", "pa:ss")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://proxy%20user:pa%3Ass@127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
        assert _get(make_session(), server.url(PATH)) == DATA
        ((line, headers),) = proxy.seen
        port = server.base.rsplit(":", 1)[1]
        assert line.startswith(f"CONNECT 127.0.0.1:{port} HTTP/1.")
        assert headers["Proxy-Authorization"] == _basic("proxy user", "pa:ss")
        # The server behind the tunnel never sees the proxy's password.
        (request,) = server.requests_for(PATH)
        assert "Proxy-Authorization" not in request.headers


def test_a_proxy_that_refuses_the_tunnel_is_named(tls_server: tuple[FaultServer, Path],
                                                  monkeypatch: pytest.MonkeyPatch, direct: None) -> None:
    server, bundle = tls_server
    with ConnectProxy(credentials=_basic("u", "right")) as proxy:
        monkeypatch.setenv("HTTPS_PROXY", f"http://u:wrong@127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
        with pytest.raises(ProxyFailed) as caught:
            make_session().get(server.url(PATH))
        assert describe(caught.value) == "Tunnel connection failed: 407 Proxy Authentication Required"
        assert str(caught.value) == (f"cannot reach 127.0.0.1 through the proxy 127.0.0.1:{proxy.port}: "
                                     "OSError('Tunnel connection failed: 407 Proxy Authentication Required')")
        assert server.requests == []


def test_a_certificate_behind_the_tunnel_is_still_checked(tls_server: tuple[FaultServer, Path],
                                                          monkeypatch: pytest.MonkeyPatch, direct: None) -> None:
    """The tunnel is the proxy's; the TLS inside it is the server's, checked against the bundle."""
    server, _ = tls_server
    with ConnectProxy() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        monkeypatch.setenv("NO_PROXY", "")
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)  # certifi's: it does not know the test's CA
        with pytest.raises(NoConnection) as caught:
            make_session().get(server.url(PATH))
        assert not isinstance(caught.value, ProxyFailed)
        assert describe(caught.value).startswith("the server's certificate is not trusted")
        assert "Proxy-Authorization" not in proxy.seen[0][1]  # a proxy named without credentials is sent none
        # Retrying cannot help: one attempt, however generous the policy.
        with pytest.raises(GaveUp) as gave_up:
            make_session().get(server.url(PATH), policy=retry_policy(sleep=lambda _: None))
        assert gave_up.value.attempts == 1


def test_an_http_url_is_asked_of_the_proxy_whole_without_its_userinfo(server: FaultServer,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://mirror.invalid:8080/v.zip"
    server.add(url, DATA)  # the proxy sees the whole URL as the path
    monkeypatch.setenv("HTTP_PROXY", server.base.replace("http://", "http://proxy:secret@"))
    monkeypatch.setenv("NO_PROXY", "")
    assert _get(make_session(), "http://me:pw@mirror.invalid:8080/v.zip") == DATA
    (request,) = server.requests_for(url)
    assert request.target == url
    assert request.headers["Host"] == "mirror.invalid:8080"
    assert request.headers["Proxy-Authorization"] == _basic("proxy", "secret")
    assert {"Authorization", "Proxy-Authorization"} <= set(request.headers.keys())  # named as curl names them
    assert request.headers["Authorization"] == _basic("me", "pw")


def test_the_lower_case_variable_wins_and_all_proxy_is_the_last_resort() -> None:
    settings = Settings({"HTTPS_PROXY": "http://upper:1", "https_proxy": "http://lower:1", "ALL_PROXY": "http://all:1"})
    assert settings.proxy_url("https://h/x") == "http://lower:1"
    assert settings.proxy_url("http://h/x") == "http://all:1"
    assert Settings({}).proxy_url("https://h/x") is None


@pytest.mark.parametrize(("no_proxy", "url", "bypassed"), [
    ("*", "https://anything.example/x", True),
    ("example.com", "https://example.com/x", True),
    ("example.com", "https://a.b.example.com/x", True),
    (".example.com", "https://a.example.com/x", True),
    ("*.example.com", "https://a.example.com/x", True),
    ("example.com", "https://badexample.com/x", False),  # a suffix of the name is not its domain
    ("ample.com", "https://example.com/x", False),
    ("EXAMPLE.com", "https://Example.COM/x", True),
    ("mirror:8443", "https://mirror:8443/x", True),
    ("mirror:8443", "https://mirror:443/x", False),
    ("10.0.0.0/8", "https://10.1.2.3/x", True),
    ("10.0.0.0/8", "https://11.1.2.3/x", False),
    ("::1/128", "https://[::1]/x", True),
    ("not/a/network", "https://10.1.2.3/x", False),
    ("not/a/network,10.0.0.0/8", "https://10.1.2.3/x", True),  # an entry that is no network is passed over
    ("10.1.2.3/8", "https://10.200.0.1/x", True),  # a network written with its host's bits
    ("10.0.0.0/8", "https://mirror.example/x", False),  # a name is in no network
    (" a.com , b.com ", "https://b.com/x", True),
])
def test_no_proxy(no_proxy: str, url: str, bypassed: bool) -> None:
    settings = Settings({"HTTPS_PROXY": "http://proxy:3128", "NO_PROXY": no_proxy})
    assert settings.proxy_url(url) == (None if bypassed else "http://proxy:3128")


@pytest.mark.parametrize(("proxy", "words"), [
    ("https://proxy:3128", "qnnctl reaches proxies over http://, not https:// (the proxy named in the environment)"),
    ("socks5://proxy:1080", "qnnctl reaches proxies over http://, not socks5:// (the proxy named in the environment)"),
    ("http://u:p:w@proxy:99999", "the proxy's port 99999 is not a port number (0 to 65535)"),
    ("http://[::1]:99999", "the proxy's port 99999 is not a port number (0 to 65535)"),
    ("http://u:p@:3128", "the proxy named in the environment names no host"),
])
def test_a_proxy_qnnctl_cannot_speak_to_is_refused_before_a_request(proxy: str, words: str, server: FaultServer,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HTTP_PROXY", proxy)
    monkeypatch.setenv("NO_PROXY", "")
    with pytest.raises(BadRequest) as caught:
        make_session().get(server.url(PATH), policy=retry_policy(sleep=lambda _: None))
    assert str(caught.value) == words
    assert server.requests == []


def test_a_proxy_without_a_scheme_is_an_http_one_and_without_credentials_is_sent_none(
        server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://mirror.invalid/v.zip"
    server.add(url, DATA)
    monkeypatch.setenv("HTTP_PROXY", server.base.removeprefix("http://"))
    monkeypatch.setenv("NO_PROXY", "")
    assert _get(make_session(), url) == DATA
    (request,) = server.requests_for(url)
    assert request.target == url  # the default port is not named
    assert "Proxy-Authorization" not in request.headers
    assert "Authorization" not in request.headers


def test_an_ipv6_host_is_named_to_the_proxy_in_brackets(server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    url = "http://[fd00::1]:8080/v.zip"
    server.add(url, DATA)
    monkeypatch.setenv("HTTP_PROXY", server.base)
    monkeypatch.setenv("NO_PROXY", "")
    assert _get(make_session(), url) == DATA
    (request,) = server.requests_for(url)
    assert (request.target, request.headers["Host"]) == (url, "[fd00::1]:8080")


@pytest.mark.parametrize(("proxy", "credentials"), [
    ("http://:pw@proxy:1", ("", "pw")),
    ("http://user@proxy:1", ("user", "")),
    ("http://us%40er:p%2Fw@proxy:1", ("us@er", "p/w")),
    ("http://proxy:1", None),
])
def test_a_proxys_credentials_are_each_part_of_its_userinfo(proxy: str, credentials: tuple[str, str] | None) -> None:
    target = Settings({"HTTPS_PROXY": proxy}).target("https://mirror.example/v.zip")
    assert target.proxy is not None
    assert (target.proxy.host, target.proxy.port) == ("proxy", 1)
    assert target.proxy.auth == (None if credentials is None else _basic(*credentials))
    assert Settings({"HTTPS_PROXY": "http://proxy"}).target("https://m/v.zip").proxy == ("proxy", 80, None)


@pytest.mark.parametrize("kind", ["missing", "no certificate"])
def test_a_ca_bundle_that_cannot_be_used_is_named_with_its_variable(
        kind: str, tls_server: tuple[FaultServer, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        direct: None) -> None:
    server, _ = tls_server
    bundle = tmp_path / "bundle.pem"
    if kind == "no certificate":
        bundle.write_text("not a certificate\n")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.setenv("CURL_CA_BUNDLE", str(bundle))
    sleeps: list[float] = []
    with pytest.raises(UnusableBundle) as caught:
        make_session().get(server.url(PATH), policy=retry_policy(sleep=sleeps.append))
    words = describe(caught.value)
    if kind == "missing":
        assert words == f"the CA bundle {bundle} (CURL_CA_BUNDLE) cannot be used: No such file or directory"
    else:
        assert words.startswith(f"the CA bundle {bundle} (CURL_CA_BUNDLE) cannot be used: [X509")
    assert (sleeps, server.connections) == ([], 0)  # nothing to retry, and nothing sent
    result = run_qnnctl("install", "--url", server.url(PATH).replace(PATH, "/v2.37.0.250724.zip"),
                        env=dict(os.environ, REQUESTS_CA_BUNDLE=str(bundle)))
    assert result.returncode == 3, result.stderr
    assert "qnnctl: error: cannot download https://127.0.0.1:" in result.stderr
    assert f"the CA bundle {bundle} (REQUESTS_CA_BUNDLE) cannot be used: " in result.stderr
    assert "qnnctl: hint: set REQUESTS_CA_BUNDLE to a file of PEM certificates" in result.stderr


# -- credentials ---------------------------------------------------------------------------


def test_a_redirect_to_another_host_does_not_carry_the_password(server: FaultServer, tmp_path: Path,
                                                                direct: None) -> None:
    """The other host gets what .netrc holds for it, if anything: never the first one's password."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine localhost login robot password for-localhost\n")
    with FaultServer() as other:
        other.add(PATH, DATA)
        elsewhere = other.url(PATH).replace("127.0.0.1", "localhost")
        server.fail(PATH, Fault("status", 302, {"Location": elsewhere}), Fault("status", 302, {"Location": elsewhere}))
        url = server.url(PATH).replace("http://", "http://me:s3cret@")
        assert _get(make_session(), url) == DATA
        assert _get(Session("qnnctl/test", {"NETRC": str(netrc)}), url) == DATA
        first, _ = server.requests_for(PATH)
        assert first.headers["Authorization"] == _basic("me", "s3cret")
        assert "Authorization" in first.headers.keys()  # named as curl names it
        followed, with_netrc = other.requests_for(PATH)
        assert "Authorization" not in followed.headers
        assert with_netrc.headers["Authorization"] == _basic("robot", "for-localhost")


def test_a_redirect_on_the_same_host_keeps_the_password_and_the_range(server: FaultServer, direct: None) -> None:
    server.add("/new.zip", DATA)
    server.fail(PATH, Fault("status", 301, {"Location": "/new.zip"}))  # relative, as many servers send it
    url = server.url(PATH).replace("http://", "http://me:s3cret@")
    with make_session().get(url, {"Range": "bytes=0-9"}) as response:
        assert response.status == 206
        assert response.read1(100) == DATA[:10]
        assert response.url == url.replace(PATH, "/new.zip")
    (followed,) = server.requests_for("/new.zip")
    assert followed.headers["Authorization"] == _basic("me", "s3cret")
    assert followed.headers["Range"] == "bytes=0-9"


def test_netrc_gives_the_login_for_its_host_alone(server: FaultServer, tmp_path: Path, direct: None) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login robot password from-netrc\n")
    netrc.chmod(0o600)
    server.add(PATH, DATA)
    session = Session("qnnctl/test", {"NETRC": str(netrc)})
    assert _get(session, server.url(PATH)) == DATA
    assert _get(session, server.url(PATH).replace("http://", "http://me:given@")) == DATA
    from_netrc, given = server.requests_for(PATH)
    assert from_netrc.headers["Authorization"] == _basic("robot", "from-netrc")
    assert given.headers["Authorization"] == _basic("me", "given")  # the URL's own wins
    other = Session("qnnctl/test", {"NETRC": str(netrc)})
    assert other.settings.netrc_auth("localhost") is None
    assert Session("qnnctl/test", {"NETRC": str(tmp_path / "none")}).settings.netrc_auth("127.0.0.1") is None


class BothSchemes(Loopback):
    """One port that speaks TLS to a client that begins a handshake and plain HTTP to one that
    does not, as a misconfigured server can: each request's headers recorded with its scheme."""

    def __init__(self, certificate: Path, key: Path, location: str) -> None:
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(certificate, key)
        self.location = location
        super().__init__()

    def answer(self, client: socket.socket) -> None:
        with contextlib.suppress(OSError), client:
            tls = client.recv(1, socket.MSG_PEEK) == b"\x16"
            conn = self.tls.wrap_socket(client, server_side=True) if tls else client
            _, headers = _request_head(conn)
            self.seen.append(("https" if tls else "http", headers))
            location = self.location.format(port=self.port)
            conn.sendall(f"HTTP/1.1 302 Found\r\nLocation: {location}\r\nContent-Length: 0\r\n"
                         "Connection: close\r\n\r\n".encode())


def test_a_password_is_never_sent_in_the_clear_after_tls(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        direct: None) -> None:
    """A redirect from https:// to http:// on the same host and port: the password stays behind."""
    certificate = self_signed_certificate(tmp_path / "tls")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate.cert))
    with BothSchemes(certificate.cert, certificate.key, "http://127.0.0.1:{port}/plain") as server:
        with pytest.raises(BadRequest, match="redirects"):
            make_session().get(f"https://me:s3cret@127.0.0.1:{server.port}/v.zip")
        (first, first_headers), (second, second_headers), *_ = server.seen
        assert (first, first_headers["Authorization"]) == ("https", _basic("me", "s3cret"))
        assert second == "http"
        assert "Authorization" not in second_headers
        assert all("Authorization" not in headers for scheme, headers in server.seen if scheme == "http")


# -- redirects and URLs --------------------------------------------------------------------


def test_redirects_end(server: FaultServer, direct: None) -> None:
    server.fail(PATH, *[Fault("status", 302, {"Location": PATH})] * (MAX_REDIRECTS + 1))
    with pytest.raises(BadRequest, match=f"more than {MAX_REDIRECTS} redirects"):
        make_session().get(server.url(PATH), policy=retry_policy(sleep=lambda _: None))
    assert len(server.requests_for(PATH)) == MAX_REDIRECTS + 1


def test_a_head_does_not_follow_redirects(server: FaultServer, direct: None) -> None:
    """doctor's check asks what the URL itself answers."""
    server.fail(PATH, Fault("status", 302, {"Location": "/elsewhere"}))
    with make_session().head(server.url(PATH)) as response:
        assert (response.status, response.headers["Location"]) == (302, "/elsewhere")
    assert server.requests_for("/elsewhere", method="HEAD") == []


def test_a_redirect_is_not_followed_when_not_asked(server: FaultServer, direct: None) -> None:
    server.fail(PATH, Fault("status", 302, {"Location": "/elsewhere"}))
    with make_session().get(server.url(PATH), redirects=False) as response:
        assert (response.status, response.headers["Location"]) == (302, "/elsewhere")


@pytest.mark.parametrize(("url", "words"), [
    ("ftp://host/v.zip", "qnnctl speaks http:// and https://, not ftp"),
    ("//host/v.zip", "qnnctl speaks http:// and https://, not a URL without a scheme"),
    ("http:///v.zip", "the URL names no host"),
    ("http://host:port/v.zip", "the URL's port port is not a port number (0 to 65535)"),
    ("http://u:1@host:99999/v.zip", "the URL's port 99999 is not a port number (0 to 65535)"),
    ("http://[::1]:99999/v.zip", "the URL's port 99999 is not a port number (0 to 65535)"),
])
def test_a_url_no_request_can_be_made_of(url: str, words: str) -> None:
    with pytest.raises(BadRequest) as caught:
        make_session().get(url, policy=retry_policy(sleep=lambda _: None))
    assert str(caught.value) == words


def test_a_path_is_quoted_as_typed(server: FaultServer, direct: None) -> None:
    server.add("/files/qairt%20sdk+v1%2B.zip", DATA)
    assert _get(make_session(), server.url("/files/qairt sdk+v1%2B.zip?a=b c")) == DATA
    (request,) = server.requests_for("/files/qairt%20sdk+v1%2B.zip")
    assert request.target == "/files/qairt%20sdk+v1%2B.zip?a=b%20c"


def test_a_request_that_cannot_be_sent_is_not_retried(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    sleeps: list[float] = []
    with pytest.raises(BadRequest, match="no request can be made"):
        make_session().get(server.url(PATH), {"X-Split": "a\r\nInjected: yes"},
                           policy=retry_policy(sleep=sleeps.append))
    assert sleeps == []
    assert server.requests == []


# -- connections ---------------------------------------------------------------------------


def test_one_connection_carries_every_request_of_a_session(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    session = make_session()
    for _ in range(3):
        assert _get(session, server.url(PATH)) == DATA
    assert server.connections == 1


def test_a_body_left_unread_closes_its_connection(server: FaultServer, direct: None) -> None:
    """What is left of a body is not read (it may never end): the next request opens another
    connection rather than reading the rest as its answer."""
    server.add(PATH, DATA)
    session = make_session()
    with session.get(server.url(PATH)) as response:
        assert response.read1(10) == DATA[:10]
    assert _get(session, server.url(PATH)) == DATA
    assert server.connections == 2


def test_a_connection_the_server_closed_while_idle_is_opened_again(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    session = make_session()
    assert _get(session, server.url(PATH)) == DATA
    assert session._open is not None
    connection = session._open.connection
    assert connection.sock is not None
    # As a server's idle timeout does: the connection ends while the session holds it.
    connection.sock.shutdown(socket.SHUT_RDWR)
    url = server.url(PATH).replace("http://", "http://me:pw@")
    with session.get(url) as response:  # the same request again, on a new connection, whole
        assert (response.status, response.url) == (200, url)
    assert server.connections == 2
    assert server.requests_for(PATH)[-1].headers["Authorization"] == _basic("me", "pw")


@pytest.mark.parametrize("block", [1, 1 << 16])
def test_a_body_shorter_than_its_length_breaks_off_read_a_byte_or_a_block_at_a_time(
        block: int, server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    server.fail(PATH, Fault.drop_after(100))
    got = bytearray()

    def read_all() -> None:
        with make_session().get(server.url(PATH)) as response:
            while piece := response.read1(block):
                got.extend(piece)

    with pytest.raises(BodyBroke) as caught:
        read_all()
    assert bytes(got) == DATA[:100]
    left = len(DATA) - 100
    assert str(caught.value) == f"the body broke off: IncompleteRead(0 bytes read, {left} more expected)"
    assert isinstance(caught.value.reason, http.client.IncompleteRead)


def test_a_body_cut_in_a_chunk_breaks_off_with_its_cause(direct: None) -> None:
    """A chunked body that ends inside a chunk: http.client's own error, kept as the cause."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def answer() -> None:
        client, _ = listener.accept()
        with client:
            _request_head(client)
            client.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n10\r\nonly eight")
            client.shutdown(socket.SHUT_WR)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        with pytest.raises(BodyBroke) as caught:
            _get(make_session(), f"http://127.0.0.1:{port}/v.zip")
        assert str(caught.value).startswith("the body broke off: ")
        assert isinstance(caught.value.reason, http.client.IncompleteRead)
        assert describe(caught.value).startswith("the server closed the connection")
    finally:
        thread.join(10)
        listener.close()


def test_a_body_shorter_than_its_length_breaks_off(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    server.fail(PATH, Fault.drop_after(1000))
    got = bytearray()

    def read_all() -> None:
        with make_session().get(server.url(PATH)) as response:
            while piece := response.read1(1 << 16):
                got.extend(piece)

    with pytest.raises(BodyBroke) as caught:
        read_all()
    assert bytes(got) == DATA[:1000]
    assert describe(caught.value) == (
        f"the server closed the connection {len(DATA) - 1000} bytes before the end it announced")


def test_no_answer_is_retried_by_the_policy_then_given_up(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    server.fail(PATH, *[Fault.raw(b"")] * 6)
    sleeps: list[float] = []
    with pytest.raises(GaveUp) as caught:
        make_session().get(server.url(PATH), policy=retry_policy(sleep=sleeps.append))
    assert caught.value.attempts == 6
    assert isinstance(caught.value.reason, NoAnswer)
    assert describe(caught.value) == "the server closed the connection without answering"
    assert str(caught.value.reason) == "no answer: RemoteDisconnected('Remote end closed connection without response')"
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_a_status_worth_retrying_comes_back_when_the_policy_is_spent(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    server.fail(PATH, *[Fault.status(503, retry_after="3")] * 6)
    sleeps: list[float] = []
    with make_session().get(server.url(PATH), policy=retry_policy(sleep=sleeps.append)) as response:
        assert response.status == 503
        assert response.retries is not None
        assert response.retries.attempts == 6
    assert sleeps == [3.0] * 5  # what the server asked for each time


# -- failures in words ---------------------------------------------------------------------


def test_tls_with_a_server_that_speaks_none_is_said_so(server: FaultServer, direct: None) -> None:
    server.add(PATH, DATA)
    with pytest.raises(NoConnection) as caught:
        make_session().get(server.url(PATH).replace("http://", "https://"))
    assert describe(caught.value).startswith("TLS failed: [SSL")


@pytest.mark.parametrize(("error", "words"), [
    (ConnectionResetError(104, "Connection reset by peer"),
     "the connection was reset ([Errno 104] Connection reset by peer)"),
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"),
     "a host name cannot be resolved ([Errno -2] Name or service not known)"),
    (caused(NoConnection("dns", "mirror.example"), socket.gaierror(socket.EAI_NONAME, "Name or service not known")),
     "the host name mirror.example cannot be resolved ([Errno -2] Name or service not known)"),
    (http.client.IncompleteRead(b""), "the server closed the connection before the end it announced"),
    (http.client.IncompleteRead(b"", 5), "the server closed the connection 5 bytes before the end it announced"),
    (TimeoutError("timed out"), "no answer in time (timed out)"),
    (TimeoutError(), "no answer in time"),
    (ValueError(), "ValueError"),  # nothing to say but its kind
])
def test_describe(error: BaseException, words: str) -> None:
    assert describe(error) == words


def test_a_policy_waits_only_after_a_failure() -> None:
    policy = retry_policy(sleep=lambda _: None)
    assert policy.wait() == 0.0
    failed = policy.increment(error=caused(NoAnswer("no answer"), TimeoutError("timed out")))
    assert (failed.wait(), failed.attempts) == (1.0, 2)
    again = failed.start("https://mirror.example/v.zip")  # from its first attempt
    assert (again.wait(), again.attempts, again.shown) == (0.0, 1, "https://mirror.example/v.zip")
    with pytest.raises(GaveUp) as caught:
        policy.new(total=0).increment(error=caused(NoAnswer("no answer"), TimeoutError("timed out")))
    assert str(caught.value) == "gave up after 1 attempt"


def test_a_connection_not_made_has_a_budget_of_its_own(caplog: pytest.LogCaptureFixture) -> None:
    """The mirror's index: a refused connection is tried once more; other failures twice."""
    policy = retry_policy(sleep=lambda _: None).new(total=2, connect=1).start("https://mirror.example/index.json")
    refused = caused(NoConnection("refused"), ConnectionRefusedError(111, "Connection refused"))
    silent = caused(NoAnswer("no answer"), TimeoutError("timed out"))
    after_refusal = policy.increment(error=refused)
    with pytest.raises(GaveUp) as caught:
        after_refusal.increment(error=refused)
    assert (caught.value.attempts, caught.value.reason, str(caught.value)) == (2, refused, "gave up after 2 attempts")
    assert after_refusal.increment(error=silent).attempts == 3
    assert policy.increment(error=silent).increment(error=refused).attempts == 3
    with pytest.raises(GaveUp):
        policy.increment(error=silent).increment(error=silent).increment(error=silent)
    assert [r.getMessage().rsplit("(", 1)[1] for r in caplog.records][:2] == ["attempt 2 of 2)", "attempt 3 of 3)"]


def test_the_causes_of_an_error_end(direct: None) -> None:
    error: BaseException = ValueError("innermost")
    for depth in range(20):
        error = caused(RequestError(f"layer {depth}"), error)
    chain = causes(error)
    assert len(chain) == 16
    assert str(chain[0]) == "layer 19"


def test_each_route_takes_the_connect_and_the_read_timeout(server: FaultServer, tls_server: tuple[FaultServer, Path],
                                                          monkeypatch: pytest.MonkeyPatch, direct: None) -> None:
    """Directly and through a proxy, over http:// and https://: a connection waits at most the
    first for its connection, then at most the second for each read."""
    secure, bundle = tls_server
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("NO_PROXY", "")
    server.add(PATH, DATA)
    server.add("http://mirror.invalid/v.zip", DATA)
    with ConnectProxy() as proxy:
        routes = [(server.url(PATH), {}), (secure.url(PATH), {}),
                  ("http://mirror.invalid/v.zip", {"HTTP_PROXY": server.base}),
                  (secure.url(PATH), {"HTTPS_PROXY": proxy.url})]
        for url, proxies in routes:
            session = Session("qnnctl/test", {**os.environ, **proxies})
            assert _get(session, url, timeout=(7.0, 9.0)) == DATA
            assert session._open is not None
            connection = session._open.connection
            assert connection.sock is not None
            assert (connection.timeout, connection.sock.gettimeout()) == (7.0, 9.0), url
    assert len(proxy.seen) == 1


def test_a_connection_refused_is_said_with_its_host(direct: None) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with pytest.raises(NoConnection) as caught:
        make_session().get(f"http://127.0.0.1:{port}/v.zip")
    assert str(caught.value) == "cannot connect to 127.0.0.1: ConnectionRefusedError(111, 'Connection refused')"
    assert describe(caught.value) == "the connection was refused ([Errno 111] Connection refused)"


def test_a_proxy_whose_name_does_not_resolve_is_named(server: FaultServer, monkeypatch: pytest.MonkeyPatch) -> None:
    real = socket.getaddrinfo

    def resolve(host: str, *args: object, **kwargs: object) -> object:
        if host == "proxy.invalid":
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        return real(host, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.invalid:3128")
    monkeypatch.setenv("NO_PROXY", "")
    with pytest.raises(GaveUp) as caught:  # retrying cannot help: at once
        make_session().get("http://mirror.example/v.zip", policy=retry_policy(sleep=lambda _: None))
    assert caught.value.attempts == 1
    assert isinstance(caught.value.reason, ProxyFailed)
    assert describe(caught.value) == ("the host name proxy.invalid cannot be resolved "
                                      "([Errno -2] Name or service not known)")


def test_a_redirect_without_a_location_is_the_answer(server: FaultServer, direct: None) -> None:
    server.fail(PATH, Fault("status", 302))
    with make_session().get(server.url(PATH)) as response:
        assert response.status == 302


def test_the_policy_goes_on_after_a_redirect(server: FaultServer, direct: None) -> None:
    server.add("/new.zip", DATA)
    server.fail(PATH, Fault("status", 302, {"Location": "/new.zip"}))
    server.fail("/new.zip", Fault.status(503))
    sleeps: list[float] = []
    assert _get(make_session(), server.url(PATH), policy=retry_policy(sleep=sleeps.append)) == DATA
    assert sleeps == [1.0]


def test_a_url_without_a_path_asks_for_the_root(server: FaultServer, direct: None) -> None:
    server.add("/", DATA)
    assert _get(make_session(), server.base) == DATA
    assert [r.target for r in server.requests_for("/")] == ["/"]


@pytest.mark.parametrize(("userinfo", "credentials"), [("me@", ("me", "")), (":pw@", ("", "pw")),
                                                       ("m%40e:p%3Aw@", ("m@e", "p:w"))])
def test_each_part_of_a_urls_userinfo_is_sent(userinfo: str, credentials: tuple[str, str], server: FaultServer,
                                              direct: None) -> None:
    server.add(PATH, DATA)
    assert _get(make_session(), server.url(PATH).replace("http://", f"http://{userinfo}")) == DATA
    (request,) = server.requests_for(PATH)
    assert request.headers["Authorization"] == _basic(*credentials)


@pytest.mark.parametrize(("entry", "credentials"), [("login robot password pw", ("robot", "pw")),
                                                    ("password only", ("", "only")),
                                                    ("login alone", ("alone", ""))])
def test_the_netrc_in_home_is_read_when_netrc_names_none(entry: str, credentials: tuple[str, str],
                                                         tmp_path: Path) -> None:
    (tmp_path / ".netrc").write_text(f"machine mirror.example {entry}\n")
    # Python 3.10's netrc takes an entry without a password for a malformed file: nothing is sent then.
    malformed = entry == "login alone" and sys.version_info < (3, 11)
    expected = None if malformed else _basic(*credentials)
    assert Settings({"HOME": str(tmp_path)}).netrc_auth("mirror.example") == expected
    assert Settings({"HOME": str(tmp_path)}).target("https://mirror.example/v.zip").port == 443
    assert Settings({"HOME": str(tmp_path)}).target("http://mirror.example/v.zip").port == 80


def test_the_lower_case_no_proxy_wins_and_other_schemes_have_no_proxy() -> None:
    settings = Settings({"HTTPS_PROXY": "http://proxy:1", "no_proxy": "a.example", "NO_PROXY": "b.example"})
    assert settings.proxy_url("https://a.example/x") is None
    assert settings.proxy_url("https://b.example/x") == "http://proxy:1"
    assert settings.proxy_url("ftp://a.example/x") is None


def test_certifis_bundle_that_cannot_be_used_is_named(tls_server: tuple[FaultServer, Path],
                                                      monkeypatch: pytest.MonkeyPatch, direct: None) -> None:
    import certifi

    from qnnctl.net.http import tls_context

    server, _ = tls_server
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    monkeypatch.setattr(certifi, "where", lambda: "/nonexistent/cacert.pem")
    tls_context.cache_clear()
    try:
        with pytest.raises(UnusableBundle) as caught:
            make_session().get(server.url(PATH))
    finally:
        tls_context.cache_clear()
    assert str(caught.value) == "certifi's CA bundle cannot be used: No such file or directory"


def test_refused_is_a_connection_refused_anywhere_in_the_chain() -> None:
    assert refused(caused(GaveUp(2), caused(NoConnection("refused"), ConnectionRefusedError(111, "refused"))))
    assert not refused(caused(NoAnswer("no answer"), TimeoutError("timed out")))
