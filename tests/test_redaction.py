"""No password or token that a URL carries is printed, logged or stored by qnnctl."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from qnnctl.net.urls import redact, redact_text
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION

PATH = f"/{VERSION}/v{VERSION}.zip"
NAME = f"v{VERSION}.zip"
PASSWORD = "S3cr3t"
TOKEN = "SIGNED"
PROXY_PASSWORD = "PrOxYpw"
FRAGMENT = "FrAgSeCrEt"
SECRETS = (PASSWORD, TOKEN, PROXY_PASSWORD, FRAGMENT)


@pytest.mark.parametrize(("url", "shown"), [
    ("https://host/All/v.zip", "https://host/All/v.zip"),
    ("http://user:pw@host:8080/All/", "http://***@host:8080/All/"),
    ("http://token@host/", "http://***@host/"),
    ("https://host/v.zip?X-Amz-Signature=abc&X-Amz-Expires=300", "https://host/v.zip?X-Amz-Signature=***&X-Amz-Expires=***"),
    ("https://host/v.zip?token=abc#part=x", "https://host/v.zip?token=***#part=***"),
    ("https://host/v.zip?abc", "https://host/v.zip?***"),  # a lone word can be the token itself
    ("https://host/v.zip?empty=&a=1", "https://host/v.zip?empty=&a=***"),
    ("https://host/v.zip#frag", "https://host/v.zip#***"),
    ("https://u:p@ss@host/x", "https://***@host/x"),  # the last "@" ends the userinfo
    ("https://user:p#ss?w@host/x?t=1", "https://***@host/x?t=***"),  # not taken for a fragment
    ("http://u:pw@[::1/x?t=1", "http://***@[::1/x?t=***"),  # does not parse, still masked
    ("/path?token=abc", "/path?token=***"),
    ("", ""),
])
def test_redact(url: str, shown: str) -> None:
    assert redact(url) == shown
    assert redact(shown) == shown  # redacting twice changes nothing


def test_redact_text_masks_the_urls_in_a_message() -> None:
    message = ("HTTPConnectionPool(host='127.0.0.1', port=9): Max retries exceeded with url: "
               "/v.zip?token=abc (Caused by 'http://u:pw@127.0.0.1:9/v.zip?token=abc')")
    masked = redact_text(message)
    assert "abc" not in masked
    assert "pw" not in masked
    assert "with url: /v.zip?token=*** (Caused by 'http://***@127.0.0.1:9/v.zip?token=***')" in masked
    assert redact_text("[Errno 111] Connection refused") == "[Errno 111] Connection refused"


def _files_below(*roots: Path) -> list[Path]:
    return [path for root in roots if root.exists() for path in sorted(root.rglob("*")) if path.is_file()]


def test_no_secret_is_printed_or_stored(mirror: FaultServer, cache_dir: Path, tmp_path: Path) -> None:
    """A full install, a failure, a resume and doctor, with a password in QNNCTL_MIRROR, a
    signed --url and a proxy password: every byte qnnctl writes is free of them."""
    host = mirror.base.removeprefix("http://")
    env = dict(os.environ, QNNCTL_MIRROR=f"http://user:{PASSWORD}@{host}")
    written: list[str] = []

    stored: dict[Path, bytes] = {}

    def run(*args: str, environ: dict[str, str] = env) -> int:
        result = run_qnnctl(*args, env=environ)
        written.extend((result.stdout, result.stderr))
        # Files are read after every run: a record of a failed download is gone once it succeeds.
        for path in _files_below(cache_dir, tmp_path / "home", tmp_path / "work"):
            stored[path] = path.read_bytes()
        return result.returncode

    # A failure that leaves a partial download: the connection drops, then the mirror refuses.
    mirror.fail(PATH, Fault.drop_after(300_000), Fault.status(403))
    assert run("-v", "install") == 3
    downloads = cache_dir / "downloads"
    assert (downloads / f"{NAME}.part").stat().st_size > 0
    record = downloads / f"{NAME}.json"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    # The resume, through a 503 and another dropped connection.
    mirror.fail(PATH, Fault.status(503, retry_after="0"), Fault.drop_after(200_000))
    assert run("-v", "install") == 0
    assert "resuming" in written[-1]
    assert run("list", "--json") == 0
    assert run("doctor") in (0, 1)
    assert run("doctor", "--json") in (0, 1)
    # doctor's network check through a proxy that wants a password.
    proxied = dict(env, HTTP_PROXY=f"http://proxyuser:{PROXY_PASSWORD}@{host}", NO_PROXY="")
    assert run("doctor", "--json", environ=proxied) in (0, 1)

    # A signed URL, refused once (401), then installed again through a dropped connection.
    signed = mirror.url(PATH) + f"?X-Amz-Signature={TOKEN}&token={TOKEN}#{FRAGMENT}"
    plain = {k: v for k, v in os.environ.items() if k != "QNNCTL_MIRROR"}
    mirror.fail(PATH, Fault.status(401))
    assert run("install", "--force", "--url", signed, environ=plain) == 3
    mirror.fail(PATH, Fault.drop_after(300_000))
    assert run("-v", "install", "--force", "--url", signed, environ=plain) == 0
    assert run("doctor", "--json", environ=plain) in (0, 1)
    assert run("--version", environ=plain) == 0

    # The secrets were sent: the mirror got the password, the URL its token.
    auth = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert any(r.headers.get("Authorization") == auth for r in mirror.requests_for(PATH))
    assert any(f"token={TOKEN}" in r.target for r in mirror.requests_for(PATH))
    # ...and are nowhere in what qnnctl wrote.
    for text in written:
        for secret in SECRETS:
            assert secret not in text, text
    assert any(f.name == f"{NAME}.json" for f in stored)
    assert any(f.name == ".qnnctl.json" for f in stored)
    for path, data in stored.items():
        for secret in SECRETS:
            assert secret.encode() not in data, path
    manifest = json.loads((cache_dir / "sdks" / VERSION / ".qnnctl.json").read_text())
    assert manifest["source"] == mirror.url(PATH) + "?X-Amz-Signature=***&token=***#***"
    assert any("from http://***@" in text for text in written)  # doctor's "installed ... from"


# Every printable character but letters and digits, a few beyond ASCII, and base64's own.
HOSTILE = sorted({c for c in map(chr, range(0x20, 0x7F)) if not c.isalnum()} | set("é€"))
LEFT, RIGHT = "Qx7", "Zk9"  # the two halves of a password, around one hostile character


@pytest.mark.parametrize("char", HOSTILE)
def test_a_password_holding_any_character_is_hidden(char: str) -> None:
    secret = f"{LEFT}{char}{RIGHT}"
    b64 = base64.b64encode(b"\xfb\xff\xbf" + secret.encode()).decode()  # "+/" and "=" in a token
    for url in (f"http://user:{secret}@host/All/?t=1", f"https://{secret}@host:8080/x.zip#f",
                f"http://user:{secret}/{secret}@host/", f"https://{b64}@host/All/", f"user:{secret}@host/x"):
        shown = redact(url)
        for part in (LEFT, RIGHT, b64[:4], b64[4:]):
            assert part not in shown, (url, shown)
        assert redact(shown) == shown
    # urllib3 names what it asked for by its request target: for `http://u:Qx7/Zk9@host/` the
    # target is "/Zk9@host/...", in words that redact_text sees.
    said = redact_text(f"HTTPConnectionPool(host='u', port=80): Max retries exceeded with url: /{RIGHT}@host/v.zip")
    assert RIGHT not in said


@pytest.mark.parametrize("url", ["https://host/pkg@1.0/v.zip?t=1", "https://host/v.zip?mail=a@b&token=abc#k=v"])
def test_an_at_after_the_authority_hides_more_never_less(url: str) -> None:
    shown = redact(url)
    for hidden in ("abc", "1.0/v.zip?t=1", "k=v"):
        assert hidden not in shown, shown


@pytest.mark.parametrize("char", ["/", "?", "#", "@", " ", "\\", ":", "%", "'", "\"", "[", "]", "+", "=", ";"])
def test_no_message_shows_a_password_holding_any_character(char: str, server: FaultServer, cache_dir: Path,
                                                           tmp_path: Path) -> None:
    """QNNCTL_MIRROR and --url with a password as typed, hostile character and all, through
    the URL check, the download's failures, `-v`'s log and what is left in the cache."""
    secret = f"{LEFT}{char}{RIGHT}"
    host = server.base.removeprefix("http://")
    mirrored = dict(os.environ, QNNCTL_MIRROR=f"http://user:{secret}@{host}/none/")
    results = [run_qnnctl("-v", "install", VERSION, env=mirrored),
               run_qnnctl("-v", "install", "--url", f"http://user:{secret}@{host}/none/{NAME}"),
               run_qnnctl("doctor", "--json", env=mirrored)]
    for result in results:
        assert result.returncode in (1, 2, 3), result.stderr
        for part in (LEFT, RIGHT):
            assert part not in result.stdout + result.stderr, result.stderr
    for path in _files_below(cache_dir, tmp_path / "home"):
        for part in (LEFT, RIGHT):
            assert part.encode() not in path.read_bytes(), path
    if char in "/\\":
        # Read as host "user" and path "/Zk9@host/": refused before anything is sent there.
        assert "holds an \"@\" after a \"/\" or" in results[0].stderr
        assert results[0].returncode == results[1].returncode == 2


def test_an_install_with_a_password_of_every_character_a_url_can_carry_records_none(mirror: FaultServer,
                                                                                    cache_dir: Path) -> None:
    """Every character that leaves the URL readable (the last "@" ends the userinfo, as urllib3
    reads it), in one password that the mirror gets: not in the output, the log or the manifest."""
    left, right = "PwLeftQx7", "PwRightZk9"  # longer: the SDK's random payload is read too
    secret = f"{left}@!$&'()*+,;=~:-._%25{right}"
    host = mirror.base.removeprefix("http://")
    env = dict(os.environ, QNNCTL_MIRROR=f"http://user:{secret}@{host}")
    result = run_qnnctl("-v", "install", env=env)
    assert result.returncode == 0, result.stderr
    auth = "Basic " + base64.b64encode(f"user:{secret.replace('%25', '%')}".encode()).decode()
    assert any(r.headers.get("Authorization") == auth for r in mirror.requests_for(PATH))
    for part in (left, right):
        assert part not in result.stdout + result.stderr
        for path in _files_below(cache_dir):
            assert part.encode() not in path.read_bytes(), path
    manifest = json.loads((cache_dir / "sdks" / VERSION / ".qnnctl.json").read_text())
    assert manifest["source"] == f"http://***@{host}{PATH}"
