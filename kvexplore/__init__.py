"""kvexplore: explore how vLLM 0.33 lays out the KV cache of hybrid models.

>>> import kvexplore
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100").block_size
544
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100").block_size
576
"""

from kvexplore.errors import KVExploreError
from kvexplore.gpus import DEFAULT_GPU, GPU, gpus
from kvexplore.models import (
    DEFAULT_MODEL,
    LayerInfo,
    ModelSource,
    catalog_names,
    load_model_config,
)
from kvexplore.planner import Admission, Plan, catalog, clear_plan_cache, plan

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_GPU",
    "DEFAULT_MODEL",
    "GPU",
    "Admission",
    "KVExploreError",
    "LayerInfo",
    "ModelSource",
    "Plan",
    "catalog",
    "catalog_names",
    "clear_plan_cache",
    "gpus",
    "load_model_config",
    "plan",
]

# --- issue 3: validation, edit rules, round-trip proof (kvexplore.validation,
# --- kvexplore.edits, kvexplore.roundtrip) ---------------------------------
from kvexplore.edits import (  # noqa: E402
    DEFAULT_EDITS,
    EditResult,
    KVCacheGroupEdit,
    MambaPageViewEdit,
    MambaUnifiedViewEdit,
    SubpagedAttentionViewEdit,
    SubpagedMLAAttentionViewEdit,
    apply_kv_cache_group_edits,
)
from kvexplore.roundtrip import RoundTripReport, verify_roundtrip  # noqa: E402
from kvexplore.validation import (  # noqa: E402
    check_kv_cache_groups,
    validate_kv_cache_groups,
)

__all__ += [
    "DEFAULT_EDITS",
    "EditResult",
    "KVCacheGroupEdit",
    "MambaPageViewEdit",
    "MambaUnifiedViewEdit",
    "RoundTripReport",
    "SubpagedAttentionViewEdit",
    "SubpagedMLAAttentionViewEdit",
    "apply_kv_cache_group_edits",
    "check_kv_cache_groups",
    "validate_kv_cache_groups",
    "verify_roundtrip",
]
# --- end issue 3 ------------------------------------------------------------

# --- issue 4: offloading config and sweeps --------------------------------
from kvexplore.offload import OffloadResult, offload_config  # noqa: E402
from kvexplore.sweep import sweep  # noqa: E402

__all__ += ["OffloadResult", "offload_config", "sweep"]

# --- issue 5: renderers and the Explorer widget (imported on first use, so
# --- `import kvexplore` does not pull in ipywidgets) ------------------------
_LAZY = {
    "Explorer": ("kvexplore.widgets", "Explorer"),
    "ExplorerState": ("kvexplore.explorer_logic", "ExplorerState"),
    "page_map": ("kvexplore.viz", "page_map"),
    "page_layout": ("kvexplore.viz", "page_layout"),
    "page_map_text": ("kvexplore.viz", "page_map_text"),
    "buffer_map": ("kvexplore.viz", "buffer_map"),
    "buffer_map_text": ("kvexplore.viz", "buffer_map_text"),
    "sweep_heatmap": ("kvexplore.viz", "sweep_heatmap"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'kvexplore' has no attribute {name!r}")


__all__ += list(_LAZY)
