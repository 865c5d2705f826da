"""kvexplore: explore how vLLM 0.33 lays out the KV cache of hybrid models.

>>> import kvexplore
>>> p = kvexplore.plan("Qwen/Qwen3.5-0.8B")
>>> p.block_size
544
"""

from kvexplore.errors import KVExploreError
from kvexplore.models import (
    DEFAULT_MODEL,
    LayerInfo,
    ModelSource,
    catalog,
    catalog_names,
    load_model_config,
)
from kvexplore.planner import Plan, clear_plan_cache, plan

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_MODEL",
    "KVExploreError",
    "LayerInfo",
    "ModelSource",
    "Plan",
    "catalog",
    "catalog_names",
    "clear_plan_cache",
    "load_model_config",
    "plan",
]
