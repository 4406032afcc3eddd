"""The layout docs/architecture.md describes, checked on the source: which way imports run.

Read with `ast`, not by importing: every `import` and `from ... import` of a qnnctl module
counts, those inside functions too, except under `if TYPE_CHECKING:` (never run).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

import qnnctl

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - qnnctl's own dependency there
    import tomli as tomllib

PACKAGE = Path(qnnctl.__file__).parent

# Lowest first: a module may import from its own layer and those before it, never after it.
LAYERS = (
    ("qnnctl.version", "qnnctl.errors", "qnnctl.records", "qnnctl.words", "qnnctl.paths", "qnnctl.files",
     "qnnctl.threads", "qnnctl.net",
     "qnnctl.shell"),
    ("qnnctl.sdk",),
    ("qnnctl.host",),
    ("qnnctl.install",),
    ("qnnctl.fleet", "qnnctl.run"),
    ("qnnctl.device",),
    ("qnnctl.doctor",),
    ("qnnctl.commands",),
    ("qnnctl.cli", "qnnctl.launch"),
    ("qnnctl.__main__",),
)


class Edge(NamedTuple):
    source: str
    target: str
    names: tuple[str, ...]
    line: int
    in_function: bool
    comment: str


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def edges(path: Path) -> list[Edge]:
    """The qnnctl imports of one source file."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    tree = ast.parse(text)
    never_run = {id(node) for top in tree.body
                 if isinstance(top, ast.If) and "TYPE_CHECKING" in ast.unparse(top.test)
                 for node in ast.walk(top)}
    in_function = {id(node) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                   for node in ast.walk(fn)}
    found = []
    for node in ast.walk(tree):
        if id(node) in never_run or not isinstance(node, (ast.Import, ast.ImportFrom)):
            continue
        if isinstance(node, ast.ImportFrom):
            targets = [(node.module or "", tuple(alias.name for alias in node.names))]
        else:
            targets = [(alias.name, ()) for alias in node.names]
        for target, names in targets:
            if target == "qnnctl" or target.startswith("qnnctl."):
                comment = _comment(lines, node.lineno)
                found.append(Edge(module_name(path), target, names, node.lineno, id(node) in in_function,
                                  comment))
    return found


def _comment(lines: list[str], lineno: int) -> str:
    """The comment on an import's line, or on the line above it."""
    here = lines[lineno - 1].partition("#")[2]
    above = lines[lineno - 2].strip() if lineno > 1 else ""
    return (here or (above[1:] if above.startswith("#") else "")).strip()


ALL = sorted(PACKAGE.rglob("*.py"))
EDGES = [edge for path in ALL for edge in edges(path)]


def layer(module: str) -> int | None:
    for index, members in enumerate(LAYERS):
        if any(module == member or module.startswith(member + ".") for member in members):
            return index
    return None


def test_every_module_has_a_layer() -> None:
    unplaced = sorted({module_name(path) for path in ALL} - {"qnnctl"} - {
        module_name(path) for path in ALL if layer(module_name(path)) is not None})
    assert unplaced == []


def test_imports_run_one_way() -> None:
    upward = []
    for e in EDGES:
        source, target = layer(e.source), layer(e.target)
        if e.target != "qnnctl" and source is not None and target is not None and target > source:
            upward.append(f"{e.source}:{e.line} imports {e.target}")
    assert upward == []


def _package(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 else module


def test_no_circles_between_modules_or_packages() -> None:
    for key in (lambda m: m, _package):
        graph: dict[str, set[str]] = {}
        for e in EDGES:
            if e.target != "qnnctl" and key(e.source) != key(e.target):
                graph.setdefault(key(e.source), set()).add(key(e.target))
        state: dict[str, int] = {}

        def visit(node: str, trail: list[str]) -> None:
            state[node] = 1
            for nxt in sorted(graph.get(node, ())):
                if state.get(nxt) == 1:
                    pytest.fail("import circle: " + " -> ".join([*trail[trail.index(nxt):], nxt]))
                if nxt not in state:
                    visit(nxt, [*trail, nxt])
            state[node] = 2

        for start in sorted(graph):
            if start not in state:
                visit(start, [start])


def test_no_private_name_crosses_modules() -> None:
    private = [f"{e.source}:{e.line} {e.target}.{name}" for e in EDGES for name in e.names
               if name.startswith("_") and name != "__version__"]
    assert private == []


def test_the_install_pipeline_is_handed_what_to_expect() -> None:
    """The lock and the mirror's index hand their expectations down (qnnctl.sdk.gate.Vouchers):
    no module of the install pipeline imports them, nor anything that does; but for the SDK
    model's choice of a version, which lists the versions a mirror holds (to resolve `2.37`)
    and never what an archive must match."""
    graph: dict[str, set[str]] = {}
    for e in EDGES:
        if (e.source, e.target) == ("qnnctl.sdk.select", "qnnctl.sdk.mirrorindex"):
            assert set(e.names) <= {"index_url", "indexed_versions"}
            continue
        graph.setdefault(e.source, set()).add(e.target)
    readers = ("qnnctl.sdk.lockfile", "qnnctl.sdk.mirrorindex", "qnnctl.sdk.vouchers")
    for start in (m for m in graph if m.startswith("qnnctl.install")):
        seen, todo = set(), [start]
        while todo:
            module = todo.pop()
            assert module not in readers, f"{start} reaches {module}"
            if module not in seen:
                seen.add(module)
                todo.extend(graph.get(module, ()))


def test_what_stays_inside_functions_says_why() -> None:
    inside = [e for e in EDGES if e.in_function]
    assert len(inside) <= 60
    assert [f"{e.source}:{e.line}" for e in inside if not e.comment] == []


def test_the_top_folder_stays_small_and_each_package_says_what_it_owns() -> None:
    assert len([path for path in PACKAGE.glob("*.py")]) <= 12
    for init in PACKAGE.glob("*/__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8")))
        assert doc, init
        assert len(doc.strip().splitlines()) <= 2, init


def test_every_package_is_shipped() -> None:
    """pyproject.toml lists qnnctl's packages by hand: a folder of modules left out of it is left
    out of the wheel, and every command that imports it fails once installed (an editable
    install, as the tests', would still find it)."""
    pyproject = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())
    listed = set(pyproject["tool"]["setuptools"]["packages"])
    folders = {".".join(("qnnctl", *folder.relative_to(PACKAGE).parts))
               for folder in (PACKAGE, *(p for p in PACKAGE.rglob("*") if p.is_dir()))
               if any(folder.glob("*.py"))}
    assert folders == listed


def test_one_door_asks_the_gate() -> None:
    """Every way an SDK's bytes arrive is checked in one place (qnnctl.install.door): no other
    module imports the gate's `check`, so no way in can hold its own, different, sequence."""
    callers = sorted({e.source for e in EDGES if e.target == "qnnctl.sdk.gate" and "check" in e.names})
    assert callers == ["qnnctl.install.door"]


def test_no_module_imports_the_package_itself() -> None:
    """`__version__` lives in a leaf (qnnctl.version): importing any module of qnnctl never runs
    the package's __init__ for it, and no circle can start there."""
    assert [f"{e.source}:{e.line}" for e in EDGES if e.target == "qnnctl" and e.source != "qnnctl"] == []


def test_no_module_is_over_600_lines() -> None:
    long = {str(path.relative_to(PACKAGE)): n for path in PACKAGE.rglob("*.py")
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > 600}
    assert long == {}
