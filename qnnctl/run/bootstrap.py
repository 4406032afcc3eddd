"""Runs first in a lowering pipeline's process, when that interpreter skips PYTHONPATH or site.

The AMD MKLDNN guard reaches a pipeline's Python processes through `_site/sitecustomize.py`
on PYTHONPATH (see there). An interpreter started with -I, -E or -S never imports it, so
`qnnctl lower` starts such a command through this file instead, run by path in the
pipeline's own interpreter, which often does not have qnnctl installed: the standard library
only, and syntax that older interpreters still read:

    python [interpreter options] bootstrap.py script PATH [ARGS]...
    python [interpreter options] bootstrap.py module NAME [ARGS]...
    python [interpreter options] bootstrap.py code SOURCE [ARGS]...

The parent, which can read the CPU vendor, hands its guard decision over in GUARD_VARIABLE.
The pipeline then runs as `python PATH`, `python -m NAME` or `python -c SOURCE` would run it:
a fresh `__main__` module, the same `sys.argv`, `sys.path[0]` and `__file__`, and tracebacks
(Ctrl-C's included) without this file's frames.
"""

from __future__ import annotations

import builtins
import importlib.util
import io
import linecache
import marshal
import os
import sys
import types
from importlib.machinery import SourceFileLoader, SourcelessFileLoader
from importlib.util import MAGIC_NUMBER

# True for mypy, which reads any name TYPE_CHECKING so; False at run time (typing's own costs `lower`
# an import: it reads this module's names).
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType
    from typing import Any

    ExceptHook = Callable[[type[BaseException], BaseException, "TracebackType | None"], Any]

GUARD_VARIABLE = "QNNCTL_DISABLE_MKLDNN"
MODES = ("script", "module", "code")
# The folder, next to this file, that `qnnctl lower` puts on PYTHONPATH.
SITE_FOLDER = "_site"


def main(argv: list[str]) -> None:
    add_path = _leave_sys_path()
    if len(argv) < 2 or argv[0] not in MODES:
        sys.stderr.write("usage: bootstrap.py {script|module|code} TARGET [ARGS]...\n")
        sys.exit(2)
    mode, target, args = argv[0], argv[1], argv[2:]
    # Popped so that the pipeline sees the environment it would see when run directly.
    if os.environ.pop(GUARD_VARIABLE, "") == "1":
        arm_mkldnn_guard()
    try:
        if mode == "script":
            _run_script(target, args, add_path)
        elif mode == "module":
            _run_module(target, args, add_path)
        else:
            _run_code(target, args, add_path)
    except SystemExit:
        raise
    except BaseException:
        # Python itself prints an uncaught exception through sys.excepthook, exits 1, and
        # ends the process by SIGINT after a KeyboardInterrupt: let it do all that, with a
        # hook that shows the traceback from the pipeline's first frame.
        sys.excepthook = _without_own_frames(sys.excepthook)
        raise


def _without_own_frames(hook: ExceptHook) -> ExceptHook:
    """`hook` (the pipeline's own, if it set one), given the traceback minus this file's frames."""

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> Any:
        sys.excepthook = hook
        tb = _pipeline_frames(tb)
        return hook(kind, value.with_traceback(tb), tb)

    return excepthook


def _leave_sys_path() -> bool:
    """Take this file's folder (qnnctl's package) off sys.path; True if the interpreter had put it there.

    Its module names (shell, errors, ...) would shadow the pipeline's imports. Under `-I`, `-P`
    or PYTHONSAFEPATH the interpreter adds no folder, and then neither may we. Under -S the
    interpreter reads PYTHONPATH but runs no sitecustomize to take its folder off: done here.
    """
    own = os.path.dirname(os.path.realpath(__file__))
    site = os.path.join(own, SITE_FOLDER)
    if site in sys.path:
        sys.path.remove(site)
        sys.path_importer_cache.pop(site, None)
    if sys.path and sys.path[0] == own:
        del sys.path[0]
        return True
    return False


def _fresh_main() -> dict[str, object]:
    """A new `__main__` module, installed for good, as the interpreter makes for a pipeline run directly."""
    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main.__dict__


def _run_script(path: str, args: list[str], add_path: bool) -> None:
    # lazy, as in _run_module: `qnnctl lower` imports this module for its names, and runpy with
    # pkgutil (and typing, which pkgutil imports) is for the pipeline's process alone
    import runpy
    from pkgutil import get_importer

    sys.argv = [path, *args]
    if get_importer(path) is not None:
        # A folder or a zip file with a __main__.py: the interpreter puts the path itself first
        # on sys.path (whatever its options) and runs __main__ from there as `python -m` would.
        sys.path.insert(0, os.path.abspath(path) if sys.version_info >= (3, 9) else path)  # as 3.9 began to
        _fresh_main()
        runpy._run_module_as_main("__main__", False)  # type: ignore[attr-defined]
        return
    if add_path:
        sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    filename = os.path.abspath(path)
    with io.open_code(filename) as handle:
        source = handle.read()
    if _is_compiled(source):
        # After the magic number, the flags and the source's stamp; the user's own compiled pipeline.
        code = marshal.loads(source[16:])  # noqa: S302
        loader: object = SourcelessFileLoader("__main__", filename)
    else:
        # dont_inherit: this file's `from __future__` imports must not reach the pipeline.
        code = compile(source, filename, "exec", dont_inherit=True)
        loader = SourceFileLoader("__main__", filename)
    namespace = _fresh_main()
    namespace.update(__file__=filename, __cached__=None, __loader__=loader)
    exec(code, namespace)  # noqa: S102 - running the user's pipeline is the point


def _is_compiled(data: bytes) -> bool:
    """Compiled code of this interpreter's version, which it runs as such (by its magic number)."""
    return data[: len(MAGIC_NUMBER)] == MAGIC_NUMBER


def _run_module(name: str, args: list[str], add_path: bool) -> None:
    import runpy  # lazy: for the pipeline's process alone (see _run_script)

    sys.argv = ["-m", *args]
    if add_path:
        sys.path.insert(0, os.getcwd())
    _fresh_main()
    # The function `python -m` itself calls (every CPython since 2.5 has it): argv[0], error
    # messages and tracebacks match.
    runpy._run_module_as_main(name, True)  # type: ignore[attr-defined]


def _run_code(source: str, args: list[str], add_path: bool) -> None:
    sys.argv = ["-c", *args]
    if add_path:
        sys.path.insert(0, "")
    code = compile(source, "<string>", "exec", dont_inherit=True)
    if sys.version_info >= (3, 13):
        # `python -c` keeps its source for tracebacks from 3.13 on, which then show its lines.
        lines = source.splitlines(True)
        if lines and not lines[-1].endswith("\n"):
            lines[-1] += "\n"
        linecache.cache["<string>"] = (len(source), None, lines, "<string>")
    namespace = _fresh_main()
    try:
        from importlib.machinery import BuiltinImporter
    except ImportError:  # Python 2, whose `python -c` gives __main__ no __loader__
        pass
    else:
        namespace["__loader__"] = BuiltinImporter  # as `python -c` has it
    exec(code, namespace)  # noqa: S102 - running the user's pipeline is the point


def _pipeline_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is not this file's."""
    own = os.path.abspath(__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == own:
        tb = tb.tb_next
    return tb


# -- the AMD MKLDNN guard --------------------------------------------------------------


def arm_mkldnn_guard() -> None:
    """Arm the guard of `_site/sitecustomize.py`, loaded by path under a name of its own.

    Loaded, not imported: this interpreter may lack qnnctl, and ignores PYTHONPATH.
    """
    path = os.path.join(os.path.dirname(os.path.realpath(__file__)), SITE_FOLDER, "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("_qnnctl_mkldnn_guard", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a .py path always has a loader
        raise ImportError(f"cannot load {path}")
    guard = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(guard)
    guard.arm_mkldnn_guard()


if __name__ == "__main__":
    main(sys.argv[1:])
