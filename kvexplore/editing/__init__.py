"""Edits, validation and the round-trip proof: what LMCache does with the
tensors vLLM registers, release by release.

``lmcache`` (what each LMCache release has, as data) ->
``validation`` (which groups a connector can serve) -> ``rules`` (the edits)
-> the round-trip proof: ``proof`` (address arithmetic) and ``roundtrip`` (the
fill / store / load-elsewhere / compare data check, the public
:func:`verify_roundtrip` and its :class:`RoundTripReport`)."""

from kvexplore.editing.lmcache import (
    LMCACHE_RELEASES,
    LMCacheRelease,
    lmcache_release,
    lmcache_releases,
)
from kvexplore.editing.roundtrip import RoundTripReport, verify_roundtrip
from kvexplore.editing.rules import (
    DEFAULT_EDITS,
    EditResult,
    KVCacheGroupEdit,
    MambaPageViewEdit,
    MambaSlicePlanesEdit,
    MambaUnifiedViewEdit,
    SubpagedAttentionContiguousPlaneViewEdit,
    SubpagedAttentionInterleavedPlaneViewEdit,
    SubpagedAttentionViewEdit,
    SubpagedMLAAttentionViewEdit,
    apply_kv_cache_group_edits,
    edit_each_layer,
    rules_for,
)
from kvexplore.editing.validation import check_kv_cache_groups, validate_kv_cache_groups

__all__ = [
    "DEFAULT_EDITS",
    "LMCACHE_RELEASES",
    "LMCacheRelease",
    "MambaSlicePlanesEdit",
    "SubpagedAttentionContiguousPlaneViewEdit",
    "SubpagedAttentionInterleavedPlaneViewEdit",
    "edit_each_layer",
    "lmcache_release",
    "lmcache_releases",
    "rules_for",
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
