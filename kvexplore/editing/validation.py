"""Which KV-cache groups a KV connector can serve, as an error or as data.

Mirrors ``validate_kv_cache_groups`` of the LMCache release named by
``lmcache=`` (``lmcache/integration/vllm/kv_cache_group_edits.py``; see
:mod:`kvexplore.editing.lmcache`): a ``CrossAttentionSpec`` group is
rejected (its blocks hold encoder output, not a prompt prefix), and so is a
``MambaSpec`` group whose ``mamba_cache_mode`` that release does not keep
snapshots for (``"align"`` up to 0.5.4; ``"align"`` or ``"all"`` from 0.5.5);
slot-compressed specs are accepted (LMCache serves them on a separate path;
the edits skip them).

>>> import torch
>>> from vllm.v1.kv_cache_interface import (
...     FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec)
>>> gdn = MambaSpec(block_size=544, shapes=((3, 6144), (16, 128, 128)),
...                 dtypes=(torch.bfloat16, torch.float32),
...                 page_size_padded=1114112, mamba_cache_mode="none")
>>> attn = FullAttentionSpec(block_size=544, num_kv_heads=2, head_size=256,
...                          dtype=torch.bfloat16)
>>> cfg = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
...     KVCacheGroupSpec(["gdn.0"], gdn), KVCacheGroupSpec(["attn.3"], attn)])
>>> check_kv_cache_groups(cfg)[["group", "kind", "verdict"]].to_string(index=False)
' group           kind  verdict\\n     0          mamba rejected\\n     1 full_attention accepted'
"""

from __future__ import annotations

import pandas as pd
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
    iter_layer_specs,
)

from kvexplore.editing.lmcache import LMCacheRelease, lmcache_release
from kvexplore.errors import KVExploreError
from kvexplore.planning.planner import Plan

__all__ = [
    "ACCEPTED",
    "as_kv_cache_config",
    "REJECTED",
    "check_kv_cache_groups",
    "declares_slot_compression",
    "validate_kv_cache_groups",
]

ACCEPTED = "accepted"
REJECTED = "rejected"

_COLUMNS = ["group", "kind", "verdict", "reason"]


def declares_slot_compression(spec: KVCacheSpec, lmcache: object = None) -> bool:
    """Whether ``spec`` packs several tokens into one stored slot, as the
    LMCache release ``lmcache`` reads it (``_declares_slot_compression``):
    ``compress_ratio > 1`` or ``tq_slot_size > 0``, and from 0.5.6 also
    ``tokens_per_state > 1`` (vLLM 0.33's field; a value below 1, Whisper
    pooling or ``MambaSpec``'s -1, is not)."""
    release = lmcache_release(lmcache)
    return any(
        _number(getattr(spec, name, off)) > off
        for name, off in release.slot_compression
    )


def _number(value: object) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return 0.0


def as_kv_cache_config(value: object) -> KVCacheConfig | None:
    """A config or ``None`` as it is, a ``Plan``'s ``kv_cache_config``; else refused."""
    if value is None or isinstance(value, KVCacheConfig):
        return value
    if isinstance(value, Plan):
        return value.kv_cache_config
    raise KVExploreError(
        f"kv_cache_config is a {type(value).__name__}; expected a "
        "vllm.v1.kv_cache_interface.KVCacheConfig, a kvexplore.Plan or None"
    )


def _judge_leaf(spec: KVCacheSpec, release: LMCacheRelease) -> tuple[str, str]:
    """(verdict, reason) for one leaf spec, by ``release``'s rules."""
    kind = get_kv_cache_spec_kind(spec)
    if kind == KVCacheSpecKind.CROSS_ATTENTION:
        return REJECTED, (
            "CrossAttentionSpec: its blocks cache encoder output, not a prompt "
            "prefix (expected no cross-attention groups)"
        )
    if kind == KVCacheSpecKind.MAMBA:
        mode = getattr(spec, "mamba_cache_mode", "none")
        if mode not in release.snapshot_modes:
            wanted = " or ".join(repr(m) for m in release.snapshot_modes)
            return REJECTED, (
                f"MambaSpec with mamba_cache_mode={mode!r}; expected {wanted} "
                f"(the modes {release} keeps reusable state snapshots for)"
            )
        return ACCEPTED, f"MambaSpec with mamba_cache_mode={mode!r}"
    if declares_slot_compression(spec, release):
        return ACCEPTED, (
            f"{type(spec).__name__} declares slot compression "
            f"(tokens_per_state/compress_ratio {spec.tokens_per_state}); served by the "
            "compression path, skipped by the edits"
        )
    return ACCEPTED, f"{type(spec).__name__}"


def check_kv_cache_groups(
    kv_cache_config: KVCacheConfig | None, *, lmcache: object = None
) -> pd.DataFrame:
    """One row per KV-cache group: ``group, kind, verdict, reason``.

    The verdicts of :func:`validate_kv_cache_groups` for the LMCache release
    ``lmcache`` (see :func:`~kvexplore.editing.lmcache.lmcache_release`)
    as a table (empty for ``None``); a ``UniformTypeKVCacheSpecs`` group is
    judged leaf by leaf and rejected if any leaf is.  Refuses what is neither
    a config nor ``None``, and a release kvexplore does not know.
    """
    release = lmcache_release(lmcache)
    config = as_kv_cache_config(kv_cache_config)
    if config is None:
        return pd.DataFrame(columns=_COLUMNS)
    rows = []
    for index, group in enumerate(config.kv_cache_groups):
        spec = group.kv_cache_spec
        leaves = list(iter_layer_specs(spec))
        judged = [_judge_leaf(leaf, release) for leaf in leaves] or [
            (ACCEPTED, "group has no layer specs")
        ]
        rejected = [reason for verdict, reason in judged if verdict == REJECTED]
        reasons = rejected or [reason for _, reason in judged]
        rows.append(
            {
                "group": index,
                "kind": get_kv_cache_spec_kind(spec).value,
                "verdict": REJECTED if rejected else ACCEPTED,
                # Distinct reasons in first-seen order: a 6-layer uniform
                # group should read once, not six times.
                "reason": "; ".join(dict.fromkeys(reasons)),
            }
        )
    return pd.DataFrame(rows, columns=_COLUMNS)


def validate_kv_cache_groups(
    kv_cache_config: KVCacheConfig | None, *, lmcache: object = None
) -> None:
    """Raise one ``ValueError`` naming every group the LMCache release
    ``lmcache`` cannot serve.

    ``None`` passes; e.g. ``"1 KV-cache group(s) cannot be served by LMCache
    0.5.6: group 0 (mamba): MambaSpec with mamba_cache_mode='none'; expected
    'align' or 'all' ..."``.
    """
    release = lmcache_release(lmcache)
    table = check_kv_cache_groups(kv_cache_config, lmcache=release)
    bad = table[table["verdict"] == REJECTED]
    if len(bad):
        listed = "; ".join(
            f"group {row.group} ({row.kind}): {row.reason}"
            for row in bad.itertuples(index=False)
        )
        raise KVExploreError(
            f"{len(bad)} KV-cache group(s) cannot be served by {release}: {listed} "
            "(its validate_kv_cache_groups, "
            "lmcache/integration/vllm/kv_cache_group_edits.py)."
        )
