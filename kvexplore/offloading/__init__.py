"""Offloading: the ``OffloadingConfig`` vLLM 0.33 hands an offloading backend
(``config``) and tables of it over many settings (``sweep``)."""

from kvexplore.offloading.config import (
    OffloadConfigError,
    OffloadResult,
    offload_config,
)
from kvexplore.offloading.sweep import sweep

__all__ = ["OffloadConfigError", "OffloadResult", "offload_config", "sweep"]
