"""Installs from a mirror served by nginx, the web server a site would put a mirror on, beside
the fault-injecting test server: Debian's nginx, started by the tests on 127.0.0.1 with a
configuration of their own, and its access log as the record of what qnnctl asked for.

A workstation without nginx skips these (`sudo apt-get install nginx`); with CI=true they fail
instead, and `.ci/run` installs it.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

from qnnctl.sdk.cache import read_manifest
from tests.conftest import IN_CI, run_qnnctl
from tests.sdkfactory import VERSION, SdkSpec, build_archive

NAME = f"v{VERSION}.zip"
URI = f"/{VERSION}/{NAME}"
_RANDOM = random.Random(37)
# Incompressible, so that what a component weighs is what its members' bytes weigh.
PAYLOADS = {
    "lib/x86_64-linux-clang/libQnnHtpPrepare.so": 512 << 10,  # host
    "lib/aarch64-android/libQnnHtpV73Stub.so": 1 << 20,  # android
    "lib/hexagon-v75/unsigned/libQnnHtpV75Skel.so": 1 << 20,  # hexagon-v75
    "docs/payload.bin": 2 << 20,  # docs
}
# Below /slow/, a whole download (no Range) is sent slowly, so that qnnctl can be killed in the
# middle of it; a request that resumes (with Range) at full speed. qnnctl writes its partial
# file through a 1 MiB buffer, which this rate fills in 2 s, of the archive's 9.
SLOW = "512k"


def _nginx() -> str:
    found = shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")
    if found is None:
        if IN_CI:
            pytest.fail("nginx is not installed; .ci/run must install it")
        pytest.skip("nginx is not installed (sudo apt-get install nginx)")
    return found


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


class Logged(NamedTuple):
    """One line of the access log."""

    method: str
    uri: str
    status: int
    range: str
    if_range: str
    sent: int


class Nginx:
    def __init__(self, root: Path, work: Path) -> None:
        self.root = root
        self.work = work
        self.port = _free_port()
        self.log = work / "access.log"

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> str:
        user = "user root;\n" if os.geteuid() == 0 else ""  # else workers run as nobody, who cannot read tmp_path
        temp = "".join(f"    {kind}_temp_path {self.work / kind};\n"
                       for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        return (
            f"{user}daemon off;\nworker_processes 1;\npid {self.work / 'nginx.pid'};\n"
            f"error_log {self.work / 'error.log'} info;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            "    default_type application/octet-stream;\n"
            "    log_format qnnctl escape=none '$request_method\\t$uri\\t$status\\t$http_range\\t$http_if_range\\t"
            "$body_bytes_sent';\n"
            f"    access_log {self.log} qnnctl;\n"
            f"{temp}"
            "    server {\n"
            f"        listen 127.0.0.1:{self.port};\n"
            f"        root {self.root};\n"
            "        location /slow/ {\n"
            f'            if ($http_range = "") {{ set $limit_rate {SLOW}; }}\n'
            "        }\n"
            "    }\n"
            "}\n"
        )

    def requests(self) -> list[Logged]:
        if not self.log.exists():
            return []
        lines = [line.split("\t") for line in self.log.read_text().splitlines()]
        return [Logged(m, u, int(s), "" if r == "-" else r, "" if i == "-" else i, int(b))
                for m, u, s, r, i, b in lines]

    def requests_for(self, uri: str) -> list[Logged]:
        return [logged for logged in self.requests() if logged.uri == uri]


@pytest.fixture
def nginx(tmp_path: Path) -> Iterator[Nginx]:
    """nginx serving tmp_path/www on a free loopback port, stopped after the test."""
    binary = _nginx()
    work = tmp_path / "nginx"
    work.mkdir()
    server = Nginx(tmp_path / "www", work)
    server.root.mkdir()
    config = work / "nginx.conf"
    config.write_text(server.config())
    proc = subprocess.Popen([binary, "-p", str(work), "-c", str(config), "-e", str(work / "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    proc.kill()
                    _, err = proc.communicate()
                    errors = (work / "error.log").read_text() if (work / "error.log").exists() else ""
                    pytest.fail(f"nginx did not start: {err}{errors}")
                time.sleep(0.05)
        yield server
    finally:
        proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def _publish(nginx: Nginx, data: bytes, under: str = "") -> Path:
    folder = nginx.root / under / VERSION
    folder.mkdir(parents=True, exist_ok=True)
    archive = folder / NAME
    archive.write_bytes(data)
    return archive


def _archive(tmp_path: Path, payloads: dict[str, int] | None = None) -> bytes:
    folder = tmp_path / f"archive-{len(list(tmp_path.glob('archive-*')))}"
    folder.mkdir()
    files = {name: _RANDOM.randbytes(size) for name, size in (payloads or PAYLOADS).items()}
    return build_archive(folder, "zip", SdkSpec(extra_files=files)).read_bytes()


def _env(nginx: Nginx, under: str = "") -> dict[str, str]:
    return {**os.environ, "QNNCTL_MIRROR": f"{nginx.base}/{under}".rstrip("/")}


def test_a_mirror_made_by_qnnctl_mirror_installs_from_nginx(nginx: Nginx, tmp_path: Path, cache_dir: Path) -> None:
    data = _archive(tmp_path)
    upstream = nginx.root / "upstream" / VERSION
    upstream.mkdir(parents=True)
    (upstream / NAME).write_bytes(data)
    # `qnnctl mirror` fills a folder of the web server from another mirror, index.json and all.
    made = run_qnnctl("mirror", str(nginx.root / "mirror"), VERSION,
                      env={**os.environ, "QNNCTL_MIRROR": f"{nginx.base}/upstream"})
    assert made.returncode == 0, made.stderr
    assert (nginx.root / "mirror" / "index.json").is_file()
    installed = run_qnnctl("install", VERSION, env={**os.environ, "QNNCTL_MIRROR": f"{nginx.base}/mirror"})
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    assert (read_manifest(root) or {})["sha256"] == hashlib.sha256(data).hexdigest()
    assert [r.status for r in nginx.requests_for("/mirror/index.json")] == [200]
    fetched = [r for r in nginx.requests_for(f"/mirror{URI}") if r.method == "GET"]
    assert [(r.status, r.range, r.sent) for r in fetched] == [(200, "", len(data))]


def _start_and_kill(nginx: Nginx, cache_dir: Path, *args: str) -> int:
    """`qnnctl install VERSION ARGS`, killed with SIGKILL once it has written part of the
    archive; what its partial download holds then."""
    part = cache_dir / "downloads" / f"{NAME}.part"
    child = subprocess.Popen([sys.executable, "-m", "qnnctl", "install", VERSION, *args], env=_env(nginx, "slow"),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (part.exists() and part.stat().st_size >= 128 << 10):
            if child.poll() is not None:
                pytest.fail(f"the install ended ({child.returncode}) before it was killed: {child.communicate()[1]}")
            if time.monotonic() > deadline:
                pytest.fail("the download did not start within a minute")
            time.sleep(0.02)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    return part.stat().st_size


def test_a_download_killed_with_sigkill_resumes_from_nginx_with_range_and_if_range(
        nginx: Nginx, tmp_path: Path, cache_dir: Path) -> None:
    data = _archive(tmp_path)
    archive = _publish(nginx, data, "slow")
    held = _start_and_kill(nginx, cache_dir)
    assert 0 < held < len(data)
    record = json.loads((cache_dir / "downloads" / f"{NAME}.json").read_text())
    assert record["etag"]  # nginx's strong ETag, the validator of the resume
    installed = run_qnnctl("install", VERSION, env=_env(nginx, "slow"))
    assert installed.returncode == 0, installed.stderr
    assert (read_manifest(Path(installed.stdout.strip())) or {})["sha256"] == hashlib.sha256(data).hexdigest()
    first, *rest = [r for r in nginx.requests_for(f"/slow{URI}") if r.method == "GET"]
    assert (first.range, first.if_range) == ("", "")
    resumed = rest[-1]
    assert resumed.range.startswith("bytes=")
    start = int(resumed.range.removeprefix("bytes=").rstrip("-"))
    assert 0 < start <= archive.stat().st_size
    assert resumed.if_range == record["etag"]
    assert resumed.status == 206
    assert resumed.sent == len(data) - start  # only what was missing


def test_an_archive_changed_on_nginx_since_the_kill_is_downloaded_whole_again(
        nginx: Nginx, tmp_path: Path, cache_dir: Path) -> None:
    archive = _publish(nginx, _archive(tmp_path), "slow")
    _start_and_kill(nginx, cache_dir)
    newer = _archive(tmp_path)
    archive.write_bytes(newer)
    stat = archive.stat()
    os.utime(archive, ns=(stat.st_atime_ns, stat.st_mtime_ns + 5 * 10**9))  # a new ETag, even within a second
    installed = run_qnnctl("install", VERSION, env=_env(nginx, "slow"))
    assert installed.returncode == 0, installed.stderr
    # If-Range no longer matches: nginx sends the whole new archive, which is what gets installed.
    assert (read_manifest(Path(installed.stdout.strip())) or {})["sha256"] == hashlib.sha256(newer).hexdigest()
    resumed = [r for r in nginx.requests_for(f"/slow{URI}") if r.method == "GET"][-1]
    assert resumed.range.startswith("bytes=")
    assert resumed.if_range
    assert (resumed.status, resumed.sent) == (200, len(newer))


def test_an_install_by_parts_from_nginx_reads_only_what_it_needs(nginx: Nginx, tmp_path: Path,
                                                                  cache_dir: Path) -> None:
    data = _archive(tmp_path)
    _publish(nginx, data)
    installed = run_qnnctl("install", VERSION, "--components", "host", env=_env(nginx))
    assert installed.returncode == 0, installed.stderr
    root = Path(installed.stdout.strip())
    manifest = read_manifest(root) or {}
    assert (manifest["partial"], manifest["components"]) == (True, ["host"])
    assert (root / "lib/x86_64-linux-clang/libQnnHtpPrepare.so").is_file()
    assert not (root / "lib/aarch64-android").exists()
    assert not (root / "docs").exists()
    fetched = [r for r in nginx.requests_for(URI) if r.method == "GET"]
    assert fetched
    assert all(r.range.startswith("bytes=") and r.status == 206 for r in fetched), fetched
    # The host library (512 KiB) and the small members, not the 4 MiB of the other components.
    assert sum(r.sent for r in fetched) < (1 << 20), fetched
    added = run_qnnctl("install", VERSION, "--components", "host,android", env=_env(nginx))
    assert added.returncode == 0, added.stderr
    assert (root / "lib/aarch64-android/libQnnHtpV73Stub.so").is_file()
    assert not (root / "docs").exists()
