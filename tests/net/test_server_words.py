"""What a server says of itself reaches a person only with its control characters escaped: a
reason phrase on the status line is the server's to choose, and one holding a terminal's escape
sequences would otherwise set a window title, clear the screen or hide the lines above it."""

from __future__ import annotations

import pytest

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
