"""kvexplore: explore how vLLM 0.33 lays out the KV cache of hybrid models.

The package follows the pipeline, one subpackage per stage; each imports only
the stages before it:

* :mod:`kvexplore.planning`   model config + named GPU -> ``Plan`` (vLLM's own model classes)
* :mod:`kvexplore.registration` a plan's KV cache as the tensors vLLM registers
* :mod:`kvexplore.editing`    LMCache's validation, edits and the round-trip proof
* :mod:`kvexplore.offloading` the ``OffloadingConfig`` vLLM hands a backend, sweeps
* :mod:`kvexplore.capacity_planning`   memory, tokens, concurrency, prefix-cache hits, host tier
* :mod:`kvexplore.rendering`  layouts as data, text, HTML and figures
* :mod:`kvexplore.explorer`   the Explorer widget over plain-Python state
* :mod:`kvexplore.cli`        the command line, mirroring this API

>>> import kvexplore
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100").block_size
544
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100").block_size
576
"""

from kvexplore.capacity_planning import (
    CapacityReport,
    capacity,
    capacity_sweep,
    profile_estimates,
)
from kvexplore.editing import (
    DEFAULT_EDITS,
    EditResult,
    KVCacheGroupEdit,
    MambaPageViewEdit,
    MambaUnifiedViewEdit,
    RoundTripReport,
    SubpagedAttentionViewEdit,
    SubpagedMLAAttentionViewEdit,
    apply_kv_cache_group_edits,
    check_kv_cache_groups,
    validate_kv_cache_groups,
    verify_roundtrip,
)
from kvexplore.errors import KVExploreError
from kvexplore.offloading import (
    OffloadConfigError,
    OffloadOptions,
    OffloadResult,
    offload_config,
    sweep,
)
from kvexplore.offloading.sizing import (
    ChunkSizes,
    HostSizing,
    host_sizing,
    lmcache_chunk_sizes,
)
from kvexplore.planning import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    GPU,
    Admission,
    LayerInfo,
    ModelSource,
    Plan,
    catalog,
    catalog_names,
    clear_plan_cache,
    gpus,
    load_model_config,
    plan,
)
from kvexplore.registration import REGISTRATIONS

__version__ = "0.1.0"

# Rendering and the Explorer are imported on first use, so that
# ``import kvexplore`` pulls in neither matplotlib nor ipywidgets.
_LAZY = {
    "page_layout": ("kvexplore.rendering.layouts", "page_layout"),
    "page_map": ("kvexplore.rendering.layouts", "page_map"),
    "page_map_text": ("kvexplore.rendering.layouts", "page_map_text"),
    "buffer_layout": ("kvexplore.rendering.layouts", "buffer_layout"),
    "buffer_map": ("kvexplore.rendering.layouts", "buffer_map"),
    "buffer_map_text": ("kvexplore.rendering.layouts", "buffer_map_text"),
    "sweep_heatmap": ("kvexplore.rendering.layouts", "sweep_heatmap"),
    "sweep_heatmap_text": ("kvexplore.rendering.layouts", "sweep_heatmap_text"),
    "bar_chart": ("kvexplore.rendering.figures", "bar_chart"),
    "prefix_cache_figure": ("kvexplore.rendering.capacity", "prefix_cache_figure"),
    "ExplorerState": ("kvexplore.explorer.state", "ExplorerState"),
    "Explorer": ("kvexplore.explorer.widgets", "Explorer"),
    "Compare": ("kvexplore.explorer.widgets", "Compare"),
    "compare": ("kvexplore.explorer.state", "compare"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'kvexplore' has no attribute {name!r}")


__all__ = [
    # planning
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
    # registration (which also provides ``Plan.allocate``)
    "REGISTRATIONS",
    # editing
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
    # offloading
    "OffloadConfigError",
    "OffloadOptions",
    "OffloadResult",
    "offload_config",
    "sweep",
    "ChunkSizes",
    "HostSizing",
    "host_sizing",
    "lmcache_chunk_sizes",
    # capacity
    "CapacityReport",
    "capacity",
    "capacity_sweep",
    "profile_estimates",
    # errors
    "KVExploreError",
    # rendering and the Explorer (lazy)
    *_LAZY,
]
