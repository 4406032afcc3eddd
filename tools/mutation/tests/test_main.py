"""`python -m tools.mutation`'s command line, where it needs no mutation run."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from tools.mutation import TARGETS
from tools.mutation.__main__ import main

REPO = Path(__file__).resolve().parents[3]


def test_without_mutmut_it_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """mutmut is an extra (`.[mutation]`): a Python without it gets the command, not a traceback."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "mutmut" else real(name, *rest))
    monkeypatch.setattr(sys, "argv", ["python -m tools.mutation", "stores", "--report"])
    assert main() == 2
    said = capsys.readouterr()
    assert said.out == ""
    assert said.err == ("python -m tools.mutation: mutmut is not installed in this Python; install it with "
                        "`pip install -e '.[test,mutation]'`\n")


def test_list_names_every_module_with_its_sources_and_tests() -> None:
    listed = subprocess.run([sys.executable, "-m", "tools.mutation", "--list"], cwd=REPO, capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert listed == [f"{name}: {' '.join(t.sources)}  <-  {' '.join(t.tests)}" for name, t in TARGETS.items()]
    for target in TARGETS.values():
        assert all((REPO / path).is_file() for path in (*target.sources, *target.tests)), target
