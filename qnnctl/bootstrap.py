"""Runs first in a lowering pipeline's process: the AMD MKLDNN guard, then the pipeline.

`qnnctl lower` runs this file by path in the pipeline's own interpreter, which often does not
have qnnctl installed, so it uses the standard library only and keeps to syntax that older
interpreters still read:

    python [interpreter options] bootstrap.py script PATH [ARGS]...
    python [interpreter options] bootstrap.py module NAME [ARGS]...
    python [interpreter options] bootstrap.py code SOURCE [ARGS]...

The parent, which can read the CPU vendor, hands its guard decision over in GUARD_VARIABLE.
The pipeline then runs as `python PATH`, `python -m NAME` or `python -c SOURCE` would run it:
a fresh `__main__` module, the same `sys.argv`, `sys.path[0]` and `__file__`, and tracebacks
without this file's frames.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType, TracebackType

GUARD_VARIABLE = "QNNCTL_DISABLE_MKLDNN"
MODES = ("script", "module", "code")


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
    except Exception as exc:
        # What Python does with an uncaught exception (print it through sys.excepthook, exit 1),
        # minus this file's frames. KeyboardInterrupt and the like propagate untouched, so that
        # Python still ends the process by the signal.
        tb = _pipeline_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)


def _leave_sys_path() -> bool:
    """Take this file's folder (qnnctl's package) off sys.path; True if the interpreter had put it there.

    Its module names (shell, errors, ...) would shadow the pipeline's imports. Under `-I`, `-P`
    or PYTHONSAFEPATH the interpreter adds no folder, and then neither may we.
    """
    own = os.path.dirname(os.path.realpath(__file__))
    if sys.path and sys.path[0] == own:
        del sys.path[0]
        return True
    return False


def _fresh_main() -> dict[str, object]:
    """A new `__main__` module, installed for good, as the interpreter makes for a pipeline run directly."""
    import builtins
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main
    return main.__dict__


def _run_script(path: str, args: list[str], add_path: bool) -> None:
    sys.argv = [path, *args]
    if not _is_plain_source(path):
        # Folders and zip files with a __main__.py, and compiled files: runpy knows how, and
        # puts the path itself first on sys.path for the first two, as the interpreter does.
        import runpy

        runpy.run_path(path, run_name="__main__")
        return
    if add_path:
        sys.path.insert(0, os.path.dirname(os.path.realpath(path)))
    import io

    filename = os.path.abspath(path)
    with io.open_code(filename) as handle:
        source = handle.read()
    # dont_inherit: this file's `from __future__` imports must not reach the pipeline.
    code = compile(source, filename, "exec", dont_inherit=True)
    from importlib.machinery import SourceFileLoader

    namespace = _fresh_main()
    namespace.update(__file__=filename, __cached__=None,
                     __loader__=SourceFileLoader("__main__", filename))
    exec(code, namespace)  # noqa: S102 - running the user's pipeline is the point


def _is_plain_source(path: str) -> bool:
    """Not a folder, not a zip file (zipapps start with a #! line), not compiled code."""
    from importlib.util import MAGIC_NUMBER
    from pkgutil import get_importer

    if get_importer(path) is not None:
        return False
    try:
        with open(path, "rb") as handle:
            return handle.read(len(MAGIC_NUMBER)) != MAGIC_NUMBER
    except OSError:
        return True  # the normal path reports it as Python would


def _run_module(name: str, args: list[str], add_path: bool) -> None:
    import runpy

    sys.argv = ["-m", *args]
    if add_path:
        sys.path.insert(0, os.getcwd())
    _fresh_main()
    run_as_main = getattr(runpy, "_run_module_as_main", None)
    if run_as_main is not None:
        # The function `python -m` itself calls: argv[0], error messages and tracebacks match.
        run_as_main(name, True)
    else:  # pragma: no cover - every CPython since 2.5 has it
        runpy.run_module(name, run_name="__main__", alter_sys=True)


def _run_code(source: str, args: list[str], add_path: bool) -> None:
    sys.argv = ["-c", *args]
    if add_path:
        sys.path.insert(0, "")
    code = compile(source, "<string>", "exec", dont_inherit=True)
    exec(code, _fresh_main())  # noqa: S102 - running the user's pipeline is the point


def _pipeline_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the first frame that is not this file's."""
    own = os.path.abspath(__file__)
    while tb is not None and os.path.abspath(tb.tb_frame.f_code.co_filename) == own:
        tb = tb.tb_next
    return tb


# -- the AMD MKLDNN guard --------------------------------------------------------------


def arm_mkldnn_guard() -> None:
    """Turn PyTorch's MKLDNN path off before the pipeline can run a convolution through it.

    Importing torch here would cost every pipeline a second or more, even one that never uses
    it, so the guard waits for the pipeline's own `import torch`: a finder first on
    sys.meta_path wraps torch's loader, and the setting is made as soon as torch/__init__ has
    run, before the importing line gets the module back. If torch is imported already (by a
    .pth file or sitecustomize), the setting is made at once.
    """
    if "torch" in sys.modules:
        _disable_mkldnn()
    else:
        sys.meta_path.insert(0, _TorchImportHook())


def _disable_mkldnn() -> None:
    import importlib

    try:
        backends = importlib.import_module("torch.backends")
        mkldnn = importlib.import_module("torch.backends.mkldnn")
    except ImportError as exc:
        _warn(f"cannot turn MKLDNN off: {exc}")
        return
    frozen = getattr(backends, "flags_frozen", None)
    if callable(frozen) and frozen():
        # The pipeline froze torch's flags (torch's own test harness does): its call, not ours.
        return
    try:
        mkldnn.enabled = False  # type: ignore[attr-defined]
    except Exception as exc:  # a torch that changed its flags API must not stop a lowering
        _warn(f"cannot turn MKLDNN off: {exc}")


def _warn(message: str) -> None:
    import logging

    logging.getLogger("qnnctl.bootstrap").warning("qnnctl: warning: %s", message)


class _TorchImportHook:
    """A meta path finder that lets the other finders find torch, then wraps its loader."""

    def find_spec(self, fullname: str, path: object, target: object = None) -> ModuleSpec | None:
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec: ModuleSpec | None = find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _GuardedLoader(spec.loader, self)  # type: ignore[assignment]
        return spec


class _GuardedLoader:
    """torch's own loader, followed by the guard once torch has been executed."""

    def __init__(self, loader: Any, hook: _TorchImportHook) -> None:
        self._loader = loader
        self._hook = hook

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        # torch sees its real loader while it initialises (importlib.resources and friends).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        if self._hook in sys.meta_path:
            sys.meta_path.remove(self._hook)
        _disable_mkldnn()

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


if __name__ == "__main__":
    main(sys.argv[1:])
