"""Which lines of the mutated sources each test runs, so that a mutant is tested only by the
tests that run the code it changes (tools/mutation/README.md, "Tests by line").

mutmut knows which tests reach a *function*. `install.install` is reached by nearly every test
of its module, and most of them run a few of its lines: a mutant of a line deep in it ran
dozens of tests that never get there before one that does, and a survivor ran them all. A test
that never runs the lines a mutant changes runs the original code, and cannot kill it.

`python -m tools.mutation MODULE --lines` runs the module's tests once on the original code
with this file as a pytest plugin: each test, in its own process and in every Python child it
starts with the tests' PYTHONPATH (through site/sitecustomize.py), appends each line of the
module's sources it runs, once, to `lines.tsv`: `source, function, line, test`, tab-separated.
ordered_run.py reads it with `reach.tsv` (each mutant's function and the lines whose running
means its change ran: __main__.py writes it) and runs a mutant's tests that ran those lines,
its killers first.
"""

from __future__ import annotations

import ast
import difflib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

from tools.mutation.plugin import load_site

# As site/sitecustomize.py reads them: the file each process appends its lines to, the sources
# (`name=absolute path`, os.pathsep-separated), the running test's node id (its children inherit it).
LINES_VARIABLE = "QNNCTL_MUTATION_LINES"
SOURCES_VARIABLE = "QNNCTL_MUTATION_LINES_SOURCES"
TEST_VARIABLE = "QNNCTL_MUTATION_LINES_TEST"
SITE = Path(__file__).resolve().parent / "site"
ANY = "*"  # reach.tsv's lines for a change to a function's signature: every test that calls it counts


def sources_variable(root: Path, sources: Iterable[str]) -> str:
    """SOURCES_VARIABLE for the sources (relative to `root`): `name=absolute path` pairs."""
    return os.pathsep.join(f"{source}={(root / source).resolve()}" for source in sources)


# The pytest plugin (`-p tools.mutation.lines`), for the collecting run only.

def pytest_configure(config: pytest.Config) -> None:
    path = os.environ.get(LINES_VARIABLE)
    if not path:
        return
    # The export's own qnnctl/ in every child, and the site folder that starts their tracer.
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(config.rootpath), str(SITE), os.environ.get("PYTHONPATH")]))
    site = load_site()
    site.record_lines(path, site.sources_from(os.environ.get(SOURCES_VARIABLE, "")))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """The test's id, for this process's tracer and its children's, from its set-up to its teardown."""
    os.environ[TEST_VARIABLE] = item.nodeid
    try:
        yield
    finally:
        os.environ.pop(TEST_VARIABLE, None)


# What a mutant's change reaches: the lines of the original that run when its change runs.

def _statement_lines(function: ast.FunctionDef | ast.AsyncFunctionDef, line: int) -> set[int] | None:
    """The lines of `function` (in the original's numbers) one of which runs whenever its line
    `line` runs: those of the innermost statement holding it, or of its header for a compound
    one (an `if`'s condition, a `with`'s items, an `except` clause). None for a line of the
    signature, which runs at every call."""
    if line < function.body[0].lineno:
        return None
    span = (function.lineno, function.end_lineno or function.lineno)
    innermost: ast.AST = function
    for node in ast.walk(function):
        if node is function or not isinstance(node, ast.stmt | ast.excepthandler):
            continue
        end = node.end_lineno or node.lineno
        if node.lineno <= line <= end and end - node.lineno <= span[1] - span[0]:
            span, innermost = (node.lineno, end), node
    children = [child.lineno for field in ("body", "orelse", "handlers", "finalbody")
                for child in getattr(innermost, field, None) or [] if isinstance(child, ast.stmt | ast.excepthandler)]
    if innermost is not function and children:
        # A line of a compound statement outside its inner statements is in its header.
        span = (span[0], min((child for child in children if child > span[0]), default=span[1] + 1) - 1)
    return set(range(span[0], span[1] + 1))


def functions_of(tree: ast.Module) -> dict[str, ast.FunctionDef | ast.AsyncFunctionDef]:
    """The module's functions and methods by their qualified names (as co_qualname gives them)."""
    found: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                found[prefix + child.name] = child
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(tree, "")
    return found


def qualname_of(mangled: str) -> str:
    """mutmut's name of a function's copies (`x_install`, `xǁArchiveǁread`) as Python names it."""
    return mangled[2:].replace("ǁ", ".") if mangled.startswith("xǁ") else mangled.removeprefix("x_")


def reach(original: str, mutated: str, spans: dict[str, tuple[int, int]], module: str) -> dict[str, tuple[str, str]]:
    """Each mutant of the mutated file -> (its function's qualified name, the original's lines
    whose running means the change ran, comma-separated, or ANY). `spans`: the lines of each
    function mutmut wrote (1-based, inclusive), as changes.mutated gives them."""
    functions = functions_of(ast.parse(original))
    original_lines = original.splitlines()
    lines = mutated.splitlines()
    found: dict[str, tuple[str, str]] = {}
    for name, (start, end) in spans.items():
        stem, _, number = name.rpartition("__mutmut_")
        if number == "orig" or not stem:
            continue
        qualname = qualname_of(stem)
        function = functions.get(qualname)
        orig_start, orig_end = spans[f"{stem}__mutmut_orig"]
        # Each copy with the original's name: the name is the one difference that is not the mutant's.
        own = function.name if function is not None else stem
        copy = _from_def([line.replace(f"{stem}__mutmut_orig", own) for line in lines[orig_start - 1:orig_end]])
        mutant = _from_def([line.replace(name, own) for line in lines[start - 1:end]])
        changed = _changed(function, copy, mutant, original_lines)
        found[f"{module}.{name}"] = (qualname, ",".join(map(str, sorted(changed))) if changed else ANY)
    return found


def _from_def(lines: list[str]) -> list[str]:
    """A function's lines from its `def` on (mutmut's spans take in the blank lines before it)."""
    for index, line in enumerate(lines):
        if line.lstrip().startswith(("def ", "async def ")):
            return lines[index:]
    return lines


def _changed(function: ast.FunctionDef | ast.AsyncFunctionDef | None, copy: list[str], mutant: list[str],
             original: list[str]) -> set[int] | None:
    """The original's lines one of which runs when the mutant's change does; None for any call."""
    # mutmut mutates no decorated function: its copies start at `def`, as the original does.
    if function is None or function.end_lineno is None or copy != original[function.lineno - 1:function.end_lineno]:
        return None  # the copy is not the original's text but for its name: no line is trusted
    changed: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, copy, mutant, autojunk=False).get_opcodes():
        if tag == "equal":
            continue
        # Lines inserted run between their neighbours: either one's statement is where they run.
        for index in (i1 - 1, i1) if tag == "insert" else range(i1, i2):
            statement = _statement_lines(function, function.lineno + index)
            if statement is None:
                return None
            changed |= statement
    return changed
