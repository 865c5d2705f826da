"""Offloading: the ``OffloadingConfig`` vLLM hands an offloading backend
(``options`` in, ``derive`` step by step, ``config`` out) and tables of it
over many settings (``sweep``).

``OffloadConfigError``, ``OffloadResult`` and ``offload_config`` are imported
on first use (they import vLLM); ``sweep`` and ``OffloadOptions`` do not.
"""

from kvexplore.lazy import lazy_attributes
from kvexplore.offloading.options import OffloadOptions
from kvexplore.offloading.sweep import sweep

#: Names imported from :mod:`kvexplore.offloading.config` on first use.
__getattr__ = lazy_attributes(__name__, dict.fromkeys(
    ("OffloadConfigError", "OffloadResult", "offload_config"), "kvexplore.offloading.config"))

__all__ = ["OffloadConfigError", "OffloadOptions", "OffloadResult", "offload_config", "sweep"]
