"""Offloading: the ``OffloadingConfig`` vLLM hands an offloading backend
(``options`` in, ``derive`` step by step, ``config`` out) and tables of it
over many settings (``sweep``).

``OffloadConfigError``, ``OffloadResult`` and ``offload_config`` are imported
on first use (they import vLLM); ``sweep`` and ``OffloadOptions`` do not.
"""

import importlib

from kvexplore.offloading.options import OffloadOptions
from kvexplore.offloading.sweep import sweep

#: Names imported from :mod:`kvexplore.offloading.config` on first use.
_CONFIG_NAMES = ("OffloadConfigError", "OffloadResult", "offload_config")


def __getattr__(name):
    if name in _CONFIG_NAMES:
        value = getattr(importlib.import_module("kvexplore.offloading.config"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvexplore.offloading' has no attribute {name!r}")


__all__ = ["OffloadConfigError", "OffloadOptions", "OffloadResult", "offload_config", "sweep"]
