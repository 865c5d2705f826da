"""Capacity: how much KV cache a named GPU holds, how many requests of a length
fit, what a repeated prompt reuses, and what the CPU tier holds.

:func:`capacity` answers for one :class:`~kvexplore.Plan` and a
``gpu_memory_utilization``, mirroring vLLM's start-up accounting:

1. Requested memory (``vllm/v1/worker/utils.py: request_memory``):
   ``ceil(total_memory x gpu_memory_utilization)``.
2. KV cache memory (``vllm/v1/worker/gpu_worker.py:
   Worker.determine_available_memory``): requested minus the weights (exact),
   the activation peak of the profile run, the non-torch memory and the
   CUDA-graph estimate, each of the last three an overridable ESTIMATE with its
   source (:func:`profile_estimates`, :mod:`kvexplore.planning.profile`).
   ``kv_cache_memory_bytes`` skips all of it, as vLLM's ``--kv-cache-memory-bytes`` does.
3. Blocks, tokens and concurrency through vLLM's own functions, wherever the
   release keeps them (:mod:`kvexplore.planning.release`): ``num_blocks``
   = memory // the pool bytes of one block id, as ``get_kv_cache_configs``
   (``kv_cache_planning.py``; before 0.33, ``kv_cache_utils.py``) divides;
   ``kv_cache_utils.py: get_kv_cache_capacity`` for the logged ``GPU KV cache size: N tokens`` and ``Maximum concurrency``;
   ``_estimate_max_model_len_from_groups`` for the largest ``max_model_len``
   that fits, the estimate vLLM prints when a length does not fit.
4. Prefix caching (``kv_cache_manager.py: get_computed_blocks``, the
   coordinators and ``kv_cache_utils.py: resolve_kv_cache_block_sizes`` /
   ``resolve_cache_hit_alignment_tokens``): a repeat of an ``n``-token prompt
   reuses ``((n - 1) // A) x A`` tokens, ``A`` the cache-hit alignment: the
   last prompt token is always recomputed (``max_cache_hit_length =
   num_tokens - 1``), hits are whole alignment units, and in Mamba ``align``
   mode the scheduler ends a prefill chunk (or the kernel exports a
   checkpoint) at ``get_mamba_prefill_checkpoint_position`` = that same
   boundary, so the state a repeat needs is cached.
5. DCP: which groups span ``block_size x DCP`` tokens per block
   (``resolve_dcp_kv_block_size``) and the blocks one request of
   ``max_model_len`` pins per group (``max_memory_usage_bytes / page``).
6. With ``cpu_bytes_to_use``, the CPU tier through
   :func:`kvexplore.offloading.sizing.host_sizing`.

>>> import kvexplore
>>> r = kvexplore.capacity("Qwen/Qwen3.5-0.8B", gpu="A100", max_model_len=32768)
>>> r.block_size, r.cache_hit_alignment, r.prefix_hit_tokens(544), r.prefix_hit_tokens(545)
(544, 544, 0, 544)
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import (
    FrozenDict,
    GiB,
    cdiv,
    check_int,
    jsonable,
    requested_memory,
)
from kvexplore.memo import per_plan
from kvexplore.planning import release, startup
from kvexplore.planning.admission import blocks_and_admission, largest_max_model_len
from kvexplore.planning.gpus import DEFAULT_GPU
from kvexplore.planning.inputs import PLAN_DEFAULTS, as_fraction, check_keywords
from kvexplore.planning.models import load_model_config
from kvexplore.planning.planner import Plan, plan
from kvexplore.planning.profile import Term, kv_cache_memory_range
from kvexplore.planning.release import release_name

if TYPE_CHECKING:
    from kvexplore.offloading.sizing import HostSizing


def profile_estimates(p: Plan) -> dict[str, tuple[int, int, str]]:
    """``(low, high, source)`` bytes per rank of every term vLLM's
    ``determine_available_memory`` subtracts, for plan ``p`` on its GPU
    (:func:`kvexplore.planning.profile.memory_terms`): ``total_memory_bytes``
    (what ``torch.cuda.mem_get_info()`` reports, per card,
    :func:`kvexplore.gpus`), ``weight_bytes`` (exact),
    ``activation_peak_bytes``, ``non_torch_bytes``, ``cudagraph_bytes``."""
    out = {name: (t.low, t.high, t.source) for name, t in p.memory_terms().items()}
    leaves_out = p.memory_profile().leaves_out
    if p.request.kv_cache_memory_bytes is None and leaves_out:
        low, high, source = out["activation_peak_bytes"]
        out["activation_peak_bytes"] = (low, high, source + "; leaves out " + ", ".join(leaves_out))
    return out


#: The memory terms a :class:`Calibration` can carry, in ``determine_available_memory``'s order.
CALIBRATED_TERMS = ("total_memory_bytes", "weight_bytes", "activation_peak_bytes",
                    "non_torch_bytes", "cudagraph_bytes")


@dataclass(frozen=True, kw_only=True)
class Calibration(Displayable):
    """Memory terms measured on one machine and vLLM release (one start-up
    log: :func:`kvexplore.calibrate`), for :func:`capacity` to answer other
    deployments from.

    Each term of :data:`CALIBRATED_TERMS` is bytes per rank, or None when not
    known; ``sources`` says for each where it comes from (the log line that
    states it, the residual the log implies, or kvexplore's estimate).
    ``measured`` names the terms the log states or implies (the others are
    kvexplore's estimates and are recomputed for any deployment).  ``model``,
    ``gpu``, ``tensor_parallel_size``, ``quantization`` and
    ``max_num_batched_tokens`` describe the deployment measured; ``release``
    the vLLM release that printed the log; ``gpu_memory_utilization`` and
    ``kv_cache_memory_bytes`` what it ran at and found.

    :func:`capacity` carries a measured term to a deployment when it applies
    there: the total, non-torch memory (same TP) and CUDA graphs on the same
    GPU, for any model; weights and the activation peak for the same model,
    TP and quantization (the activation peak rescaled by kvexplore's estimate
    when ``max_num_batched_tokens`` differs); every other term is recomputed.
    """

    model: str | None
    gpu: str
    release: str | None
    tensor_parallel_size: int = 1
    quantization: str | None = None
    max_num_batched_tokens: int | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None
    total_memory_bytes: int | None = None
    weight_bytes: int | None = None
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None
    cudagraph_bytes: int | None = None
    estimated_activation_peak_bytes: int | None = None
    measured: tuple[str, ...] = ()
    sources: FrozenDict = field(default_factory=FrozenDict, compare=False)

    @property
    def table(self) -> pd.DataFrame:
        """One row per term: bytes, GiB, measured or not, source."""
        rows = [{"term": name, "bytes": getattr(self, name),
                 "GiB": None if getattr(self, name) is None else round(getattr(self, name) / GiB, 3),
                 "measured": name in self.measured, "source": self.sources.get(name, "")}
                for name in CALIBRATED_TERMS]
        return pd.DataFrame(rows, columns=["term", "bytes", "GiB", "measured", "source"])

    def explain(self) -> str:
        head = (f"calibration: {self.model or 'model not named'} on {self.gpu}, TP "
                f"{self.tensor_parallel_size}, measured by vLLM {self.release or '(release not stated)'}")
        return "\n".join([head] + [f"{name}: {self.sources.get(name, 'not known')}"
                                   for name in CALIBRATED_TERMS])


def _calibrated_terms(p: Plan, c: Calibration, given: dict) -> tuple[dict, dict, dict]:
    """The terms :func:`capacity` takes from calibration ``c`` for plan ``p``
    (those the caller did not give), their sources, and for every term
    whether it was ``carried``, ``rescaled`` or ``recomputed``."""
    if c.gpu != p.gpu.name:
        raise KVExploreError(
            f"calibration={c.gpu!r} measures a {c.gpu}, but the deployment asked about runs on "
            f"a {p.gpu.name}; expected gpu={c.gpu!r} (a calibration carries one machine's terms)")
    same_model = (c.model == p.model.name and c.tensor_parallel_size == p.tensor_parallel_size
                  and (c.quantization or None) == (p.request.quantization or c.quantization or None))
    tokens = int(p.vllm_config.scheduler_config.max_num_batched_tokens)
    where = (f"{c.model or 'a model'} on {c.gpu} TP {c.tensor_parallel_size}, vLLM "
             f"{c.release or '(release not stated)'}")
    values, sources, how = {}, {}, {}
    for name in CALIBRATED_TERMS:
        measured = getattr(c, name)
        if given[name] is not None:
            how[name] = "given"
            continue
        if name not in c.measured or measured is None:
            how[name] = "recomputed"
            continue
        if name in ("weight_bytes", "activation_peak_bytes") and not same_model:
            how[name] = "recomputed"
            continue
        if name == "non_torch_bytes" and c.tensor_parallel_size != p.tensor_parallel_size:
            how[name] = "recomputed"
            continue
        if (name == "activation_peak_bytes" and c.max_num_batched_tokens not in (None, tokens)
                and c.estimated_activation_peak_bytes):
            estimate = p.memory_terms()["activation_peak_bytes"].high
            values[name] = round(measured * estimate / c.estimated_activation_peak_bytes)
            sources[name] = (
                f"rescaled: {values[name]:,} = measured {measured:,} x kvexplore's estimate "
                f"{estimate:,} at max_num_batched_tokens={tokens} / "
                f"{c.estimated_activation_peak_bytes:,} at {c.max_num_batched_tokens} ({where})")
            how[name] = "rescaled"
            continue
        values[name] = measured
        sources[name] = f"carried: {measured:,} from {where}: {c.sources.get(name, 'measured')}"
        how[name] = "carried"
    return values, sources, how


# ---------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CapacityReport(Displayable):
    """vLLM's capacity for one plan on its GPU: memory, blocks, tokens,
    concurrency, prefix-cache reuse, DCP and (optionally) the CPU tier.

    Memory fields are bytes per rank.  ``kv_cache_memory`` is the low end of
    ``kv_cache_memory_range``: the total's low end minus each estimated
    term's high end, so it is never above what vLLM would find; the memory
    terms shown are the ones it subtracts.  ``estimated`` names the fields
    that are estimates (not given by the caller); ``sources`` says where each
    memory figure comes from.  ``plan`` is the plan asked about (re-planned
    with ``kv_cache_memory_bytes`` only when ``max_model_len=-1`` asks vLLM to
    auto-fit the length to the memory).

    Fields, each with the vLLM function it mirrors (``vllm/v1/...``):

    Memory (``gpu_worker.py: Worker.determine_available_memory``; all zero
    but ``weight_bytes`` when ``kv_cache_memory_bytes`` is given, as vLLM
    then skips profiling):

    * ``plan``: the :class:`~kvexplore.Plan` answered for.
    * ``gpu_memory_utilization``: the fraction of the card vLLM may use
      (``CacheConfig.gpu_memory_utilization``; the plan's, vLLM's 0.92 by
      default, or a calibration's).
    * ``total_memory_bytes``: the card's memory as
      ``torch.cuda.mem_get_info()`` reports it (:func:`kvexplore.gpus`), or
      the value given.
    * ``requested_memory_bytes``: ``ceil(total_memory_bytes x
      gpu_memory_utilization)`` (``worker/utils.py: request_memory``).
    * ``weight_bytes``: the model's weights (and a drafter's) on this rank
      (``model_runner.model_memory_usage``); exact.
    * ``activation_peak_bytes``: the peak activation memory of the dummy
      forward and sampler of ``profile_run``; an estimate unless given
      (:mod:`kvexplore.planning.profile`).
    * ``non_torch_bytes``: memory outside torch's allocator (cuBLAS
      workspaces, NCCL buffers at TP > 1); an estimate unless given.
    * ``cudagraph_bytes``: the CUDA-graph pool
      (``profile_cudagraph_memory``); an estimate unless given.
    * ``kv_cache_memory``: the bytes left to the KV cache, the low end of
      ``kv_cache_memory_range``; ``kv_cache_memory_given``: whether the caller
      gave it (``kv_cache_memory_bytes``) instead.
    * ``kv_cache_memory_range``: ``(low, high)`` bytes the estimates allow
      (:func:`kvexplore.planning.profile.kv_cache_memory_range`).
    * ``estimated``: the names of the memory fields that are estimates;
      ``sources``: each memory field -> where its value comes from.

    Blocks, tokens and admission (``get_kv_cache_configs`` in
    ``core/kv_cache_planning.py``, before that ``core/kv_cache_utils.py``):

    * ``bytes_per_block``: the bytes one block id costs in the pool, the
      release's own divisor
      (:func:`kvexplore.planning.release.pool_bytes_per_block`).
    * ``num_blocks``: ``kv_cache_memory // bytes_per_block``.
    * ``max_model_len``: the deployment's length in tokens (after auto-fit);
      ``model_max_model_len``: the model config's own.
    * ``kv_cache_size_tokens``, ``max_concurrency``: what vLLM logs as
      ``GPU KV cache size: N tokens`` and ``Maximum concurrency for L tokens
      per request`` (``kv_cache_utils.py: get_kv_cache_capacity``).
    * ``admitted``, ``admission_message``: the verdict of
      ``_check_enough_kv_cache_memory`` on one request of ``max_model_len``,
      and vLLM's error text when it refuses (else None).
    * ``largest_max_model_len``: the longest request the memory admits
      (``_estimate_max_model_len_from_groups``), in tokens.

    Prefix caching (``core/kv_cache_utils.py: resolve_kv_cache_block_sizes``,
    ``resolve_cache_hit_alignment_tokens``; :meth:`prefix_hit_tokens`):

    * ``prefix_caching``: ``CacheConfig.enable_prefix_caching``;
      ``mamba_cache_mode``: ``CacheConfig.mamba_cache_mode``.
    * ``block_size``: the block size in tokens the engine core sets
      (``EngineCore._initialize_kv_caches``).
    * ``scheduler_block_size``, ``hash_block_size``: the tokens per block of
      the scheduler and of the prefix-cache hash.
    * ``cache_hit_alignment``: the tokens a cache hit comes in whole units of.

    The rest:

    * ``warnings``: one line each for what limits the answer (prefix caching
      off or unable to hit, DCP with Mamba groups, vLLM's refusal).
    * ``host``: the CPU tier with ``cpu_bytes_to_use``
      (:class:`~kvexplore.offloading.sizing.HostSizing`,
      :func:`~kvexplore.offloading.sizing.host_sizing`), else None.
    * ``calibrated``: with a :class:`Calibration`, each memory term ->
      ``"carried"``, ``"rescaled"`` or ``"recomputed"``.
    """

    plan: Plan = field(repr=False, compare=False)
    gpu_memory_utilization: float
    total_memory_bytes: int
    requested_memory_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    kv_cache_memory: int
    kv_cache_memory_range: tuple[int, int]
    kv_cache_memory_given: bool
    estimated: tuple[str, ...]
    sources: FrozenDict = field(repr=False, compare=False)
    bytes_per_block: int
    num_blocks: int
    max_model_len: int
    model_max_model_len: int
    kv_cache_size_tokens: int
    max_concurrency: float
    admitted: bool
    admission_message: str | None
    largest_max_model_len: int
    prefix_caching: bool
    mamba_cache_mode: str
    block_size: int
    scheduler_block_size: int
    hash_block_size: int
    cache_hit_alignment: int
    warnings: tuple[str, ...]
    host: HostSizing | None = field(default=None, compare=False)
    calibrated: FrozenDict = field(default_factory=FrozenDict, compare=False)
    _vllm: Any = field(default=None, repr=False, compare=False)

    # -- prefix caching --------------------------------------------------------
    @property
    def smallest_hit_prompt(self) -> int | None:
        """Shortest prompt whose repeat hits the cache (``A + 1`` tokens: ``A``
        reused, the last one recomputed); None when no prompt can hit."""
        if not self.prefix_caching or self.cache_hit_alignment + 1 > self.max_model_len:
            return None
        return self.cache_hit_alignment + 1

    def prefix_hit_tokens(self, n: int) -> int:
        """Tokens a repeat of an ``n``-token prompt takes from the prefix cache
        (``num_computed_tokens`` after ``get_computed_blocks``), with the first
        run's blocks still cached."""
        check_int("n (prompt tokens)", n)
        if n > self.max_model_len:
            raise KVExploreError(
                f"n={n} is invalid; expected a prompt of at most max_model_len="
                f"{self.max_model_len} tokens (vLLM rejects longer prompts)"
            )
        if not self.prefix_caching:
            return 0
        a = self.cache_hit_alignment
        return (n - 1) // a * a

    def prefix_table(self, lengths: Iterable[int]) -> pd.DataFrame:
        """One row per prompt length: tokens reused by a repeat, recomputed, share."""
        rows = []
        for n in lengths:
            hit = self.prefix_hit_tokens(n)
            rows.append({"prompt_tokens": n, "cached_tokens": hit,
                         "recomputed_tokens": n - hit, "cached_share": hit / n})
        return pd.DataFrame(rows)

    # -- concurrency -------------------------------------------------------------
    def requests_of_length(self, n: int) -> float:
        """Requests of ``n`` tokens the cache holds at once: vLLM's
        ``get_max_concurrency_for_kv_cache_config`` with ``max_model_len = n``
        (every group's blocks for ``n`` tokens drawn from one pool)."""
        check_int("n (tokens per request)", n)
        from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

        vc, cfg = self._vllm
        return get_max_concurrency_for_kv_cache_config(_with_max_model_len(vc, n), cfg)

    @cached_property
    def group_table(self) -> pd.DataFrame:
        """Per KV cache group: kind, layers, block size, the tokens one block
        spans under DCP and whether DCP scales it, and the blocks and bytes one
        request of ``max_model_len`` pins."""
        from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        vc, cfg = self._vllm
        dcp = vc.parallel_config.decode_context_parallel_size
        rows = []
        for gid, g in enumerate(cfg.kv_cache_groups):
            spec = g.kv_cache_spec
            span = resolve_dcp_kv_block_size(spec, dcp)
            blocks = cdiv(spec.max_memory_usage_bytes(vc), spec.page_size_bytes)
            rows.append({
                "group": gid,
                "kind": get_kv_cache_spec_kind(spec).value,
                "layers": len(g.layer_names),
                "block_size": spec.block_size,
                "tokens_per_block": span,
                "dcp_scaled": span != spec.block_size or (dcp > 1 and bool(spec.dcp_sharded)),
                "blocks_per_request": blocks,
                "bytes_per_request": blocks * self.bytes_per_block,
            })
        return pd.DataFrame(rows)

    @property
    def blocks_per_request(self) -> int:
        """Blocks one request of ``max_model_len`` pins, all groups together."""
        return int(self.group_table.blocks_per_request.sum())

    # -- views -------------------------------------------------------------------
    @cached_property
    def summary(self) -> pd.DataFrame:
        rows = [
            ("model", self.plan.model.name),
            ("gpu", str(self.plan.gpu)),
            ("tensor_parallel_size", self.plan.tensor_parallel_size),
            ("decode_context_parallel_size", self.plan.decode_context_parallel_size),
            ("gpu_memory_utilization", self.gpu_memory_utilization),
            ("total_memory_bytes", self.total_memory_bytes),
            ("requested_memory_bytes", self.requested_memory_bytes),
            ("weight_bytes", self.weight_bytes),
            ("activation_peak_bytes", self.activation_peak_bytes),
            ("non_torch_bytes", self.non_torch_bytes),
            ("cudagraph_bytes", self.cudagraph_bytes),
            ("kv_cache_memory", self.kv_cache_memory),
            ("kv_cache_memory_high", self.kv_cache_memory_range[1]),
            ("bytes_per_block", self.bytes_per_block),
            ("num_blocks", self.num_blocks),
            ("block_size", self.block_size),
            ("max_model_len", self.max_model_len),
            ("kv_cache_size_tokens", self.kv_cache_size_tokens),
            ("max_concurrency", round(self.max_concurrency, 4)),
            ("blocks_per_request", self.blocks_per_request),
            ("admitted", self.admitted),
            ("largest_max_model_len", self.largest_max_model_len),
            ("prefix_caching", self.prefix_caching),
            ("cache_hit_alignment", self.cache_hit_alignment),
            ("smallest_hit_prompt", self.smallest_hit_prompt),
        ]
        if self.host is not None:
            rows += [
                ("cpu_bytes_to_use", self.host.cpu_bytes_to_use),
                ("host_bytes_per_block", round(self.host.host_bytes_per_block, 1)),
                ("host_bytes_per_token", round(self.host.host_bytes_per_token, 1)),
                ("host_tokens", self.host.tokens),
            ]
        return pd.DataFrame(rows, columns=["quantity", "value"])

    @cached_property
    def derivation(self) -> FrozenDict:
        """How each number came about, by name."""
        return FrozenDict(_derivation(self))

    def explain(self) -> str:
        """Every number with its rule and inputs, one line each."""
        lines = [f"{k}: {v}" for k, v in self.derivation.items()]
        if self.host is not None:
            lines += [f"host.{line}" for line in self.host.explain().splitlines()]
        lines += [f"warning: {w}" for w in self.warnings]
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        out = {k: jsonable(v) for k, v in zip(self.summary.quantity, self.summary.value, strict=True)}
        out["estimated"] = list(self.estimated)
        out["sources"] = dict(self.sources)
        out["admission_message"] = self.admission_message
        out["groups"] = [jsonable(r) for r in self.group_table.to_dict("records")]
        out["warnings"] = list(self.warnings)
        out["derivation"] = dict(self.derivation)
        if self.host is not None:
            out["host"] = jsonable(self.host.to_dict())
        return out


# ---------------------------------------------------------------------------
# capacity()
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Facts:
    """What a plan's capacity answers share whatever the memory."""

    vc: Any
    cfg: Any
    pool_bytes: int
    scheduler_bs: int
    hash_bs: int
    alignment: int


def _plan_facts(p: Plan) -> _Facts:
    """vLLM's scheduler ``KVCacheConfig`` of ``p``, the bytes one block id
    costs in the pool (:func:`kvexplore.planning.release.pool_bytes_per_block`,
    the release's own divisor) and the prefix-cache block sizes."""
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        resolve_kv_cache_block_sizes,
    )

    from kvexplore.planning.emulation import emulate

    cfg = generate_scheduler_kv_cache_config([p.kv_cache_config])
    vc = _engine_block_size(p.vllm_config, cfg)
    with emulate(p.gpu, meta_tensors=False):
        pool = release.pool_bytes_per_block(vc, list(cfg.kv_cache_groups))
    scheduler_bs, hash_bs = resolve_kv_cache_block_sizes(cfg, vc)
    alignment = release.cache_hit_alignment_tokens(cfg, vc, scheduler_bs, hash_bs)
    return _Facts(vc, cfg, int(pool), int(scheduler_bs), int(hash_bs), int(alignment))


def _engine_block_size(vc, cfg):
    """``vc``, or a copy of it whose ``cache_config.block_size`` is the one
    ``EngineCore._initialize_kv_caches`` (``vllm/v1/engine/core.py``) sets
    from the scheduler's ``KVCacheConfig`` ``cfg`` before the scheduler
    resolves its block sizes: the smallest block size of the prefix-cacheable
    groups (of every group when none is).  It differs from the plan's only
    where no group blocks at the configured size (an attention-free model,
    whose one Mamba group blocks at its own size, not the configured 16)."""
    groups = cfg.kv_cache_groups
    if not groups:
        return vc
    participating = [g.kv_cache_spec.block_size for g in groups
                     if g.kv_cache_spec.prefix_cacheable]
    block_size = min(participating or [g.kv_cache_spec.block_size for g in groups])
    if block_size == vc.cache_config.block_size:
        return vc
    vc = copy.copy(vc)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.block_size = block_size
    return vc


def _with_max_model_len(vc, n: int):
    """A copy of ``vc`` whose ``model_config.max_model_len`` is ``n``."""
    vc = copy.copy(vc)
    vc.model_config = copy.copy(vc.model_config)
    vc.model_config.max_model_len = n
    return vc


def _vllm_answers(p: Plan, available: int, total: int, util: float) -> dict[str, Any]:
    """The report's fields for ``available`` bytes, each by vLLM's own
    function on ``p``'s config: blocks and admission as the plan's own
    (:func:`kvexplore.planning.admission.blocks_and_admission`),
    ``get_kv_cache_capacity``, and ``_estimate_max_model_len_from_groups`` for
    the longest request the memory admits; the memory-independent half is
    computed once per plan.  The verdict is the whole start-up's
    (:mod:`kvexplore.planning.startup`): ``request_memory`` on a card of
    ``total`` bytes at ``util``, the memory check, and the checks on the KV
    cache config with these blocks (the CUDA-graph mode's Mamba-blocks rule)."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

    f = per_plan(p, ("capacity",), lambda: _plan_facts(p))
    vc, cc, groups = f.vc, f.vc.cache_config, list(f.cfg.kv_cache_groups)
    mml = vc.model_config.max_model_len
    num_blocks, admission = blocks_and_admission(vc, groups, f.pool_bytes, available)
    cfg = dataclasses.replace(f.cfg, num_blocks=num_blocks)
    admission = admission.with_checks(
        before=(startup.request_memory(cc, total, p.request.gpu_memory_in_use, util),),
        after=p.checks_after_kv_cache(cfg))
    tokens, concurrency = get_kv_cache_capacity(vc, cfg)
    message, check_memory = admission.message, admission.available_bytes
    probe = _with_max_model_len(vc, max(p.model_max_model_len, mml))
    largest = largest_max_model_len(probe, groups, f.pool_bytes, check_memory)
    return {
        "bytes_per_block": f.pool_bytes, "num_blocks": int(num_blocks), "max_model_len": int(mml),
        "model_max_model_len": p.model_max_model_len, "kv_cache_size_tokens": int(tokens),
        "max_concurrency": float(concurrency), "admitted": admission.ok,
        "admission_message": message, "largest_max_model_len": int(largest),
        "prefix_caching": bool(cc.enable_prefix_caching),
        "mamba_cache_mode": str(cc.mamba_cache_mode), "block_size": int(cc.block_size),
        "scheduler_block_size": f.scheduler_bs, "hash_block_size": f.hash_bs,
        "cache_hit_alignment": f.alignment, "warnings": tuple(_warnings(f, message)),
        "_vllm": (vc, cfg),
    }


def shared_prefix_hit_tokens(p: Plan, shared_prefix: int, prompt_tokens: int | None = None) -> int:
    """Tokens of a ``shared_prefix`` a later request takes from vLLM's prefix
    cache, by vLLM's own ``Scheduler`` and ``KVCacheManager``
    (``vllm/v1/core/sched/scheduler.py``, ``kv_cache_manager.py:
    get_computed_blocks``) on the CPU, with plan ``p``'s configs (the block
    size the engine core sets, the scheduler's ``KVCacheConfig``:
    :func:`_engine_block_size`).

    A first request of ``prompt_tokens`` tokens (default: the prefix and one
    more) runs to completion, chunked as the scheduler chunks it; a second of
    the same length sharing only the first ``shared_prefix`` tokens is
    scheduled, and its ``num_computed_tokens`` is the answer.  The block pool
    holds the plan's blocks, capped at what the two requests can touch (the
    answer is the same: nothing is evicted either way).  0 when the plan has
    prefix caching off."""
    if shared_prefix <= 0:
        return 0
    prompt = prompt_tokens if prompt_tokens is not None else shared_prefix + 1
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from kvexplore.planning.emulation import patch_attributes

    init_none_hash(sha256)
    f = per_plan(p, ("capacity",), lambda: _plan_facts(p))
    vc, cfg = copy.copy(f.vc), f.cfg
    smallest = min(g.kv_cache_spec.block_size for g in cfg.kv_cache_groups)
    reach = len(cfg.kv_cache_groups) * (2 * (prompt // smallest + 2)) + 16
    cfg = dataclasses.replace(cfg, num_blocks=max(2, min(cfg.num_blocks, reach)))
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.num_gpu_blocks = cfg.num_blocks
    sb, hb = f.scheduler_bs, f.hash_bs
    with patch_attributes([(type(vc.model_config), "supports_multimodal_inputs",
                            property(lambda self: False))]):
        s = Scheduler(vllm_config=vc, kv_cache_config=cfg,
                      structured_output_manager=StructuredOutputManager(vc),
                      block_size=sb, hash_block_size=hb)
    hasher = get_request_block_hasher(hb, sha256)
    first = list(range(1, prompt + 1))
    second = first[:shared_prefix] + [t + prompt for t in first[shared_prefix:]]
    reused = 0
    for n, tokens in enumerate((first, second)):
        req = Request(f"kvexplore-probe-{n}", tokens, SamplingParams(max_tokens=1), None,
                      block_hasher=hasher)
        s.add_request(req)
        scheduled_first = True
        while s.has_unfinished_requests():
            out = s.schedule()
            if scheduled_first and out.scheduled_new_reqs:
                reused = out.scheduled_new_reqs[0].num_computed_tokens
                scheduled_first = False
            ids = list(out.num_scheduled_tokens)
            if not ids:
                raise KVExploreError(
                    f"vLLM's scheduler could not schedule a {prompt}-token request in "
                    f"{cfg.num_blocks} blocks; expected a cache that holds it")
            done = req.num_computed_tokens >= prompt
            s.update_from_output(out, release.model_runner_output(
                ids, [[7] if done else [] for _ in ids]))
    return int(min(reused, shared_prefix))


def check_capacity_keywords(kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword of :func:`capacity` that is neither one of its own
    nor a :func:`kvexplore.plan` keyword (``gpu`` included), naming it, the
    nearest spellings (``difflib``) and where the full lists are."""
    check_keywords("capacity()", kwargs,
                   dict.fromkeys([*_CAPACITY_KEYWORDS, "gpu", *PLAN_DEFAULTS]))


def _plan_of(model: Any, plan_kwargs: dict) -> Plan:
    if isinstance(model, Plan):
        return model.replace(**plan_kwargs) if plan_kwargs else model
    if plan_kwargs.get("num_blocks") is not None:
        raise KVExploreError(
            f"num_blocks={plan_kwargs['num_blocks']!r} is invalid here; expected None: "
            "capacity sizes the cache from memory (give kv_cache_memory_bytes to fix it)"
        )
    return plan(model, **plan_kwargs)


def _memory(p: Plan, util: float, given: dict[str, int | None]) -> dict[str, Any]:
    """The report's memory fields: what ``determine_available_memory`` leaves
    the KV cache, as a range (:func:`kvexplore.planning.profile.kv_cache_memory_range`;
    the terms shown are the high ends); a term given by the caller is exact.
    Refuses a utilization that leaves no KV cache memory."""
    terms, estimated, sources = {}, [], {}
    for name, (low, high, source) in profile_estimates(p).items():
        if given[name] is not None:
            low = high = given[name]
            source = f"given: {low:,}"
        elif low != high or source.startswith("ESTIMATE"):
            estimated.append(name)
        terms[name], sources[name] = Term(low, high, source), source
    low, high = kv_cache_memory_range(terms, util, extensible=p.extensible_kv_cache)
    total = terms.pop("total_memory_bytes").low
    requested = requested_memory(total, util)
    highs = {name: int(t.high) for name, t in terms.items()}
    if low <= 0:
        raise KVExploreError(
            f"gpu_memory_utilization={util} of {total:,} B leaves {requested:,} B, "
            f"not enough for {p.model.name}'s {highs['weight_bytes']:,} B of weights per "
            f"rank plus {sum(highs.values()) - highs['weight_bytes']:,} B of "
            "activations, non-torch memory and CUDA graphs (high ends); expected more "
            "memory (raise gpu_memory_utilization or tensor_parallel_size)"
        )
    return {"total_memory_bytes": int(total), "requested_memory_bytes": int(requested), **highs,
            "kv_cache_memory_range": (int(low), int(high)), "estimated": tuple(estimated),
            "sources": FrozenDict(sources)}


def capacity(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    gpu_memory_utilization: float | None = None,
    total_memory_bytes: int | None = None,
    weight_bytes: int | None = None,
    activation_peak_bytes: int | None = None,
    non_torch_bytes: int | None = None,
    cudagraph_bytes: int | None = None,
    cpu_bytes_to_use: int | None = None,
    offload_extra_config: Mapping[str, Any] | None = None,
    calibration: Calibration | None = None,
    **plan_kwargs,
) -> CapacityReport:
    """vLLM's KV cache capacity for ``model`` (an id, a config, or a
    :class:`~kvexplore.Plan`) on one GPU rank, as the module doc lists it.

    ``plan_kwargs`` are :func:`kvexplore.plan`'s (``gpu="H100"``,
    ``tensor_parallel_size``, ``max_model_len``, ...);
    ``gpu_memory_utilization`` defaults to the plan's (vLLM's 0.92).
    ``total_memory_bytes``, ``weight_bytes``, ``activation_peak_bytes``,
    ``non_torch_bytes`` and ``cudagraph_bytes`` replace the
    :func:`profile_estimates` terms with exact figures (vLLM's logged ones).
    ``cpu_bytes_to_use`` adds the CPU offloading tier
    (:func:`kvexplore.offloading.sizing.host_sizing`, with
    ``offload_extra_config`` as ``kv_connector_extra_config``).  Refuses
    ``num_blocks`` with a model (the cache is sized from memory) and a
    utilization that leaves no KV cache memory, and pipeline parallelism
    (the cache is sized over every stage's worker: :func:`kvexplore.plan`).
    A keyword neither capacity() nor :func:`kvexplore.plan` takes is refused
    naming it and the nearest spellings.

    ``calibration`` (a :class:`Calibration`, from :func:`kvexplore.calibrate`
    of a start-up log) replaces the estimated terms with the measured ones
    where they apply (see :class:`Calibration`; ``calibrated`` on the report
    says for each term whether it was carried, rescaled or recomputed); it
    also supplies the GPU and, when none is given, the utilization the log
    ran at.  A calibration from another GPU is refused.
    """
    check_capacity_keywords(plan_kwargs)
    given = {"total_memory_bytes": total_memory_bytes, "weight_bytes": weight_bytes,
             "activation_peak_bytes": activation_peak_bytes,
             "non_torch_bytes": non_torch_bytes, "cudagraph_bytes": cudagraph_bytes}
    gpu_memory_utilization = _checked_inputs(model, plan_kwargs, calibration,
                                             gpu_memory_utilization, given, cpu_bytes_to_use)
    if gpu_memory_utilization is not None and not isinstance(model, Plan):
        plan_kwargs = {**plan_kwargs, "gpu_memory_utilization": gpu_memory_utilization}
    p = _plan_of(model, plan_kwargs)
    if p.pipeline_parallel_size > 1:
        raise KVExploreError(
            f"capacity() answers for one worker's memory, but pipeline_parallel_size="
            f"{p.pipeline_parallel_size} sizes every stage's cache to the fewest blocks of any "
            "stage; expected pipeline_parallel_size=1 (plan() gives that num_blocks)"
        )
    util = (p.gpu_memory_utilization if gpu_memory_utilization is None
            else float(gpu_memory_utilization))
    given_kv = p.request.kv_cache_memory_bytes
    memory, calibrated = _memory_of(p, util, given, calibration)
    available = memory["kv_cache_memory_range"][0]
    if p.request.max_model_len == -1:
        # auto-fit decides max_model_len from the memory: vLLM's own path
        p = p.replace(num_blocks=None, kv_cache_memory_bytes=available)
    answers = _vllm_answers(p, available, memory["total_memory_bytes"]
                            or p.gpu.total_memory_range[0], util)
    host = None
    if cpu_bytes_to_use is not None:
        from kvexplore.offloading.config import offload_config
        from kvexplore.offloading.sizing import host_sizing

        host = host_sizing(offload_config(p, extra_config=offload_extra_config), cpu_bytes_to_use)
    return CapacityReport(plan=p, gpu_memory_utilization=util, kv_cache_memory=available,
                          kv_cache_memory_given=given_kv is not None, host=host,
                          calibrated=FrozenDict(calibrated), **memory, **answers)


def _checked_inputs(model: Any, plan_kwargs: dict, calibration: Calibration | None,
                    gpu_memory_utilization: float | None, given: dict[str, int | None],
                    cpu_bytes_to_use: int | None) -> float | None:
    """:func:`capacity`'s arguments checked, one :class:`KVExploreError` each;
    a calibration supplies the GPU (into ``plan_kwargs``) and, when none is
    given, the utilization, which is returned."""
    if calibration is not None and not isinstance(calibration, Calibration):
        raise KVExploreError(
            f"calibration={calibration!r} is invalid; expected a kvexplore Calibration "
            "(kvexplore.calibrate(log))")
    if calibration is not None:
        if not isinstance(model, Plan):
            plan_kwargs.setdefault("gpu", calibration.gpu)
        if gpu_memory_utilization is None and calibration.gpu_memory_utilization is not None:
            gpu_memory_utilization = calibration.gpu_memory_utilization
    if gpu_memory_utilization is not None:
        as_fraction("gpu_memory_utilization", gpu_memory_utilization)
    for name, value in given.items():
        check_int(name, value, minimum=0, allow_none=True)
    check_int("cpu_bytes_to_use", cpu_bytes_to_use, allow_none=True)
    return gpu_memory_utilization


def _memory_of(p: Plan, util: float, given: dict[str, int | None],
               calibration: Calibration | None) -> tuple[dict[str, Any], dict[str, str]]:
    """``(memory terms, calibrated)``: :func:`_memory` of the plan with the
    given and calibrated terms; with the KV cache memory given to the plan,
    that memory alone (vLLM skips profiling and the utilization)."""
    given_kv = p.request.kv_cache_memory_bytes
    if given_kv is not None:
        return {
            "total_memory_bytes": 0, "requested_memory_bytes": 0,
            "weight_bytes": p.loaded_weight_bytes, "activation_peak_bytes": 0,
            "non_torch_bytes": 0, "cudagraph_bytes": 0,
            "kv_cache_memory_range": (given_kv, given_kv), "estimated": (),
            "sources": FrozenDict({"kv_cache_memory": (
                f"given: kv_cache_memory_bytes={given_kv:,} (vLLM skips memory profiling "
                "and gpu_memory_utilization)")}),
        }, {}
    labels: dict[str, str] = {}
    calibrated: dict[str, str] = {}
    if calibration is not None:
        values, labels, calibrated = _calibrated_terms(p, calibration, given)
        given = {**given, **values}
    memory = _memory(p, util, given)
    if labels:
        memory["sources"] = FrozenDict({**memory["sources"], **labels})
    return memory, calibrated


def _warnings(f: _Facts, admission_message: str | None) -> list[str]:
    from vllm.v1.kv_cache_interface import MambaSpec, iter_layer_specs

    cc = f.vc.cache_config
    warnings = []
    prefix = bool(cc.enable_prefix_caching)
    mml = f.vc.model_config.max_model_len
    if not prefix:
        warnings.append("prefix caching is off (enable_prefix_caching=False): no prompt is ever reused")
    elif f.alignment + 1 > mml:
        warnings.append(
            f"cache hits come in {f.alignment}-token units and the last prompt token is "
            f"recomputed, so a hit needs a prompt of {f.alignment + 1} tokens > "
            f"max_model_len {mml}: prefix caching can never hit"
        )
    dcp = f.vc.parallel_config.decode_context_parallel_size
    if prefix and dcp > 1 and any(isinstance(s, MambaSpec) for g in f.cfg.kv_cache_groups
                                  for s in iter_layer_specs(g.kv_cache_spec)):
        warnings.append(
            f"DCP {dcp} with Mamba groups: {release_name()}'s MambaManager.find_longest_cache_hit "
            "asserts dcp_world_size == 1, so a prefix-cache lookup fails; the hit figures "
            "assume DCP 1"
        )
    if admission_message is not None:
        warnings.append(f"{release_name()} refuses to start: {admission_message}")
    return warnings


def _derivation(r: CapacityReport) -> dict[str, str]:
    p = r.plan
    # where the release keeps get_kv_cache_configs and its pool arithmetic
    planning_file = release.kv_cache_planning().__name__.rsplit(".", 1)[-1] + ".py"
    out: dict[str, str] = {}
    if r.kv_cache_memory_given:
        out["kv_cache_memory"] = r.sources["kv_cache_memory"]
    else:
        out["total_memory_bytes"] = r.sources["total_memory_bytes"]
        out["requested_memory_bytes"] = (
            f"{r.requested_memory_bytes:,} = ceil({r.total_memory_bytes:,} x "
            f"{r.gpu_memory_utilization}) (worker/utils.py: request_memory)"
        )
        for name in ("weight_bytes", "activation_peak_bytes", "non_torch_bytes", "cudagraph_bytes"):
            out[name] = r.sources[name]
        if r.calibrated:
            out["calibration"] = ", ".join(f"{name} {how}" for name, how in r.calibrated.items())
        out["kv_cache_memory"] = (
            f"{r.kv_cache_memory:,} = {r.requested_memory_bytes:,} - {r.weight_bytes:,} weights "
            f"- {r.activation_peak_bytes:,} activations - {r.non_torch_bytes:,} non-torch "
            f"- {r.cudagraph_bytes:,} CUDA graphs (gpu_worker.py: determine_available_memory), "
            f"the low end of {r.kv_cache_memory_range[0]:,}-{r.kv_cache_memory_range[1]:,}"
            + (f"; estimated: {', '.join(r.estimated)}" if r.estimated else "")
        )
    out["num_blocks"] = (
        f"{r.num_blocks:,} = {r.kv_cache_memory:,} // {r.bytes_per_block:,} B per block id "
        f"({planning_file}: get_kv_cache_configs; one block id = one page in every "
        f"tensor of the shared pool)"
    )
    rows = r.group_table
    per_group = " + ".join(f"{b}" for b in rows.blocks_per_request)
    out["blocks_per_request"] = (
        f"{r.blocks_per_request} = {per_group} blocks over {len(rows)} groups for one request "
        f"of {r.max_model_len:,} tokens (cdiv(max_memory_usage_bytes, page) per group)"
    )
    out["max_concurrency"] = (
        f"{r.max_concurrency:.4f} = {r.num_blocks:,} blocks / {r.blocks_per_request} "
        "(kv_cache_utils.py: get_max_concurrency_for_kv_cache_config)"
    )
    out["kv_cache_size_tokens"] = (
        f"{r.kv_cache_size_tokens:,} = int({r.max_concurrency:.4f} x {r.max_model_len:,}) "
        "(get_kv_cache_capacity: the 'GPU KV cache size: N tokens' log line, which counts "
        "Mamba state blocks too, not num_blocks x block_size)"
    )
    out["admitted"] = (
        f"{r.admitted}: " + (f"one request of {r.max_model_len:,} tokens fits"
                             if r.admitted else str(r.admission_message))
    )
    out["largest_max_model_len"] = (
        f"{r.largest_max_model_len:,}: binary search up to the model's "
        f"{r.model_max_model_len:,} ({planning_file}: _estimate_max_model_len_from_groups, "
        "on the memory less the null block)"
    )
    dcp = p.decode_context_parallel_size
    scaled = [int(g) for g, s in zip(rows.group, rows.dcp_scaled, strict=True) if s]
    out["dcp"] = (
        f"DCP {dcp}: groups {scaled} span block_size x {dcp} tokens per block "
        "(resolve_dcp_kv_block_size: dcp_sharded attention); Mamba groups keep their block"
        if dcp > 1 else "DCP 1: no group is scaled"
    )
    if r.prefix_caching:
        out["cache_hit_alignment"] = (
            f"{r.cache_hit_alignment}: scheduler block {r.scheduler_block_size}, hash block "
            f"{r.hash_block_size} (resolve_kv_cache_block_sizes, "
            "resolve_cache_hit_alignment_tokens)"
            + (f"; Mamba mode {r.mamba_cache_mode!r}: the state is checkpointed at "
               "get_mamba_prefill_checkpoint_position" if r.mamba_cache_mode == "align" else "")
        )
        out["prefix_hit_tokens"] = (
            f"(n - 1) // {r.cache_hit_alignment} x {r.cache_hit_alignment}: the last prompt "
            "token is recomputed (max_cache_hit_length = num_tokens - 1) and hits are whole units"
        )
        out["smallest_hit_prompt"] = (
            f"{r.smallest_hit_prompt} tokens" if r.smallest_hit_prompt is not None
            else "none: the first hit needs more than max_model_len tokens"
        )
    else:
        out["prefix_hit_tokens"] = "0: prefix caching is off"
    return out


#: :func:`capacity_sweep`'s columns, in order (``error``: missing when the
#: row is valid, else the reason the deployment is refused).
CAPACITY_COLUMNS = (
    "model", "gpu", "tensor_parallel_size", "gpu_memory_utilization", "kv_cache_memory", "num_blocks",
    "block_size", "max_model_len", "kv_cache_size_tokens", "max_concurrency",
    "largest_max_model_len", "cache_hit_alignment", "error",
)

#: The answer store's kind for a capacity row.
CAPACITY_KIND = "capacity-row"


#: :func:`capacity`'s own keywords besides the model (the rest are plan()'s).
_CAPACITY_KEYWORDS = tuple(
    name for name, param in inspect.signature(capacity).parameters.items()
    if param.kind is inspect.Parameter.KEYWORD_ONLY
)


def capacity_row(model: Any, kwargs: dict) -> dict[str, Any]:
    """One :func:`capacity_sweep` row: :func:`capacity` of ``model`` with
    ``kwargs``; a refused deployment (a ``ValueError``: kvexplore's or
    vLLM's) is a row whose ``error`` holds the reason."""
    try:
        r = capacity(model, **kwargs)
    except ValueError as exc:
        try:
            name = load_model_config(model).name
        except ValueError:
            name = str(model)
        row = dict.fromkeys(CAPACITY_COLUMNS)
        row.update(model=name, gpu=str(kwargs.get("gpu", DEFAULT_GPU)),
                   tensor_parallel_size=kwargs.get("tensor_parallel_size", 1), error=str(exc))
        return row
    return {
        "model": r.plan.model.name, "gpu": r.plan.gpu.name,
        "tensor_parallel_size": r.plan.tensor_parallel_size,
        "gpu_memory_utilization": r.gpu_memory_utilization,
        "kv_cache_memory": r.kv_cache_memory, "num_blocks": r.num_blocks,
        "block_size": r.block_size, "max_model_len": r.max_model_len,
        "kv_cache_size_tokens": r.kv_cache_size_tokens,
        "max_concurrency": r.max_concurrency,
        "largest_max_model_len": r.largest_max_model_len,
        "cache_hit_alignment": r.cache_hit_alignment,
        "error": None,
    }


def capacity_rows(model: Any, kwargs: dict) -> list[dict[str, Any]]:
    """``[capacity_row(model, kwargs)]``: one task's rows in a sweep."""
    return [capacity_row(model, kwargs)]


def capacity_question(model: Any, kwargs: dict):
    """The :class:`~kvexplore.store.Question` of one :func:`capacity_sweep`
    row: the model (by name and config content), the plan's keywords and
    ``gpu``, and the other capacity keywords of ``kwargs`` as its options;
    None when a value cannot be keyed (the row is computed on every run)."""
    from kvexplore.planning.stored import question

    planned = {k: v for k, v in kwargs.items() if k == "gpu" or k in PLAN_DEFAULTS}
    rest = {k: v for k, v in kwargs.items() if k not in planned}
    try:
        return question(CAPACITY_KIND, model, rest, **planned)
    except (KVExploreError, TypeError, ValueError):
        return None


#: The column an output file of :func:`capacity_sweep` adds after
#: :data:`CAPACITY_COLUMNS`: which row it is (:func:`capacity_file_key`).
FILE_KEY_COLUMN = "capacity_key"


def capacity_file_key(question) -> str | None:
    """The :data:`FILE_KEY_COLUMN` of a row whose :func:`capacity_question`
    is ``question``: its key less the releases (the vLLM release is the
    file's ``vllm`` column, :data:`kvexplore.fleet.RELEASE_COLUMN`, which the
    file resumes by too); None when ``question`` is None (the row is
    computed again)."""
    return None if question is None else question.replace(releases=None).key()


def _agrees(question) -> Any:
    """Whether a file row's own cells (model, GPU, TP) are the ones
    ``question`` asks for: a row whose cells were edited is computed again."""
    request = dict(question.request)

    def check(row: dict) -> bool:
        return (row.get("model") == question.model["name"] and row.get("gpu") == question.gpu["name"]
                and row.get("tensor_parallel_size") == request.get("tensor_parallel_size"))
    return check


def capacity_sweep(models: Iterable[Any], *, executor=None, output=None, store: Any = True,
                   **kwargs) -> pd.DataFrame:
    """One :func:`capacity` summary row per model or plan, in order
    (:data:`CAPACITY_COLUMNS`; a refused deployment is a row with its reason
    in ``error``).

    ``executor``: any ``concurrent.futures.Executor`` (e.g. a
    ``ProcessPoolExecutor``) or a ``dask.distributed.Client``; a plan is sent
    as its model and inputs, and a model's rows go to one worker where
    possible, which builds each deployment once
    (:func:`kvexplore.fleet.run_tasks`).  ``store`` (default ``True``: the
    user's answer store; ``False``: none; or a folder): rows answered before
    are read back, rows computed are stored (:mod:`kvexplore.store`).
    ``output`` (a ``.parquet`` or ``.csv`` path, checked before any work, a
    :class:`KVExploreError` naming it when it cannot be written): the rows
    are written as they come (:class:`kvexplore.fleet.RowFile`), with
    :data:`FILE_KEY_COLUMN` and ``vllm`` (the installed vLLM release) after
    :data:`CAPACITY_COLUMNS`; a re-run with the same file takes the rows the
    installed release wrote there (same model, plan and capacity keywords,
    :func:`capacity_file_key`, with the model, GPU and TP cells the key asks
    for) and computes only the others, and always the rows
    whose key cannot be computed (a refused input).  Rows another release
    wrote are computed again and kept in the file beside this release's (the
    returned frame holds this release's only)."""
    from kvexplore.fleet import RowFile, check_executor, resumable_sweep
    from kvexplore.store import answer_store

    check_executor(executor)  # a closed executor is refused before any work
    out = (RowFile(output, [*CAPACITY_COLUMNS, FILE_KEY_COLUMN], [FILE_KEY_COLUMN])
           if output is not None else None)
    answers = answer_store(store)
    tasks = []
    for m in models:
        if isinstance(m, Plan):
            model = m.model.served_name or m.model.config
            tasks.append((model, {**m.inputs, **kwargs}))
        else:
            tasks.append((m, kwargs))
    keyed = answers is not None or out is not None
    questions = [capacity_question(*task) if keyed else None for task in tasks]
    file_keys = [[capacity_file_key(q)] for q in questions]
    rows = resumable_sweep(
        capacity_rows, tasks, columns=CAPACITY_COLUMNS, key_column=FILE_KEY_COLUMN,
        questions=[[q] if q is not None else None for q in questions], file_keys=file_keys,
        checks=[[_agrees(q) if q is not None else None] for q in questions],
        executor=executor, output=out, store=answers, what="capacity")
    rows = [r for [r] in rows]
    return pd.DataFrame(rows, columns=list(CAPACITY_COLUMNS))


__all__ = [
    "CALIBRATED_TERMS",
    "CAPACITY_COLUMNS",
    "Calibration",
    "FILE_KEY_COLUMN",
    "CapacityReport",
    "capacity",
    "capacity_file_key",
    "capacity_question",
    "check_capacity_keywords",
    "capacity_row",
    "capacity_rows",
    "capacity_sweep",
    "shared_prefix_hit_tokens",
    "profile_estimates",
]
