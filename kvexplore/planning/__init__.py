"""Models and planning, the first stage: a model config and a named GPU in, a
:class:`~kvexplore.planning.planner.Plan` out (vLLM's own code, on the meta device).

The planner's names (``plan``, ``Plan`` ...) are imported on first use, so
that reading a model config, a GPU or a request costs no vLLM import.
"""

from kvexplore.lazy import lazy_attributes
from kvexplore.planning.gpus import DEFAULT_GPU, GPU, gpus, resolve_gpu
from kvexplore.planning.models import (
    DEFAULT_MODEL,
    LayerInfo,
    ModelSource,
    catalog_names,
    load_model_config,
)

#: The planner's names (and the start-up check's and way out's types), imported on first use.
__getattr__ = lazy_attributes(__name__, {
    **dict.fromkeys(("Admission", "Plan", "catalog", "clear_plan_cache", "plan"),
                    "kvexplore.planning.planner"),
    "StartupCheck": "kvexplore.planning.startup",
    "WayOut": "kvexplore.planning.way_out",
})

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "GPU",
    "Admission",
    "LayerInfo",
    "ModelSource",
    "Plan",
    "StartupCheck",
    "WayOut",
    "catalog",
    "catalog_names",
    "clear_plan_cache",
    "gpus",
    "load_model_config",
    "plan",
    "resolve_gpu",
]
