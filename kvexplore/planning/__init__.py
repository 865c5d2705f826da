"""Models and planning, the first stage: a model config and a named GPU in, a
:class:`~kvexplore.planning.planner.Plan` out (vLLM's own code, on the meta device).
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
