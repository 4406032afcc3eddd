"""mutmut's command line, run by path (tests/mutation/__main__.py), with the tests of each mutant
in a better order: first those that killed other mutants of the same function, the most kills
first, then the rest as mutmut orders them (fastest first).

mutmut stops a mutant's tests at the first failure. Mutants of one function are mostly killed
by the same few tests, which the duration order often puts last, behind dozens that pass: the
killing test first makes such a mutant cost one test. A survivor still runs them all.

The tests plugin (plugin.py) records each mutant's failing test in the file QNNCTL_MUTATION_KILLERS
names; each mutant's process reads it afresh when it orders its tests, so kills made earlier in
the same run count. The only change to mutmut is the `sorted` its worker module orders tests with.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

KILLERS_VARIABLE = "QNNCTL_MUTATION_KILLERS"  # as plugin.py reads it
MARK = "__mutmut_"  # what separates a mutant's function from its number


def kills_by_function(path: str) -> dict[str, Counter[str]]:
    """For each mutated function, how many of its mutants each test has killed."""
    found: dict[str, Counter[str]] = {}
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                mutant, _, test = line.rstrip("\n").partition("\t")
                if test:
                    found.setdefault(mutant.rpartition(MARK)[0], Counter())[test] += 1
    except FileNotFoundError:
        pass
    return found


def killers_first(tests: Iterable[Any], key: Callable[[Any], Any] | None = None, reverse: bool = False) -> list[Any]:
    """`sorted` as mutmut's worker calls it, then, in a mutant's process, its function's killers first."""
    ordered = sorted(tests, key=key, reverse=reverse)
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    path = os.environ.get(KILLERS_VARIABLE)
    if path:  # a name without MARK (stats, the clean run) is no function: no kills
        counts = kills_by_function(path).get(mutant.rpartition(MARK)[0])
        if counts:
            ordered.sort(key=lambda test: -counts[test] if isinstance(test, str) else 0)  # stable
    return ordered


def main() -> int:
    del sys.path[0]  # this folder: nothing of the tests' package is imported here
    import mutmut.workers.isolation as isolation
    from mutmut.__main__ import cli

    vars(isolation)["sorted"] = killers_first  # found before the builtin by the worker's `sorted(...)`
    sys.argv[0] = "mutmut"
    cli()
    return 0


if __name__ == "__main__":
    sys.exit(main())
