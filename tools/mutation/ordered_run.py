"""mutmut's command line, run by path (tools/mutation/__main__.py), with the tests of each mutant
in a better order: first those that killed other mutants of the same function, the most kills
first, then the rest as mutmut orders them (fastest first).

mutmut stops a mutant's tests at the first failure. Mutants of one function are mostly killed
by the same few tests, which the duration order often puts last, behind dozens that pass: the
killing test first makes such a mutant cost one test. A survivor still runs them all. The test
that killed the mutant itself in an earlier run (the record, record.py) goes before all others.

Mutants that equivalent.txt marks (the file QNNCTL_MUTATION_EQUIVALENT names, one a line) are
not tested: no test can kill them, so each would run every test that reaches its function,
for a verdict the score leaves out. They get mutmut's "skipped".

With the lines each test ran (`--lines`, lines.py), a mutant is tested only by the tests that
ran the lines of its change, and by those that ran no line of its function though mutmut saw
them reach it (traced in part): the others run only the original code.

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
EQUIVALENT_VARIABLE = "QNNCTL_MUTATION_EQUIVALENT"
REACH_VARIABLE = "QNNCTL_MUTATION_REACH"  # reach.tsv: each mutant's function and lines (lines.py)
LINES_RAN_VARIABLE = "QNNCTL_MUTATION_LINES_RAN"  # lines.tsv: the lines each test ran (lines.py)
ANY = "*"  # as lines.py writes it
MARK = "__mutmut_"  # what separates a mutant's function from its number
SKIPPED = 34  # mutmut's exit code for "skipped"


def kills_of(path: str, mutant: str) -> tuple[str | None, Counter[str]]:
    """The test last recorded as killing `mutant`, and how many of the mutants of its function
    each test has killed."""
    function = mutant.rpartition(MARK)[0]
    own: str | None = None
    counts: Counter[str] = Counter()
    try:
        with open(path, encoding="utf-8") as lines:
            for line in lines:
                killed, _, test = line.rstrip("\n").partition("\t")
                if test and killed.rpartition(MARK)[0] == function:
                    counts[test] += 1
                    if killed == mutant:
                        own = test
    except FileNotFoundError:
        pass
    return own, counts


def runners_of(reach_path: str, lines_path: str, mutant: str) -> tuple[set[str], set[str]] | None:
    """The tests that ran the lines where `mutant`'s change is, and those that ran any line of its
    function (a test that calls it but ran none was traced in part: it is kept); None when any
    test that calls its function can tell it (a change to the signature, or a mutant reach.tsv
    does not know)."""
    module = mutant.rpartition(".")[0]  # qnnctl.install.pipeline.x_install__mutmut_5 -> qnnctl.install.pipeline
    where: tuple[str, set[str]] | None = None
    with open(reach_path, encoding="utf-8") as rows:
        for row in rows:
            name, _, rest = row.rstrip("\n").partition("\t")
            if name == mutant:
                function, _, lines = rest.partition("\t")
                where = None if lines == ANY else (function, set(lines.split(",")))
                break
    if where is None:
        return None
    source = module.replace(".", "/") + ".py"
    # mutmut mutates a function with what is nested in it; the tracer names a nested function's
    # lines (a key for sorted, a lambda, a comprehension before Python 3.12) by its own code's
    # qualified name: `f.<locals>.key`.
    nested = where[0] + ".<locals>."
    ran: set[str] = set()
    known: set[str] = set()
    with open(lines_path, encoding="utf-8") as rows:
        for row in rows:
            fields = row.rstrip("\n").split("\t")
            if len(fields) != 4:
                continue  # the header
            if fields[0] == source and (fields[1] == where[0] or fields[1].startswith(nested)):
                known.add(fields[3])
                if fields[2] in where[1]:
                    ran.add(fields[3])
    return ran, known


def killers_first(tests: Iterable[Any], key: Callable[[Any], Any] | None = None, reverse: bool = False) -> list[Any]:
    """`sorted` as mutmut's worker calls it, then, in a mutant's process, its function's killers
    first; with the lines each test ran (lines.py), only the tests that ran the mutant's change,
    and those that ran no line of its function, which a test that reaches it did where lines.tsv
    missed it."""
    ordered = sorted(tests, key=key, reverse=reverse)
    mutant = os.environ.get("MUTANT_UNDER_TEST", "")
    if MARK not in mutant:  # other names (stats, the clean run) are no function's: no kills
        return ordered
    path = os.environ.get(KILLERS_VARIABLE)
    if path:
        own, counts = kills_of(path, mutant)
        if counts:  # a stable sort: mutmut's order among tests with as many kills
            ordered.sort(key=lambda test: (test != own, -counts[test]) if isinstance(test, str) else (True, 0))
    reach_path, lines_path = os.environ.get(REACH_VARIABLE), os.environ.get(LINES_RAN_VARIABLE)
    found = runners_of(reach_path, lines_path, mutant) if reach_path and lines_path else None
    if found is not None:
        ran, known = found
        kept = [test for test in ordered if test in ran or test not in known]
        # No test runs the change: one that does not is run all the same, and the mutant survives
        # (mutmut would run every test for an empty list).
        ordered = kept or ordered[:1]
    return ordered


def without_equivalents(collect: Callable[..., Any]) -> Callable[..., Any]:
    """mutmut's collect_source_file_mutation_data, less the mutants marked equivalent that have
    no verdict yet, which it records as skipped."""

    def collect_(*, mutant_names: Any) -> Any:
        mutants, by_path = collect(mutant_names=mutant_names)
        path = os.environ.get(EQUIVALENT_VARIABLE)
        if not path:
            return mutants, by_path
        with open(path, encoding="utf-8") as names:
            equivalent = set(names.read().split())
        kept, skipped = [], {}
        for data, name, result in mutants:
            if name in equivalent and result is None:
                data.exit_code_by_key[name] = SKIPPED
                skipped[id(data)] = data
            else:
                kept.append((data, name, result))
        for data in skipped.values():
            data.save()
        return kept, by_path

    return collect_


def main() -> int:
    del sys.path[0]  # this folder: nothing of the tests' package is imported here
    import mutmut.__main__ as mutmut_main
    import mutmut.workers.isolation as isolation

    vars(isolation)["sorted"] = killers_first  # found before the builtin by the worker's `sorted(...)`
    mutmut_main.collect_source_file_mutation_data = without_equivalents(mutmut_main.collect_source_file_mutation_data)
    cli = mutmut_main.cli
    sys.argv[0] = "mutmut"
    cli()
    return 0


if __name__ == "__main__":
    sys.exit(main())
