"""In the children of a mutation run's tests (tools/mutation/plugin.py): report calls to mutmut.

While mutmut counts which tests reach which function (MUTANT_UNDER_TEST=stats), each call of a
mutated function goes through mutmut's `record_trampoline_hit`. In a child process that record
would die with the child: this module, imported by `site` at the start of every child that has
this folder on PYTHONPATH, replaces it before any mutated module imports it, with one that
appends each function's name, once per process, to the file QNNCTL_MUTATION_HITS names.

A child that ignores PYTHONPATH (python -I, -E: how `qnnctl lower` starts qnnctl's bootstrap)
runs this file all the same, through the .pth file that `python -m tools.mutation` puts in
site-packages for the length of a run. When mutants run, it switches on the mutant of a
module run by path (qnnctl's bootstrap) in the process that runs it as __main__.

Then it hands over to the sitecustomize that would have run without it, as qnnctl/run/_site does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

HITS_VARIABLE = "QNNCTL_MUTATION_HITS"  # as tools/mutation/plugin.py sets it
STATS_VARIABLE = "QNNCTL_MUTATION_STATS"
HOOK_NAME = "qnnctl_mutation_hook"  # the name the .pth file runs this file under (tools/mutation/__main__.py)


def _script_module() -> str | None:
    """The name of the mutated module this process runs by path, as __main__ (qnnctl's
    bootstrap, which `qnnctl lower` starts so), or None.

    mutmut names a function by the module it is in, and a file run by path is `__main__`: its
    calls would be counted for no function of qnnctl's, and a mutant named after its module
    would never be switched on.
    """
    if not sys.argv or not sys.argv[0].endswith(".py"):
        return None
    here = os.path.abspath(__file__)  # <mutants>/tools/mutation/site/sitecustomize.py
    mutants = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(here))))
    script = os.path.abspath(sys.argv[0])
    if not script.startswith(os.path.join(mutants, "qnnctl") + os.sep):
        return None
    return os.path.relpath(script, mutants)[: -len(".py")].replace(os.sep, ".")


def _switch_on_in_main(module: str) -> None:
    """Make the mutant named after `module` the one of __main__ in this process."""
    import mutmut.mutation.trampoline as trampoline

    named = trampoline.get_mutant_under_test

    def get_mutant_under_test() -> str:
        name = str(named())
        return "__main__." + name[len(module) + 1 :] if name.startswith(module + ".") else name

    trampoline.get_mutant_under_test = get_mutant_under_test


def hit_recorder(path: str, script_module: str | None = None) -> Callable[..., None]:
    """mutmut's `record_trampoline_hit` for a process whose own record would die with it: it
    appends each function's name to the file at `path`, once per process (the plugin loads this
    file for the processes its tests fork, see tools/mutation/plugin.py)."""
    seen: set[str] = set()

    def record_trampoline_hit(name: str, caller: str | None = None) -> None:
        if script_module is not None and name.startswith("__main__."):
            name = script_module + name[len("__main__") :]
        if name not in seen:
            seen.add(name)
            # One short line, appended: lines from concurrent children do not interleave.
            with open(path, "a", encoding="utf-8") as hits:
                hits.write(name + "\n")

    return record_trampoline_hit


LINES_VARIABLE = "QNNCTL_MUTATION_LINES"  # as tools/mutation/lines.py sets them
SOURCES_VARIABLE = "QNNCTL_MUTATION_LINES_SOURCES"
TEST_VARIABLE = "QNNCTL_MUTATION_LINES_TEST"


def record_lines(path: str, sources: dict[str, str]) -> None:
    """Trace this process and the threads it starts: append each line of `sources` (absolute
    path -> the name to record) that runs, once per test, to the file at `path`, as soon as it
    first runs, so that a worker ending with os._exit keeps what it ran (tools/mutation/lines.py)."""
    import threading

    seen: set[tuple[str, str, int]] = set()

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            code = frame.f_code
            key = (os.environ.get(TEST_VARIABLE, ""), getattr(code, "co_qualname", code.co_name), frame.f_lineno)
            if key not in seen:
                seen.add(key)
                try:
                    # One short line, appended: lines from concurrent processes do not interleave.
                    with open(path, "a", encoding="utf-8") as lines:
                        lines.write(f"{sources[code.co_filename]}\t{key[1]}\t{key[2]}\t{key[0]}\n")
                except OSError:
                    # Never a failure of the code traced: this process's lines are lost, and its
                    # test is then one that ran none of a function's (ordered_run.py keeps it).
                    sys.settrace(None)
                    threading.settrace(None)
                    return None
        return local

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return local if event == "call" and frame.f_code.co_filename in sources else None

    threading.settrace(calls)
    sys.settrace(calls)


def sources_from(value: str) -> dict[str, str]:
    """SOURCES_VARIABLE's `name=path` pairs, os.pathsep-separated, as record_lines takes them."""
    pairs = (item.partition("=") for item in value.split(os.pathsep) if item)
    return {path: name for name, _, path in pairs}


def _report_hits(path: str, script_module: str | None) -> None:
    import mutmut.stats

    mutmut.stats.record_trampoline_hit = hit_recorder(path, script_module)
    # This process counts calls, and so do its children that run this module (through PYTHONPATH,
    # or the .pth file under python -I and -E). Told so by MUTANT_UNDER_TEST=stats, a child that
    # runs neither (python -S) would call mutmut's own record, which cannot find its settings
    # there and fails: the variable makes way for STATS_VARIABLE, and such children run the
    # original code.
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


def _start() -> None:
    if os.environ.get(LINES_VARIABLE):
        record_lines(os.environ[LINES_VARIABLE], sources_from(os.environ.get(SOURCES_VARIABLE, "")))
    counting = os.environ.get("MUTANT_UNDER_TEST") == "stats" or os.environ.get(STATS_VARIABLE) == "1"
    script_module = _script_module()
    if counting and os.environ.get(HITS_VARIABLE):
        _report_hits(os.environ[HITS_VARIABLE], script_module)
    elif script_module is not None:
        _switch_on_in_main(script_module)


if __name__ == "sitecustomize":
    _start()
    _hand_over()
elif __name__ == HOOK_NAME:  # run by the .pth file of a mutation run, in an interpreter that skips this folder
    _start()
