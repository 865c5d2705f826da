"""The inputs of an offloading deployment that a :class:`~kvexplore.Plan` does not carry.

The plan holds the parallel sizes it was made at (:class:`ParallelSizes`: TP,
PP, DP and DCP, read from its ``ParallelConfig``); they are never options.
The rest ``build_offloading_config`` reads (the PCP size, which ``plan()``
does not take, the DP replica and worker indices, executor backend, model
runner, KV events, ``kv_connector_extra_config``) is an
:class:`OffloadOptions`, whose fields are the one list of option names,
defaults and checks.

>>> OffloadOptions(prefill_context_parallel_size=2).prefill_context_parallel_size
2
>>> OffloadOptions.from_kwargs(data_parallel_size=2)
Traceback (most recent call last):
...
kvexplore.errors.KVExploreError: data_parallel_size=2 is not an offload option: the offloading config takes the plan's data_parallel_size; expected it given to plan(..., data_parallel_size=2)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, check_int

#: ``--distributed-executor-backend`` values vLLM accepts by name.
EXECUTOR_BACKENDS = ("mp", "uni", "ray", "external_launcher")

#: Backends vLLM's ``ParallelConfig`` allows a DP replica to span nodes with.
MULTI_NODE_BACKENDS = (None, "mp", "uni", "external_launcher")

DEFAULT_ENGINE_ID = "kvexplore"

#: The parallel sizes ``build_offloading_config`` reads that a plan is made at:
#: ``plan()`` keywords, never offload options.
PLAN_PARALLEL_KEYWORDS = (
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "decode_context_parallel_size",
)


class ParallelSizes(NamedTuple):
    """The parallel sizes of a plan's ``ParallelConfig`` that
    ``build_offloading_config`` reads (:data:`PLAN_PARALLEL_KEYWORDS`)."""

    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    decode_context_parallel_size: int

    @classmethod
    def of(cls, plan: Any) -> ParallelSizes:
        """The sizes of ``plan``'s ``ParallelConfig`` (vLLM's, as the plan's
        engine resolved them)."""
        pc = plan.parallel_config
        return cls(*(int(getattr(pc, name)) for name in PLAN_PARALLEL_KEYWORDS))


@dataclass(frozen=True, kw_only=True)
class OffloadOptions:
    """What the engine's ``ParallelConfig``, ``KVEventsConfig`` and
    ``KVTransferConfig`` hold besides the plan's :class:`ParallelSizes`,
    checked on construction.

    ``extra_config`` (``kv_connector_extra_config``: ``block_size`` in tokens
    *or* ``blocks_per_chunk``, ``canonical_layout``) is copied into a read-only
    mapping.  ``distributed_executor_backend=None`` resolves as on one node
    (:func:`~kvexplore.offloading.derive.parallel_layout`).  Checks that need
    the plan's sizes are :meth:`check_parallel`.
    """

    extra_config: Mapping[str, Any] | None = field(
        default=None,
        metadata={"help": 'kv_connector_extra_config, e.g. {"block_size": 1088}'},
    )
    prefill_context_parallel_size: int = field(
        default=1, metadata={"help": "PCP size", "minimum": 1}
    )
    data_parallel_rank: int = field(
        default=0, metadata={"help": "this engine's DP replica index", "minimum": 0}
    )
    distributed_executor_backend: str | None = field(
        default="mp",
        metadata={"help": "executor backend; None resolves as vLLM does", "choices": EXECUTOR_BACKENDS},
    )
    nnodes_within_dp: int = field(
        default=1, metadata={"help": "nodes one DP replica spans", "minimum": 1}
    )
    use_v2_model_runner: bool = field(default=False, metadata={"help": "vLLM's V2 model runner"})
    enable_kv_cache_events: bool = field(
        default=False, metadata={"help": "kv_events_config.enable_kv_cache_events"}
    )
    rank: int = field(default=0, metadata={"help": "worker index in [0, world size)", "minimum": 0})
    engine_id: str = field(
        default=DEFAULT_ENGINE_ID, metadata={"help": "kv_transfer_config.engine_id"}
    )

    def __post_init__(self) -> None:
        extra = {} if self.extra_config is None else self.extra_config
        if not isinstance(extra, Mapping):
            raise KVExploreError(
                f"extra_config={extra!r} is invalid; expected a mapping such as "
                "{'block_size': 1088} or {'blocks_per_chunk': 2} (kv_connector_extra_config)"
            )
        object.__setattr__(self, "extra_config", FrozenDict(extra))  # a private, read-only copy
        for name, minimum in _MINIMUMS:
            check_int(name, getattr(self, name), minimum=minimum)
        for name in _FLAGS:
            value = getattr(self, name)
            if value is not True and value is not False:
                raise KVExploreError(f"{name}={value!r} is invalid; expected True or False")
        backend = self.distributed_executor_backend
        if backend is not None and backend not in EXECUTOR_BACKENDS:
            raise KVExploreError(
                f"distributed_executor_backend={backend!r} is invalid; expected one of "
                f"{list(EXECUTOR_BACKENDS)} or None"
            )
        if self.nnodes_within_dp > 1 and backend not in MULTI_NODE_BACKENDS:
            raise KVExploreError(
                f"nnodes_within_dp={self.nnodes_within_dp} with distributed_executor_backend="
                f"{backend!r} is invalid; vLLM's ParallelConfig allows nnodes > 1 only with "
                "'mp', 'uni' or 'external_launcher'"
            )
        if not isinstance(self.engine_id, str) or not self.engine_id:
            raise KVExploreError(
                f"engine_id={self.engine_id!r} is invalid; expected a non-empty string"
            )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The option names, in field order."""
        return _NAMES

    @classmethod
    def from_kwargs(cls, **options: Any) -> OffloadOptions:
        """``OffloadOptions(**options)``, with an unknown name a ``KVExploreError``
        (a :data:`PLAN_PARALLEL_KEYWORDS` name one pointing to ``plan()``)."""
        planned = [name for name in options if name in PLAN_PARALLEL_KEYWORDS]
        if planned:
            name = planned[0]
            raise KVExploreError(
                f"{name}={options[name]!r} is not an offload option: the offloading config "
                f"takes the plan's {name}; expected it given to plan(..., {name}={options[name]!r})"
            )
        unknown = [name for name in options if name not in _NAMES]
        if unknown:
            raise KVExploreError(
                f"unknown offload option {unknown[0]!r}; expected one of {list(_NAMES)}"
            )
        return cls(**options)

    def replace(self, **changes: Any) -> OffloadOptions:
        """A copy with ``changes`` (checked names and values)."""
        if not changes:
            return self
        return type(self).from_kwargs(**{**self.as_dict(), **changes})

    def as_dict(self) -> dict[str, Any]:
        """Field name -> value, in field order (``extra_config`` a plain dict)."""
        out = {name: getattr(self, name) for name in _NAMES}
        out["extra_config"] = dict(self.extra_config)
        return out

    def world_size(self, sizes: ParallelSizes) -> int:
        """``ParallelConfig.world_size`` with the plan's ``sizes``: PP x TP x
        PCP, times DP under ``external_launcher`` (every DP replica is one
        world there)."""
        world = (sizes.pipeline_parallel_size * sizes.tensor_parallel_size
                 * self.prefill_context_parallel_size)
        if self.distributed_executor_backend == "external_launcher":
            world *= sizes.data_parallel_size
        return world

    def check_parallel(self, sizes: ParallelSizes) -> None:
        """Raise ``KVExploreError`` where vLLM's ``ParallelConfig`` rejects these
        options with the plan's ``sizes``."""
        tp, dcp = sizes.tensor_parallel_size, sizes.decode_context_parallel_size
        dp, dp_rank = sizes.data_parallel_size, self.data_parallel_rank
        if dp_rank >= dp:
            raise KVExploreError(
                f"data_parallel_rank={dp_rank} is invalid; expected it in [0, {dp}) "
                f"for the plan's data_parallel_size={dp}"
            )
        pcp = self.prefill_context_parallel_size
        if pcp > 1 and dcp not in (1, pcp, tp * pcp):
            raise KVExploreError(
                f"prefill_context_parallel_size={pcp} with the plan's decode context "
                f"parallel size {dcp} is invalid: when PCP is enabled, DCP must be "
                f"disabled, span the PCP axis, or span the full TP x PCP axis (TP={tp}); "
                f"expected DCP in {sorted({1, pcp, tp * pcp})} (vLLM's ParallelConfig)"
            )
        world = self.world_size(sizes)
        if self.rank >= world:
            raise KVExploreError(
                f"rank={self.rank} is invalid; expected a worker index in [0, {world}) "
                f"(world size {world})"
            )


_NAMES = tuple(f.name for f in dataclasses.fields(OffloadOptions))
_MINIMUMS = tuple(
    (f.name, f.metadata["minimum"]) for f in dataclasses.fields(OffloadOptions) if "minimum" in f.metadata
)
_FLAGS = tuple(f.name for f in dataclasses.fields(OffloadOptions) if f.type in ("bool", bool))

__all__ = [
    "DEFAULT_ENGINE_ID",
    "EXECUTOR_BACKENDS",
    "MULTI_NODE_BACKENDS",
    "OffloadOptions",
    "PLAN_PARALLEL_KEYWORDS",
    "ParallelSizes",
]
