"""Rule 1: importing qnnctl, or any module of it, does nothing.

Two independent checks: an AST walk of the code that runs at import time (module and class
bodies, decorators, default arguments, base classes, and the functions those call), and a
fresh interpreter that imports every module with sockets, subprocesses and environment writes
turned into errors.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from tests.conftest import REPO

# What import-time code must never call, by the dotted name the call resolves to (through
# `import x as y`, `from x import y` and `y = x.z`); shell-style wildcards allowed. A call that is
# not listed is allowed: `@click.command()` and `logging.getLogger(...)` run at import time and
# are harmless.
DENIED_CALLS: dict[str, str] = {
    # setup, installs, downloads
    "qnnctl.setup_sdk": "sets the SDK up",
    "qnnctl.disable_mkldnn_on_amd": "changes a torch setting",
    "qnnctl.run.api.setup_sdk": "sets the SDK up",
    "qnnctl.run.api.disable_mkldnn_on_amd": "changes a torch setting",
    "qnnctl.run.api.preload": "loads the SDK's libraries",
    "qnnctl.run.api.preload_runtime": "loads the staged runtime",
    "qnnctl.run.environment.ensure_loadable": "stages the host runtime",
    "qnnctl.install.pipeline.install": "installs an SDK",
    "qnnctl.install.prune.uninstall": "removes an SDK",
    "qnnctl.install.prune.clean_cache": "removes files",
    "qnnctl.net.download.*": "downloads",
    "qnnctl.run.lower.plan_lower": "resolves and installs an SDK",
    "qnnctl.run.environment.resolve_sdk": "resolves and installs an SDK",
    "qnnctl.run.lower.exec_plan": "replaces the process",
    "qnnctl.host.machine.cpu_vendor": "reads the CPU (py-cpuinfo starts a subprocess where /proc/cpuinfo is missing)",
    "cpuinfo.*": "starts a subprocess",
    # subprocesses
    "subprocess.*": "starts a subprocess",
    "os.system": "starts a subprocess",
    "os.popen": "starts a subprocess",
    "os.fork": "forks",
    "os.forkpty": "forks",
    "os.exec*": "replaces the process",
    "os.spawn*": "starts a subprocess",
    "os.posix_spawn*": "starts a subprocess",
    "pty.spawn": "starts a subprocess",
    "ctypes.util.find_library": "starts a subprocess",
    # environment writes
    "os.putenv": "writes the environment",
    "os.unsetenv": "writes the environment",
    "os.environ.update": "writes the environment",
    "os.environ.pop": "writes the environment",
    "os.environ.popitem": "writes the environment",
    "os.environ.clear": "writes the environment",
    "os.environ.setdefault": "writes the environment",
    "os.environ.__setitem__": "writes the environment",
    "os.environ.__delitem__": "writes the environment",
    # network
    "socket.*": "opens the network",
    "urllib.request.*": "opens the network",
    "http.client.*": "opens the network",
    "requests.*": "opens the network",
    "urllib3.*": "opens the network",
    # PyTorch settings and native libraries
    "torch.*": "changes a torch setting",
    "ctypes.CDLL": "loads a native library",
    "ctypes.PyDLL": "loads a native library",
    "ctypes.cdll.*": "loads a native library",
    "ctypes.pydll.*": "loads a native library",
}
# Assigning to (or deleting) these, or setattr/delattr on them, is denied too.
DENIED_TARGETS: dict[str, str] = {
    "os.environ": "writes the environment",
    "os.environ.*": "writes the environment",
    "torch.*": "changes a torch setting",
}
# Methods that run when a class is instantiated at import time.
_CONSTRUCTORS = ("__new__", "__init__", "__post_init__")


@dataclass(frozen=True)
class Finding:
    module: str
    line: int
    what: str
    why: str
    via: tuple[str, ...] = ()

    def __str__(self) -> str:
        chain = f" (via {' -> '.join(self.via)})" if self.via else ""
        return f"{self.module}:{self.line}: {self.what}: {self.why}{chain}"


def _denied(name: str, table: dict[str, str]) -> str | None:
    for pattern, why in table.items():
        if fnmatchcase(name, pattern):
            return why
    return None


def _is_main_guard(test: ast.expr) -> bool:
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and len(test.comparators) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == "__main__"
    )


def _has_future_annotations(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ImportFrom) and node.module == "__future__"
        and any(alias.name == "annotations" for alias in node.names)
        for node in tree.body
    )


class _Module:
    """One parsed module: its top-level functions and classes, and the names its imports bind."""

    def __init__(self, name: str, source: str, is_package: bool) -> None:
        self.name = name
        self.package = name if is_package else name.rpartition(".")[0]
        self.tree = ast.parse(source)
        self.lazy_annotations = _has_future_annotations(self.tree)
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}
        for node in self.tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions[node.name] = node
            elif isinstance(node, ast.ClassDef):
                self.classes[node.name] = node
        self.aliases = self.bindings(self.tree.body, {})

    def bindings(self, body: list[ast.stmt], outer: dict[str, str]) -> dict[str, str]:
        """name -> dotted name, for the imports and `y = x.z` aliases of a block (not of nested defs)."""
        names = dict(outer)
        for defined in (*self.functions, *self.classes):
            names.setdefault(defined, f"{self.name}.{defined}")
        for node in _block_nodes(body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        names[top] = top
            elif isinstance(node, ast.ImportFrom):
                base = self._absolute(node)
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{base}.{alias.name}" if base else alias.name
            elif (isinstance(node, ast.Assign) and len(node.targets) == 1
                  and isinstance(node.targets[0], ast.Name)):
                value = _dotted(node.value, names)
                if value is not None and isinstance(node.value, (ast.Name, ast.Attribute)):
                    names[node.targets[0].id] = value
        return names

    def _absolute(self, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        parts = self.package.split(".")
        base = ".".join(parts[: len(parts) - node.level + 1])
        return f"{base}.{node.module}" if node.module else base


def _block_nodes(body: list[ast.stmt]) -> Iterator[ast.AST]:
    """Every node of a block, nested defs and lambdas excluded (their bodies do not run)."""
    stack: list[ast.AST] = list(body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))


def _dotted(expr: ast.expr, names: dict[str, str]) -> str | None:
    parts: list[str] = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if isinstance(expr, ast.Name):
        return ".".join([names.get(expr.id, expr.id), *reversed(parts)])
    return None


class ImportTimeWalker:
    """Finds denied calls and writes in the code that importing the given modules runs."""

    def __init__(self, modules: dict[str, _Module]) -> None:
        self.modules = modules
        self.findings: list[Finding] = []
        self._entered: set[str] = set()

    @classmethod
    def from_sources(cls, sources: dict[str, str], packages: Iterable[str] = ()) -> ImportTimeWalker:
        packages = set(packages)
        return cls({name: _Module(name, source, name in packages) for name, source in sources.items()})

    def check(self, name: str) -> list[Finding]:
        module = self.modules[name]
        self._entered = set()
        before = len(self.findings)
        _Visitor(self, module, module.aliases, ()).visit_block(module.tree.body)
        return self.findings[before:]

    def enter(self, dotted: str, via: tuple[str, ...]) -> None:
        """Walk the body of a project function (or the constructors of a class) called at import time."""
        if dotted in self._entered:
            return
        self._entered.add(dotted)
        module_name, _, attr = dotted.rpartition(".")
        module = self.modules.get(module_name)
        if module is None:
            return
        bodies: list[ast.FunctionDef | ast.AsyncFunctionDef] = []
        if attr in module.functions:
            bodies.append(module.functions[attr])
        elif attr in module.classes:
            bodies += [node for node in module.classes[attr].body
                       if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in _CONSTRUCTORS]
        else:
            target = module.aliases.get(attr)
            if target is not None and target != dotted:
                self.enter(target, via)
            return
        for function in bodies:
            names = module.bindings(function.body, module.aliases)
            _Visitor(self, module, names, (*via, dotted)).visit_block(function.body)


class _Visitor(ast.NodeVisitor):
    def __init__(self, walker: ImportTimeWalker, module: _Module, names: dict[str, str],
                 via: tuple[str, ...]) -> None:
        self.walker = walker
        self.module = module
        self.names = names
        self.via = via

    def visit_block(self, body: list[ast.stmt]) -> None:
        for statement in body:
            self.visit(statement)

    def report(self, node: ast.AST, what: str, why: str) -> None:
        line = getattr(node, "lineno", 0)
        self.walker.findings.append(Finding(self.module.name, line, what, why, self.via))

    # Definitions: what runs when they are defined, not their bodies.
    def _function_header(self, node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> None:
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
        for default in [*node.args.defaults, *node.args.kw_defaults]:
            if default is not None:
                self.visit(default)
        if not isinstance(node, ast.Lambda) and not self.module.lazy_annotations:
            arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                         *(a for a in (node.args.vararg, node.args.kwarg) if a is not None)]
            for argument in arguments:
                if argument.annotation is not None:
                    self.visit(argument.annotation)
            if node.returns is not None:
                self.visit(node.returns)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._function_header(node)

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._function_header(node)

    def visit_Lambda(self, node: ast.Lambda) -> None:
        self._function_header(node)

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for expr in [*node.decorator_list, *node.bases, *(k.value for k in node.keywords)]:
            self.visit(expr)
        self.visit_block(node.body)

    def visit_If(self, node: ast.If) -> None:
        if _is_main_guard(node.test):
            self.visit_block(node.orelse)  # the body runs only as a script, never on import
            return
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self._check_target(node.target)
        if node.value is not None:
            self.visit(node.value)
        if not self.module.lazy_annotations:
            self.visit(node.annotation)

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._check_target(target)
        self.visit(node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._check_target(node.target)
        self.visit(node.value)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._check_target(target)

    def _check_target(self, target: ast.expr) -> None:
        if isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._check_target(element)
            return
        inner = target.value if isinstance(target, ast.Subscript) else target
        if isinstance(target, (ast.Subscript, ast.Attribute)):
            name = _dotted(inner, self.names)
            why = _denied(name, DENIED_TARGETS) if name else None
            if why and name:
                self.report(target, f"assignment to {name}", why)
        self.generic_visit(target)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func, self.names)
        if name is not None:
            why = _denied(name, DENIED_CALLS)
            if why:
                self.report(node, f"call to {name}", why)
            elif name in ("setattr", "delattr") and node.args:
                target = _dotted(node.args[0], self.names)
                target_why = _denied(target, DENIED_TARGETS) if target else None
                if target_why:
                    self.report(node, f"{name} on {target}", target_why)
            elif name.split(".")[0] in {m.split(".")[0] for m in self.walker.modules}:
                self.walker.enter(name, self.via)
        self.generic_visit(node)


# -- the real package ------------------------------------------------------------------


def project_sources() -> tuple[dict[str, str], set[str]]:
    sources: dict[str, str] = {}
    packages: set[str] = set()
    for path in sorted((REPO / "qnnctl").rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts.pop()
            packages.add(".".join(parts))
        sources[".".join(parts)] = path.read_text(encoding="utf-8")
    return sources, packages


def test_no_module_does_anything_on_import() -> None:
    sources, packages = project_sources()
    assert {"qnnctl", "qnnctl.run.api", "qnnctl.run.bootstrap", "qnnctl.run.lower", "qnnctl.cli"} <= set(sources)
    walker = ImportTimeWalker.from_sources(sources, packages)
    findings = [str(f) for name in sorted(sources) for f in walker.check(name)]
    assert findings == []


# -- the walker catches each shape -----------------------------------------------------


def _check(source: str, module: str = "qnnctl.mod", extra: dict[str, str] | None = None) -> list[str]:
    sources = {module: textwrap.dedent(source), **(extra or {})}
    walker = ImportTimeWalker.from_sources(sources)
    return [str(f) for f in walker.check(module)]


CAUGHT = {
    "module body": "import subprocess\nsubprocess.run(['x'])\n",
    "import alias": "import subprocess as sp\nsp.Popen(['x'])\n",
    "from import": "from os import system\nsystem('x')\n",
    "assigned alias": "import subprocess\nrun = subprocess.run\nrun(['x'])\n",
    "inside try": "import os\ntry:\n    os.fork()\nexcept OSError:\n    pass\n",
    "comprehension": "import os\n[os.system(c) for c in ['a']]\n",
    "environ item": "import os\nos.environ['A'] = '1'\n",
    "environ from import": "from os import environ\nenviron['A'] = '1'\n",
    "environ augmented": "import os\nos.environ['PATH'] += ':/x'\n",
    "environ delete": "import os\ndel os.environ['A']\n",
    "environ method": "import os\nos.environ.update(A='1')\n",
    "environ setdefault": "import os\nos.environ.setdefault('A', '1')\n",
    "putenv": "import os\nos.putenv('A', '1')\n",
    "network": "import urllib.request\nurllib.request.urlopen('http://127.0.0.1/')\n",
    "socket": "import socket\nsocket.create_connection(('127.0.0.1', 1))\n",
    "requests": "import requests\nrequests.get('http://127.0.0.1/')\n",
    "torch call": "import torch\ntorch.set_num_threads(1)\n",
    "torch flag": "import torch\ntorch.backends.mkldnn.enabled = False\n",
    "torch setattr": "import torch\nsetattr(torch.backends.mkldnn, 'enabled', False)\n",
    "native library": "import ctypes\nctypes.CDLL('libQnnHtp.so')\n",
    "cpu vendor": "from qnnctl.host.machine import cpu_vendor\nVENDOR = cpu_vendor()\n",
    "setup": "import qnnctl\nqnnctl.setup_sdk()\n",
    "setup alias": "from qnnctl.run.api import setup_sdk as s\ns()\n",
    "relative import": "from .run.api import setup_sdk\nsetup_sdk()\n",
    "decorator": (
        "import subprocess\ndef deco(x):\n    return lambda f: f\n@deco(subprocess.run(['x']))\ndef f():\n    pass\n"
    ),
    "default argument": "import socket\ndef f(s=socket.socket()):\n    pass\n",
    "keyword-only default": "import os\ndef f(*, v=os.environ.pop('A')):\n    pass\n",
    "lambda default": "import os\nf = lambda x=os.system('a'): x\n",
    "annotation": "import os\ndef f(x: os.system('a')):\n    pass\n",
    "base class": "from qnnctl.run.api import setup_sdk\nclass C(setup_sdk().__class__):\n    pass\n",
    "metaclass": "import subprocess\nclass C(metaclass=subprocess.check_output(['x'])):\n    pass\n",
    "class body": "import os\nclass C:\n    os.environ['A'] = '1'\n",
    "nested class body": "import os\nclass C:\n    class D:\n        X = os.popen('x')\n",
    "method decorator": "import os\nclass C:\n    @os.system('x')\n    def m(self):\n        pass\n",
    "local function called": "import subprocess\ndef helper():\n    subprocess.run(['x'])\nhelper()\n",
    "class instantiated": "import os\nclass C:\n    def __init__(self):\n        os.system('x')\nINSTANCE = C()\n",
    "main guard else": "import os\nif __name__ == '__main__':\n    pass\nelse:\n    os.system('x')\n",
}


@pytest.mark.parametrize("shape", sorted(CAUGHT))
def test_walker_catches(shape: str) -> None:
    assert len(_check(CAUGHT[shape])) == 1, shape


def test_walker_follows_calls_into_other_modules() -> None:
    helper = "def go():\n    import socket\n    return socket.socket()\n"
    findings = _check("from qnnctl.helper import go\nVALUE = go()\n", extra={"qnnctl.helper": helper})
    assert len(findings) == 1
    assert "via qnnctl.helper.go" in findings[0]
    assert findings[0].startswith("qnnctl.helper:3: call to socket.socket")


ALLOWED = {
    "function body": "import subprocess\ndef f():\n    subprocess.run(['x'])\n",
    "lambda body": "import os\nf = lambda: os.system('x')\n",
    "main guard": "import os\nif __name__ == '__main__':\n    os.system('x')\n",
    "click decorators": "import click\n@click.command()\n@click.option('--x', default=1)\ndef f(x):\n    pass\n",
    "environ reads": "import os\nA = os.environ.get('A')\nB = os.environ['B'] if 'B' in os.environ else None\n",
    "logger": "import logging\nlog = logging.getLogger('qnnctl.mod')\n",
    "lazy annotations": "from __future__ import annotations\nimport os\ndef f(x: os.system('a')):\n    pass\n",
    "method body": "import os\nclass C:\n    def m(self):\n        os.environ['A'] = '1'\n",
    "class not instantiated": "import os\nclass C:\n    def __init__(self):\n        os.system('x')\n",
}


@pytest.mark.parametrize("shape", sorted(ALLOWED))
def test_walker_allows(shape: str) -> None:
    assert _check(ALLOWED[shape]) == [], shape


# -- a real import, with the dangerous calls turned into errors ------------------------

_IMPORT_ALL = """\
import ctypes, json, os, pkgutil, importlib, socket, subprocess, sys

before = dict(os.environ)

def refuse(what):
    def raiser(*args, **kwargs):
        raise RuntimeError("called at import time: " + what)
    return raiser

# Subclasses, so that modules which subclass these at import time still can.
class NoSocket(socket.socket):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("called at import time: socket.socket")

class NoPopen(subprocess.Popen):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("called at import time: subprocess.Popen")

class NoCDLL(ctypes.CDLL):
    def __init__(self, *args, **kwargs):
        raise RuntimeError("called at import time: ctypes.CDLL")

socket.socket = NoSocket
socket.create_connection = refuse("socket.create_connection")
socket.getaddrinfo = refuse("socket.getaddrinfo")
subprocess.Popen = NoPopen
ctypes.CDLL = NoCDLL
for name in ("system", "popen", "fork", "forkpty", "execv", "execve", "execvp", "execvpe", "execl",
             "execlp", "execle", "execlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
             "posix_spawn", "posix_spawnp", "putenv", "unsetenv"):
    if hasattr(os, name):
        setattr(os, name, refuse("os." + name))

import qnnctl

failed = []
names = [info.name for info in pkgutil.walk_packages(qnnctl.__path__, "qnnctl.", onerror=failed.append)]
for name in names:
    importlib.import_module(name)
# The lazily exported names import their modules too.
qnnctl.setup_sdk, qnnctl.disable_mkldnn_on_amd, qnnctl.Sdk
changed = sorted(k for k in set(before) | set(os.environ) if before.get(k) != os.environ.get(k))
print(json.dumps({"modules": names, "failed": failed, "changed": changed,
                  "torch": "torch" in sys.modules, "cpuinfo": "cpuinfo" in sys.modules}))
"""


def test_importing_every_module_in_a_fresh_interpreter_does_nothing() -> None:
    env = {**os.environ, "QNN_SDK_ROOT": "", "LD_LIBRARY_PATH": "/opt/untouched"}
    result = subprocess.run([sys.executable, "-c", _IMPORT_ALL], capture_output=True, text=True,
                            timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert {"qnnctl.run.api", "qnnctl.run.bootstrap", "qnnctl.run.lower", "qnnctl.cli"} <= set(report["modules"])
    assert report["failed"] == []
    assert report["changed"] == []
    assert report["torch"] is False
    assert report["cpuinfo"] is False


def test_the_fresh_interpreter_check_would_notice(tmp_path: Path) -> None:
    # The same harness, given a module that does write the environment on import, reports it.
    package = tmp_path / "qnnctl_probe_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "bad.py").write_text("import os\nos.environ['QNNCTL_PROBE'] = '1'\n")
    script = _IMPORT_ALL.replace("import qnnctl\n", "import qnnctl_probe_pkg as qnnctl\n").replace(
        '"qnnctl."', '"qnnctl_probe_pkg."').replace(
        "qnnctl.setup_sdk, qnnctl.disable_mkldnn_on_amd, qnnctl.Sdk\n", "")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode != 0
    assert "called at import time: os.putenv" in result.stderr
