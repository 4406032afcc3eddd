"""What a server says of itself reaches a person only with its control characters escaped: a
reason phrase on the status line is the server's to choose, and one holding a terminal's escape
sequences would otherwise set a window title, clear the screen or hide the lines above it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from qnnctl.errors import DownloadError
from qnnctl.net.download import Downloader, make_session
from tests.conftest import run_qnnctl
from tests.httpserver import Fault, FaultServer
from tests.sdkfactory import VERSION

ARCHIVE = f"/{VERSION}/v{VERSION}.zip"
REASON = "Forbidden\x1b]0;owned\x07\x1b[2J\x1b[1A"
ESCAPED = "Forbidden\\x1b]0;owned\\x07\\x1b[2J\\x1b[1A"


@pytest.mark.parametrize("how", [(), ("--components", "host")], ids=["whole", "by parts"])
def test_a_reason_phrase_with_escape_sequences_is_shown_escaped(how: tuple[str, ...], mirror: FaultServer,
                                                                cache_dir: object) -> None:
    mirror.fail(ARCHIVE, *[Fault.status(403, reason=REASON)] * 4)
    proc = run_qnnctl("install", VERSION, *how)
    assert (proc.returncode, proc.stdout) == (3, ""), proc.stderr
    assert f"HTTP 403 {ESCAPED}" in proc.stderr, proc.stderr
    assert "\x1b" not in proc.stderr
    assert "\x07" not in proc.stderr



def test_a_status_line_that_is_none_is_shown_escaped(server: FaultServer, tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    """Not HTTP at all: what the server sent in its place is in the error (Python's http.client
    puts the line it could not read there) and in each retry's warning, escaped."""
    server.add(ARCHIVE, b"PK\x03\x04")
    server.fail(ARCHIVE, *[Fault.raw(b"\x1b]0;owned\x07\x1b[2J not http\r\n\r\n")] * 64)
    downloader = Downloader(make_session(), tmp_path / "downloads", sleep=lambda seconds: None)
    with caplog.at_level(logging.INFO, logger="qnnctl"), pytest.raises(DownloadError) as failed:
        downloader.fetch([server.url(ARCHIVE)], "v.zip")
    said = [failed.value.message, *(record.getMessage() for record in caplog.records)]
    assert "\\x1b]0;owned\\x07\\x1b[2J not http" in failed.value.message, failed.value.message
    assert len(said) > 2  # the error, and a warning for each retry
    assert not [line for line in said if "\x1b" in line or "\x07" in line], said
