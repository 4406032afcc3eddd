"""In the children of a mutation run's tests (tests/mutation/plugin.py): report calls to mutmut.

While mutmut counts which tests reach which function (MUTANT_UNDER_TEST=stats), each call of a
mutated function goes through mutmut's `record_trampoline_hit`. In a child process that record
would die with the child: this module, imported by `site` at the start of every child that has
this folder on PYTHONPATH, replaces it before any mutated module imports it, with one that
appends each function's name, once per process, to the file QNNCTL_MUTATION_HITS names.

Then it hands over to the sitecustomize that would have run without it, as qnnctl/_site does.
"""

from __future__ import annotations

import os
import sys


def _report_hits(path: str) -> None:
    import mutmut.stats

    seen: set[str] = set()

    def record_trampoline_hit(name: str, caller: str | None = None) -> None:
        if name not in seen:
            seen.add(name)
            # One short line, appended: lines from concurrent children do not interleave.
            with open(path, "a", encoding="utf-8") as hits:
                hits.write(name + "\n")

    mutmut.stats.record_trampoline_hit = record_trampoline_hit
    # This process counts calls, and so do its children that import this module. Told so by
    # MUTANT_UNDER_TEST=stats, a child that skips this module (python -I, -E or -S: qnnctl's
    # bootstrap) would call mutmut's own record, which cannot find its settings there and
    # fails: the variable makes way for STATS_VARIABLE, and such children run the original code.
    import mutmut.mutation.trampoline as trampoline

    trampoline._mutant_under_test = "stats"
    os.environ.pop("MUTANT_UNDER_TEST", None)
    os.environ[STATS_VARIABLE] = "1"


def _hand_over() -> None:
    own = os.path.dirname(os.path.abspath(__file__))
    if own in sys.path:
        sys.path.remove(own)
    sys.path_importer_cache.pop(own, None)
    # The next one takes this one's place in sys.modules. With none, the import fails, and `site`
    # (or qnnctl's own sitecustomize, which imported this one) passes over that in silence as it
    # would have without this module: caught here, the import of this module would seem to have
    # worked, and the import system would look for it in sys.modules after the entry was removed.
    del sys.modules["sitecustomize"]
    import importlib

    importlib.import_module("sitecustomize")


STATS_VARIABLE = "QNNCTL_MUTATION_STATS"

if __name__ == "sitecustomize":
    counting = os.environ.get("MUTANT_UNDER_TEST") == "stats" or os.environ.get(STATS_VARIABLE) == "1"
    if counting and os.environ.get("QNNCTL_MUTATION_HITS"):
        _report_hits(os.environ["QNNCTL_MUTATION_HITS"])
    _hand_over()
