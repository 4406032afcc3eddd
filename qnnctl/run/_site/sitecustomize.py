"""The AMD MKLDNN guard, in every Python process of a `qnnctl lower` pipeline.

When the guard is wanted (an AMD host, no --keep-mkldnn), `qnnctl lower` puts this file's
folder first on PYTHONPATH, and the `site` module imports this file at the start of every
Python process that honours it: the pipeline itself, a console script such as torchrun,
multiprocessing's spawn workers, a launcher's children. Imported as `sitecustomize` it:

1. takes its own folder off sys.path (and out of the importer cache): the pipeline sees the
   sys.path it would see without qnnctl. PYTHONPATH keeps the entry, so that the pipeline's
   own Python children are guarded too;
2. imports the next `sitecustomize` on sys.path, the one that would have run without qnnctl,
   and leaves it in sys.modules in its place (or none, when there is none); its errors reach
   `site`, which reports them as it always does;
3. arms the guard (arm_mkldnn_guard), after the user's sitecustomize, so that torch flags it
   froze stay as it left them.

Any Python the pipeline starts reads this file, whatever its version and whether or not it
has qnnctl: standard library only, and syntax that every interpreter parses, Python 2.7
included (type comments, no f-strings); the guard itself arms on Python 3.4 and later.

Imported under any other name (qnnctl's bootstrap loads it by path for interpreters that skip
PYTHONPATH) it only defines the guard.
"""

import os
import sys

# Not typing's: importing typing would cost every Python process of the pipeline 2-3 ms.
# The names below are used in type comments, which ruff does not read.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from importlib.machinery import ModuleSpec  # noqa: F401
    from types import ModuleType  # noqa: F401
    from typing import Any, Optional  # noqa: F401

HANDOVER_NAME = "sitecustomize"


def _start():  # type: () -> None
    own = os.path.dirname(os.path.abspath(__file__))
    if own in sys.path:
        sys.path.remove(own)
    sys.path_importer_cache.pop(own, None)
    # The user's module takes this one's place in sys.modules; with none, the import below
    # fails as `site`'s own would have, and `site` passes over that failure in silence. Held
    # meanwhile: Python 2 empties a module's globals once nothing refers to the module.
    this = sys.modules.pop(HANDOVER_NAME)  # noqa: F841
    try:
        import importlib  # lazy: this file runs in every process of the pipeline; it imports on need

        importlib.import_module(HANDOVER_NAME)
    finally:
        if sys.version_info >= (3, 4):  # noqa: UP036 - meta path finders with find_spec
            arm_mkldnn_guard()


# -- the guard ---------------------------------------------------------------------------


def arm_mkldnn_guard():  # type: () -> None
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


def _disable_mkldnn():  # type: () -> None
    import importlib  # lazy: only once torch is imported

    try:
        backends = importlib.import_module("torch.backends")
        mkldnn = importlib.import_module("torch.backends.mkldnn")
    except ImportError as exc:
        _warn("cannot turn MKLDNN off: " + str(exc))
        return
    frozen = getattr(backends, "flags_frozen", None)
    if callable(frozen) and frozen():
        # The pipeline froze torch's flags (torch's own test harness does): its call, not ours.
        return
    try:
        mkldnn.enabled = False  # type: ignore[attr-defined]
    except Exception as exc:  # a torch that changed its flags API must not stop a lowering
        _warn("cannot turn MKLDNN off: " + str(exc))


def _warn(message):  # type: (str) -> None
    import logging  # lazy: only when there is something to say

    logging.getLogger("qnnctl.guard").warning("qnnctl: warning: %s", message)


def _import_system_marks_specs():  # type: () -> bool
    """Whether the import system sets `spec._initializing` False once a module has run (3.8 on)."""
    bootstrap = sys.modules.get("importlib._bootstrap")
    load = getattr(bootstrap, "_load_unlocked", None)
    return "_initializing" in getattr(getattr(load, "__code__", None), "co_names", ())


class _TorchImportHook:
    """A meta path finder that lets the other finders find torch, then watches it load."""

    def find_spec(self, fullname, path, target=None):
        # type: (str, object, object) -> Optional[ModuleSpec]
        if fullname != "torch":
            return None
        for finder in sys.meta_path:
            find_spec = getattr(finder, "find_spec", None)
            if finder is self or find_spec is None:
                continue
            spec = find_spec(fullname, path, target)  # type: Optional[ModuleSpec]
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

    def loaded(self):  # type: () -> None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _disable_mkldnn()


def _watch_spec(spec, hook):  # type: (ModuleSpec, _TorchImportHook) -> None
    """Call `hook.loaded()` when the import system marks torch's spec as initialised.

    The import system sets `spec._initializing` True before it runs torch/__init__ and False
    after, success or not. A property on a subclass of the spec's own class sees the second;
    the spec gets its class back at once. Unlike a wrapped loader, this puts no frame of ours
    on the stack while torch runs, so a traceback from inside `import torch` (Ctrl-C during
    the second it takes) looks as it would without qnnctl.
    """
    own_class = type(spec)

    def get(self):  # type: (ModuleSpec) -> object
        return self.__dict__.get("_initializing", False)

    def set_(self, value):  # type: (ModuleSpec, object) -> None
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

    def __init__(self, loader, hook):  # type: (Any, _TorchImportHook) -> None
        self._loader = loader
        self._hook = hook

    def create_module(self, spec):  # type: (ModuleSpec) -> Optional[ModuleType]
        return self._loader.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module):  # type: (ModuleType) -> None
        # torch sees its real loader while it initialises (importlib.resources and friends).
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._hook.loaded()

    def __getattr__(self, name):  # type: (str) -> object
        return getattr(self._loader, name)


if __name__ == HANDOVER_NAME:
    _start()
