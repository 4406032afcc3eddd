"""qnnctl: find, install and use the Qualcomm AI Runtime (QNN) SDK.

Importing this package does nothing else: no download, no environment change, no
subprocess. The public functions are loaded on first use.
"""

from __future__ import annotations

from qnnctl.records import TYPE_CHECKING
from qnnctl.version import __version__

__all__ = ["Sdk", "__version__", "disable_mkldnn_on_amd", "setup_sdk"]

if TYPE_CHECKING:
    from typing import Any

    from qnnctl.run.api import disable_mkldnn_on_amd, setup_sdk
    from qnnctl.sdk.layout import Sdk

_LAZY = {
    "setup_sdk": "qnnctl.run.api",
    "disable_mkldnn_on_amd": "qnnctl.run.api",
    "Sdk": "qnnctl.sdk.layout",
}


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'qnnctl' has no attribute {name!r}")
    import importlib  # lazy: `import qnnctl` loads nothing until a public name is used

    return getattr(importlib.import_module(module_name), name)
