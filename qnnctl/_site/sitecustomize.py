"""The AMD MKLDNN guard, in every Python process of a `qnnctl lower` pipeline.

When the guard is wanted (an AMD host, no --keep-mkldnn), `qnnctl lower` puts this file's
folder first on PYTHONPATH, and the `site` module imports this file at the start of every
Python process that honours it: the pipeline itself, a console script such as torchrun,
multiprocessing's spawn workers, a launcher's children. Those interpreters often lack
qnnctl, so this file uses the standard library only and keeps to syntax that older
interpreters still read. Imported as `sitecustomize` it:

1. takes its own folder off sys.path (and out of the importer cache): the pipeline sees the
   sys.path it would see without qnnctl. PYTHONPATH keeps the entry, so that the pipeline's
   own Python children are guarded too;
2. imports the next `sitecustomize` on sys.path, the one that would have run without qnnctl,
   and leaves it in sys.modules in its place (or none, when there is none); its errors reach
   `site`, which reports them as it always does;
3. arms the guard (arm_mkldnn_guard). After the user's sitecustomize, so that torch flags it
   froze stay as it left them.

Imported under any other name (qnnctl's bootstrap loads it by path for interpreters that skip
PYTHONPATH) it only defines the guard.
"""

from __future__ import annotations

import os
import sys

# Not typing's: importing typing would cost every Python process of the pipeline 2-3 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec
    from types import ModuleType
    from typing import Any

HANDOVER_NAME = "sitecustomize"


def _start() -> None:
    own = os.path.dirname(os.path.abspath(__file__))
    if own in sys.path:
        sys.path.remove(own)
    sys.path_importer_cache.pop(own, None)
    # The user's module takes this one's place in sys.modules; with none, the import below
    # fails as `site`'s own would have, and `site` passes over that failure in silence.
    del sys.modules[HANDOVER_NAME]
    try:
        import importlib

        importlib.import_module(HANDOVER_NAME)
    finally:
        arm_mkldnn_guard()


# -- the guard ---------------------------------------------------------------------------


def arm_mkldnn_guard() -> None:
    """Turn PyTorch's MKLDNN path off before the pipeline can run a convolution through it.

    Importing torch here would cost every Python process a second or more, even one that
    never uses it, so the guard waits for the pipeline's own `import torch`: a finder first
    on sys.meta_path finds torch as the others would, and the setting is made as soon as
    torch/__init__ has run, before the importing line gets the module back. If torch is
    imported already (by a .pth file or a sitecustomize), the setting is made at once.
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

    logging.getLogger("qnnctl.guard").warning("qnnctl: warning: %s", message)


def _import_system_marks_specs() -> bool:
    """Whether the import system sets `spec._initializing` False once a module has run (3.8 on)."""
    bootstrap = sys.modules.get("importlib._bootstrap")
    load = getattr(bootstrap, "_load_unlocked", None)
    return "_initializing" in getattr(getattr(load, "__code__", None), "co_names", ())


class _TorchImportHook:
    """A meta path finder that lets the other finders find torch, then watches it load."""

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
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if _import_system_marks_specs():
            _watch_spec(spec, self)
        else:
            spec.loader = _GuardedLoader(spec.loader, self)  # type: ignore[assignment]
        return spec

    def loaded(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _disable_mkldnn()


def _watch_spec(spec: ModuleSpec, hook: _TorchImportHook) -> None:
    """Call `hook.loaded()` when the import system marks torch's spec as initialised.

    The import system sets `spec._initializing` True before it runs torch/__init__ and False
    after, success or not. A property on a subclass of the spec's own class sees the second;
    the spec gets its class back at once. Unlike a wrapped loader, this puts no frame of ours
    on the stack while torch runs, so a traceback from inside `import torch` (Ctrl-C during
    the second it takes) looks as it would without qnnctl.
    """
    own_class = type(spec)

    def get(self: ModuleSpec) -> object:
        return self.__dict__.get("_initializing", False)

    def set_(self: ModuleSpec, value: object) -> None:
        self.__dict__["_initializing"] = value
        if value:
            return
        self.__class__ = own_class
        module = sys.modules.get(self.name)
        if module is not None and getattr(module, "__spec__", None) is self:
            hook.loaded()

    watched = type(own_class.__name__, (own_class,), {"_initializing": property(get, set_),
                                                      "__module__": own_class.__module__})
    spec.__class__ = watched


class _GuardedLoader:
    """torch's own loader, followed by the guard: for interpreters before 3.8."""

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
        self._hook.loaded()

    def __getattr__(self, name: str) -> object:
        return getattr(self._loader, name)


if __name__ == HANDOVER_NAME:
    _start()
