"""A pytest plugin for mutation runs only (mutmut's `pytest_add_cli_args` loads it).

mutmut runs the tests in its own process against a mutated copy of qnnctl (`mutants/`), and
learns which tests reach which function by counting calls in that process. Most of qnnctl's
tests run the real entry point in a child process, so without help a mutant would be tested
only by the few tests that call qnnctl in-process, and the children would run the original
code. This plugin:

1. puts the mutated copy first on the children's PYTHONPATH, so `python -m qnnctl` (and every
   Python a test starts with the test's environment) imports the mutants; the active mutant is
   named by MUTANT_UNDER_TEST, which the children inherit;
2. puts the `site` folder beside this file on PYTHONPATH too. While mutmut counts calls
   (MUTANT_UNDER_TEST=stats), its sitecustomize makes each child append the functions it
   reached to a file, which this plugin hands to mutmut at the end of each test, as if the test
   had made those calls itself; when mutants run, it switches on the mutant of a module that a
   child runs by path (the bootstrap);
3. does the same for the processes a test forks without a new interpreter (the workers of
   `pool.in_processes`, which write most members of an extraction): mutmut's own record of
   their calls would die with them, and a mutant of the code that runs only there would be tested
   by the few tests that reach it in the test's own process.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HITS_VARIABLE = "QNNCTL_MUTATION_HITS"
HOOK_VARIABLE = "QNNCTL_MUTATION_HOOK"
KILLERS_VARIABLE = "QNNCTL_MUTATION_KILLERS"  # set by tools/mutation/__main__.py
_SITE = Path(__file__).resolve().parent / "site"
_MUTANTS = Path(__file__).resolve().parents[2]  # the copy mutmut runs in: <work>/mutants
_ORIGINAL_PYTHONPATH = os.environ.get("PYTHONPATH")


def pytest_configure(config: pytest.Config) -> None:
    # Set afresh for each pytest run of the process: mutmut runs stats, the clean run and the
    # mutants one after another, forked from the same process.
    entries = [str(_MUTANTS), str(_SITE)]
    os.environ[HOOK_VARIABLE] = str(_SITE / "sitecustomize.py")  # for the .pth file (tools/mutation/__main__.py)
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        handle, hits = tempfile.mkstemp(prefix="qnnctl-mutation-hits-")
        os.close(handle)
        os.environ[HITS_VARIABLE] = hits
        _count_in_forked_children()
    else:
        os.environ.pop(HITS_VARIABLE, None)
    if _ORIGINAL_PYTHONPATH:
        entries.append(_ORIGINAL_PYTHONPATH)
    os.environ["PYTHONPATH"] = os.pathsep.join(entries)


_forked_recorder: Callable[[str], Callable[..., None]] | None = None


def load_site() -> Any:
    """site/sitecustomize.py, loaded under a name of its own: a test process does not start as
    a child does, with it as its sitecustomize."""
    spec = importlib.util.spec_from_file_location("qnnctl_mutation_site", _SITE / "sitecustomize.py")
    assert spec is not None
    assert spec.loader is not None
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    return site


def _count_in_forked_children() -> None:
    """Have each process forked while calls are counted report them as the children do (once
    per mutmut process: a fork hook cannot be taken back, and mutmut forks for each mutant)."""
    global _forked_recorder
    if _forked_recorder is not None:
        return
    _forked_recorder = load_site().hit_recorder
    os.register_at_fork(after_in_child=_report_forked_calls)


def _report_forked_calls() -> None:
    hits = os.environ.get(HITS_VARIABLE)
    trampoline = sys.modules.get("mutmut.mutation.trampoline")
    if not hits or trampoline is None or _forked_recorder is None or trampoline.get_mutant_under_test() != "stats":
        return  # a fork of mutmut's for a mutant, or of a test while mutants run
    # The trampolines look the name up in their module at each call.
    trampoline.record_trampoline_hit = _forked_recorder(hits)  # type: ignore[attr-defined]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The tests a mutated bootstrap cannot pass are left out while it is mutated: it imports
    mutmut, which an interpreter without the tests' site-packages lacks, and mutmut's frames
    show in the tracebacks it leaves."""
    bootstrap = _MUTANTS / "qnnctl" / "run" / "bootstrap.py"
    if "mutmut" not in bootstrap.read_text(encoding="utf-8"):
        return
    skip = pytest.mark.skip(reason="a mutated bootstrap cannot run in an interpreter without mutmut")
    for item in items:
        if item.get_closest_marker("no_mutated_bootstrap"):
            item.add_marker(skip)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """While calls are counted, a test that fails still counts what it reached: a few tests see
    that counting changes the children (their environment lacks MUTANT_UNDER_TEST, see
    site/sitecustomize.py), and mutmut would give up on the whole run. The run of the unmutated
    code that follows shows every real failure."""
    outcome = yield
    report = outcome.get_result()
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if mutant == "stats" and report.when == "call" and report.failed:
        report.outcome = "passed"
    killers = os.environ.get(KILLERS_VARIABLE)
    if report.failed and killers and "__mutmut_" in mutant:
        # The test that killed this mutant: ordered_run.py runs it first for the function's others.
        with open(killers, "a", encoding="utf-8") as found:
            found.write(f"{mutant}\t{report.nodeid}\n")


def pytest_unconfigure(config: pytest.Config) -> None:
    hits = os.environ.pop(HITS_VARIABLE, None)
    if hits:
        Path(hits).unlink(missing_ok=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: Any) -> None:
    """Before mutmut's own teardown hook files this test's calls: add the children's."""
    hits = os.environ.get(HITS_VARIABLE)
    if not hits:
        return
    path = Path(hits)
    names = set(path.read_text(encoding="utf-8").split())
    path.write_text("", encoding="utf-8")
    if names:
        from mutmut.state import state

        state()._stats.update(names)
