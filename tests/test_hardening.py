"""Bugs of a realistic shape that a suite can let through unless a test names them: a digest
compared by a prefix, text from a device or a model escaped for C0 controls only, a guard
variable read as true for any value."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from qnnctl.errors import IntegrityError
from qnnctl.run import bootstrap as bootstrap_module
from qnnctl.sdk import gate
from qnnctl.words import printable

A = "a" * 64


@pytest.mark.parametrize("at", [0, 15, 16, 63])
def test_a_digest_that_differs_in_any_one_hex_digit_is_refused(at: int) -> None:
    other = A[:at] + "b" + A[at + 1:]
    lock = gate.Expected("qnnctl.lock", "the lock", "pins", "hint", sha256=A, components={"host": A})
    with pytest.raises(IntegrityError):
        gate.check([lock], gate.Observed("sdk.zip", sha256=other))
    with pytest.raises(IntegrityError):
        gate.check([lock._replace(sha256=None)], gate.Observed("sdk.zip", components={"host": other}))
    gate.check([lock], gate.Observed("sdk.zip", sha256=A, components={"host": A}))


# C0 controls, DEL, C1 controls (0x9b is the 8-bit CSI that some terminals obey), and the
# bidirectional overrides that reorder what a terminal shows (U+202E, U+2066).
HOSTILE = ["\x1b]0;title\x07", "\x7f", "\x9b2J", "\x85", "name\u202etxt.so", "\u2066x"]


@pytest.mark.parametrize("text", HOSTILE)
def test_text_from_a_device_a_model_or_a_server_reaches_no_terminal_raw(text: str) -> None:
    """One escaping for what a device, a model or a server says (qnnctl.words.printable)."""
    out = printable(text)
    assert out.isprintable()
    assert out.isascii()


@pytest.mark.parametrize(("value", "armed"), [("1", True), ("0", False), ("", False), ("true", False)])
def test_the_mkldnn_guard_variable_is_on_only_for_1(tmp_path: Path, value: str, armed: bool) -> None:
    """The channel from `qnnctl lower` to its bootstrap: only the "1" lower writes arms the guard."""
    torch = tmp_path / "torch"
    (torch / "backends").mkdir(parents=True)
    (torch / "__init__.py").write_text("")
    (torch / "backends" / "__init__.py").write_text("")
    (torch / "backends" / "mkldnn.py").write_text("enabled = True\n")
    bootstrap = Path(str(bootstrap_module.__file__))
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "QNNCTL_DISABLE_MKLDNN": value}
    result = subprocess.run([sys.executable, str(bootstrap), "code",
                             "import torch.backends.mkldnn as m; print(m.enabled)"],
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False" if armed else "True"]
