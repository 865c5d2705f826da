"""kvexplore: explore how vLLM lays out the KV cache of hybrid models.

The package follows the pipeline, one subpackage or module per stage, in
this order; each imports only its own stage and the stages before it:

* shared base: :mod:`kvexplore.errors`, :mod:`kvexplore.layout` (byte-layout
  arithmetic), :mod:`kvexplore.memo`, :mod:`kvexplore.display` (the display
  protocol), :mod:`kvexplore.paths`, :mod:`kvexplore.version`,
  :mod:`kvexplore.store` (the answer store), :mod:`kvexplore.lazy`
* :mod:`kvexplore.planning`   model config + named GPU -> ``Plan`` (vLLM's own model classes)
* :mod:`kvexplore.fleet`      sweeps' tasks on an executor or a Dask cluster, rows written as they come
* :mod:`kvexplore.versions.environments` one uv environment per vLLM release of the window
* :mod:`kvexplore.registration` a plan's KV cache as the tensors vLLM registers
* :mod:`kvexplore.pages`      a registered layer's page as byte segments and views
* :mod:`kvexplore.editing`    every LMCache release's validation and edits, the round-trip proof
* :mod:`kvexplore.connectors` what LMCache's multi-process connector and server store, per release
* :mod:`kvexplore.offloading` the ``OffloadingConfig`` vLLM hands a backend, sweeps
* :mod:`kvexplore.capacity_planning`   memory, tokens, concurrency, prefix-cache hits, host tier
* :mod:`kvexplore.logs`       a vLLM start-up log read, checked against kvexplore, calibrated
* :mod:`kvexplore.advising`   what to run: the settings that start, hold a workload, reuse its prefix
* :mod:`kvexplore.rendering`  layouts as data, text, HTML and figures
* :mod:`kvexplore.versions`   one deployment compared across vLLM releases, the vLLM x LMCache matrix
* :mod:`kvexplore.explorer`   the Explorer widget over plain-Python state
* :mod:`kvexplore.cli`        the command line, mirroring this API

>>> import kvexplore
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100").block_size
544
>>> kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100").block_size
576
"""

from kvexplore.errors import KVExploreError
from kvexplore.lazy import lazy_attributes
from kvexplore.version import VERSION

#: Every public name and the module it lives in: imported on first use, so
#: that ``import kvexplore`` (and the command line's answers from the store)
#: costs no vLLM import.  A result's display forms are found on its first
#: ``text()`` / ``_repr_html_()`` / ``figure()`` (:mod:`kvexplore.display`),
#: whichever name gave it.
_NAMES = {
    "Advice": "kvexplore.advising",
    "ReleaseAdvice": "kvexplore.advising",
    "Workload": "kvexplore.advising",
    "advise": "kvexplore.advising",
    "Calibration": "kvexplore.capacity_planning",
    "CapacityReport": "kvexplore.capacity_planning",
    "capacity": "kvexplore.capacity_planning",
    "capacity_sweep": "kvexplore.capacity_planning",
    "profile_estimates": "kvexplore.capacity_planning",
    "DEFAULT_EDITS": "kvexplore.editing",
    "EditResult": "kvexplore.editing",
    "KVCacheGroupEdit": "kvexplore.editing",
    "MambaPageViewEdit": "kvexplore.editing",
    "MambaUnifiedViewEdit": "kvexplore.editing",
    "RoundTripReport": "kvexplore.editing",
    "SubpagedAttentionViewEdit": "kvexplore.editing",
    "SubpagedMLAAttentionViewEdit": "kvexplore.editing",
    "apply_kv_cache_group_edits": "kvexplore.editing",
    "check_kv_cache_groups": "kvexplore.editing",
    "validate_kv_cache_groups": "kvexplore.editing",
    "verify_roundtrip": "kvexplore.editing",
    "LMCacheRelease": "kvexplore.editing",
    "MambaSlicePlanesEdit": "kvexplore.editing",
    "SubpagedAttentionContiguousPlaneViewEdit": "kvexplore.editing",
    "SubpagedAttentionInterleavedPlaneViewEdit": "kvexplore.editing",
    "edit_each_layer": "kvexplore.editing",
    "lmcache_release": "kvexplore.editing",
    "lmcache_releases": "kvexplore.editing",
    "rules_for": "kvexplore.editing",
    "LMCacheLayout": "kvexplore.connectors.lmcache_layout",
    "lmcache_layout": "kvexplore.connectors.lmcache_layout",
    "lmcache_layouts": "kvexplore.connectors.lmcache_layout",
    "ExplorerState": "kvexplore.explorer.state",
    "compare": "kvexplore.explorer.state",
    "OffloadConfigError": "kvexplore.offloading",
    "OffloadOptions": "kvexplore.offloading",
    "OffloadResult": "kvexplore.offloading",
    "offload_config": "kvexplore.offloading",
    "sweep": "kvexplore.offloading",
    "ChunkSizes": "kvexplore.offloading.sizing",
    "HostSizing": "kvexplore.offloading.sizing",
    "host_sizing": "kvexplore.offloading.sizing",
    "lmcache_chunk_sizes": "kvexplore.offloading.sizing",
    "DEFAULT_GPU": "kvexplore.planning",
    "DEFAULT_MODEL": "kvexplore.planning",
    "GPU": "kvexplore.planning",
    "Admission": "kvexplore.planning",
    "LayerInfo": "kvexplore.planning",
    "ModelSource": "kvexplore.planning",
    "Plan": "kvexplore.planning",
    "StartupCheck": "kvexplore.planning",
    "WayOut": "kvexplore.planning",
    "catalog": "kvexplore.planning",
    "catalog_names": "kvexplore.planning",
    "clear_plan_cache": "kvexplore.planning",
    "gpus": "kvexplore.planning",
    "load_model_config": "kvexplore.planning",
    "plan": "kvexplore.planning",
    "plan_facts": "kvexplore.planning.stored",
    "LogCheck": "kvexplore.logs.checking",
    "VllmLog": "kvexplore.logs.reading",
    "calibrate": "kvexplore.logs.calibrating",
    "check_log": "kvexplore.logs.checking",
    "read_log": "kvexplore.logs.reading",
    "REGISTRATIONS": "kvexplore.registration",
    "allocate": "kvexplore.registration",
    "prefix_cache_figure": "kvexplore.rendering.capacity",
    "bar_chart": "kvexplore.rendering.figures",
    "buffer_layout": "kvexplore.rendering.layouts",
    "buffer_map": "kvexplore.rendering.layouts",
    "buffer_map_text": "kvexplore.rendering.layouts",
    "page_layout": "kvexplore.rendering.layouts",
    "page_map": "kvexplore.rendering.layouts",
    "page_map_text": "kvexplore.rendering.layouts",
    "sweep_heatmap": "kvexplore.rendering.layouts",
    "sweep_heatmap_text": "kvexplore.rendering.layouts",
    "VersionComparison": "kvexplore.versions",
    "Compatibility": "kvexplore.versions",
    "compatibility": "kvexplore.versions",
    "compare_versions": "kvexplore.versions",
    "deployment_facts": "kvexplore.versions",
    "environment": "kvexplore.versions",
}

__version__ = VERSION

#: The widgets need ipywidgets, imported on first use.
_WIDGETS = ("Explorer", "Compare")

__getattr__ = lazy_attributes(
    __name__, {**_NAMES, **dict.fromkeys(_WIDGETS, "kvexplore.explorer.widgets")},
    submodules=True)


def __dir__():
    return sorted({*globals(), *_NAMES, *_WIDGETS})


__all__ = [
    # planning
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
    "plan_facts",
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
    "LMCacheRelease",
    "MambaSlicePlanesEdit",
    "SubpagedAttentionContiguousPlaneViewEdit",
    "SubpagedAttentionInterleavedPlaneViewEdit",
    "edit_each_layer",
    "lmcache_release",
    "lmcache_releases",
    "rules_for",
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
    "Calibration",
    "CapacityReport",
    "capacity",
    "capacity_sweep",
    "profile_estimates",
    # start-up logs
    "LogCheck",
    "VllmLog",
    "calibrate",
    "check_log",
    "read_log",
    # what to run
    "Advice",
    "ReleaseAdvice",
    "Workload",
    "advise",
    # what LMCache stores
    "LMCacheLayout",
    "lmcache_layout",
    "lmcache_layouts",
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
    "Compatibility",
    "compatibility",
    "compare_versions",
    "deployment_facts",
    "environment",
    *_WIDGETS,
]
