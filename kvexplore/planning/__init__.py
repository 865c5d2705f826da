"""Models and planning: the first stage of the pipeline.

A model config and a named GPU go in; a :class:`~kvexplore.planning.planner.Plan`
comes out, built by vLLM 0.33's own worker and engine-core code on the meta
device while vLLM's platform answers as that GPU (``emulation``, ``worker``).
"""

from kvexplore.planning.gpus import DEFAULT_GPU, GPU, gpus, resolve_gpu
from kvexplore.planning.models import (
    DEFAULT_MODEL,
    LayerInfo,
    ModelSource,
    catalog_names,
    load_model_config,
)
from kvexplore.planning.planner import Admission, Plan, catalog, clear_plan_cache, plan

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "GPU",
    "Admission",
    "LayerInfo",
    "ModelSource",
    "Plan",
    "catalog",
    "catalog_names",
    "clear_plan_cache",
    "gpus",
    "load_model_config",
    "plan",
    "resolve_gpu",
]
