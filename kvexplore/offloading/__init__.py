"""Offloading: the ``OffloadingConfig`` vLLM hands an offloading backend
(``options`` in, ``derive`` step by step, ``config`` out) and tables of it
over many settings (``sweep``)."""

from kvexplore.offloading.config import (
    OffloadConfigError,
    OffloadResult,
    offload_config,
)
from kvexplore.offloading.options import OffloadOptions
from kvexplore.offloading.sweep import sweep

__all__ = ["OffloadConfigError", "OffloadOptions", "OffloadResult", "offload_config", "sweep"]
