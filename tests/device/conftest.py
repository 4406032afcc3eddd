"""What every test of the device side starts from: a CPU named Intel's (the AMD guard stays out of
what is compared), and the stand-in phones of tests/phones.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.phones import Phones, standin


@pytest.fixture(autouse=True)
def _known_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QNNCTL_FORCE_CPU_VENDOR", "GenuineIntel")


@pytest.fixture
def phones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Phones:
    return standin(tmp_path, monkeypatch)
