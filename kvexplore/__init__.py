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
