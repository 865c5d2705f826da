"""kvexplore: explore how vLLM lays out the KV cache of hybrid models.

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

import kvexplore.rendering  # noqa: F401  registers every result's display forms
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
from kvexplore.explorer.state import ExplorerState, compare
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
from kvexplore.registration import REGISTRATIONS, allocate
from kvexplore.rendering.capacity import prefix_cache_figure
from kvexplore.rendering.figures import bar_chart
from kvexplore.rendering.layouts import (
    buffer_layout,
    buffer_map,
    buffer_map_text,
    page_layout,
    page_map,
    page_map_text,
    sweep_heatmap,
    sweep_heatmap_text,
)
from kvexplore.versions import (
    VersionComparison,
    compare_versions,
    deployment_facts,
    environment,
)

__version__ = "0.1.0"

#: The widgets need ipywidgets, imported on first use.
_WIDGETS = ("Explorer", "Compare")


def __getattr__(name):
    if name in _WIDGETS:
        from kvexplore.explorer import widgets

        return getattr(widgets, name)
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
    # registration
    "REGISTRATIONS",
    "allocate",
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
    # rendering and the Explorer
    "ExplorerState",
    "bar_chart",
    "buffer_layout",
    "buffer_map",
    "buffer_map_text",
    "compare",
    "page_layout",
    "page_map",
    "page_map_text",
    "prefix_cache_figure",
    "sweep_heatmap",
    "sweep_heatmap_text",
    "VersionComparison",
    "compare_versions",
    "deployment_facts",
    "environment",
    *_WIDGETS,
]
