"""What vLLM hands a native KV offloading backend, and why.

:func:`offload_config` builds the ``OffloadingConfig``
(``vllm/v1/kv_offload/config.py``) that ``build_offloading_config``
(``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``) builds
from a :class:`~kvexplore.Plan` (its KV cache and its parallel sizes) plus
the :class:`~kvexplore.offloading.options.OffloadOptions` the plan does not
carry (:func:`kvexplore.offloading.derive.derive`), with every derived
field's rule.
Qwen3.5-0.8B on an A100 at TP 4, DCP 2 (attention 272 x 2 tokens per block,
GDN 272, so the hash unit is their gcd):

>>> from kvexplore import plan
>>> r = offload_config(plan("Qwen/Qwen3.5-0.8B", gpu="A100", tensor_parallel_size=4,
...                         decode_context_parallel_size=2))
>>> [g.tokens_per_block for g in r.config.groups], r.config.cache.tokens_per_hash
([272, 272, 272, 544], 272)
>>> r.rule("parallel.is_parallelism_agnostic")
'4 KV cache groups, not a single full-attention group; DCP 2 != 1'
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

import pandas as pd
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, check_int, jsonable
from kvexplore.offloading.derive import Derivation, OffloadConfigError, derive
from kvexplore.offloading.options import (
    PLAN_PARALLEL_KEYWORDS,
    OffloadOptions,
    ParallelSizes,
)
from kvexplore.planning import release
from kvexplore.planning.planner import Plan

#: Keywords of :func:`offload_config` besides the plan: the option names.
OFFLOAD_KEYWORDS = OffloadOptions.names()


class FieldRow(NamedTuple):
    """One field of the ``OffloadingConfig``: dotted name, value, rule ('' when passed through)."""

    field: str
    value: Any
    rule: str


def _fields(obj, prefix: str = ""):
    """``(dotted name, value)`` of every field of a config dataclass but its
    groups, nested configs flattened, in field order."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            yield from _fields(value, f"{prefix}{f.name}.")
        elif f.name != "groups":
            yield prefix + f.name, value


@dataclass(frozen=True, eq=False, repr=False)
class OffloadResult(Displayable):
    """``offload_config``'s answer, frozen: ``config``, the real
    ``vllm.v1.kv_offload.config.OffloadingConfig``, and ``derivation``, every
    derived value with its rule (the actual inputs), shown per field by
    :meth:`explain`, :attr:`reasons`, :meth:`rule` and :meth:`table`.
    """

    plan: Plan
    options: OffloadOptions
    derivation: Derivation
    config: Any = field(repr=False)

    def rows(self) -> tuple[FieldRow, ...]:
        """Every field of the config, flattened, with its rule."""
        c, d, o = self.config, self.derivation, self.options
        rows = [FieldRow("groups", tuple(g.group_id for g in c.groups), d.groups.rule)]
        for i, g in enumerate(c.groups):
            names = g.layer_names
            shown = f"{len(names)} layers" + (f" ({names[0]} ... {names[-1]})" if names else "")
            rows += [
                FieldRow(f"groups[{i}].group_id", g.group_id, ""),
                FieldRow(f"groups[{i}].layer_names", shown, ""),
                FieldRow(f"groups[{i}].tokens_per_block", g.tokens_per_block, d.tokens_per_block[i].rule),
            ]
            if release.offloading_has_windows():
                rows.append(FieldRow(
                    f"groups[{i}].sliding_window_size_in_chunks",
                    g.sliding_window_size_in_chunks,
                    d.sliding_window_size_in_chunks[i].rule,
                ))
        rules = {
            "worker_kv_bytes_per_block": d.worker_kv_bytes_per_block.rule,
            "enable_kv_cache_events": f"kv_events_config.enable_kv_cache_events = {o.enable_kv_cache_events}",
            "model.name": f"model_config.model (for {self.plan.model.name})",
            "model.dtype": d.dtype.rule,
            "model.max_model_len": "model_config.max_model_len",
            "cache.tokens_per_hash": d.tokens_per_hash.rule,
            "cache.blocks_per_chunk": d.blocks_per_chunk.rule,
            "parallel.world_size": d.world_size.rule,
            "parallel.data_parallel_index": f"data_parallel_rank {o.data_parallel_rank}",
            "parallel.data_parallel_rank_local": d.data_parallel_rank_local.rule,
            "parallel.is_parallelism_agnostic": d.is_parallelism_agnostic.rule,
            "replicated_layout": d.replicated_layout.rule,
            "canonical_layout": d.canonical_layout.rule,
            "kv_cache_layout": "cache_config.kv_cache_layout",
        }
        for name, value in _fields(c):
            if name == "extra_config":
                value = json.dumps(jsonable(value), sort_keys=True)
            rows.append(FieldRow(name, value, rules.get(name, "")))
        return tuple(rows)

    def table(self) -> pd.DataFrame:
        """Every field of the ``OffloadingConfig`` (flattened): field, value, rule."""
        return pd.DataFrame(self.rows(), columns=["field", "value", "rule"])

    @property
    def reasons(self) -> pd.DataFrame:
        """The derived fields only: field, value, rule (with the actual inputs)."""
        return pd.DataFrame([r for r in self.rows() if r.rule], columns=["field", "value", "rule"])

    def rule(self, field: str) -> str:
        """The rule behind one field, e.g. ``rule("replicated_layout")``; a
        unique last component names a nested field too
        (``rule("is_parallelism_agnostic")``)."""
        rows = self.rows()
        exact = [r for r in rows if r.field == field]
        tails = exact or [r for r in rows if r.field.rsplit(".", 1)[-1] == field]
        if len(tails) == 1:
            return tails[0].rule
        if tails:
            raise KVExploreError(
                f"field={field!r} is not a field of this OffloadingConfig by itself: it "
                f"names {len(tails)} fields; expected one of {[r.field for r in tails]}"
            )
        raise KVExploreError(
            f"field={field!r} is not a field of this OffloadingConfig; expected one of "
            f"{[r.field for r in rows]}"
        )

    def explain(self) -> str:
        """One line per derived field: ``field = value: rule`` (the text form)."""
        return self.text()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the config (``dataclasses.asdict``), reasons and inputs."""
        out = jsonable(asdict(self.config))
        out["reasons"] = {r.field: r.rule for r in self.rows() if r.rule}
        inputs = self.options.as_dict()
        inputs["distributed_executor_backend"] = self.derivation.distributed_executor_backend.value
        out["inputs"] = {"model": self.plan.model.name, **jsonable(self.plan.inputs), **jsonable(inputs)}
        return out

    def __repr__(self) -> str:
        c = self.config
        return (
            f"OffloadResult({self.plan.model.name!r}, tp={c.parallel.tp_size}, "
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


def build_config(p: Plan, o: OffloadOptions, d: Derivation):
    """vLLM's ``OffloadingConfig`` from a derivation (the constructor call that
    ends ``build_offloading_config``)."""
    groups = tuple(
        release.construct(
            OffloadingGroupConfig,
            group_id=gid,
            tokens_per_block=t.value,
            layer_names=p.groups[gid].layer_names,
            sliding_window_size_in_chunks=w.value,
        )
        for gid, t, w in zip(d.groups.value, d.tokens_per_block, d.sliding_window_size_in_chunks, strict=True)
    )
    return OffloadingConfig(
        groups=groups,
        worker_kv_bytes_per_block=d.worker_kv_bytes_per_block.value,
        enable_kv_cache_events=o.enable_kv_cache_events,
        extra_config=FrozenDict(o.extra_config),
        engine_id=o.engine_id,
        model=release.construct(OffloadingModelConfig, name=p.served_model, dtype=d.dtype.value,
                                max_model_len=p.max_model_len),
        cache=OffloadingCacheConfig(
            tokens_per_hash=d.tokens_per_hash.value, blocks_per_chunk=d.blocks_per_chunk.value
        ),
        parallel=OffloadingParallelConfig(
            rank=o.rank,
            world_size=d.world_size.value,
            tp_size=d.parallel_sizes.tensor_parallel_size,
            pp_size=d.parallel_sizes.pipeline_parallel_size,
            pcp_size=o.prefill_context_parallel_size,
            dcp_size=d.parallel_sizes.decode_context_parallel_size,
            data_parallel_index=o.data_parallel_rank,
            data_parallel_size=d.parallel_sizes.data_parallel_size,
            data_parallel_rank_local=d.data_parallel_rank_local.value,
            is_parallelism_agnostic=d.is_parallelism_agnostic.value,
        ),
        replicated_layout=d.replicated_layout.value,
        canonical_layout=d.canonical_layout.value,
        kv_cache_layout=p.kv_cache_layout_name,
    )


def offload_config(plan: Plan, options: OffloadOptions | None = None, **kwargs: Any) -> OffloadResult:
    """The ``OffloadingConfig`` vLLM's ``build_offloading_config`` builds.

    The parallel sizes TP, PP, DP and DCP are the plan's (its
    ``ParallelConfig``, :class:`~kvexplore.offloading.options.ParallelSizes`),
    and a plan of one pipeline stage gives that stage's worker's layers; one
    of them given here as a keyword (:data:`PLAN_PARALLEL_KEYWORDS`) is
    accepted only at the plan's value and otherwise refused by name.  The
    rest is an :class:`~kvexplore.offloading.options.OffloadOptions`
    (``options``), its fields given as keywords overriding it
    (:data:`OFFLOAD_KEYWORDS`); ``VLLM_DP_RANK_LOCAL`` takes its default.

    Raises :class:`OffloadConfigError` (a ``ValueError``, with ``code``) where
    vLLM raises or asserts, with the same facts, and ``KVExploreError`` for
    malformed inputs or unknown option names.
    """
    restated = {name: kwargs.pop(name) for name in PLAN_PARALLEL_KEYWORDS if name in kwargs}
    if options is None:
        o = OffloadOptions.from_kwargs(**kwargs)
    elif not isinstance(options, OffloadOptions):
        raise KVExploreError(
            f"options={options!r:.80} is invalid; expected an OffloadOptions or None "
            "(option values go in as keywords)"
        )
    else:
        o = options.replace(**kwargs)
    if restated:
        check_restated_sizes(plan, restated)
    d = derive(plan, o)
    return OffloadResult(plan, o, d, build_config(plan, o, d))


def check_restated_sizes(plan: Plan, restated: dict[str, Any]) -> None:
    """Refuse a parallel size (:data:`PLAN_PARALLEL_KEYWORDS`) given to
    :func:`offload_config` that is not the plan's, naming it, the plan's
    value and how to plan the other."""
    if not isinstance(plan, Plan):
        return  # derive() refuses a non-plan with its own message
    sizes = ParallelSizes.of(plan)
    for name, value in restated.items():
        check_int(name, value, minimum=1)
        ours = getattr(sizes, name)
        if value != ours:
            raise KVExploreError(
                f"{name}={value!r} differs from the plan's {name}={ours}; the offloading "
                f"config takes its parallel sizes from the plan: expected {ours} (or leave "
                f"it out), or plan(..., {name}={value!r}) for the other deployment"
            )


__all__ = [
    "OFFLOAD_KEYWORDS",
    "PLAN_PARALLEL_KEYWORDS",
    "FieldRow",
    "OffloadConfigError",
    "OffloadOptions",
    "OffloadResult",
    "build_config",
    "check_restated_sizes",
    "offload_config",
]
