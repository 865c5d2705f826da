"""What vLLM 0.33 hands a native KV offloading backend, and why.

vLLM's ``OffloadingConnector`` turns the engine's configuration and the
``KVCacheConfig`` into one ``OffloadingConfig``
(``vllm/v1/kv_offload/config.py``) through ``build_offloading_config`` in
``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``.
:func:`offload_config` derives the same object from a :class:`~kvexplore.Plan`
plus the parallel and connector inputs the plan does not carry, and records
for every derived field the rule and the actual numbers behind it.

The derivation mirrors, step by step and in the same order (so the same input
fails on the same rule):

1. ``get_offloading_group_ids``: the transferable, prefix-cacheable groups.
2. ``resolve_dcp_kv_block_size``: each group's ``tokens_per_block``; a
   DCP-sharded (attention) group spans ``block_size x DCP`` tokens, a Mamba
   group keeps ``block_size``.
3. ``resolve_kv_cache_block_sizes`` (``vllm/v1/core/kv_cache_utils.py``) with a
   connector configured: ``tokens_per_hash``; every group's
   ``tokens_per_block`` must be a multiple of it.
4. ``blocks_per_chunk`` from ``kv_connector_extra_config``: ``blocks_per_chunk``
   directly, or ``block_size`` (tokens) divided by the one common
   ``tokens_per_block``.
5. ``get_sliding_window_size_in_chunks`` per group.
6. ``worker_kv_bytes_per_block``: the backing allocation over ``num_blocks``.
7. ``replicated_layout``, ``is_parallelism_agnostic`` and the
   ``canonical_layout`` gate.

Worked example (GUIDE section 4), Qwen3.5-0.8B on an A100 at TP 4 with DCP 2: the
attention group spans 272 x 2 tokens per block, the GDN groups 272, so the
hash unit is their gcd and a chunk given in tokens cannot be expressed:

>>> from kvexplore import plan
>>> r = offload_config(plan("Qwen/Qwen3.5-0.8B", gpu="A100", tensor_parallel_size=4,
...                         decode_context_parallel_size=2))
>>> [g.tokens_per_block for g in r.config.groups], r.config.cache.tokens_per_hash
([272, 272, 272, 544], 272)
>>> r.rule("parallel.is_parallelism_agnostic")
'4 KV cache groups, not a single full-attention group; DCP 2 != 1'
"""

from __future__ import annotations

import html
import json
import math
import os
import threading
from collections import OrderedDict
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from functools import cache, cached_property
from types import SimpleNamespace
from typing import Any

import pandas as pd

from kvexplore.errors import KVExploreError
from kvexplore.planning.planner import Plan

#: ``--distributed-executor-backend`` values vLLM accepts by name.
EXECUTOR_BACKENDS = ("mp", "uni", "ray", "external_launcher")

#: Keywords of :func:`offload_config` besides the plan (the sweep uses them).
OFFLOAD_KEYWORDS = (
    "extra_config",
    "pipeline_parallel_size",
    "prefill_context_parallel_size",
    "data_parallel_size",
    "data_parallel_rank",
    "distributed_executor_backend",
    "nnodes_within_dp",
    "use_v2_model_runner",
    "enable_kv_cache_events",
    "rank",
    "engine_id",
)

DEFAULT_ENGINE_ID = "kvexplore"


class OffloadConfigError(KVExploreError):
    """A configuration ``build_offloading_config`` rejects (raise or assert).

    ``code`` names the vLLM rule, so callers and the conformance test can tell
    the cases apart without parsing the message:

    ``no_eligible_groups``, ``prefix_match_unit``, ``tokens_per_hash``,
    ``both_chunk_keys``, ``not_an_integer``, ``blocks_per_chunk_not_positive``,
    ``mixed_tokens_per_block``, ``block_size_not_multiple``,
    ``unsupported_spec``, ``invalid_window``, ``zero_chunk``.
    """

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


# ---------------------------------------------------------------------------
# small pure helpers (vllm/utils/math_utils.py semantics, negatives included)
# ---------------------------------------------------------------------------


def _cdiv(a: int, b: int) -> int:
    """Ceiling division as vLLM's ``cdiv`` computes it (``-(a // -b)``)."""
    return -(a // -b)


def _round_up(x: int, y: int) -> int:
    """vLLM's ``round_up``: the next multiple of ``y`` at or above ``x``."""
    return ((x + y - 1) // y) * y


@cache
def _v():
    """vLLM's spec classes, imported on first use (``import kvexplore`` stays light)."""
    from vllm.v1.kv_cache_interface import (
        AttentionSpec,
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowMLASpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    return SimpleNamespace(
        AttentionSpec=AttentionSpec,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec,
        FullAttentionSpec=FullAttentionSpec,
        MambaSpec=MambaSpec,
        MLAAttentionSpec=MLAAttentionSpec,
        SlidingWindowMLASpec=SlidingWindowMLASpec,
        SlidingWindowSpec=SlidingWindowSpec,
        UniformTypeKVCacheSpecs=UniformTypeKVCacheSpecs,
        OffloadingCacheConfig=OffloadingCacheConfig,
        OffloadingConfig=OffloadingConfig,
        OffloadingGroupConfig=OffloadingGroupConfig,
        OffloadingModelConfig=OffloadingModelConfig,
        OffloadingParallelConfig=OffloadingParallelConfig,
    )


def _layer_specs(spec) -> tuple:
    """The per-layer specs of a group spec (vLLM's ``iter_layer_specs``)."""
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict):
        return tuple(inner.values())
    return (spec,)


def _is_per_token_head(spec) -> bool:
    mode = getattr(spec, "kv_quant_mode", None)
    return bool(mode is not None and mode.is_per_token_head)


def _spec_name(spec) -> str:
    return type(spec).__name__


# ---------------------------------------------------------------------------
# Facts of one plan (computed once per plan, shared by every offload call)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Window:
    """How ``get_sliding_window_size_in_chunks`` treats a group's first layer."""

    kind: str  # "sliding", "chunked", "mamba", "full", "unsupported", "invalid"
    spec_name: str
    size: int = 0  # sliding window or attention chunk size, in tokens
    extra_retained: int = 0


@dataclass(frozen=True)
class _PlanFacts:
    """Everything ``build_offloading_config`` reads that depends only on the plan."""

    model_id: str
    tp: int
    dcp: int
    num_groups: int
    selected: tuple[int, ...]
    selected_rule: str
    layer_names: tuple[tuple[str, ...], ...]
    tokens_per_block: tuple[int, ...]
    tokens_per_block_rules: tuple[str, ...]
    tokens_per_hash: int
    tokens_per_hash_rule: str
    early_error: OffloadConfigError | None
    windows: tuple[_Window, ...]
    worker_kv_bytes_per_block: int
    worker_bytes_rule: str
    use_mla: bool
    kv_tp_replicas: int
    total_kv_heads: int
    # is_parallelism_agnostic, direct layout: clauses known from the plan
    direct_clauses: tuple[tuple[bool, str], ...]
    # canonical gate: the per-layer certification outcome
    canonical_certified: bool
    canonical_cert_rule: str
    selected_all_exact_mla: bool
    selected_mla_rule: str
    name: str
    dtype: str
    dtype_rule: str
    max_model_len: int
    kv_cache_layout: str | None


_FACTS: OrderedDict = OrderedDict()
_FACTS_SIZE = 4096
_FACTS_LOCK = threading.Lock()


def _plan_facts(p: Plan) -> _PlanFacts:
    key = id(p)
    with _FACTS_LOCK:
        hit = _FACTS.get(key)
        if hit is not None and hit[0] is p:
            _FACTS.move_to_end(key)
            return hit[1]
    facts = _compute_plan_facts(p)
    with _FACTS_LOCK:
        _FACTS[key] = (p, facts)  # the strong reference keeps id(p) unique
        while len(_FACTS) > _FACTS_SIZE:
            _FACTS.popitem(last=False)
    return facts


def _compute_plan_facts(p: Plan) -> _PlanFacts:
    V = _v()
    kc = p.kv_cache_config
    vc = p.vllm_config
    mc, cc, pc = vc.model_config, vc.cache_config, vc.parallel_config
    tp = pc.tensor_parallel_size
    dcp = pc.decode_context_parallel_size
    groups = list(kc.kv_cache_groups)
    early_error: OffloadConfigError | None = None

    # 1. get_offloading_group_ids
    if kc.hisparse_host_num_blocks is None:
        selected = tuple(
            gid
            for gid, g in enumerate(groups)
            if g.enable_kv_transfer and g.kv_cache_spec.prefix_cacheable
        )
        skipped = [
            f"group {gid} ({_spec_name(g.kv_cache_spec)}) "
            + (
                "has KV transfer disabled"
                if not g.enable_kv_transfer
                else "is not prefix-cacheable"
            )
            for gid, g in enumerate(groups)
            if gid not in selected
        ]
        selected_rule = (
            f"{len(selected)} of {len(groups)} KV cache groups are transferable and "
            "prefix-cacheable (KVCacheConfig.prefix_cacheable_group_ids)"
            + (f"; skipped: {', '.join(skipped)}" if skipped else "")
        )
    else:
        from vllm.v1.kv_cache_interface import KVCacheGroupRole

        selected = tuple(
            gid
            for gid, g in enumerate(groups)
            if g.role is KVCacheGroupRole.HISPARSE_INDEXER
        )
        selected_rule = (
            f"HiSparse host pool of {kc.hisparse_host_num_blocks} blocks: the "
            f"{len(selected)} HISPARSE_INDEXER groups"
        )
    if not selected:
        early_error = OffloadConfigError(
            f"KV offloading found no eligible cache groups in {p.model.name}: "
            f"{selected_rule}; expected at least one transferable, prefix-cacheable group "
            "(build_offloading_config)",
            code="no_eligible_groups",
        )

    # 2. resolve_dcp_kv_block_size per selected group
    tpb: list[int] = []
    tpb_rules: list[str] = []
    for gid in selected:
        spec = groups[gid].kv_cache_spec
        if spec.dcp_sharded:
            tpb.append(spec.block_size * dcp)
            tpb_rules.append(
                f"block_size {spec.block_size} x DCP {dcp} ({_spec_name(spec)} is DCP-sharded)"
            )
        else:
            tpb.append(spec.block_size)
            tpb_rules.append(
                f"block_size {spec.block_size} ({_spec_name(spec)} is not DCP-sharded: "
                "each rank holds the whole state)"
            )

    # 3. resolve_kv_cache_block_sizes with a KV connector configured
    tokens_per_hash, hash_rule, hash_error = 0, "", None
    if early_error is None:
        tokens_per_hash, hash_rule, hash_error = _tokens_per_hash(groups, cc, dcp)
        early_error = hash_error
    if early_error is None:
        for gid, t in zip(selected, tpb, strict=True):
            if t % tokens_per_hash:
                early_error = OffloadConfigError(
                    f"group {gid}: tokens_per_block={t} is not divisible by "
                    f"tokens_per_hash={tokens_per_hash} ({hash_rule}); expected every "
                    f"offloaded group's tokens per block to be a multiple of it. Hybrid "
                    "models (e.g. Mamba+Attention) need --enable-prefix-caching to "
                    "align block sizes (build_offloading_config)",
                    code="tokens_per_hash",
                )
                break

    # 5. window kinds (the sizes depend on blocks_per_chunk)
    windows = tuple(_window(groups[gid].kv_cache_spec) for gid in selected)

    # 6. worker_kv_bytes_per_block
    if (
        kc.hisparse_host_num_blocks is None
        and kc.num_blocks > 0
        and kc.kv_cache_tensors
    ):
        total = kc.kv_cache_tensors[0].size
        wbytes = total // kc.num_blocks
        wrule = (
            f"backing KV cache allocation {total} B // {kc.num_blocks} blocks "
            "(every KVCacheTensor places layers in one shared allocation)"
        )
    elif kc.num_blocks > 0:
        parts = []
        for gid in selected:
            g = groups[gid]
            if isinstance(g.kv_cache_spec, V.UniformTypeKVCacheSpecs):
                parts.append(
                    (
                        g.kv_cache_spec.page_size_bytes,
                        f"group {gid}: {g.kv_cache_spec.page_size_bytes}",
                    )
                )
            else:
                b = g.kv_cache_spec.page_size_bytes * len(g.layer_names)
                parts.append(
                    (
                        b,
                        f"group {gid}: {g.kv_cache_spec.page_size_bytes} x {len(g.layer_names)} layers",
                    )
                )
        wbytes = sum(b for b, _ in parts)
        wrule = (
            "sum of the offloaded groups' pages per block ("
            + "; ".join(t for _, t in parts)
            + ")"
        )
    else:
        wbytes = 0
        wrule = f"0: the KV cache has {kc.num_blocks} blocks"

    # 7a. is_parallelism_agnostic, the plan's part of the direct rule
    total_kv_heads = mc.get_total_num_kv_heads()
    single = groups[0].kv_cache_spec if len(groups) == 1 else None
    direct: list[tuple[bool, str]] = []
    if single is None:
        direct.append(
            (False, f"{len(groups)} KV cache groups, not a single full-attention group")
        )
    else:
        is_full = isinstance(single, V.FullAttentionSpec) and not isinstance(
            single, V.MLAAttentionSpec
        )
        if not is_full:
            why = (
                "MLA"
                if isinstance(single, V.MLAAttentionSpec)
                else "not FullAttentionSpec"
            )
            direct.append((False, f"the single group is {_spec_name(single)} ({why})"))
        else:
            direct.append((True, "a single FullAttentionSpec group"))
            per_rank = single.num_kv_heads
            prod = per_rank * tp
            if prod == total_kv_heads:
                direct.append(
                    (
                        True,
                        f"{per_rank} KV heads per rank x TP {tp} = {prod} == {total_kv_heads} total KV heads",
                    )
                )
            else:
                direct.append(
                    (
                        False,
                        f"{per_rank} KV heads per rank x TP {tp} = {prod} != {total_kv_heads} total KV heads (heads replicated across ranks)",
                    )
                )
            if _is_per_token_head(single):
                direct.append(
                    (False, f"per-token-head KV quantization ({cc.cache_dtype})")
                )
            else:
                direct.append((True, "no per-token-head KV quantization"))
    direct.append((dcp == 1, f"DCP {dcp} {'==' if dcp == 1 else '!='} 1"))

    # 7b. canonical gate: per-layer certification over every group
    all_layer_specs = [s for g in groups for s in _layer_specs(g.kv_cache_spec)]
    failures: OrderedDict[str, int] = OrderedDict()
    for s in all_layer_specs:
        why = _uncertifiable(s, tp, total_kv_heads, V)
        if why is not None:
            failures[why] = failures.get(why, 0) + 1
    if not all_layer_specs:
        certified, cert_rule = False, "no layer specs to certify"
    elif failures:
        certified = False
        cert_rule = "; ".join(f"{n} layer(s): {why}" for why, n in failures.items())
    else:
        certified = True
        cert_rule = f"all {len(all_layer_specs)} layer specs certifiable (canonical mapping derivable)"

    sel_specs = [s for gid in selected for s in _layer_specs(groups[gid].kv_cache_spec)]
    not_mla = sorted(
        {_spec_name(s) for s in sel_specs if type(s) is not V.MLAAttentionSpec}
    )
    exact_mla = not not_mla
    mla_rule = (
        "every offloaded layer is MLAAttentionSpec"
        if exact_mla
        else f"offloaded layers include {', '.join(not_mla)} (not pure MLAAttentionSpec)"
    )

    cache_dtype = mc.dtype if cc.cache_dtype == "auto" else cc.cache_dtype
    dtype = str(cache_dtype).removeprefix("torch.")
    dtype_rule = (
        f"kv_cache_dtype 'auto' follows the model dtype ({dtype})"
        if cc.cache_dtype == "auto"
        else f"kv_cache_dtype {cc.cache_dtype!r}"
    )
    return _PlanFacts(
        model_id=p.model.name,
        tp=tp,
        dcp=dcp,
        num_groups=len(groups),
        selected=selected,
        selected_rule=selected_rule,
        layer_names=tuple(tuple(groups[gid].layer_names) for gid in selected),
        tokens_per_block=tuple(tpb),
        tokens_per_block_rules=tuple(tpb_rules),
        tokens_per_hash=tokens_per_hash,
        tokens_per_hash_rule=hash_rule,
        early_error=early_error,
        windows=windows,
        worker_kv_bytes_per_block=wbytes,
        worker_bytes_rule=wrule,
        use_mla=bool(mc.use_mla),
        kv_tp_replicas=kc.kv_tp_replicas,
        total_kv_heads=total_kv_heads,
        direct_clauses=tuple(direct),
        canonical_certified=certified,
        canonical_cert_rule=cert_rule,
        selected_all_exact_mla=exact_mla,
        selected_mla_rule=mla_rule,
        name=mc.model,
        dtype=dtype,
        dtype_rule=dtype_rule,
        max_model_len=mc.max_model_len,
        kv_cache_layout=cc.kv_cache_layout,
    )


def _tokens_per_hash(
    groups, cc, dcp: int
) -> tuple[int, str, OffloadConfigError | None]:
    """``resolve_kv_cache_block_sizes`` (``vllm/v1/core/kv_cache_utils.py``) as the
    offloading connector sees it: a connector is configured, so block hashing is on."""
    V = _v()
    unit = cc.prefix_match_unit
    if len(groups) <= 1:
        sharded = not groups or groups[0].kv_cache_spec.dcp_sharded
        d = dcp if sharded else 1
        bs = cc.block_size * d
        if unit not in (None, bs) and len(groups) == 1:
            return (
                0,
                "",
                OffloadConfigError(
                    f"prefix_match_unit={unit} is invalid with a single KV cache group: "
                    f"prefix-cache hits land on the block size ({bs}); expected it unset or "
                    f"{bs} (resolve_kv_cache_block_sizes)",
                    code="prefix_match_unit",
                ),
            )
        rule = (
            f"single group: cache block_size {cc.block_size}"
            + (f" x DCP {d}" if d != 1 else "")
            + (" (not DCP-sharded)" if not sharded and dcp != 1 else "")
        )
        return bs, rule, None
    sizes = [
        g.kv_cache_spec.block_size * (dcp if g.kv_cache_spec.dcp_sharded else 1)
        for g in groups
    ]
    lcm = math.lcm(*sizes)
    non_align = sorted(
        {
            s.mamba_cache_mode
            for g in groups
            for s in _layer_specs(g.kv_cache_spec)
            if isinstance(s, V.MambaSpec) and s.mamba_cache_mode != "align"
        }
    )
    if non_align:
        return (
            lcm,
            (
                f"lcm{tuple(sizes)} of the groups' DCP-resolved block sizes: Mamba cache mode "
                f"{non_align[0]!r} (not 'align') disables finer hashing"
            ),
            None,
        )
    hashing = [
        s
        for g, s in zip(groups, sizes, strict=True)
        if g.kv_cache_spec.prefix_cacheable
    ] or sizes
    h = unit if unit is not None else math.gcd(*hashing)
    if any(s % h for s in hashing):
        return (
            0,
            "",
            OffloadConfigError(
                f"prefix_match_unit={h} is invalid: prefix-cacheable KV cache group block "
                f"sizes must be divisible by it; got group block sizes={sizes}, "
                f"prefix-cacheable={hashing} (resolve_kv_cache_block_sizes)",
                code="prefix_match_unit",
            ),
        )
    rule = (
        f"prefix_match_unit {unit}"
        if unit is not None
        else f"gcd{tuple(hashing)} of the prefix-cacheable groups' DCP-resolved block sizes"
    )
    alignments = sorted(
        {
            s.tokens_per_state
            for g in groups
            for s in _layer_specs(g.kv_cache_spec)
            if s.prefix_cacheable
            and isinstance(s.tokens_per_state, int)
            and s.tokens_per_state > 1
        }
    )
    if alignments:
        partial = any(
            isinstance(s, V.MambaSpec)
            and s.mamba_cache_mode == "align"
            and ((dcp == 1 and s.block_size > h) or (dcp > 1 and s.block_size >= h))
            for g in groups
            for s in _layer_specs(g.kv_cache_spec)
        )
        hit = h if partial else lcm
        if any(hit % a for a in alignments):
            return (
                0,
                "",
                OffloadConfigError(
                    f"prefix_match_unit={h} is invalid: prefix-cache boundaries ({hit} tokens) "
                    f"must align with each spec's per-state compression; got alignments="
                    f"{alignments} (resolve_kv_cache_block_sizes)",
                    code="prefix_match_unit",
                ),
            )
    return h, rule, None


def _window(spec) -> _Window:
    V = _v()
    first = _layer_specs(spec)[0]
    name = _spec_name(first)
    if isinstance(first, V.SlidingWindowSpec):
        if not first.sliding_window > 0:
            return _Window("invalid", name, first.sliding_window)
        return _Window(
            "sliding", name, first.sliding_window, first.extra_retained_tokens
        )
    if isinstance(first, V.ChunkedLocalAttentionSpec):
        if not first.attention_chunk_size > 0:
            return _Window("invalid", name, first.attention_chunk_size)
        return _Window("chunked", name, first.attention_chunk_size)
    if isinstance(first, V.MambaSpec):
        return _Window("mamba", name)
    if isinstance(first, V.FullAttentionSpec):
        return _Window("full", name)
    return _Window("unsupported", name)


def _uncertifiable(spec, tp: int, total: int, V) -> str | None:
    """Why a layer spec fails the canonical gate's static certification, or None.

    Mirrors ``spec_certifiable`` inside ``build_offloading_config``.
    """
    name = _spec_name(spec)
    if not isinstance(spec, V.AttentionSpec):
        return f"{name} is not an attention spec"
    if _is_per_token_head(spec):
        return f"{name} uses per-token-head KV quantization"
    if type(spec) is V.MLAAttentionSpec:
        if spec.tokens_per_state != 1:
            return (
                f"MLAAttentionSpec compresses {spec.tokens_per_state} tokens per state"
            )
        if spec.real_page_size_bytes % spec.block_size:
            return (
                f"MLAAttentionSpec page {spec.real_page_size_bytes} B is not a multiple of "
                f"block_size {spec.block_size}"
            )
        return None
    if isinstance(spec, (V.SlidingWindowMLASpec, V.MLAAttentionSpec)):
        return f"{name} (an MLA variant) has no canonical mapping"
    if not isinstance(spec, (V.FullAttentionSpec, V.SlidingWindowSpec)):
        return f"{name} is neither full nor sliding-window attention"
    divides = total % tp == 0 or tp % total == 0
    expected = max(1, total // tp)
    if not divides:
        return f"TP {tp} and {total} total KV heads do not divide one another"
    if spec.num_kv_heads != expected:
        return (
            f"{name} has {spec.num_kv_heads} KV heads per rank, expected max(1, "
            f"{total} // TP {tp}) = {expected}"
        )
    return None


# ---------------------------------------------------------------------------
# The per-call derivation
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Derived:
    """Values and rules of one ``offload_config`` call (before dataclasses)."""

    world_size: int
    world_rule: str
    backend: str
    data_parallel_rank_local: int | None
    blocks_per_chunk: int
    blocks_rule: str
    windows: tuple[int | None, ...]
    window_rules: tuple[str, ...]
    replicated_layout: bool
    replicated_rule: str
    is_parallelism_agnostic: bool
    agnostic_rule: str
    canonical_layout: bool
    canonical_rule: str


def _verdict(clauses) -> tuple[bool, str]:
    """AND of (ok, text) clauses: the failing texts when False, all when True."""
    bad = [t for ok, t in clauses if not ok]
    if bad:
        return False, "; ".join(bad)
    return True, "; ".join(t for _, t in clauses)


def _cmp(a, b) -> str:
    return "==" if a == b else "!="


def _as_int(name: str, value) -> int:
    """``int(value)`` as vLLM applies it to ``kv_connector_extra_config`` entries."""
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise OffloadConfigError(
            f"extra_config[{name!r}]={value!r} is not an integer; expected a whole number "
            f"(vLLM calls int() on it)",
            code="not_an_integer",
        ) from None


def _derive(f: _PlanFacts, extra: Mapping, o: dict) -> _Derived:
    if f.early_error is not None:
        raise f.early_error
    tp, dcp = f.tp, f.dcp
    pp, pcp, dp = (
        o["pipeline_parallel_size"],
        o["prefill_context_parallel_size"],
        o["data_parallel_size"],
    )
    backend = o["distributed_executor_backend"]
    nnodes = o["nnodes_within_dp"]

    # ParallelConfig.__post_init__: world_size, backend default, DP local rank
    world = pp * tp * pcp
    world_rule = f"PP {pp} x TP {tp} x PCP {pcp}"
    if backend == "external_launcher":
        world *= dp
        world_rule += f" x DP {dp} (external_launcher)"
    if backend is None:
        backend = "mp" if world * dp > 1 else "uni"

    # 4. blocks_per_chunk
    bpc_raw = extra.get("blocks_per_chunk")
    tok_raw = extra.get("block_size")
    if bpc_raw is not None and tok_raw is not None:
        raise OffloadConfigError(
            f"extra_config gives both 'block_size'={tok_raw!r} and 'blocks_per_chunk'="
            f"{bpc_raw!r}; expected only one of them (kv_connector_extra_config)",
            code="both_chunk_keys",
        )
    if bpc_raw is not None:
        bpc = _as_int("blocks_per_chunk", bpc_raw)
        if bpc <= 0:
            raise OffloadConfigError(
                f"extra_config['blocks_per_chunk']={bpc_raw!r} is invalid; expected an "
                "integer greater than 0",
                code="blocks_per_chunk_not_positive",
            )
        bpc_rule = f"extra_config['blocks_per_chunk'] = {bpc_raw!r}"
    elif tok_raw is not None:
        tokens = _as_int("block_size", tok_raw)
        unique = sorted(set(f.tokens_per_block))
        if len(unique) != 1:
            raise OffloadConfigError(
                f"extra_config['block_size']={tok_raw!r} needs all offloaded groups to share "
                f"one tokens_per_block; got {dict(zip(f.selected, f.tokens_per_block, strict=True))} "
                f"(group: tokens). Use 'blocks_per_chunk' instead",
                code="mixed_tokens_per_block",
            )
        t = unique[0]
        if tokens % t:
            raise OffloadConfigError(
                f"extra_config['block_size']={tokens} must be a multiple of the GPU KV "
                f"cache block size ({t} tokens); use {_round_up(tokens, t)} instead, or set "
                "'blocks_per_chunk' to express the chunk size in blocks",
                code="block_size_not_multiple",
            )
        bpc = tokens // t
        bpc_rule = f"extra_config['block_size'] {tokens} // {t} tokens per block"
        if bpc <= 0:
            bpc_rule += (
                f" (vLLM 0.33 accepts this block_size, though it rejects blocks_per_chunk={bpc} "
                "given directly)"
            )
    else:
        bpc = 1
        bpc_rule = (
            "default: extra_config has neither 'block_size' nor 'blocks_per_chunk'"
        )

    # 5. sliding_window_size_in_chunks
    wins: list[int | None] = []
    wrules: list[str] = []
    for gid, t, w in zip(f.selected, f.tokens_per_block, f.windows, strict=True):
        chunk = t * bpc
        if w.kind == "full":
            wins.append(None)
            wrules.append(f"{w.spec_name} reaches back without a bound")
        elif w.kind == "mamba":
            wins.append(1)
            wrules.append("a Mamba layer depends on a single state")
        elif w.kind in ("sliding", "chunked"):
            if chunk == 0:
                raise OffloadConfigError(
                    f"group {gid} ({w.spec_name}): a chunk of {t} tokens per block x "
                    f"{bpc} blocks = 0 tokens cannot hold its window of {w.size} tokens; "
                    "expected a positive chunk size (vLLM fails with ZeroDivisionError)",
                    code="zero_chunk",
                )
            if w.kind == "sliding":
                a = _cdiv(w.size, chunk)
                b = _cdiv(w.size - 1 + w.extra_retained, chunk)
                wins.append(max(a, b))
                wrules.append(
                    f"max(cdiv({w.size}, {chunk}), cdiv({w.size} - 1 + {w.extra_retained}, "
                    f"{chunk})): sliding window {w.size}, chunk {t} x {bpc} tokens"
                )
            else:
                wins.append(_cdiv(w.size, chunk))
                wrules.append(
                    f"cdiv({w.size}, {chunk}): attention chunk {w.size}, chunk {t} x {bpc} tokens"
                )
        elif w.kind == "invalid":
            raise OffloadConfigError(
                f"group {gid} ({w.spec_name}) has window {w.size}; expected a positive "
                "sliding window / attention chunk size (get_sliding_window_size_in_chunks)",
                code="invalid_window",
            )
        else:
            raise OffloadConfigError(
                f"group {gid} is {w.spec_name}; vLLM 0.33's offloading supports full, "
                "sliding-window, chunked-local and Mamba groups only "
                "(get_sliding_window_size_in_chunks asserts FullAttentionSpec)",
                code="unsupported_spec",
            )

    wbytes = f.worker_kv_bytes_per_block
    # 7. replicated_layout, direct rule
    rep_clauses = (
        (
            f.use_mla,
            "the model uses MLA" if f.use_mla else "the model does not use MLA",
        ),
        (tp > 1, f"TP {tp} {'>' if tp > 1 else '<='} 1"),
        (
            f.kv_tp_replicas == tp,
            f"kv_tp_replicas {f.kv_tp_replicas} {_cmp(f.kv_tp_replicas, tp)} TP {tp}",
        ),
        (
            wbytes > 0,
            f"worker_kv_bytes_per_block {wbytes} {'>' if wbytes > 0 else '<='} 0",
        ),
        (pp == 1, f"PP {pp} {_cmp(pp, 1)} 1"),
        (pcp == 1, f"PCP {pcp} {_cmp(pcp, 1)} 1"),
        (dcp == 1, f"DCP {dcp} {_cmp(dcp, 1)} 1"),
        (world == tp, f"world size {world} {_cmp(world, tp)} TP {tp}"),
        (backend == "mp", f"executor backend {backend!r} {_cmp(backend, 'mp')} 'mp'"),
        (nnodes == 1, f"nnodes_within_dp {nnodes} {_cmp(nnodes, 1)} 1"),
    )
    replicated, rep_rule = _verdict(rep_clauses)

    # is_parallelism_agnostic, direct rule
    v2 = o["use_v2_model_runner"]
    agn_clauses = (
        (not v2, "V2 model runner" if v2 else "V1 model runner"),
        *f.direct_clauses,
        (pcp == 1, f"PCP {pcp} {_cmp(pcp, 1)} 1"),
    )
    agnostic, agn_rule = _verdict(agn_clauses)

    canonical = bool(extra.get("canonical_layout", False))
    raw_canon = extra.get("canonical_layout", False)
    canon_rule = (
        f"bool(extra_config.get('canonical_layout', False)) = bool({raw_canon!r})"
    )
    if canonical and not agnostic:
        gate = (
            (f.canonical_certified, f.canonical_cert_rule),
            (dcp == 1, f"DCP {dcp} {_cmp(dcp, 1)} 1"),
            (pcp == 1, f"PCP {pcp} {_cmp(pcp, 1)} 1"),
            (world == tp, f"world size {world} {_cmp(world, tp)} TP {tp}"),
        )
        agnostic, gate_rule = _verdict(gate)
        agn_rule = f"canonical layout gate: {gate_rule} (direct rule: {agn_rule})"
    elif canonical:
        agn_rule = f"direct rule holds, canonical layout kept it: {agn_rule}"
    if canonical:
        single_host = world == 1 or backend == "mp"
        rep2 = (
            (
                agnostic,
                "parallelism-agnostic" if agnostic else "not parallelism-agnostic",
            ),
            (f.selected_all_exact_mla, f.selected_mla_rule),
            (nnodes == 1, f"nnodes_within_dp {nnodes} {_cmp(nnodes, 1)} 1"),
            (
                single_host,
                f"world size {world} with executor backend {backend!r}"
                + (
                    " (single process or mp)"
                    if single_host
                    else ": needs world size 1 or 'mp'"
                ),
            ),
        )
        replicated, r2 = _verdict(rep2)
        rep_rule = f"canonical layout rule: {r2}"

    return _Derived(
        world_size=world,
        world_rule=world_rule,
        backend=backend,
        data_parallel_rank_local=0 if dp == 1 else None,
        blocks_per_chunk=bpc,
        blocks_rule=bpc_rule,
        windows=tuple(wins),
        window_rules=tuple(wrules),
        replicated_layout=replicated,
        replicated_rule=rep_rule,
        is_parallelism_agnostic=agnostic,
        agnostic_rule=agn_rule,
        canonical_layout=canonical,
        canonical_rule=canon_rule,
    )


# ---------------------------------------------------------------------------
# Input checks
# ---------------------------------------------------------------------------


def _check_pos_int(name: str, value, minimum: int = 1) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KVExploreError(
            f"{name}={value!r} is invalid; expected an integer >= {minimum}"
        )


def _check_bool(name: str, value) -> None:
    if not isinstance(value, bool):
        raise KVExploreError(f"{name}={value!r} is invalid; expected True or False")


def _check_options(o: dict, tp: int, dcp: int) -> None:
    for name in (
        "pipeline_parallel_size",
        "prefill_context_parallel_size",
        "data_parallel_size",
        "nnodes_within_dp",
    ):
        _check_pos_int(name, o[name])
    _check_pos_int("data_parallel_rank", o["data_parallel_rank"], 0)
    _check_pos_int("rank", o["rank"], 0)
    _check_bool("use_v2_model_runner", o["use_v2_model_runner"])
    _check_bool("enable_kv_cache_events", o["enable_kv_cache_events"])
    backend = o["distributed_executor_backend"]
    if backend is not None and backend not in EXECUTOR_BACKENDS:
        raise KVExploreError(
            f"distributed_executor_backend={backend!r} is invalid; expected one of "
            f"{list(EXECUTOR_BACKENDS)} or None"
        )
    dp, dp_rank = o["data_parallel_size"], o["data_parallel_rank"]
    if dp_rank >= dp:
        raise KVExploreError(
            f"data_parallel_rank={dp_rank} is invalid; expected it in [0, {dp}) "
            f"for data_parallel_size={dp}"
        )
    if o["nnodes_within_dp"] > 1 and backend not in (
        None,
        "mp",
        "uni",
        "external_launcher",
    ):
        raise KVExploreError(
            f"nnodes_within_dp={o['nnodes_within_dp']} with distributed_executor_backend="
            f"{backend!r} is invalid; vLLM's ParallelConfig allows nnodes > 1 only with "
            "'mp', 'uni' or 'external_launcher'"
        )
    pcp = o["prefill_context_parallel_size"]
    if pcp > 1 and dcp not in (1, pcp, tp * pcp):
        raise KVExploreError(
            f"prefill_context_parallel_size={pcp} with the plan's decode context "
            f"parallel size {dcp} is invalid: when PCP is enabled, DCP must be "
            f"disabled, span the PCP axis, or span the full TP x PCP axis (TP={tp}); "
            f"expected DCP in {sorted({1, pcp, tp * pcp})} (vLLM's ParallelConfig)"
        )
    world = o["pipeline_parallel_size"] * tp * pcp
    if backend == "external_launcher":
        world *= dp
    if o["rank"] >= world:
        raise KVExploreError(
            f"rank={o['rank']} is invalid; expected a worker index in [0, {world}) "
            f"(world size {world})"
        )
    eid = o["engine_id"]
    if not isinstance(eid, str) or not eid:
        raise KVExploreError(
            f"engine_id={eid!r} is invalid; expected a non-empty string"
        )


def _check_extra(extra) -> dict:
    if extra is None:
        return {}
    if not isinstance(extra, Mapping):
        raise KVExploreError(
            f"extra_config={extra!r} is invalid; expected a mapping such as "
            "{'block_size': 1088} or {'blocks_per_chunk': 2} (kv_connector_extra_config)"
        )
    return dict(extra)  # a copy: the caller's dict is never touched


def _check_plan(p) -> None:
    if not isinstance(p, Plan):
        raise KVExploreError(
            f"offload_config expects a kvexplore.Plan (from kvexplore.plan(model, ...)); "
            f"got {type(p).__name__} {p!r:.80}"
        )


# ---------------------------------------------------------------------------
# The result
# ---------------------------------------------------------------------------


class OffloadResult:
    """``offload_config``'s answer: the real ``OffloadingConfig`` and its reasons.

    ``config`` is a ``vllm.v1.kv_offload.config.OffloadingConfig``;
    :meth:`explain`, :attr:`reasons` and :meth:`rule` give, per derived field,
    the rule and the actual inputs; :meth:`table` lists every field;
    :meth:`to_dict` is JSON-ready.
    """

    def __init__(
        self, plan: Plan, facts: _PlanFacts, derived: _Derived, config, options: dict
    ):
        self.plan = plan
        self._facts = facts
        self._d = derived
        self.config = config
        self.options = options

    # -- reasons ---------------------------------------------------------------
    @cached_property
    def _rows(self) -> list[tuple[str, Any, str]]:
        """(field, value, rule) for every field of the config, rule '' if passed through."""
        c, f, d, o = self.config, self._facts, self._d, self.options
        rows: list[tuple[str, Any, str]] = [
            ("groups", tuple(g.group_id for g in c.groups), f.selected_rule)
        ]
        for i, g in enumerate(c.groups):
            names = g.layer_names
            shown = f"{len(names)} layers" + (
                f" ({names[0]} ... {names[-1]})" if names else ""
            )
            rows += [
                (f"groups[{i}].group_id", g.group_id, ""),
                (f"groups[{i}].layer_names", shown, ""),
                (
                    f"groups[{i}].tokens_per_block",
                    g.tokens_per_block,
                    f.tokens_per_block_rules[i],
                ),
                (
                    f"groups[{i}].sliding_window_size_in_chunks",
                    g.sliding_window_size_in_chunks,
                    d.window_rules[i],
                ),
            ]
        rows += [
            (
                "worker_kv_bytes_per_block",
                c.worker_kv_bytes_per_block,
                f.worker_bytes_rule,
            ),
            (
                "enable_kv_cache_events",
                c.enable_kv_cache_events,
                f"kv_events_config.enable_kv_cache_events = {o['enable_kv_cache_events']}",
            ),
            ("extra_config", json.dumps(_jsonable(c.extra_config), sort_keys=True), ""),
            ("engine_id", c.engine_id, ""),
            ("model.name", c.model.name, f"model_config.model (for {f.model_id})"),
            ("model.dtype", c.model.dtype, f.dtype_rule),
            (
                "model.max_model_len",
                c.model.max_model_len,
                "model_config.max_model_len",
            ),
            ("cache.tokens_per_hash", c.cache.tokens_per_hash, f.tokens_per_hash_rule),
            ("cache.blocks_per_chunk", c.cache.blocks_per_chunk, d.blocks_rule),
            ("parallel.rank", c.parallel.rank, ""),
            ("parallel.world_size", c.parallel.world_size, d.world_rule),
            ("parallel.tp_size", c.parallel.tp_size, ""),
            ("parallel.pp_size", c.parallel.pp_size, ""),
            ("parallel.pcp_size", c.parallel.pcp_size, ""),
            ("parallel.dcp_size", c.parallel.dcp_size, ""),
            (
                "parallel.data_parallel_index",
                c.parallel.data_parallel_index,
                f"data_parallel_rank {o['data_parallel_rank']}",
            ),
            ("parallel.data_parallel_size", c.parallel.data_parallel_size, ""),
            (
                "parallel.data_parallel_rank_local",
                c.parallel.data_parallel_rank_local,
                "DP 1: vLLM reads VLLM_DP_RANK_LOCAL (default 0)"
                if o["data_parallel_size"] == 1
                else f"DP {o['data_parallel_size']}: set only in SPMD mode",
            ),
            (
                "parallel.is_parallelism_agnostic",
                c.parallel.is_parallelism_agnostic,
                d.agnostic_rule,
            ),
            ("replicated_layout", c.replicated_layout, d.replicated_rule),
            ("canonical_layout", c.canonical_layout, d.canonical_rule),
            ("kv_cache_layout", c.kv_cache_layout, "cache_config.kv_cache_layout"),
        ]
        return rows

    def table(self) -> pd.DataFrame:
        """Every field of the ``OffloadingConfig`` (flattened): field, value, rule."""
        return pd.DataFrame(self._rows, columns=["field", "value", "rule"])

    @property
    def reasons(self) -> pd.DataFrame:
        """The derived fields only: field, value, rule (with the actual inputs)."""
        rows = [r for r in self._rows if r[2]]
        return pd.DataFrame(rows, columns=["field", "value", "rule"])

    def rule(self, field: str) -> str:
        """The rule behind one field, e.g. ``rule("replicated_layout")``.

        A unique last component names a nested field too:
        ``rule("is_parallelism_agnostic")`` is
        ``rule("parallel.is_parallelism_agnostic")``.
        """
        for name, _, why in self._rows:
            if name == field:
                return why
        tails = [(n, why) for n, _, why in self._rows if n.rsplit(".", 1)[-1] == field]
        if len(tails) == 1:
            return tails[0][1]
        if tails:
            raise KVExploreError(
                f"field={field!r} is not a field of this OffloadingConfig by itself: it "
                f"names {len(tails)} fields; expected one of {[n for n, _ in tails]}"
            )
        raise KVExploreError(
            f"field={field!r} is not a field of this OffloadingConfig; expected one of "
            f"{[r[0] for r in self._rows]}"
        )

    def explain(self) -> str:
        """One line per derived field: ``field = value: rule``."""
        return "\n".join(
            f"{name} = {value}: {why}" for name, value, why in self._rows if why
        )

    # -- export ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the config (``dataclasses.asdict``), reasons and inputs."""
        out = _jsonable(asdict(self.config))
        out["reasons"] = {name: why for name, _, why in self._rows if why}
        out["inputs"] = {
            "model": self._facts.model_id,
            **_jsonable(self.plan.inputs),
            **_jsonable(self.options),
        }
        return out

    # -- display -----------------------------------------------------------------
    def __repr__(self) -> str:
        c = self.config
        return (
            f"OffloadResult({self._facts.model_id!r}, tp={c.parallel.tp_size}, "
            f"dcp={c.parallel.dcp_size}, pp={c.parallel.pp_size}, "
            f"groups={[g.group_id for g in c.groups]}, "
            f"tokens_per_block={[g.tokens_per_block for g in c.groups]}, "
            f"tokens_per_hash={c.cache.tokens_per_hash}, "
            f"blocks_per_chunk={c.cache.blocks_per_chunk}, "
            f"worker_kv_bytes_per_block={c.worker_kv_bytes_per_block}, "
            f"replicated_layout={c.replicated_layout}, "
            f"is_parallelism_agnostic={c.parallel.is_parallelism_agnostic}, "
            f"canonical_layout={c.canonical_layout})"
        )

    def _repr_html_(self) -> str:
        c = self.config
        head = (
            f"<b>OffloadingConfig</b> for {html.escape(self._facts.model_id)} "
            f"(TP {c.parallel.tp_size}, DCP {c.parallel.dcp_size}, PP {c.parallel.pp_size})"
        )
        body = "".join(
            f"<tr><td><code>{html.escape(name)}</code></td><td>{html.escape(str(value))}</td><td>{html.escape(why)}</td></tr>"
            for name, value, why in self._rows
        )
        return (
            f"<div>{head}<table><thead><tr><th>field</th><th>value</th><th>rule</th></tr>"
            f"</thead><tbody>{body}</tbody></table></div>"
        )


def _jsonable(v):
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return repr(v)  # strict JSON has no NaN / Infinity
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def _derive_checked(p: Plan, o: dict) -> tuple[_PlanFacts, dict, _Derived]:
    """Validate the inputs, then derive (the sweep's fast path stops here)."""
    _check_plan(p)
    extra = _check_extra(o["extra_config"])
    facts = _plan_facts(p)
    _check_options(o, facts.tp, facts.dcp)
    return facts, extra, _derive(facts, extra, o)


def offload_config(
    plan: Plan,
    *,
    extra_config: Mapping[str, Any] | None = None,
    pipeline_parallel_size: int = 1,
    prefill_context_parallel_size: int = 1,
    data_parallel_size: int = 1,
    data_parallel_rank: int = 0,
    distributed_executor_backend: str | None = "mp",
    nnodes_within_dp: int = 1,
    use_v2_model_runner: bool = False,
    enable_kv_cache_events: bool = False,
    rank: int = 0,
    engine_id: str = DEFAULT_ENGINE_ID,
) -> OffloadResult:
    """The ``OffloadingConfig`` vLLM 0.33's ``build_offloading_config`` builds.

    TP and DCP come from ``plan``; the other parallel sizes, the executor
    backend, ``nnodes_within_dp`` (nodes one DP replica spans), the model
    runner, KV events and ``extra_config`` (``kv_connector_extra_config``:
    ``block_size`` in tokens *or* ``blocks_per_chunk``, ``canonical_layout``)
    are what the engine's ``ParallelConfig``, ``KVEventsConfig`` and
    ``KVTransferConfig`` would hold.  ``distributed_executor_backend=None``
    resolves as ``ParallelConfig.__post_init__`` does on one node (``mp`` for
    more than one worker, else ``uni``).  Values vLLM reads from environment
    variables (``VLLM_DP_RANK_LOCAL``) take their defaults.

    The plan's ``KVCacheConfig`` is used as is: with ``pipeline_parallel_size >
    1`` it still lists every layer (one stage's share is not modelled).

    Raises ``ValueError`` (:class:`OffloadConfigError`, with ``code``) where
    vLLM raises or asserts, with the same facts, and ``ValueError`` for
    malformed inputs.  ``extra_config`` is copied, never modified.
    """
    o = {
        "extra_config": extra_config,
        "pipeline_parallel_size": pipeline_parallel_size,
        "prefill_context_parallel_size": prefill_context_parallel_size,
        "data_parallel_size": data_parallel_size,
        "data_parallel_rank": data_parallel_rank,
        "distributed_executor_backend": distributed_executor_backend,
        "nnodes_within_dp": nnodes_within_dp,
        "use_v2_model_runner": use_v2_model_runner,
        "enable_kv_cache_events": enable_kv_cache_events,
        "rank": rank,
        "engine_id": engine_id,
    }
    facts, extra, d = _derive_checked(plan, o)
    V = _v()
    groups = tuple(
        V.OffloadingGroupConfig(
            group_id=gid,
            tokens_per_block=t,
            layer_names=names,
            sliding_window_size_in_chunks=w,
        )
        for gid, t, names, w in zip(
            facts.selected,
            facts.tokens_per_block,
            facts.layer_names,
            d.windows,
            strict=True,
        )
    )
    config = V.OffloadingConfig(
        groups=groups,
        worker_kv_bytes_per_block=facts.worker_kv_bytes_per_block,
        enable_kv_cache_events=enable_kv_cache_events,
        extra_config=extra,
        engine_id=engine_id,
        model=V.OffloadingModelConfig(
            name=facts.name, dtype=facts.dtype, max_model_len=facts.max_model_len
        ),
        cache=V.OffloadingCacheConfig(
            tokens_per_hash=facts.tokens_per_hash, blocks_per_chunk=d.blocks_per_chunk
        ),
        parallel=V.OffloadingParallelConfig(
            rank=rank,
            world_size=d.world_size,
            tp_size=facts.tp,
            pp_size=pipeline_parallel_size,
            pcp_size=prefill_context_parallel_size,
            dcp_size=facts.dcp,
            data_parallel_index=data_parallel_rank,
            data_parallel_size=data_parallel_size,
            data_parallel_rank_local=d.data_parallel_rank_local,
            is_parallelism_agnostic=d.is_parallelism_agnostic,
        ),
        replicated_layout=d.replicated_layout,
        canonical_layout=d.canonical_layout,
        kv_cache_layout=facts.kv_cache_layout,
    )
    o = dict(o, extra_config=extra, distributed_executor_backend=d.backend)
    return OffloadResult(plan, facts, d, config, o)


def offload_cli_table(result: OffloadResult) -> str:
    """Plain-text table for ``kvexplore offload``: field, value, rule."""
    return result.table().to_string(index=False, max_colwidth=120)


# ---------------------------------------------------------------------------
# vLLM's own inputs (conformance tests and the benchmark)
# ---------------------------------------------------------------------------


@contextmanager
def _env(changes: dict[str, str]):
    saved = {k: os.environ.get(k) for k in (*changes, "VLLM_ENABLE_V1_MULTIPROCESSING")}
    os.environ.update(changes)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def vllm_parallel_config(
    plan: Plan,
    *,
    pipeline_parallel_size: int = 1,
    prefill_context_parallel_size: int = 1,
    data_parallel_size: int = 1,
    data_parallel_rank: int = 0,
    distributed_executor_backend: str | None = "mp",
    nnodes_within_dp: int = 1,
    rank: int = 0,
):
    """A real ``vllm.config.ParallelConfig`` for these inputs (plan's TP and DCP).

    ``nnodes_within_dp`` becomes ``nnodes`` with every DP replica local to
    the node group (``data_parallel_size_local = data_parallel_size``), so
    ``ParallelConfig.nnodes_within_dp`` equals it.  Ray is not installed
    offline, so a valid ``"ray"`` configuration is built as ``"mp"`` and
    renamed afterwards (with ``nnodes > 1`` it is built as ``"ray"``, which
    vLLM rejects); ``external_launcher`` gets the ``RANK`` variable it reads,
    and the environment is restored.
    """
    from vllm.config import ParallelConfig

    pc_plan = plan.vllm_config.parallel_config
    backend = distributed_executor_backend
    kwargs = dict(
        tensor_parallel_size=pc_plan.tensor_parallel_size,
        decode_context_parallel_size=pc_plan.decode_context_parallel_size,
        pipeline_parallel_size=pipeline_parallel_size,
        prefill_context_parallel_size=prefill_context_parallel_size,
        data_parallel_size=data_parallel_size,
        data_parallel_rank=data_parallel_rank,
        data_parallel_size_local=data_parallel_size,
        nnodes=nnodes_within_dp,
        distributed_executor_backend="mp"
        if backend == "ray" and nnodes_within_dp == 1
        else backend,
        rank=rank,
    )
    per_replica = (
        pipeline_parallel_size
        * pc_plan.tensor_parallel_size
        * prefill_context_parallel_size
    )
    env = (
        {"RANK": str(data_parallel_rank * per_replica)}
        if backend == "external_launcher"
        else {}
    )
    with _env(env):
        try:
            pc = ParallelConfig(**kwargs)
        except Exception as exc:  # pydantic ValidationError carries the reason
            raise KVExploreError(
                f"vLLM's ParallelConfig rejects {kwargs}: {exc}"
            ) from None
    if backend == "ray":
        pc.distributed_executor_backend = "ray"
    return pc


def vllm_offload_inputs(plan: Plan, *, parallel_config=None, **kw):
    """``(vllm_config, kv_cache_config)`` to call vLLM's own ``build_offloading_config``.

    The stand-in (:class:`kvexplore.offloading.standin.VllmConfigStandIn`) carries the
    plan's ``ModelConfig`` / ``CacheConfig``, a real ``ParallelConfig``
    (:func:`vllm_parallel_config`, or ``parallel_config`` when given, to share
    one across calls), a real ``KVTransferConfig`` for the
    ``OffloadingConnector`` and a real ``KVEventsConfig`` when events are on.
    Takes :func:`offload_config`'s keywords.
    """
    from vllm.config import KVTransferConfig
    from vllm.config.kv_events import KVEventsConfig

    from kvexplore.offloading.standin import VllmConfigStandIn

    extra = kw.pop("extra_config", None)
    engine_id = kw.pop("engine_id", DEFAULT_ENGINE_ID)
    events = kw.pop("enable_kv_cache_events", False)
    v2 = kw.pop("use_v2_model_runner", False)
    if parallel_config is None:
        parallel_config = vllm_parallel_config(plan, **kw)
    vc = plan.vllm_config
    stand_in = VllmConfigStandIn(
        model_config=vc.model_config,
        cache_config=vc.cache_config,
        parallel_config=parallel_config,
        kv_transfer_config=KVTransferConfig(
            kv_connector="OffloadingConnector",
            kv_role="kv_both",
            engine_id=engine_id,
            kv_connector_extra_config=dict(extra or {}),
        ),
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True)
        if events
        else None,
        use_v2_model_runner=v2,
    )
    return stand_in, plan.kv_cache_config


__all__ = [
    "DEFAULT_ENGINE_ID",
    "EXECUTOR_BACKENDS",
    "OFFLOAD_KEYWORDS",
    "OffloadConfigError",
    "OffloadResult",
    "offload_cli_table",
    "offload_config",
    "vllm_offload_inputs",
    "vllm_parallel_config",
]
