"""A version a mirror's index lists is the mirror's text: what a prefix resolves to is the
version it parses as, never the key as it was written (whitespace and control characters around
it would be carried into messages, URLs and the cache's folder names)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import run_qnnctl
from tests.httpserver import FaultServer
from tests.sdkfactory import VERSION

LISTED = "2.37.9.260101"


def test_a_prefix_resolves_to_the_version_a_listed_key_parses_as(mirror: FaultServer, tmp_path: Path,
                                                                   cache_dir: Path) -> None:
    made = run_qnnctl("mirror", str(tmp_path / "made"), VERSION)
    assert made.returncode == 0, made.stderr
    index = json.loads((tmp_path / "made" / "index.json").read_text())
    index["versions"][f"{LISTED}\r\x0b\x1c"] = index["versions"][VERSION]
    mirror.add("/index.json", json.dumps(index).encode(), "application/json")
    proc = run_qnnctl("install", "2.37", "-v")
    assert proc.returncode == 3, proc.stderr  # nothing is served under that version
    assert f"the archive was not found (HTTP 404) at {mirror.base}/{LISTED}/v{LISTED}.zip\n" in proc.stderr
    assert f"chose SDK {LISTED} (argument: given as 2.37)" in proc.stderr, proc.stderr
    for character in "\x0b\x1c":
        assert character not in proc.stderr, proc.stderr
    assert mirror.requests_for(f"/{LISTED}/v{LISTED}.zip") != []
