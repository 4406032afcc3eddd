"""Downloads over a real loopback HTTP server: resume, retries, faults, checksums, progress."""

from __future__ import annotations

import email.utils
import hashlib
import json
import os
import re
import shutil
import socket
import ssl
import subprocess
import sys
import time
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from qnnctl import __version__
from qnnctl.errors import DiskSpaceError, DownloadError, IntegrityError
from qnnctl.files import space_margin
from qnnctl.net.body import Pace, TooSlow
from qnnctl.net.download import MAX_ATTEMPTS, Downloader, make_session, retry_policy
from qnnctl.net.failures import BodyBroke
from qnnctl.net.retry import retry_after
from qnnctl.sdk.cache import read_manifest
from qnnctl.sdk.vouchers import vouchers
from tests.conftest import require_tool, run_qnnctl, run_qnnctl_on_a_terminal
from tests.httpserver import Certificate, Fault, FaultServer, self_signed_certificate
from tests.sdkfactory import VERSION, build_archive

PATH = f"/{VERSION}/v{VERSION}.zip"
NAME = f"v{VERSION}.zip"


def _served(server: FaultServer, path: str = PATH) -> bytes:
    return server.files[path]


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _range_start(request_headers: Message) -> int | None:
    value = request_headers.get("Range")
    return None if value is None else int(value.removeprefix("bytes=").split("-", 1)[0])


def _etag(url: str) -> str:
    """The ETag the server sends for `url` now (a HEAD)."""
    with make_session() as session, session.head(url) as response:
        return str(response.headers["ETag"])


def _installed_manifest(cache_dir: Path) -> dict[str, Any]:
    manifest = read_manifest(cache_dir / "sdks" / VERSION)
    assert manifest is not None
    return manifest


def _nothing_installed(cache_dir: Path) -> None:
    sdks = cache_dir / "sdks"
    assert not sdks.exists() or list(sdks.iterdir()) == []
    downloads = cache_dir / "downloads"
    # No finished archive is left where the next run would take it as valid.
    assert not (downloads / NAME).exists()


# -- through the CLI ---------------------------------------------------------------------


def test_resume_after_a_dropped_connection(mirror: FaultServer, cache_dir: Path) -> None:
    mirror.fail(PATH, Fault.drop_after(300_000))
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    first, second = mirror.requests_for(PATH)
    assert _range_start(first.headers) is None
    offset = _range_start(second.headers)
    assert offset is not None
    assert 0 < offset <= 300_000
    assert "If-Range" in second.headers  # so a changed file is sent whole, not spliced
    manifest = _installed_manifest(cache_dir)
    assert manifest["sha256"] == _sha256(_served(mirror))
    assert manifest["size"] == len(_served(mirror))
    assert "resuming" in result.stderr


@pytest.mark.parametrize("status", [503, 429, 500, 502, 504, 507])
def test_retry_after_a_transient_status(mirror: FaultServer, cache_dir: Path, status: int) -> None:
    mirror.fail(PATH, Fault.status(status, retry_after="0"), Fault.status(status, retry_after="0"))
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert len(mirror.requests_for(PATH)) == 3
    assert f"HTTP {status}" in result.stderr
    assert "retrying" in result.stderr
    assert _installed_manifest(cache_dir)["sha256"] == _sha256(_served(mirror))


def test_restart_when_the_server_ignores_range(mirror: FaultServer, cache_dir: Path) -> None:
    mirror.fail(PATH, Fault.drop_after(300_000), Fault.ignore_range())
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    requests = mirror.requests_for(PATH)
    assert len(requests) == 2
    assert _range_start(requests[1].headers)
    # Had the 200 body been appended to the partial file, this would not hold.
    assert _installed_manifest(cache_dir)["sha256"] == _sha256(_served(mirror))


def _leave_partial(cache_dir: Path, url: str, data: bytes) -> Path:
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True)
    (downloads / f"{NAME}.json").write_text(json.dumps({"url": url}))
    part = downloads / f"{NAME}.part"
    part.write_bytes(data)
    return part


def test_416_discards_the_partial(mirror: FaultServer, cache_dir: Path) -> None:
    """A partial file longer than the archive cannot be resumed: start again from zero."""
    served = _served(mirror)
    _leave_partial(cache_dir, mirror.url(PATH), served + b"trailing garbage")
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    first, second = mirror.requests_for(PATH)
    assert _range_start(first.headers) == len(served) + len(b"trailing garbage")
    assert _range_start(second.headers) is None
    assert "416" in result.stderr
    assert _installed_manifest(cache_dir)["sha256"] == _sha256(served)


def test_partial_from_another_url_is_not_resumed(mirror: FaultServer, cache_dir: Path) -> None:
    served = _served(mirror)
    _leave_partial(cache_dir, "http://127.0.0.1:9/elsewhere/" + NAME, served[:1000])
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    (only,) = mirror.requests_for(PATH)
    assert "Range" not in only.headers


@pytest.mark.parametrize("fault", [Fault.html(), Fault.html_untyped()], ids=["text/html", "binary-type"])
def test_html_page_with_200_is_not_an_archive(mirror: FaultServer, cache_dir: Path, fault: Fault) -> None:
    mirror.fail(PATH, fault)
    result = run_qnnctl("install")
    assert result.returncode == 3, result.stderr
    assert "HTML page" in result.stderr
    assert result.stdout == ""
    _nothing_installed(cache_dir)
    assert not (cache_dir / "downloads" / f"{NAME}.part").exists()
    # The next run downloads the real archive, it does not build on the page.
    again = run_qnnctl("install")
    assert again.returncode == 0, again.stderr
    assert _range_start(mirror.requests_for(PATH)[-1].headers) is None


def test_404_is_a_download_failure(server: FaultServer, cache_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_MIRROR", server.base)
    result = run_qnnctl("install")
    assert result.returncode == 3, result.stderr
    assert "404" in result.stderr
    assert server.url(PATH) in result.stderr
    assert len(server.requests_for(PATH)) == 1  # not retried
    _nothing_installed(cache_dir)


@pytest.mark.parametrize("status", [403, 401, 410])
def test_other_client_errors_are_not_retried(mirror: FaultServer, cache_dir: Path, status: int) -> None:
    mirror.fail(PATH, Fault.status(status))
    result = run_qnnctl("install")
    assert result.returncode == 3, result.stderr
    assert f"HTTP {status}" in result.stderr
    assert len(mirror.requests_for(PATH)) == 1
    _nothing_installed(cache_dir)


def test_sha256_mismatch_removes_the_download(mirror: FaultServer, cache_dir: Path) -> None:
    wrong = "0" * 64
    result = run_qnnctl("install", "--sha256", wrong)
    assert result.returncode == 4, result.stderr
    assert "sha256 mismatch" in result.stderr
    assert wrong in result.stderr
    assert _sha256(_served(mirror)) in result.stderr
    _nothing_installed(cache_dir)
    assert list((cache_dir / "downloads").iterdir()) == []


def test_sha256_match_installs(mirror: FaultServer, cache_dir: Path) -> None:
    digest = _sha256(_served(mirror))
    result = run_qnnctl("install", "--sha256", digest.upper())
    assert result.returncode == 0, result.stderr
    assert _installed_manifest(cache_dir)["sha256"] == digest


def test_malformed_sha256_is_a_usage_error(mirror: FaultServer) -> None:
    result = run_qnnctl("install", "--sha256", "abc")
    assert result.returncode == 2, result.stderr
    assert mirror.requests == []


def test_not_enough_space_for_the_download(server: FaultServer, tmp_path: Path) -> None:
    """The server announces more bytes than the disk holds; nothing is written."""
    server.add(PATH, b"PK" + bytes(1000))
    server.fail(PATH, Fault.claim_length(1 << 60))
    with pytest.raises(DiskSpaceError) as caught:
        _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert "not enough free space" in caught.value.message
    assert "QNNCTL_CACHE_DIR" in (caught.value.hint or "")
    assert not (tmp_path / "downloads" / f"{NAME}.part").exists()


def test_a_length_past_any_sdk_archive_is_refused_before_a_byte_is_written(mirror: FaultServer,
                                                                           cache_dir: Path) -> None:
    """Nothing pins the archive: the server announces more than any SDK archive is (16 GiB)."""
    mirror.fail(PATH, Fault.claim_length(1 << 60))
    result = run_qnnctl("install")
    assert result.returncode == 4, result.stderr
    assert (f"is longer than {16 << 30} bytes, the size qnnctl takes as the most any SDK archive is (it says the "
            f"file is {1 << 60} bytes)") in result.stderr
    _nothing_installed(cache_dir)
    assert not (cache_dir / "downloads" / f"{NAME}.part").exists()


def test_progress_is_plain_lines_when_stderr_is_not_a_terminal(mirror: FaultServer) -> None:
    """Piped, a download of a moment says only how it ended: no ten lines of percentages (the
    lines on the way, at most one every PLAIN_INTERVAL seconds, are test_plain_progress_...)."""
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    assert "\r" not in result.stderr
    assert "\x1b" not in result.stderr
    assert [line for line in result.stderr.splitlines() if "% of" in line] == []
    assert re.search(rf"^qnnctl: v{VERSION}\.zip: 1\.\d MiB in \d+\.\ds$", result.stderr, re.M), result.stderr


def test_progress_is_a_bar_when_stderr_is_a_terminal(mirror: FaultServer) -> None:
    returncode, out, seen = run_qnnctl_on_a_terminal("-v", "install")
    assert returncode == 0, seen.decode(errors="replace")
    assert out.strip().endswith(f"sdks/{VERSION}")
    assert re.search(rb"\r(?!\n)", seen), seen  # tqdm redraws its bar in place (each line ends in \r\n here)
    assert b"% of" not in seen  # and the plain lines are not printed as well
    # Sizes and the rate in the same units, and a line that stays when the bar is gone.
    drawn = seen.decode(errors="replace")
    assert re.search(r"\d+\.\d+[KM]?iB/1\.\d+MiB \[[^]]*, *[\d.?]+[KMG]?iB/s\]", drawn), drawn
    assert b"MB/s" not in seen
    assert re.search(rf"qnnctl: v{VERSION}\.zip: 1\.\d MiB in \d+\.\ds\r\n", drawn), drawn
    # The bar leaves no thread behind that would keep the extraction from forking.
    assert re.search(rb"\d+ jobs in \d+ processes", seen), seen.decode(errors="replace")


def test_proxy_from_the_environment_is_used(server: FaultServer, cache_dir: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTP_PROXY is honoured: the request reaches the proxy in absolute form."""
    from tests.sdkfactory import build_archive

    (cache_dir.parent / "a").mkdir()
    data = build_archive(cache_dir.parent / "a", "zip").read_bytes()
    url = f"http://sdk.invalid/{VERSION}/v{VERSION}.zip"
    server.add(url, data)  # the proxy sees the whole URL as the path
    monkeypatch.setenv("HTTP_PROXY", server.base)
    monkeypatch.setenv("NO_PROXY", "localhost")
    result = run_qnnctl("install", "--url", url)
    assert result.returncode == 0, result.stderr
    (request,) = server.requests_for(url)
    assert request.headers["User-Agent"].startswith("qnnctl/")


# -- the downloader on its own -----------------------------------------------------------


class Sleeps(list[float]):
    def __call__(self, seconds: float) -> None:
        self.append(seconds)


@pytest.fixture
def served(server: FaultServer) -> bytes:
    data = os.urandom(1 << 20)
    server.add(PATH, data)
    return data


def _downloader(tmp_path: Path, sleeps: Sleeps | None = None) -> Downloader:
    return Downloader(make_session(), tmp_path / "downloads", sleep=sleeps if sleeps is not None else Sleeps())


def test_session_reads_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bundle = tmp_path / "ca.pem"
    bundle.write_text("")
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(bundle))
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.example:3128")
    session = make_session()
    assert session.headers["User-Agent"] == f"qnnctl/{__version__}"
    assert make_session("9.9.9").headers["User-Agent"] == "qnnctl/9.9.9"
    assert session.headers["Accept-Encoding"] == "identity"
    assert session.headers["Accept"] == "*/*"  # some servers answer nothing else
    assert session.settings.ca_bundle == str(bundle)
    assert session.settings.proxy_url("https://softwarecenter.qualcomm.com/x") == "http://proxy.example:3128"


def test_backoff_is_exponential_without_retry_after(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    server.fail(PATH, Fault.status(503), Fault.status(503), Fault.status(503))
    sleeps = Sleeps()
    fetched = _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert sleeps == [1.0, 2.0, 4.0]
    assert fetched.sha256 == _sha256(served)
    assert fetched.path.read_bytes() == served


@pytest.mark.parametrize(("header", "expected"), [
    ("7", 7.0),
    ("3600", 60.0),  # honoured, within a bound
    (email.utils.formatdate(time.time() - 60, usegmt=True), 0.0),
], ids=["seconds", "seconds-over-the-bound", "a-date-past"])  # a date in an id would differ between test workers
def test_retry_after_is_honoured(server: FaultServer, served: bytes, tmp_path: Path,
                                 header: str, expected: float) -> None:
    server.fail(PATH, Fault.status(429, retry_after=header))
    sleeps = Sleeps()
    _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert sleeps == [expected]


def test_retries_are_bounded(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    server.fail(PATH, *[Fault.status(503)] * 20)
    sleeps = Sleeps()
    with pytest.raises(DownloadError, match="after 6 attempts") as caught:
        _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert caught.value.exit_code == 3
    assert len(server.requests_for(PATH)) == MAX_ATTEMPTS
    assert sleeps == [1.0, 2.0, 4.0, 8.0, 16.0]


def test_connection_refused_is_retried_then_fails(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    sleeps = Sleeps()
    with pytest.raises(DownloadError, match="cannot reach"):
        _downloader(tmp_path, sleeps).fetch([f"http://127.0.0.1:{port}{PATH}"], NAME)
    assert len(sleeps) == MAX_ATTEMPTS - 1


def test_drops_that_make_progress_do_not_exhaust_the_retries(server: FaultServer, served: bytes,
                                                              tmp_path: Path) -> None:
    # Each attempt keeps one more whole 64 KiB block: more attempts than MAX_ATTEMPTS, yet it
    # completes.
    server.fail(PATH, *[Fault.drop_after(100_000)] * (MAX_ATTEMPTS + 3))
    fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert fetched.sha256 == _sha256(served)
    starts = [_range_start(r.headers) or 0 for r in server.requests_for(PATH)]
    assert starts == sorted(starts)
    assert starts[-1] > 0


@pytest.mark.parametrize("shift", [-(1 << 30), -1, 1, 65536], ids=["from-0", "one-early", "one-late", "a-block-late"])
def test_a_206_that_starts_elsewhere_is_not_spliced(server: FaultServer, served: bytes, tmp_path: Path,
                                                    shift: int) -> None:
    """A resumed request answered with 206 from another offset than the one asked for: its bytes
    would not follow the partial file's, so the download starts over."""
    server.fail(PATH, Fault.drop_after(300_000), Fault.misplaced_range(shift))
    fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert fetched.sha256 == _sha256(served)
    assert fetched.path.read_bytes() == served
    first, resumed, again = server.requests_for(PATH)
    assert _range_start(first.headers) is None
    assert _range_start(resumed.headers)
    assert _range_start(again.headers) is None  # started over, from nothing


def _lenient_content_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """An HTTP stack that does not hold a body to its Content-Length (http.client's own read1,
    urllib3 1.x by default): a body that ends early arrives without an error, its bytes kept."""
    from qnnctl.net.http import Response

    monkeypatch.setattr(Response, "read1", lambda self, size=-1: self.raw.read1(size))


def test_a_body_shorter_than_its_length_is_not_complete(server: FaultServer, served: bytes, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """With an HTTP stack that does not enforce Content-Length, a body that ends early arrives
    without an error: the downloader itself must see that it is short."""
    _lenient_content_length(monkeypatch)
    server.fail(PATH, Fault.drop_after(0), Fault.drop_after(300_000))
    sleeps = Sleeps()
    fetched = _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert fetched.sha256 == _sha256(served)
    empty, first, resumed = server.requests_for(PATH)
    assert _range_start(empty.headers) is None
    assert _range_start(first.headers) is None
    assert _range_start(resumed.headers) == 300_000
    # A retry each, as for a connection that broke: the second renewed by the bytes it kept.
    assert sleeps == [1.0, 1.0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "the body ended early, at 0 B of 1.0 MiB; retrying in 1.0s (attempt 2 of 6)",
        "the body ended early, at 293.0 KiB of 1.0 MiB; retrying in 1.0s (attempt 2 of 6)"]


def test_the_first_byte_kept_renews_the_retries_spent_before_it(server: FaultServer, served: bytes, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """A download with nothing on disk yet that keeps its first byte has moved on: the retry
    the session spent on a 503 before it is given back."""
    _lenient_content_length(monkeypatch)  # so that a body cut after one byte keeps it
    server.fail(PATH, Fault.status(503), Fault.drop_after(1))
    sleeps = Sleeps()
    fetched = _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    assert _range_start(server.requests_for(PATH)[-1].headers) == 1
    assert sleeps == [1.0, 1.0]
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"][-1] == (
        "the body ended early, at 1 B of 1.0 MiB; retrying in 1.0s (attempt 2 of 6)")


def test_a_changed_file_is_fetched_whole(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    """If-Range: when the file changed between runs, the server sends all of it (200)."""
    server.fail(PATH, Fault.drop_after(100_000), *[Fault.status(500)] * 10)
    downloader = _downloader(tmp_path)
    with pytest.raises(DownloadError):
        downloader.fetch([server.url(PATH)], NAME)
    assert (tmp_path / "downloads" / f"{NAME}.part").stat().st_size > 0
    changed = os.urandom(700_000)
    server.add(PATH, changed)
    with server.lock:
        server.faults[PATH].clear()
    fetched = downloader.fetch([server.url(PATH)], NAME)
    assert fetched.sha256 == _sha256(changed)
    assert _range_start(server.requests_for(PATH)[-1].headers)  # it asked to resume...


def test_finished_download_is_reused_without_a_request(server: FaultServer, served: bytes,
                                                       tmp_path: Path) -> None:
    downloader = _downloader(tmp_path)
    first = downloader.fetch([server.url(PATH)], NAME)
    again = downloader.fetch([server.url(PATH)], NAME)
    assert again == first
    assert len(server.requests_for(PATH)) == 1
    # A finished file that was changed on disk is not trusted.
    first.path.write_bytes(b"tampered")
    third = downloader.fetch([server.url(PATH)], NAME)
    assert third.sha256 == _sha256(served)
    assert len(server.requests_for(PATH)) == 2


def test_the_next_url_is_tried_after_a_404(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    fetched = _downloader(tmp_path).fetch([server.url("/missing/" + NAME), server.url(PATH)], NAME)
    assert fetched.url == server.url(PATH)


def test_free_space_is_checked_from_content_length(server: FaultServer, served: bytes, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    with pytest.raises(DiskSpaceError) as caught:
        _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    needed = caught.value.needed
    assert needed == len(served) + space_margin(len(served))
    assert caught.value.message == (f"not enough free space in {tmp_path / 'downloads'} to download the archive: "
                                    f"need {needed / (1 << 20):.1f} MiB, 1.0 MiB free")
    assert not (tmp_path / "downloads" / NAME).exists()
    assert not (tmp_path / "downloads" / f"{NAME}.part").exists()


@pytest.mark.parametrize(("value", "expected"), [
    (None, None), ("", None), ("0", 0.0), ("120", 120.0), ("soon", None),
    ("Wed, 21 Oct 2015 07:28:00 GMT", 30.0),
])
def test_retry_after_parsing(value: str | None, expected: float | None) -> None:
    now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:27:30 GMT").timestamp()
    assert retry_after(value, now=now) == expected


# -- what retrying cannot fix fails at once, and says why ----------------------------------


@pytest.fixture
def certificate(tmp_path: Path) -> Certificate:
    require_tool("openssl")
    return self_signed_certificate(tmp_path / "tls")


def _error_line(stderr: str) -> str:
    (line,) = [line for line in stderr.splitlines() if line.startswith("qnnctl: error:")]
    return line


def test_an_untrusted_certificate_fails_at_once_with_its_whole_cause(certificate: Certificate,
                                                                      cache_dir: Path) -> None:
    (cache_dir.parent / "a").mkdir()
    data = build_archive(cache_dir.parent / "a", "zip").read_bytes()
    with FaultServer(tls=certificate) as server:
        server.add(PATH, data)
        started = time.monotonic()
        result = run_qnnctl("install", "--url", server.url(PATH))
        elapsed = time.monotonic() - started
        assert result.returncode == 3, result.stderr
        assert server.connections == 1  # retried, it would take 31 s and 6 connections
        assert elapsed < 20
        assert "retrying" not in result.stderr
        # The cause in full, on the error's own line (it was cut at 200 characters).
        line = _error_line(result.stderr)
        assert re.search(r"certificate verify failed: self[- ]signed certificate \(_ssl\.c:\d+\)$", line), line
        assert "REQUESTS_CA_BUNDLE" in result.stderr
        # The same download, with that certificate trusted.
        trusted = dict(os.environ, REQUESTS_CA_BUNDLE=str(certificate.cert))
        again = run_qnnctl("install", "--url", server.url(PATH), env=trusted)
        assert again.returncode == 0, again.stderr


UNKNOWN_HOST = "qnnctl-test.invalid"  # RFC 2606: never resolves


def _no_such_name(host: str, *args: Any, **kwargs: Any) -> Any:
    """socket.getaddrinfo as a resolver answers for a name that does not exist."""
    raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")


# The entry point, with the resolver answering so for UNKNOWN_HOST: no query leaves the machine.
ENTRY_WITHOUT_UNKNOWN_HOST = f"""
import runpy, socket
real = socket.getaddrinfo
def getaddrinfo(host, *args, **kwargs):
    if host == {UNKNOWN_HOST!r}:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    return real(host, *args, **kwargs)
socket.getaddrinfo = getaddrinfo
runpy.run_module("qnnctl", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def unknown_host(monkeypatch: pytest.MonkeyPatch) -> str:
    """A host the resolver does not know, reached directly (no proxy)."""
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        monkeypatch.delenv(name)
    monkeypatch.setattr(socket, "getaddrinfo", _no_such_name)
    return UNKNOWN_HOST


def test_an_unknown_host_fails_at_once(unknown_host: str, tmp_path: Path) -> None:
    sleeps = Sleeps()
    with pytest.raises(DownloadError) as caught:
        _downloader(tmp_path, sleeps).fetch([f"http://{unknown_host}{PATH}"], NAME)
    assert sleeps == []
    assert caught.value.exit_code == 3
    assert f"the host name {unknown_host} cannot be resolved ([Errno -2] Name or service not known)" \
        in str(caught.value)


def test_an_unknown_host_fails_at_once_on_the_command_line(unknown_host: str) -> None:
    result = subprocess.run([sys.executable, "-c", ENTRY_WITHOUT_UNKNOWN_HOST, "install", "--url",
                             f"https://{unknown_host}{PATH}"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert "retrying" not in result.stderr
    assert f"the host name {unknown_host} cannot be resolved" in _error_line(result.stderr)


def test_retry_warnings_say_what_happened_in_words(mirror: FaultServer) -> None:
    mirror.fail(PATH, Fault.drop_after(300_000))
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    (warning,) = [line for line in result.stderr.splitlines() if "retrying" in line]
    assert re.search(r"stopped at [\d.]+ KiB of [\d.]+ MiB: the server closed the connection \d+ bytes "
                     r"before the end it announced; retrying in 1\.0s \(attempt 2 of 6\)$", warning), warning
    for repr_of_an_exception in ("IncompleteRead(", "ProtocolError(", "Connection broken:"):
        assert repr_of_an_exception not in result.stderr


def test_a_refused_connection_is_retried_and_said_in_words(tmp_path: Path,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DownloadError) as caught:
        _downloader(tmp_path).fetch([f"http://127.0.0.1:{port}{PATH}"], NAME)
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == MAX_ATTEMPTS - 1
    assert warnings[0] == (f"cannot reach http://127.0.0.1:{port}{PATH}: the connection was refused "
                           "([Errno 111] Connection refused); retrying in 1.0s (attempt 2 of 6)")
    assert str(caught.value) == (f"download of http://127.0.0.1:{port}{PATH} failed after 6 attempts: "
                                 "cannot reach the server: the connection was refused ([Errno 111] Connection refused)")


def test_the_retry_policy_is_declared() -> None:
    policy = retry_policy()
    assert policy.total == MAX_ATTEMPTS - 1
    for status in (408, 425, 429, 500, 503, 599):
        assert policy.is_retry("GET", status)
    for status in (401, 403, 404, 410, 416):
        assert not policy.is_retry("GET", status)
    # Only requests that change nothing are sent again.
    assert [policy.is_retry(method, 503) for method in ("HEAD", "POST", "PUT", "DELETE")] == [
        True, False, False, False]


# -- the rest ----------------------------------------------------------------------------


def test_a_resumed_download_reports_what_this_run_received(mirror: FaultServer, cache_dir: Path) -> None:
    mirror.fail(PATH, Fault.drop_after(300_000), Fault.status(403))
    assert run_qnnctl("install").returncode == 3
    result = run_qnnctl("install")
    assert result.returncode == 0, result.stderr
    summary = re.search(r"(\d+\.\d) KiB in [\d.]+s \(resumed at (\d+\.\d) KiB; 1\.0 MiB in all\)",
                        result.stderr)
    assert summary is not None, result.stderr  # it said "1.0 MiB in 0.0s"
    received, resumed = (float(x) for x in summary.groups())
    assert resumed > 0
    assert received + resumed == pytest.approx(len(_served(mirror)) / 1024, abs=0.2)


def test_a_resumed_download_on_a_terminal_says_it_resumed(mirror: FaultServer, cache_dir: Path) -> None:
    mirror.fail(PATH, Fault.drop_after(300_000), Fault.status(403))
    assert run_qnnctl("install").returncode == 3
    returncode, _, seen = run_qnnctl_on_a_terminal("install")
    drawn = seen.decode(errors="replace")
    assert returncode == 0, drawn
    assert re.search(rf"qnnctl: v{VERSION}\.zip: resuming at \d+\.\d KiB of 1\.0 MiB\r\n", drawn), drawn
    assert re.search(r"KiB in [\d.]+s \(resumed at \d+\.\d KiB; 1\.0 MiB in all\)\r\n", drawn), drawn


def test_the_free_space_margin_scales_with_the_archive(server: FaultServer, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A 61 KB SDK installs on a disk with 20 MB free (a fixed 64 MiB margin refused it)."""
    from qnnctl.install.pipeline import InstallRequest, install
    from qnnctl.sdk.cache import Cache
    from tests.sdkfactory import build_archive

    (tmp_path / "a").mkdir()
    archive = build_archive(tmp_path / "a", "zip")
    assert len(archive.read_bytes()) < 100_000
    server.add(PATH, archive.read_bytes())
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=20 << 20))
    cache = Cache(tmp_path / "small-disk")
    result = install(InstallRequest(url=server.url(PATH)), cache, dict(os.environ), tmp_path,
                     vouchers(os.environ, tmp_path))
    assert result.action == "installed"
    assert space_margin(61_000) == 1 << 20
    assert space_margin(200 << 20) == 20 << 20
    assert space_margin(1_543_955_191) == 64 << 20


def test_an_html_page_leaves_no_record_behind(mirror: FaultServer, cache_dir: Path) -> None:
    mirror.fail(PATH, Fault.html_untyped())
    result = run_qnnctl("install")
    assert result.returncode == 3, result.stderr
    assert list((cache_dir / "downloads").iterdir()) == []


# -- the words of each failure, and the small pieces -----------------------------------------

SHOWN = "https://***@mirror.example/v2.37.0.250724.zip"
AGAIN = ("run the same command again to resume; check the network, HTTPS_PROXY and REQUESTS_CA_BUNDLE "
         "with `qnnctl doctor`")


def _failed(exc: BaseException) -> DownloadError:
    from qnnctl.net.download import request_failed

    return request_failed(SHOWN, exc)


def test_each_kind_of_failed_request_has_its_own_words() -> None:
    from qnnctl.net.failures import BadRequest, NoConnection, UnusableBundle
    from qnnctl.net.retry import GaveUp, describe
    from tests.net.test_http import caused

    untrusted = caused(NoConnection("tls"), ssl.SSLCertVerificationError(1, "certificate verify failed: "
                                                                         "self-signed certificate"))
    error = _failed(untrusted)
    assert (error.message, error.hint) == (
        f"cannot download {SHOWN}: {describe(untrusted)}",
        "if your network inspects TLS, set REQUESTS_CA_BUNDLE to your organisation's CA bundle; "
        "`qnnctl doctor` shows the bundle in use")
    nameless = caused(NoConnection("dns"), socket.gaierror(socket.EAI_NONAME, "Name or service not known"))
    error = _failed(nameless)
    assert (error.message, error.hint) == (
        f"cannot download {SHOWN}: {describe(nameless)}",
        "check the host name in the URL (or QNNCTL_MIRROR); behind a proxy, set HTTPS_PROXY")
    odd = BadRequest("the URL names no host")
    error = _failed(odd)
    assert (error.message, error.hint) == (f"request to {SHOWN} failed: {describe(odd)}",
                                           "check the URL (or QNNCTL_MIRROR) and proxy settings")
    unusable = UnusableBundle("the CA bundle /etc/none.pem (REQUESTS_CA_BUNDLE) cannot be used: "
                              "No such file or directory")
    error = _failed(unusable)
    assert (error.message, error.hint, error.exit_code) == (
        f"cannot download {SHOWN}: the CA bundle /etc/none.pem (REQUESTS_CA_BUNDLE) cannot be used: No such file or "
        "directory",
        "set REQUESTS_CA_BUNDLE to a file of PEM certificates (or a folder of them), or unset it and CURL_CA_BUNDLE "
        "to use certifi's bundle; `qnnctl doctor` shows the bundle in use", 3)
    refused = caused(NoConnection("refused"), ConnectionRefusedError(111, "Connection refused"))
    error = _failed(refused)
    assert (error.message, error.hint) == (f"cannot reach {SHOWN}: {describe(refused)}", AGAIN)
    for attempts in (2, 6):
        retried = caused(GaveUp(attempts), refused)
        error = _failed(retried)
        assert (error.message, error.hint) == (
            f"download of {SHOWN} failed after {attempts} attempts: cannot reach the server: {describe(retried)}",
            AGAIN)
        assert error.exit_code == 3


def test_plain_progress_says_every_tenth(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """At each tenth when the download is slow (seconds apart), but not the last one: the
    closing line says it."""
    import logging

    from qnnctl.net.download import PLAIN_INTERVAL, PlainProgress

    clock = _Clock(1000.0)
    monkeypatch.setattr("qnnctl.net.download.time.monotonic", clock)
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 1000, 0)
        for _ in range(20):
            clock.now += PLAIN_INTERVAL / 2
            bar.update(50)
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [*(f"v.zip: {p:3d}% of 1000 B" for p in range(10, 100, 10)), "v.zip: 1000 B in 30.0s"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 1000, 0)
        clock.now += PLAIN_INTERVAL
        bar.update(50)  # short of the first tenth, however late: not said
    assert caplog.records == []
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 999, 0)
        clock.now += PLAIN_INTERVAL
        bar.update(99)  # exactly at the first mark (a tenth, rounded down): said
        bar.update(1)
        clock.now += PLAIN_INTERVAL
        bar.update(899)
    assert [r.getMessage() for r in caplog.records] == ["v.zip:   9% of 999 B"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        unknown = PlainProgress("v.zip", None, 0)
        clock.now += PLAIN_INTERVAL
        unknown.update(128 << 20)  # half-way to the first 256 MiB, however late: not said
        clock.now += PLAIN_INTERVAL
        unknown.update((128 << 20) - 1)
        unknown.update(1)
    assert [r.getMessage() for r in caplog.records] == ["v.zip: 256.0 MiB"]


def test_plain_progress_of_a_quick_download_says_only_how_it_ended(caplog: pytest.LogCaptureFixture,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten tenths within PLAIN_INTERVAL: no line on the way; one every PLAIN_INTERVAL at most."""
    import logging

    from qnnctl.net.download import PLAIN_INTERVAL, PlainProgress

    clock = _Clock(1000.0)
    monkeypatch.setattr("qnnctl.net.download.time.monotonic", clock)
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 1000, 0)
        for _ in range(10):
            clock.now += PLAIN_INTERVAL / 25
            bar.update(100)
        bar.close()
    assert [r.getMessage() for r in caplog.records] == ["v.zip: 1000 B in 1.2s"]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 1000, 0)
        for _ in range(10):
            clock.now += PLAIN_INTERVAL * 0.4
            bar.update(100)
    # 1.2, 2.4 seconds in: too soon; 3.6 s: said; then again 3 s or more after that.
    assert [r.getMessage() for r in caplog.records] == ["v.zip:  30% of 1000 B", "v.zip:  60% of 1000 B",
                                                        "v.zip:  90% of 1000 B"]


def test_the_bar_on_a_terminal_counts_bytes(monkeypatch: pytest.MonkeyPatch,
                                            caplog: pytest.LogCaptureFixture) -> None:
    """In MiB, its rate too; a resumed download says so first, and the bar leaves a line saying
    how it ended, once."""
    import io
    import logging

    from qnnctl.net.download import terminal_progress

    clock = _Clock(1000.0)
    monkeypatch.setattr("qnnctl.net.download.time.monotonic", clock)
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar: Any = terminal_progress("v.zip", 4 << 20, 1 << 20)
        assert [r.getMessage() for r in caplog.records] == ["v.zip: resuming at 1.0 MiB of 4.0 MiB"]
        try:
            assert (bar.total, bar.n, bar.unit, bar.unit_scale, bar.unit_divisor, bar.desc, bar.leave) == (
                4 << 20, 1 << 20, "iB", True, 1024, "v.zip", False)
            assert type(bar).monitor_interval == 0
            bar.update(3 << 20)
            clock.now += 2.0
        finally:
            bar.close()
        bar.close()
    # The bar is the label, then tqdm's bar and the sizes and rate in MiB: nothing around them.
    drawn = stderr.getvalue()
    assert re.search(r"\rv\.zip: +25%\|[^|\r]*\| 1\.00MiB/4\.00MiB \[[^]\r]*iB/s\]\r", drawn), drawn
    assert [r.getMessage() for r in caplog.records][1:] == [
        "v.zip: 3.0 MiB in 2.0s (resumed at 1.0 MiB; 4.0 MiB in all)"]


def test_small_pieces_of_the_downloader(tmp_path: Path) -> None:
    from qnnctl.net.download import (
        BACKOFF_MAX,
        Retry,
        _Broke,
        _of,
        _range_start,
        backoff_delay,
        file_sha256,
        retryable_status,
    )
    from qnnctl.net.failures import BodyBroke

    assert _of(1536, None) == "1.5 KiB"
    assert _of(1536, 3 << 20) == "1.5 KiB of 3.0 MiB"
    assert _range_start("bytes 100-199/200") == 100
    assert _range_start("bytes 100-199-7/200") == 100
    assert _range_start("") is None
    assert _range_start(None) is None
    assert _range_start("items 100-199/200") is None
    assert _range_start("bytes */200") is None
    big = tmp_path / "big"
    big.write_bytes(os.urandom(3 << 20))
    assert file_sha256(big) == _sha256(big.read_bytes())
    assert [retryable_status(s) for s in (408, 429, 500, 503, 404, 403, 200)] == [True] * 4 + [False] * 3
    assert [backoff_delay(a, 1.0) for a in (0, 1, 2, 3, 9)] == [1.0, 1.0, 2.0, 4.0, BACKOFF_MAX]
    retry = Retry("busy", 2.5)
    assert (str(retry), retry.reason, retry.delay) == ("busy", "busy", 2.5)
    policy = retry_policy()
    broke = _Broke(policy, BodyBroke("the body ended early"))
    assert (str(broke), broke.policy, str(broke.error)) == ("the body ended early", policy, "the body ended early")


def test_retry_after_a_date_is_from_now() -> None:
    later = email.utils.formatdate(time.time() + 30, usegmt=True)
    waited = retry_after(later)
    assert waited is not None
    assert 25 < waited <= 30
    assert retry_after(email.utils.formatdate(time.time() - 30, usegmt=True)) == 0.0


def test_plain_progress_steps_by_one_byte_for_a_tiny_file(caplog: pytest.LogCaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from qnnctl.net.download import PlainProgress

    # A tenth of 5 bytes rounds down to 0: every byte is a step, none is skipped.
    clock = _Clock(1000.0)
    monkeypatch.setattr("qnnctl.net.download.time.monotonic", clock)
    with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
        bar = PlainProgress("v.zip", 5, 0)
        for _ in range(5):
            clock.now += 3.0
            bar.update(1)
    assert [r.getMessage() for r in caplog.records] == [f"v.zip: {p:3d}% of 5 B" for p in range(20, 100, 20)]


class _Clock:
    """time.monotonic for the progress lines: moves only when a test says so."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_plain_progress_closes_with_this_runs_size_and_time(caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    import logging

    from qnnctl.net.download import PlainProgress

    clock = _Clock(1000.0)
    monkeypatch.setattr("qnnctl.net.download.time.monotonic", clock)

    def closing(total: int | None, initial: int, received: int, seconds: float) -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="qnnctl.net.download"):
            bar = PlainProgress("v.zip", total, initial)
            bar.update(received)
            clock.now += seconds
            caplog.clear()  # the lines said on the way
            bar.close()
        [line] = [r.getMessage() for r in caplog.records]
        return line

    assert closing(3 << 20, 0, 3 << 20, 2.5) == "v.zip: 3.0 MiB in 2.5s"
    assert closing(None, 0, 1536, 0.5) == "v.zip: 1.5 KiB in 0.5s"
    # No time at all is said as such, not as a second.
    assert closing(1000, 0, 1000, 0.0) == "v.zip: 1000 B in 0.0s"
    assert closing(2048, 512, 1536, 4.0) == "v.zip: 1.5 KiB in 4.0s (resumed at 512 B; 2.0 KiB in all)"
    # Short of the size: how far it got, nothing that reads like success.
    assert closing(1000, 0, 400, 3.0) == "v.zip: stopped at 400 B of 1000 B"
    assert closing(2048, 512, 512, 3.0) == "v.zip: stopped at 1.0 KiB of 2.0 KiB"


def test_sizes_are_said_in_binary_units_up_to_gib() -> None:
    from qnnctl.words import human_size

    assert [human_size(n) for n in (0, 1023, 1024, (1 << 20) - 1, 1 << 20, 3 << 30, 5000 << 30)] == [
        "0 B", "1023 B", "1.0 KiB", "1024.0 KiB", "1.0 MiB", "3.0 GiB", "5000.0 GiB"]


def test_each_answer_that_ends_a_download_has_its_own_words(server: FaultServer, served: bytes,
                                                            tmp_path: Path) -> None:
    downloader = _downloader(tmp_path)
    url = server.url(PATH)

    def refusal(*faults: Fault, urls: list[str] | None = None) -> tuple[str, str | None]:
        server.fail(PATH, *faults)
        with pytest.raises(DownloadError) as caught:
            downloader.fetch(urls or [url], NAME)
        with server.lock:
            server.faults[PATH].clear()
        return caught.value.message, caught.value.hint

    # Not found at any of them: the last one tried is named.
    missing = [server.url("/a/" + NAME), server.url("/b/" + NAME)]
    assert refusal(urls=missing) == (
        f"the archive was not found (HTTP 404) at {missing[1]}",
        "check the version (a prefix such as `qnnctl install 2.37` picks the newest known release), "
        "or set QNNCTL_MIRROR to a mirror that holds it")
    final = (f"HTTP 403 Forbidden from {url}", "check the URL, the version, or your access to the mirror")
    assert refusal(Fault.status(403)) == final
    # A code with no reason phrase: said without one, and without a space where it would be.
    assert refusal(Fault.status(499)) == (f"HTTP 499 from {url}", final[1])
    assert refusal(*[Fault.status(503)] * MAX_ATTEMPTS) == (
        f"download of {url} failed after 6 attempts: the last answer was HTTP 503 Service Unavailable", AGAIN)
    assert refusal(*[Fault.status(599)] * MAX_ATTEMPTS) == (
        f"download of {url} failed after 6 attempts: the last answer was HTTP 599", AGAIN)
    assert refusal(*[Fault.status(416)] * 30) == (
        f"download of {url} failed after 30 attempts: the server never let the download resume", AGAIN)
    assert refusal(Fault.html()) == (
        f"{url} answered with an HTML page, not an archive (a login page, a proxy's error page, or a wrong URL)",
        "open the URL in a browser, or download the archive by hand and run `qnnctl install --file ARCHIVE`")
    assert refusal(Fault.html_untyped()) == (
        f"{url} answered with an HTML page, not an archive",
        "check the URL or mirror; download the archive by hand and run `qnnctl install --file ARCHIVE`")
    # No whole block arrives: none is kept, and each attempt counts against the six.
    assert refusal(*[Fault.drop_after(1000)] * MAX_ATTEMPTS) == (
        f"download of {url} failed after 6 attempts: the download stopped at 0 B of 1.0 MiB: "
        f"the server closed the connection {len(served) - 1000} bytes before the end it announced", AGAIN)


def test_a_download_that_moves_on_every_time_still_ends(server: FaultServer, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each request brings one more 64 KiB block of a 4 MiB file: after 30 requests it gives
    up, saying how far it got."""
    big = "/big/" + NAME
    url = server.add(big, os.urandom(4 << 20))
    server.fail(big, *[Fault.drop_after(70_000)] * 40)
    with pytest.raises(DownloadError) as caught:
        _downloader(tmp_path).fetch([url], NAME)
    kept = 29 * (64 << 10)  # the whole blocks of the 29 requests before the last
    assert (caught.value.message, caught.value.hint) == (
        f"download of {url} failed after 30 attempts: the download stopped at 1.9 MiB of 4.0 MiB: "
        f"the server closed the connection {(4 << 20) - kept - 70_000} bytes before the end it announced", AGAIN)
    assert len(server.requests_for(big)) == 30


def test_a_sha256_mismatch_names_both_digests_in_lower_case(server: FaultServer, served: bytes,
                                                            tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError

    url = server.url(PATH)
    with pytest.raises(IntegrityError) as caught:
        _downloader(tmp_path).fetch([url], NAME, "AB" * 32)
    assert (caught.value.message, caught.value.hint) == (
        f"sha256 mismatch for {url}: expected {'ab' * 32}, got {_sha256(served)}",
        "the download was removed; check the --sha256 value or the mirror's file")
    assert list((tmp_path / "downloads").iterdir()) == []


@pytest.mark.parametrize(("first", "html"), [
    (b"<!DOCTYPE html><html>", True),
    (b"<HTML><body>Please log in", True),
    (b"\r\n  \t<head><title>Sign in</title>", True),  # what comes before the tag does not hide it
    (b'<?xml version="1.0"?><html xmlns="http://www.w3.org/1999/xhtml">', True),
    (b"PK\x03\x04<html>", False),  # a zip that holds a page is still a zip
    (b"\x1f\x8b\x08\x00 <html>", False),
    (b"", False),
])
def test_a_body_that_starts_as_a_page_is_html(first: bytes, html: bool) -> None:
    from qnnctl.net.download import _is_html

    assert _is_html(first) is html


def test_only_a_strong_etag_is_kept_to_resume_by() -> None:
    from qnnctl.net.download import strong_etag

    # A weak one (RFC 9110: "W/", case-sensitive) names no exact bytes: If-Range cannot use it.
    assert [strong_etag(tag) for tag in (None, "", 'W/"5-abc"', '"5-abc"', 'w/"5-abc"')] == [
        False, False, False, True, True]


def test_the_record_of_a_download_is_private_and_exact(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    import stat

    url = server.url(PATH)
    fetched = _downloader(tmp_path).fetch([url], NAME)
    record = tmp_path / "downloads" / f"{NAME}.json"
    # It names the URL: only its owner reads it, whatever the umask.
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text(encoding="utf-8")) == {
        "url": url, "etag": _etag(url), "last_modified": None,
        "total": len(served), "sha256": fetched.sha256, "size": len(served)}


@pytest.mark.parametrize("record", ["[]", '"a string"', "{not json"])
def test_a_record_that_is_not_one_is_no_base_to_resume_from(server: FaultServer, served: bytes, tmp_path: Path,
                                                            record: str) -> None:
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    (downloads / f"{NAME}.json").write_text(record)
    (downloads / f"{NAME}.part").write_bytes(served[:1000])
    fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    (only,) = server.requests_for(PATH)
    assert "Range" not in only.headers


def test_a_finished_download_is_checked_against_the_sha256_asked_for(server: FaultServer, served: bytes,
                                                                     tmp_path: Path) -> None:
    from qnnctl.errors import IntegrityError

    # The downloads folder is made with its parents.
    downloader = Downloader(make_session(), tmp_path / "cache" / "downloads", sleep=Sleeps())
    url = server.url(PATH)
    first = downloader.fetch([url], NAME)
    # Kept from an earlier run, it is not taken on trust: the digest asked for must match.
    with pytest.raises(IntegrityError, match=re.escape(f"expected {'0' * 64}, got {first.sha256}")):
        downloader.fetch([url], NAME, "0" * 64)
    assert list((tmp_path / "cache" / "downloads").iterdir()) == []
    assert len(server.requests_for(PATH)) == 1
    # An archive removed by hand, its record left: downloaded again.
    downloader.fetch([url], NAME)
    first.path.unlink()
    again = downloader.fetch([url], NAME, first.sha256)
    assert again == first
    assert len(server.requests_for(PATH)) == 3


def test_only_a_drop_that_keeps_more_renews_the_retries(server: FaultServer, served: bytes, tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """Drops that keep nothing count against the six attempts; one that keeps a block renews
    them, once: the drops after it keep nothing either."""
    url = server.url(PATH)
    server.fail(PATH, *[Fault.drop_after(1000)] * 3, Fault.drop_after(70_000), Fault.status(503),
                *[Fault.drop_after(1000)] * 40)
    sleeps = Sleeps()
    with pytest.raises(DownloadError) as caught:
        _downloader(tmp_path, sleeps).fetch([url], NAME)
    assert caught.value.message == (
        f"download of {url} failed after 6 attempts: the download stopped at 64.0 KiB of 1.0 MiB: "
        f"the server closed the connection {len(served) - 65536 - 1000} bytes before the end it announced")
    assert len(server.requests_for(PATH)) == 9
    assert sleeps == [1.0, 2.0, 4.0, 1.0, 2.0, 4.0, 8.0, 16.0]  # renewed after the fourth
    # A retry after the budget was renewed still names the URL.
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warnings[4] == f"{url} answered HTTP 503 Service Unavailable; retrying in 2.0s (attempt 3 of 6)"


class _Reader:
    """A Sink that records what it is told, and checks that the bytes it is told of are on disk."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []
        self.part: Path | None = None

    def begin(self, part: Path, offset: int, total: int | None) -> None:
        self.part = part
        self.events.append(("begin", part.name, offset, total))

    def extend(self, size: int) -> None:
        assert self.part is not None
        assert self.part.stat().st_size >= size  # written through, not only buffered
        self.events.append(("extend", size))


class _Bars:
    """A progress factory that records each bar's label, total, start and updates."""

    def __init__(self) -> None:
        self.bars: list[list[Any]] = []

    def __call__(self, label: str, total: int | None, initial: int) -> _Bars:
        self.bars.append([label, total, initial, 0, False])
        return self

    def update(self, n: int) -> None:
        self.bars[-1][3] += n

    def close(self) -> None:
        self.bars[-1][4] = True


def test_a_reader_and_the_progress_are_told_of_every_byte_as_it_lands(server: FaultServer, tmp_path: Path) -> None:
    data = os.urandom(3 << 20)
    url = server.add(PATH, data)
    server.fail(PATH, Fault.drop_after(1_500_000))  # 22 whole 64 KiB blocks arrive
    bars = _Bars()
    reader = _Reader()
    fetched = Downloader(make_session(), tmp_path / "downloads", bars, sleep=Sleeps()).fetch(
        [url], NAME, sink=reader)
    assert fetched.path.read_bytes() == data
    kept = 22 * (64 << 10)
    # Told after each whole MiB of this request, and at the end.
    assert reader.events == [
        ("begin", f"{NAME}.part", 0, 3 << 20), ("extend", 1 << 20),
        ("begin", f"{NAME}.part", kept, 3 << 20), ("extend", kept + (1 << 20)), ("extend", 3 << 20)]
    assert bars.bars == [[NAME, 3 << 20, 0, kept, True], [NAME, 3 << 20, kept, (3 << 20) - kept, True]]


def test_html_is_looked_for_only_at_the_start_of_a_download(server: FaultServer, tmp_path: Path) -> None:
    """An archive may hold a page: bytes that read as one in a later block, or at the start of a
    resumed body, are the archive's."""
    data = os.urandom(64 << 10) + b"<html><body>inside the archive</body></html>" + os.urandom(300_000)
    url = server.add(PATH, data)
    assert _downloader(tmp_path / "whole").fetch([url], NAME).path.read_bytes() == data
    server.fail(PATH, Fault.drop_after(70_000))
    resumed = _downloader(tmp_path / "resumed").fetch([url], NAME)
    assert resumed.path.read_bytes() == data
    assert _range_start(server.requests_for(PATH)[-1].headers) == 64 << 10


def test_an_answer_with_no_type_and_no_length_is_read_to_its_end(server: FaultServer, served: bytes,
                                                                  tmp_path: Path) -> None:
    url = server.url(PATH)
    server.fail(PATH, Fault.bare())
    bars = _Bars()
    fetched = Downloader(make_session(), tmp_path / "downloads", bars, sleep=Sleeps()).fetch([url], NAME)
    assert fetched.path.read_bytes() == served
    assert bars.bars == [[NAME, None, 0, len(served), True]]  # a size not known is not made up
    assert json.loads((tmp_path / "downloads" / f"{NAME}.json").read_text())["total"] is None


def test_a_weak_etag_gives_way_to_last_modified_to_resume_by(server: FaultServer, served: bytes,
                                                             tmp_path: Path) -> None:
    date = "Wed, 21 Oct 2026 07:28:00 GMT"
    server.weak_etags = True
    server.last_modified = date
    server.fail(PATH, Fault.drop_after(300_000))
    fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    first, resumed, *_ = server.requests_for(PATH)
    assert "If-Range" not in first.headers
    assert resumed.headers["If-Range"] == date
    record = json.loads((tmp_path / "downloads" / f"{NAME}.json").read_text())
    assert (record["etag"], record["last_modified"]) == (None, date)


def test_a_disk_that_fills_up_part_way_keeps_the_partial_file(server: FaultServer, served: bytes,
                                                               tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes to /dev/full fail with ENOSPC: the partial file, a link to it, is where a full disk
    stops the download."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    downloads = tmp_path / "downloads"
    _leave_partial(tmp_path, server.url(PATH), b"")
    part = downloads / f"{NAME}.part"
    part.unlink()
    part.symlink_to("/dev/full")
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: real(p)._replace(free=(1 << 40) + (5 << 20)))
    with pytest.raises(DiskSpaceError) as caught:
        _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert (caught.value.message, caught.value.hint) == (
        f"ran out of space in {downloads} while trying to download the archive (1048581.0 MiB free)",
        "free some space, or point QNNCTL_CACHE_DIR at a larger disk, then run the same command again")
    assert part.is_symlink()  # kept, for the next run to resume once space is freed


def test_a_server_that_does_not_answer_in_time_is_asked_again(server: FaultServer, served: bytes, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("qnnctl.net.download.READ_TIMEOUT", 0.3)
    server.fail(PATH, Fault.stall(3.0))
    sleeps = Sleeps()
    fetched = _downloader(tmp_path, sleeps).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    assert len(server.requests_for(PATH)) == 2
    assert sleeps == [1.0]
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning == (f"cannot reach {server.url(PATH)}: no answer in time (timed out); "
                       "retrying in 1.0s (attempt 2 of 6)")


def test_while_a_download_runs_its_record_claims_no_digest(server: FaultServer, served: bytes,
                                                           tmp_path: Path) -> None:
    """A finished file that no longer matches is fetched again; until that ends, the record
    claims no digest, so a run that stops part-way leaves nothing that passes for finished."""
    downloader = _downloader(tmp_path)
    first = downloader.fetch([server.url(PATH)], NAME)
    first.path.write_bytes(b"tampered")
    record = tmp_path / "downloads" / f"{NAME}.json"
    seen: list[dict[str, Any]] = []

    class Peek(_Reader):
        def begin(self, part: Path, offset: int, total: int | None) -> None:
            seen.append(json.loads(record.read_text()))
            super().begin(part, offset, total)

    again = downloader.fetch([server.url(PATH)], NAME, sink=Peek())
    assert again == first
    assert [("sha256" in r, r["url"]) for r in seen] == [(False, server.url(PATH))]


def test_a_206_nobody_asked_for_is_not_trusted(server: FaultServer, served: bytes, tmp_path: Path) -> None:
    server.fail(PATH, Fault.unasked_206())
    fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    unasked, again = server.requests_for(PATH)
    assert "Range" not in unasked.headers
    assert "Range" not in again.headers


def test_https_is_retried_as_http_is(certificate: Certificate, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(certificate.cert))
    data = os.urandom(200_000)
    with FaultServer(tls=certificate) as server:
        url = server.add(PATH, data)
        assert url.startswith("https://")
        server.fail(PATH, Fault.status(503), Fault.status(503))
        sleeps = Sleeps()
        fetched = _downloader(tmp_path, sleeps).fetch([url], NAME)
        assert fetched.path.read_bytes() == data
        assert sleeps == [1.0, 2.0]


def test_a_record_written_with_the_url_as_given_is_resumed_and_kept_redacted(server: FaultServer, served: bytes,
                                                                             tmp_path: Path) -> None:
    """Records are kept redacted; one from before that holds the URL with its password is still
    a base to resume from, and is redacted from then on."""
    secret = server.url(PATH).replace("http://", "http://user:s3cret@")
    shown = server.url(PATH).replace("http://", "http://***@")
    part = _leave_partial(tmp_path, secret, served[:65536])
    fetched = _downloader(tmp_path).fetch([secret], NAME)
    assert (fetched.url, fetched.path.read_bytes()) == (shown, served)
    assert _range_start(server.requests_for(PATH)[-1].headers) == 65536
    assert not part.exists()
    record = (tmp_path / "downloads" / f"{NAME}.json").read_text()
    assert json.loads(record)["url"] == shown
    assert "s3cret" not in record


# -- a size pinned ---------------------------------------------------------------------------

PINNED = "the lock pins"  # who pins the size, as the caller names it (qnnctl.sdk.gate.size_limit)


def _too_long(url: str, size: int, how: str) -> tuple[str, str]:
    return (f"{url} is longer than {size} bytes, the size {PINNED} ({how}): it is not that archive; the download "
            "was stopped and removed, and nothing was installed",
            "check the server or proxy that answers for that URL; run the same command again once it serves the "
            "archive")


def test_a_download_stops_at_the_first_byte_past_the_size_pinned(server: FaultServer, served: bytes,
                                                                 tmp_path: Path) -> None:
    """A body as long as the size pinned is downloaded, with a length or without; a length one
    byte longer is refused before a byte is written, and a body without one is stopped where it
    passes the size: neither leaves a partial file or a record to resume from."""
    url, folder = server.url(PATH), tmp_path / "downloads"
    downloader = _downloader(tmp_path)
    with pytest.raises(IntegrityError) as announced:
        downloader.fetch([url], NAME, limit=(len(served) - 1, PINNED))
    assert (announced.value.message, announced.value.hint) == _too_long(
        url, len(served) - 1, f"it says the file is {len(served)} bytes")
    assert list(folder.iterdir()) == []
    server.fail(PATH, Fault.bare())
    with pytest.raises(IntegrityError) as sent:
        downloader.fetch([url], NAME, limit=(len(served) - 1, PINNED))
    assert (sent.value.message, sent.value.hint) == _too_long(url, len(served) - 1, "the body went on past them")
    assert list(folder.iterdir()) == []
    assert downloader.fetch([url], NAME, limit=(len(served), PINNED)).path.read_bytes() == served
    server.fail(PATH, Fault.bare())
    assert downloader.fetch([url], f"bare-{NAME}", limit=(len(served), PINNED)).path.read_bytes() == served


def test_a_file_sent_whole_again_leaves_nothing_of_a_longer_partial_one(server: FaultServer, served: bytes,
                                                                        tmp_path: Path) -> None:
    """A server that sends the whole file where the rest was asked for (it ignores the range, or
    the file changed since): the download starts over, and a partial file longer than the file
    leaves no tail behind it."""
    url = server.url(PATH)
    folder = tmp_path / "downloads"
    folder.mkdir()
    (folder / f"{NAME}.json").write_text(json.dumps({"url": url}))
    (folder / f"{NAME}.part").write_bytes(os.urandom(len(served) + 1000))
    server.fail(PATH, Fault.ignore_range())
    fetched = _downloader(tmp_path).fetch([url], NAME)
    assert _range_start(server.requests_for(PATH)[0].headers) == len(served) + 1000
    assert (fetched.path.read_bytes(), fetched.size) == (served, len(served))


def test_a_partial_file_is_never_wider_than_its_owners_even_before_its_fchmod(
        server: FaultServer, served: bytes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under a umask of 0, the partial file is made readable and writable by its owner alone, not
    made wider and narrowed a moment later: its mode as its fchmod is called."""
    seen: dict[str, int] = {}
    fchmod = os.fchmod

    def recording(fd: int, mode: int) -> None:
        seen[os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))] = os.fstat(fd).st_mode & 0o7777
        fchmod(fd, mode)

    monkeypatch.setattr(os, "fchmod", recording)
    umask = os.umask(0)
    try:
        fetched = _downloader(tmp_path).fetch([server.url(PATH)], NAME)
    finally:
        os.umask(umask)
    assert seen[f"{NAME}.part"] == 0o600
    assert fetched.path.stat().st_mode & 0o7777 == 0o600


# -- the pace a body must keep (qnnctl.net.body) ----------------------------------------------


def _paced(tmp_path: Path, sleeps: Sleeps, slowest: tuple[int, float]) -> Downloader:
    return Downloader(make_session(), tmp_path / "downloads", sleep=sleeps, slowest=slowest)


def test_a_body_slower_than_its_pace_is_broken_off_and_asked_for_again(server: FaultServer, served: bytes,
                                                                        tmp_path: Path) -> None:
    """A server that answers every read in time with a few bytes (2,000 a second): the body is
    broken off once half a second brings fewer than 8 KiB, not after the 500 s it would take, and
    asked for again. Each piece is counted as it lands: a reader that waited to fill a 64 KiB block
    would count nothing for 32 s."""
    server.fail(PATH, Fault.slow(100, 0.05))
    sleeps = Sleeps()
    fetched = _paced(tmp_path, sleeps, (8 << 10, 0.5)).fetch([server.url(PATH)], NAME)
    assert (fetched.path.read_bytes(), fetched.sha256) == (served, _sha256(served))
    first, second = server.requests_for(PATH)
    # No whole block came before the break: nothing was kept, and the second asks for the whole.
    assert (_range_start(first.headers), _range_start(second.headers)) == (None, None)
    assert len(sleeps) == 1


def test_a_body_that_never_keeps_its_pace_ends_the_download(server: FaultServer, served: bytes,
                                                            tmp_path: Path) -> None:
    server.fail(PATH, *[Fault.slow(100, 0.05)] * 10)
    sleeps = Sleeps()
    url = server.url(PATH)
    with pytest.raises(DownloadError) as caught:
        _paced(tmp_path, sleeps, (8 << 10, 0.2)).fetch([url], NAME)
    assert caught.value.message == (f"download of {url} failed after {MAX_ATTEMPTS} attempts: the download "
                                    "stopped at 0 B of 1.0 MiB: less than 8.0 KiB came in 0.2 s")
    assert len(server.requests_for(PATH)) == MAX_ATTEMPTS


def test_a_body_that_keeps_its_pace_however_slowly_is_read_whole(server: FaultServer, served: bytes,
                                                                 tmp_path: Path) -> None:
    """Bursts of 16 KiB every 0.1 s against a pace of 8 KiB in each 0.3 s: one request, whole."""
    server.fail(PATH, Fault.slow(16 << 10, 0.1))
    fetched = _paced(tmp_path, Sleeps(), (8 << 10, 0.3)).fetch([server.url(PATH)], NAME)
    assert fetched.path.read_bytes() == served
    assert len(server.requests_for(PATH)) == 1


def test_the_pace_is_counted_in_windows() -> None:
    """At least `least` bytes in each window, counted from the last window that closed: a window
    closes when a piece lands at or past its end."""
    now = [100.0]
    pace = Pace(100, 10.0, clock=lambda: now[0])
    for at, n in [(105.0, 60), (109.99, 39)]:  # 99 bytes, but the window is not over
        now[0] = at
        pace(n)
    now[0] = 110.0
    pace(1)  # 100 bytes in 10 s: enough; the next window starts here, empty
    now[0] = 119.99
    pace(99)
    now[0] = 120.0
    with pytest.raises(TooSlow) as caught:
        pace(0)
    assert str(caught.value) == "less than 100 B came in 10 s"
    assert isinstance(caught.value, BodyBroke)
    first = Pace(100, 10.0, clock=lambda: now[0])  # the first window counts from nothing too
    now[0] += 10.0
    with pytest.raises(TooSlow):
        first(99)
    quick = Pace(1 << 20, 0.5, clock=lambda: now[0])
    now[0] += 0.5
    with pytest.raises(TooSlow, match=r"^less than 1\.0 MiB came in 0\.5 s$"):
        quick(1 << 10)


def test_a_download_keeps_at_least_64_kib_a_minute_unless_told_otherwise(tmp_path: Path) -> None:
    """The pace of every download, as the README says: slower bodies are broken off and resumed."""
    assert Downloader(make_session(), tmp_path).slowest == (64 << 10, 60.0)


def test_a_body_is_kept_as_it_was_sent_never_decoded(server: FaultServer, tmp_path: Path) -> None:
    """A server that encodes the archive although qnnctl asks for it as stored: what is kept and
    hashed is what came, which the archive's checks then refuse; nothing is inflated here."""
    import gzip

    sent = gzip.compress(b"PK\x03\x04" + b"\0" * (1 << 20))
    server.add(PATH, b"")
    server.fail(PATH, Fault.raw(b"HTTP/1.1 200 OK\r\nContent-Type: application/zip\r\nContent-Encoding: gzip\r\n"
                                b"Content-Length: %d\r\n\r\n" % len(sent) + sent))
    fetched = _paced(tmp_path, Sleeps(), (8 << 10, 60.0)).fetch([server.url(PATH)], NAME)
    assert (fetched.path.read_bytes(), fetched.sha256, fetched.size) == (sent, _sha256(sent), len(sent))
