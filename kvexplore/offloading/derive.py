"""``build_offloading_config`` as one pass of small steps, each value with its reason.

vLLM's ``build_offloading_config``
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``) reads
the engine's ``VllmConfig`` and ``KVCacheConfig`` top to bottom.  :func:`derive`
takes the same steps in the same order (so the same input fails on the same
rule), each a pure function returning a :class:`Derived` (the value vLLM
computes and the rule with the actual numbers), or raising
:class:`OffloadConfigError` where vLLM raises or asserts.

>>> from kvexplore import plan
>>> d = derive(plan("Qwen/Qwen3.5-0.8B", gpu="A100"), OffloadOptions())
>>> d.tokens_per_hash
Derived(value=544, rule="gcd(544, 544, 544, 544) of the prefix-cacheable groups' DCP-resolved block sizes")
>>> [w.value for w in d.sliding_window_size_in_chunks]
[1, 1, 1, None]
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    _group_kv_bytes_per_block as group_bytes_per_block,
)
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

from kvexplore.errors import KVExploreError
from kvexplore.layout import cdiv, leaf_specs
from kvexplore.offloading.options import OffloadOptions, ParallelSizes
from kvexplore.planning import release
from kvexplore.planning.planner import Plan
from kvexplore.planning.release import release_name


class OffloadConfigError(KVExploreError):
    """A configuration ``build_offloading_config`` rejects (raise or assert).

    ``code`` names the vLLM rule, so callers and the conformance test can tell
    the cases apart without parsing the message:

    ``no_eligible_groups``, ``prefix_match_unit``, ``tokens_per_hash``,
    ``both_chunk_keys``, ``not_an_integer``, ``blocks_per_chunk_not_positive``,
    ``mixed_tokens_per_block``, ``block_size_not_multiple``,
    ``unsupported_spec``, ``invalid_window``, ``zero_chunk``.

    Three codes name values vLLM takes without complaint but no backend
    could use, which kvexplore refuses (:data:`STRICTER_CODES`).
    """

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


#: :class:`OffloadConfigError` codes of ``kv_connector_extra_config`` values
#: vLLM's ``build_offloading_config`` accepts (or fails on later, dividing by
#: zero) that kvexplore refuses: a float with a fraction, which vLLM's
#: ``int()`` truncates; a ``block_size`` that gives no block per chunk or a
#: negative number of them; a ``canonical_layout`` other than a boolean
#: (vLLM's ``bool()`` reads ``"false"`` as True).
STRICTER_CODES = ("not_a_whole_number", "block_size_not_positive", "canonical_layout_not_bool")


class Derived(NamedTuple):
    """One derived value and the rule, with the actual inputs, that gave it."""

    value: Any
    rule: str


class Clause(NamedTuple):
    """One term of a boolean rule vLLM ANDs together: holds or not, and why."""

    ok: bool
    text: str


def verdict(clauses: Iterable[Clause]) -> Derived:
    """The AND of ``clauses``: the failing texts when False, all texts when True."""
    clauses = tuple(clauses)
    bad = [c.text for c in clauses if not c.ok]
    if bad:
        return Derived(False, "; ".join(bad))
    return Derived(True, "; ".join(c.text for c in clauses))


def _eq(name: str, value, expected, shown=None) -> Clause:
    """``name value == expected`` (``!=`` when it fails); ``shown`` names ``expected``."""
    op = "==" if value == expected else "!="
    return Clause(value == expected, f"{name} {value} {op} {expected if shown is None else shown}")


def _gt(name: str, value: int, bound: int) -> Clause:
    """``name value > bound`` (``<=`` when it fails)."""
    return Clause(value > bound, f"{name} {value} {'>' if value > bound else '<='} {bound}")


def _named(ok: bool, yes: str, no: str) -> Clause:
    return Clause(ok, yes if ok else no)


def _spec_name(spec) -> str:
    return type(spec).__name__


def _offloaded(p: Plan) -> list:
    """The plan's ``GroupInfo`` of each offloaded group, in group order."""
    return [p.groups[gid] for gid in offloading_groups(p).value]


def parallel_layout(o: OffloadOptions, sizes: ParallelSizes) -> tuple[Derived, Derived, Derived]:
    """What ``ParallelConfig.__post_init__`` (``vllm/config/parallel.py``) fills
    in before ``build_offloading_config`` reads it, with the plan's ``sizes``:
    the world size (:meth:`OffloadOptions.world_size`), the executor backend
    when none is named, and the local DP rank (read from
    ``VLLM_DP_RANK_LOCAL``, default 0, with one DP replica)."""
    dp, backend = sizes.data_parallel_size, o.distributed_executor_backend
    tp = sizes.tensor_parallel_size
    world = o.world_size(sizes)
    world_rule = (f"PP {sizes.pipeline_parallel_size} x TP {tp} x PCP "
                  f"{o.prefill_context_parallel_size}")
    if backend == "external_launcher":
        world_rule += f" x DP {dp} (external_launcher)"
    if backend is None:
        backend = "mp" if world * dp > 1 else "uni"
        backend_rule = f"None resolves to {backend!r} for {world * dp} worker(s) on one node"
    else:
        backend_rule = "as given"
    if dp == 1:
        local = Derived(0, "DP 1: vLLM reads VLLM_DP_RANK_LOCAL (default 0)")
    else:
        local = Derived(None, f"DP {dp}: set only in SPMD mode")
    return Derived(world, world_rule), Derived(backend, backend_rule), local


def offloading_groups(p: Plan) -> Derived:
    """``get_offloading_group_ids``: the transferable, prefix-cacheable groups
    (``KVCacheConfig.prefix_cacheable_group_ids``; a plan has no HiSparse
    host pool, whose indexer groups vLLM would take instead)."""
    groups = p.groups
    selected = tuple(g.index for g in groups
                     if g.enable_kv_transfer and g.kv_cache_spec.prefix_cacheable)
    skipped = [
        f"group {g.index} ({_spec_name(g.kv_cache_spec)}) "
        + ("has KV transfer disabled" if not g.enable_kv_transfer else "is not prefix-cacheable")
        for g in groups if g.index not in selected
    ]
    rule = (
        f"{len(selected)} of {len(groups)} KV cache groups are transferable and "
        "prefix-cacheable (KVCacheConfig.prefix_cacheable_group_ids)"
        + (f"; skipped: {', '.join(skipped)}" if skipped else "")
    )
    if not selected:
        raise OffloadConfigError(
            f"KV offloading found no eligible cache groups in {p.model.name}: "
            f"{rule}; expected at least one transferable, prefix-cacheable group "
            "(build_offloading_config)",
            code="no_eligible_groups",
        )
    return Derived(selected, rule)


def dcp_tokens_per_block(spec, dcp: int) -> Derived:
    """``resolve_dcp_kv_block_size`` (``vllm/v1/core/kv_cache_utils.py``): a
    DCP-sharded (attention) group spans ``block_size x DCP`` tokens, a Mamba
    group keeps ``block_size`` (each rank holds the whole state)."""
    if spec.dcp_sharded:
        return Derived(
            spec.block_size * dcp,
            f"block_size {spec.block_size} x DCP {dcp} ({_spec_name(spec)} is DCP-sharded)",
        )
    return Derived(
        spec.block_size,
        f"block_size {spec.block_size} ({_spec_name(spec)} is not DCP-sharded: "
        "each rank holds the whole state)",
    )


def tokens_per_block(p: Plan) -> tuple[Derived, ...]:
    """Each offloaded group's ``tokens_per_block`` (:func:`dcp_tokens_per_block`)."""
    dcp = p.decode_context_parallel_size
    return tuple(dcp_tokens_per_block(g.kv_cache_spec, dcp) for g in _offloaded(p))


def hash_block_size(groups, block_size: int, prefix_match_unit: int | None, dcp: int) -> Derived:
    """``resolve_kv_cache_block_sizes`` (``vllm/v1/core/kv_cache_utils.py``) as
    the offloading connector sees it: a connector is configured, so block
    hashing is on.  One group hashes at its block size; several at the gcd of
    the prefix-cacheable groups' DCP-resolved block sizes (or
    ``prefix_match_unit``), unless a Mamba group outside ``align`` mode backs
    off to their lcm."""
    unit = prefix_match_unit
    if len(groups) <= 1:
        sharded = not groups or groups[0].kv_cache_spec.dcp_sharded
        d = dcp if sharded else 1
        bs = block_size * d
        if (unit not in (None, bs) and len(groups) == 1
                and release.rejects_single_group_prefix_match_unit()):
            raise OffloadConfigError(
                f"prefix_match_unit={unit} is invalid with a single KV cache group: "
                f"prefix-cache hits land on the block size ({bs}); expected it unset or "
                f"{bs} (resolve_kv_cache_block_sizes)",
                code="prefix_match_unit",
            )
        return Derived(
            bs,
            f"single group: cache block_size {block_size}"
            + (f" x DCP {d}" if d != 1 else "")
            + (" (not DCP-sharded)" if not sharded and dcp != 1 else ""),
        )
    sizes = [dcp_tokens_per_block(g.kv_cache_spec, dcp).value for g in groups]
    lcm = math.lcm(*sizes)
    specs = [s for g in groups for s in leaf_specs(g.kv_cache_spec)]
    non_align = sorted(
        {s.mamba_cache_mode for s in specs if isinstance(s, MambaSpec) and s.mamba_cache_mode != "align"}
    )
    if non_align:
        return Derived(
            lcm,
            f"lcm{tuple(sizes)} of the groups' DCP-resolved block sizes: Mamba cache mode "
            f"{non_align[0]!r} (not 'align') disables finer hashing",
        )
    hashing = [s for g, s in zip(groups, sizes, strict=True) if g.kv_cache_spec.prefix_cacheable] or sizes
    h = unit if unit is not None else math.gcd(*hashing)
    if any(s % h for s in hashing):
        raise OffloadConfigError(
            f"prefix_match_unit={h} is invalid: prefix-cacheable KV cache group block "
            f"sizes must be divisible by it; got group block sizes={sizes}, "
            f"prefix-cacheable={hashing} (resolve_kv_cache_block_sizes)",
            code="prefix_match_unit",
        )
    alignments = sorted(
        {
            s.tokens_per_state
            for s in specs
            if s.prefix_cacheable and isinstance(s.tokens_per_state, int) and s.tokens_per_state > 1
        }
    )
    # partial_hash_hits_enabled: an align-mode Mamba block larger than the hash unit
    partial = any(
        isinstance(s, MambaSpec)
        and s.mamba_cache_mode == "align"
        and ((dcp == 1 and s.block_size > h) or (dcp > 1 and s.block_size >= h))
        for s in specs
    )
    hit = h if partial else lcm
    if any(hit % a for a in alignments):
        raise OffloadConfigError(
            f"prefix_match_unit={h} is invalid: prefix-cache boundaries ({hit} tokens) "
            f"must align with each spec's per-state compression; got alignments="
            f"{alignments} (resolve_kv_cache_block_sizes)",
            code="prefix_match_unit",
        )
    return Derived(
        h,
        f"prefix_match_unit {unit}"
        if unit is not None
        else f"gcd{tuple(hashing)} of the prefix-cacheable groups' DCP-resolved block sizes",
    )


def tokens_per_hash(p: Plan) -> Derived:
    """``tokens_per_hash`` (:func:`hash_block_size`), and the assertion that
    follows it in ``build_offloading_config``: every offloaded group's
    ``tokens_per_block`` is a multiple of it."""
    h = hash_block_size(p.groups, p.block_size, p.prefix_match_unit,
                        p.decode_context_parallel_size)
    for gid, t in zip(offloading_groups(p).value, tokens_per_block(p), strict=True):
        if t.value % h.value:
            raise OffloadConfigError(
                f"group {gid}: tokens_per_block={t.value} is not divisible by "
                f"tokens_per_hash={h.value} ({h.rule}); expected every "
                f"offloaded group's tokens per block to be a multiple of it. Hybrid "
                "models (e.g. Mamba+Attention) need --enable-prefix-caching to "
                "align block sizes (build_offloading_config)",
                code="tokens_per_hash",
            )
    return h


def _extra_int(name: str, value, stricter: bool = True) -> int:
    """``int(value)`` as vLLM applies it to ``kv_connector_extra_config``
    entries; with ``stricter``, a float with a fraction, which ``int()`` would
    truncate, is refused (:data:`STRICTER_CODES`).  NaN and the infinities,
    which ``int()`` refuses, are refused as vLLM refuses them (not an integer)."""
    if stricter and isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        raise OffloadConfigError(
            f"extra_config[{name!r}]={value!r} is not a whole number; expected an integer "
            f"(vLLM's int() would truncate it to {int(value)})",
            code="not_a_whole_number",
        )
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        raise OffloadConfigError(
            f"extra_config[{name!r}]={value!r} is not an integer; expected a whole number "
            f"(vLLM calls int() on it)",
            code="not_an_integer",
        ) from None


def blocks_per_chunk(extra: Mapping[str, Any], group_ids: tuple[int, ...], tpb: tuple[int, ...],
                     *, stricter: bool = True) -> Derived:
    """``blocks_per_chunk`` from ``kv_connector_extra_config``: given directly,
    or ``block_size`` (tokens) over the one ``tokens_per_block`` every group
    shares; 1 when neither is given.  ``stricter=False`` gives what vLLM's
    ``build_offloading_config`` takes where kvexplore refuses by one of
    :data:`STRICTER_CODES` (``int()``'s truncation, a ``block_size`` of no
    or negative blocks per chunk); vLLM's own refusals stay."""
    bpc_raw = extra.get("blocks_per_chunk")
    tok_raw = extra.get("block_size")
    if bpc_raw is not None and tok_raw is not None:
        raise OffloadConfigError(
            f"extra_config gives both 'block_size'={tok_raw!r} and 'blocks_per_chunk'="
            f"{bpc_raw!r}; expected only one of them (kv_connector_extra_config)",
            code="both_chunk_keys",
        )
    if bpc_raw is not None:
        bpc = _extra_int("blocks_per_chunk", bpc_raw, stricter)
        if bpc <= 0:
            raise OffloadConfigError(
                f"extra_config['blocks_per_chunk']={bpc_raw!r} is invalid; expected an "
                "integer greater than 0",
                code="blocks_per_chunk_not_positive",
            )
        return Derived(bpc, f"extra_config['blocks_per_chunk'] = {bpc_raw!r}")
    if tok_raw is None:
        return Derived(1, "default: extra_config has neither 'block_size' nor 'blocks_per_chunk'")
    tokens = _extra_int("block_size", tok_raw, stricter)
    unique = sorted(set(tpb))
    if len(unique) != 1:
        raise OffloadConfigError(
            f"extra_config['block_size']={tok_raw!r} needs all offloaded groups to share "
            f"one tokens_per_block; got {dict(zip(group_ids, tpb, strict=True))} "
            f"(group: tokens). Use 'blocks_per_chunk' instead",
            code="mixed_tokens_per_block",
        )
    t = unique[0]
    if tokens % t:
        raise OffloadConfigError(
            f"extra_config['block_size']={tokens} must be a multiple of the GPU KV "
            f"cache block size ({t} tokens); use {cdiv(tokens, t) * t} instead, or set "
            "'blocks_per_chunk' to express the chunk size in blocks",
            code="block_size_not_multiple",
        )
    bpc = tokens // t
    if stricter and bpc <= 0:
        raise OffloadConfigError(
            f"extra_config['block_size']={tok_raw!r} is invalid: it gives {bpc} blocks per "
            f"chunk ({tokens} // {t} tokens per block); expected a positive multiple of the "
            f"GPU KV cache block size ({t}, {2 * t}, ...)",
            code="block_size_not_positive",
        )
    return Derived(bpc, f"extra_config['block_size'] {tokens} // {t} tokens per block")


def sliding_window_size_in_chunks(gid: int, spec, tpb: int, bpc: int) -> Derived:
    """``get_sliding_window_size_in_chunks`` for group ``gid``'s first layer
    spec: the chunks of ``tpb x bpc`` tokens the tier keeps for one request;
    1 for a Mamba group, None (no bound) for full attention."""
    name = _spec_name(spec)
    extra = 0
    if isinstance(spec, SlidingWindowSpec):
        size, extra = spec.sliding_window, spec.extra_retained_tokens
    elif isinstance(spec, ChunkedLocalAttentionSpec):
        size = spec.attention_chunk_size
    elif isinstance(spec, MambaSpec):
        return Derived(1, "a Mamba layer depends on a single state")
    elif isinstance(spec, FullAttentionSpec):
        return Derived(None, f"{name} reaches back without a bound")
    else:
        raise OffloadConfigError(
            f"group {gid} is {name}; {release_name()}'s offloading supports full, "
            "sliding-window, chunked-local and Mamba groups only "
            "(get_sliding_window_size_in_chunks asserts FullAttentionSpec)",
            code="unsupported_spec",
        )
    if not size > 0:
        raise OffloadConfigError(
            f"group {gid} ({name}) has window {size}; expected a positive "
            "sliding window / attention chunk size (get_sliding_window_size_in_chunks)",
            code="invalid_window",
        )
    chunk = tpb * bpc
    if chunk == 0:
        raise OffloadConfigError(
            f"group {gid} ({name}): a chunk of {tpb} tokens per block x "
            f"{bpc} blocks = 0 tokens cannot hold its window of {size} tokens; "
            "expected a positive chunk size (vLLM fails with ZeroDivisionError)",
            code="zero_chunk",
        )
    if isinstance(spec, ChunkedLocalAttentionSpec):
        return Derived(
            cdiv(size, chunk),
            f"cdiv({size}, {chunk}): attention chunk {size}, chunk {tpb} x {bpc} tokens",
        )
    return Derived(
        max(cdiv(size, chunk), cdiv(size - 1 + extra, chunk)),
        f"max(cdiv({size}, {chunk}), cdiv({size} - 1 + {extra}, "
        f"{chunk})): sliding window {size}, chunk {tpb} x {bpc} tokens",
    )


def worker_kv_bytes_per_block(p: Plan) -> Derived:
    """``worker_kv_bytes_per_block``: the backing allocation over ``num_blocks``
    (every ``KVCacheTensor`` places layers in the same allocation, so its
    size is the total), else the offloaded groups' pages summed."""
    if p.num_blocks <= 0:
        return Derived(0, f"0: the KV cache has {p.num_blocks} blocks")
    if p.tensors:
        total = p.tensors[0].size
        return Derived(
            total // p.num_blocks,
            f"backing KV cache allocation {total} B // {p.num_blocks} blocks "
            "(every KVCacheTensor places layers in one shared allocation)",
        )
    parts = [
        f"group {g.index}: {g.kv_cache_spec.page_size_bytes}"
        + ("" if isinstance(g.kv_cache_spec, UniformTypeKVCacheSpecs) else f" x {len(g.layer_names)} layers")
        for g in _offloaded(p)
    ]
    total = sum(group_bytes_per_block(g) for g in _offloaded(p))
    return Derived(total, "sum of the offloaded groups' pages per block (" + "; ".join(parts) + ")")


def replicated_layout(p: Plan, o: OffloadOptions, sizes: ParallelSizes, world: int, backend: str,
                      worker_bytes: int) -> Derived:
    """``replicated_layout`` for the direct layout: an MLA latent replicated on
    every TP rank (``kv_tp_replicas == TP``), TP only, single-node ``mp`` (one
    shared host copy); the plan's ``sizes``."""
    tp = sizes.tensor_parallel_size
    return verdict(
        (
            _named(p.use_mla, "the model uses MLA", "the model does not use MLA"),
            _gt("TP", tp, 1),
            _eq("kv_tp_replicas", p.kv_tp_replicas, tp, f"TP {tp}"),
            _gt("worker_kv_bytes_per_block", worker_bytes, 0),
            _eq("PP", sizes.pipeline_parallel_size, 1),
            _eq("PCP", o.prefill_context_parallel_size, 1),
            _eq("DCP", p.decode_context_parallel_size, 1),
            _eq("world size", world, tp, f"TP {tp}"),
            _eq("executor backend", repr(backend), repr("mp")),
            _eq("nnodes_within_dp", o.nnodes_within_dp, 1),
        )
    )


def canonical_layout(extra: Mapping[str, Any]) -> Derived:
    """``bool(extra_config.get("canonical_layout", False))``, as vLLM reads it;
    a value other than a boolean or the integers 0 and 1 is refused (vLLM
    reads any non-empty string as True, ``"false"`` included)."""
    raw = extra.get("canonical_layout", False)
    if not (isinstance(raw, bool) or (isinstance(raw, int) and raw in (0, 1))):
        raise OffloadConfigError(
            f"extra_config['canonical_layout']={raw!r} is invalid; expected true or false "
            f"(vLLM's bool() would read it as {bool(raw)})",
            code="canonical_layout_not_bool",
        )
    return Derived(bool(raw), f"bool(extra_config.get('canonical_layout', False)) = bool({raw!r})")


def single_full_attention_group(p: Plan) -> tuple[Clause, ...]:
    """The plan's terms of the direct ``is_parallelism_agnostic`` rule: a
    single non-MLA ``FullAttentionSpec`` group whose KV heads are really split
    over TP, without per-token-head quantization, and DCP 1."""
    dcp = _eq("DCP", p.decode_context_parallel_size, 1)
    if len(p.groups) != 1:
        return (Clause(False, f"{len(p.groups)} KV cache groups, not a single full-attention group"), dcp)
    spec = p.groups[0].kv_cache_spec
    if isinstance(spec, MLAAttentionSpec) or not isinstance(spec, FullAttentionSpec):
        why = "MLA" if isinstance(spec, MLAAttentionSpec) else "not FullAttentionSpec"
        return (Clause(False, f"the single group is {_spec_name(spec)} ({why})"), dcp)
    tp, total = p.tensor_parallel_size, p.total_num_kv_heads
    prod = spec.num_kv_heads * tp
    heads = f"{spec.num_kv_heads} KV heads per rank x TP {tp} = {prod}"
    return (
        Clause(True, "a single FullAttentionSpec group"),
        _named(prod == total, f"{heads} == {total} total KV heads",
               f"{heads} != {total} total KV heads (heads replicated across ranks)"),
        _named(not spec.kv_quant_mode.is_per_token_head, "no per-token-head KV quantization",
               f"per-token-head KV quantization ({p.kv_cache_dtype})"),
        dcp,
    )


def uncertifiable(spec, tp: int, total_kv_heads: int) -> str | None:
    """Why a layer spec fails the canonical gate's certification, or None
    (``spec_certifiable`` inside ``build_offloading_config``, a static
    mirror of the per-layer mapping checks)."""
    name = _spec_name(spec)
    if not isinstance(spec, AttentionSpec):
        return f"{name} is not an attention spec"
    if spec.kv_quant_mode.is_per_token_head:
        return f"{name} uses per-token-head KV quantization"
    if type(spec) is MLAAttentionSpec:
        if spec.tokens_per_state != 1:
            return f"MLAAttentionSpec compresses {spec.tokens_per_state} tokens per state"
        if spec.real_page_size_bytes % spec.block_size:
            return (
                f"MLAAttentionSpec page {spec.real_page_size_bytes} B is not a multiple of "
                f"block_size {spec.block_size}"
            )
        return None
    if isinstance(spec, (SlidingWindowMLASpec, MLAAttentionSpec)):
        return f"{name} (an MLA variant) has no canonical mapping"
    if not isinstance(spec, (FullAttentionSpec, SlidingWindowSpec)):
        return f"{name} is neither full nor sliding-window attention"
    if not (total_kv_heads % tp == 0 or tp % total_kv_heads == 0):
        return f"TP {tp} and {total_kv_heads} total KV heads do not divide one another"
    expected = max(1, total_kv_heads // tp)
    if spec.num_kv_heads != expected:
        return (
            f"{name} has {spec.num_kv_heads} KV heads per rank, expected max(1, "
            f"{total_kv_heads} // TP {tp}) = {expected}"
        )
    return None


def canonical_certification(p: Plan) -> Clause:
    """Every layer spec of every group certifiable (:func:`uncertifiable`),
    the plan's term of the ``canonical_layout`` gate."""
    tp, total = p.tensor_parallel_size, p.total_num_kv_heads
    specs = [s for g in p.groups for s in leaf_specs(g.kv_cache_spec)]
    whys = [uncertifiable(s, tp, total) for s in specs]
    failures = Counter(why for why in whys if why is not None)
    if failures:
        return Clause(False, "; ".join(f"{n} layer(s): {why}" for why, n in failures.items()))
    return Clause(True, f"all {len(specs)} layer specs certifiable (canonical mapping derivable)")


def _v1_runner(o: OffloadOptions) -> Clause:
    """The direct rule's first term: the V1 model runner, which a release
    without one (no ``VllmConfig.use_v2_model_runner``) never runs."""
    if not release.has_v1_model_runner():
        return Clause(False, f"V2 model runner ({release_name()} has no other)")
    return _named(not o.use_v2_model_runner, "V1 model runner", "V2 model runner")


def is_parallelism_agnostic(p: Plan, o: OffloadOptions, world: int, canonical: bool) -> Derived:
    """``is_parallelism_agnostic``: the direct rule (V1 model runner,
    :func:`single_full_attention_group`'s terms, PCP 1), widened by the
    canonical layout gate to every config whose layers all certify
    (:func:`canonical_certification`), with no context parallelism and
    world size == TP."""
    pcp, tp = o.prefill_context_parallel_size, p.tensor_parallel_size
    direct = verdict(
        (
            _v1_runner(o),
            *single_full_attention_group(p),
            _eq("PCP", pcp, 1),
        )
    )
    if not canonical:
        return direct
    if direct.value:
        return Derived(True, f"direct rule holds, canonical layout kept it: {direct.rule}")
    gate = verdict(
        (
            canonical_certification(p),
            _eq("DCP", p.decode_context_parallel_size, 1),
            _eq("PCP", pcp, 1),
            _eq("world size", world, tp, f"TP {tp}"),
        )
    )
    return Derived(gate.value, f"canonical layout gate: {gate.rule} (direct rule: {direct.rule})")


def canonical_replicated_layout(
    p: Plan, o: OffloadOptions, world: int, backend: str, agnostic: bool
) -> Derived:
    """``replicated_layout`` under the canonical layout: parallelism-agnostic,
    every offloaded layer exactly ``MLAAttentionSpec``, one node, and one
    worker or ``mp``."""
    single_host = world == 1 or backend == "mp"
    not_mla = sorted(
        {_spec_name(s) for g in _offloaded(p) for s in leaf_specs(g.kv_cache_spec)
         if type(s) is not MLAAttentionSpec}
    )
    rule = verdict(
        (
            _named(agnostic, "parallelism-agnostic", "not parallelism-agnostic"),
            _named(not not_mla, "every offloaded layer is MLAAttentionSpec",
                   f"offloaded layers include {', '.join(not_mla)} (not pure MLAAttentionSpec)"),
            _eq("nnodes_within_dp", o.nnodes_within_dp, 1),
            Clause(
                single_host,
                f"world size {world} with executor backend {backend!r}"
                + (" (single process or mp)" if single_host else ": needs world size 1 or 'mp'"),
            ),
        )
    )
    return Derived(rule.value, f"canonical layout rule: {rule.rule}")


def cache_dtype(p: Plan) -> Derived:
    """``model.dtype``: the KV cache dtype, the model dtype under ``auto``,
    without the ``torch.`` prefix."""
    if p.kv_cache_dtype == "auto":
        return Derived(p.model_dtype, f"kv_cache_dtype 'auto' follows the model dtype ({p.model_dtype})")
    return Derived(p.kv_cache_dtype, f"kv_cache_dtype {p.kv_cache_dtype!r}")


@dataclass(frozen=True, slots=True)
class Derivation:
    """Every value ``build_offloading_config`` derives for one plan and
    options, each a :class:`Derived` (per group: a tuple in ``groups`` order),
    and the plan's parallel sizes it read."""

    world_size: Derived
    distributed_executor_backend: Derived
    data_parallel_rank_local: Derived
    groups: Derived
    tokens_per_block: tuple[Derived, ...]
    tokens_per_hash: Derived
    blocks_per_chunk: Derived
    sliding_window_size_in_chunks: tuple[Derived, ...]
    worker_kv_bytes_per_block: Derived
    replicated_layout: Derived
    canonical_layout: Derived
    is_parallelism_agnostic: Derived
    dtype: Derived
    parallel_sizes: ParallelSizes


def derive(p: Plan, o: OffloadOptions) -> Derivation:
    """``build_offloading_config`` for plan ``p`` and options ``o``, in vLLM's
    order, at the plan's parallel sizes (:meth:`ParallelSizes.of`).

    Raises ``KVExploreError`` for inputs vLLM's ``ParallelConfig`` rejects and
    :class:`OffloadConfigError` (a ``ValueError``) where
    ``build_offloading_config`` raises or asserts.
    """
    if not isinstance(p, Plan):
        raise KVExploreError(
            f"offload_config expects a kvexplore.Plan (from kvexplore.plan(model, ...)); "
            f"got {type(p).__name__} {p!r:.80}"
        )
    sizes = ParallelSizes.of(p)
    o.check_parallel(sizes)
    world, backend, local_rank = parallel_layout(o, sizes)
    groups = offloading_groups(p)
    tpb = tokens_per_block(p)
    hashing = tokens_per_hash(p)
    tpb_values = tuple(t.value for t in tpb)
    try:
        bpc, refused = blocks_per_chunk(o.extra_config, groups.value, tpb_values), None
    except OffloadConfigError as exc:
        if exc.code not in STRICTER_CODES:
            raise
        # vLLM goes on with the value its int() gives: a refusal of its own
        # that comes later in build_offloading_config is the one raised
        refused = exc
        bpc = blocks_per_chunk(o.extra_config, groups.value, tpb_values, stricter=False)
    try:
        if release.offloading_has_windows():
            windows = tuple(
                sliding_window_size_in_chunks(gid, leaf_specs(p.groups[gid].kv_cache_spec)[0], t,
                                              bpc.value)
                for gid, t in zip(groups.value, tpb_values, strict=True)
            )
        else:
            windows = tuple(Derived(None, f"{release_name()} keeps no window per group")
                            for _ in groups.value)
    except OffloadConfigError as exc:
        # no block per chunk: vLLM divides by zero, kvexplore names the block_size
        if refused is None or exc.code != "zero_chunk":
            raise
    if refused is not None:
        raise refused
    wbytes = worker_kv_bytes_per_block(p)
    replicated = replicated_layout(p, o, sizes, world.value, backend.value, wbytes.value)
    canonical = canonical_layout(o.extra_config)
    agnostic = is_parallelism_agnostic(p, o, world.value, canonical.value)
    if canonical.value:
        replicated = canonical_replicated_layout(p, o, world.value, backend.value, agnostic.value)
    return Derivation(
        world_size=world,
        distributed_executor_backend=backend,
        data_parallel_rank_local=local_rank,
        groups=groups,
        tokens_per_block=tpb,
        tokens_per_hash=hashing,
        blocks_per_chunk=bpc,
        sliding_window_size_in_chunks=windows,
        worker_kv_bytes_per_block=wbytes,
        replicated_layout=replicated,
        canonical_layout=canonical,
        is_parallelism_agnostic=agnostic,
        dtype=cache_dtype(p),
        parallel_sizes=sizes,
    )


__all__ = [
    "Clause",
    "Derivation",
    "Derived",
    "OffloadConfigError",
    "STRICTER_CODES",
    "derive",
    "group_bytes_per_block",
    "verdict",
]
