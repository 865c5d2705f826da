"""Sweeps: one offloading configuration per combination of inputs, as a table.

``sweep(model, tensor_parallel_size=[1, 2, 4, 8], extra_config=[None,
{"blocks_per_chunk": 2}])`` plans every combination of the ``plan`` keywords
once, derives vLLM 0.33's ``OffloadingConfig`` (``build_offloading_config``
in ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``) for
every row through :func:`kvexplore.offloading.derive.derive` (the derivation
``offload_config`` runs, without building vLLM's dataclasses), and
returns a pandas DataFrame.  A combination vLLM rejects (in planning or in
``build_offloading_config``) is a row whose ``error`` column holds the reason.

>>> df = sweep("Qwen/Qwen3.5-0.8B", gpu="A100", tensor_parallel_size=[1, 4],
...            decode_context_parallel_size=[1, 2])
>>> df.tokens_per_block.tolist()
[(544, 544, 544, 544), None, (272, 272, 272, 272), (272, 272, 272, 544)]
>>> "tp_size=1 must be divisible by dcp_size=2" in df.error[1]
True
"""

from __future__ import annotations

import inspect
import itertools
import json
from typing import Any

import pandas as pd

from kvexplore.errors import KVExploreError
from kvexplore.layout import jsonable
from kvexplore.offloading.derive import derive
from kvexplore.offloading.options import OffloadOptions
from kvexplore.planning.models import load_model_config
from kvexplore.planning.planner import plan as make_plan

#: ``plan()`` keywords a sweep can vary.
PLAN_KEYWORDS = tuple(
    name for name in inspect.signature(make_plan).parameters if name != "model"
)

#: ``offload_config`` keywords a sweep can vary: the option names.
OFFLOAD_KEYWORDS = OffloadOptions.names()

#: Result columns after the input columns, in order.
RESULT_COLUMNS = (
    "gpu_block_size",
    "padding_share",
    "tokens_per_gib",
    "groups",
    "tokens_per_block",
    "sliding_window_size_in_chunks",
    "tokens_per_hash",
    "blocks_per_chunk",
    "worker_kv_bytes_per_block",
    "world_size",
    "replicated_layout",
    "replicated_layout_reason",
    "is_parallelism_agnostic",
    "is_parallelism_agnostic_reason",
    "canonical_layout",
    "error",
)


def _axis(name: str, value) -> list:
    if isinstance(value, (list, tuple, range)):
        values = list(value)
        if not values:
            raise KVExploreError(
                f"{name}=[] is an empty axis; expected at least one value"
            )
        return values
    return [value]


def _key(values: tuple):
    try:
        hash(values)
        return values
    except TypeError:
        return repr(values)


def _cell(name: str, value):
    if name == "extra_config":
        return None if value is None else json.dumps(jsonable(value), sort_keys=True)
    return value


def sweep(model: Any = "Qwen/Qwen3.5-0.8B", **axes) -> pd.DataFrame:
    """One row per combination of ``axes``: inputs, sizes, flags and reasons.

    Every keyword is a ``kvexplore.plan`` keyword (``tensor_parallel_size``,
    ``decode_context_parallel_size``, ``block_size``, ``kv_cache_dtype`` ...)
    or an :func:`kvexplore.offloading.config.offload_config` keyword
    (``extra_config``, ``pipeline_parallel_size``, ``nnodes_within_dp`` ...).
    A list, tuple or range is an axis; any other value is held fixed.
    Combinations run in ``itertools.product`` order of the keywords as given.

    Columns: ``model``, one per keyword given, then :data:`RESULT_COLUMNS`:
    ``gpu_block_size`` (the plan's block size after vLLM's alignment),
    ``padding_share`` and ``tokens_per_gib`` of the plan, per-group
    ``tokens_per_block`` and ``sliding_window_size_in_chunks`` (tuples in
    ``groups`` order), ``tokens_per_hash``, ``blocks_per_chunk``,
    ``worker_kv_bytes_per_block``, ``world_size``, the two layout flags with
    their reasons, ``canonical_layout``, and ``error`` (missing, i.e.
    ``pd.isna``, when the row is valid).
    ``extra_config`` cells are JSON text.  Plans are built once per distinct
    set of ``plan`` keywords and shared by the rows that use them.
    """
    unknown = [k for k in axes if k not in PLAN_KEYWORDS and k not in OFFLOAD_KEYWORDS]
    if unknown:
        raise KVExploreError(
            f"sweep got unknown keyword(s) {unknown}; expected plan keywords "
            f"{list(PLAN_KEYWORDS)} or offload_config keywords {list(OFFLOAD_KEYWORDS)}"
        )
    names = list(axes)
    values = [_axis(n, axes[n]) for n in names]
    plan_idx = [i for i, n in enumerate(names) if n in PLAN_KEYWORDS]
    off_idx = [i for i, n in enumerate(names) if n in OFFLOAD_KEYWORDS]
    src = load_model_config(model)  # an unknown model is an error, not rows
    plans: dict[Any, tuple] = {}
    rows: list[dict] = []
    for combo in itertools.product(*values):
        row = {"model": src.name}
        for n, v in zip(names, combo, strict=True):
            row[n] = _cell(n, v)
        pkey = _key(tuple(combo[i] for i in plan_idx))
        entry = plans.get(pkey)
        if entry is None:
            kwargs = {names[i]: combo[i] for i in plan_idx}
            try:
                p = make_plan(src, **kwargs)
                entry = (p, None, (p.block_size, p.padding_share, p.tokens_per_gib))
            except ValueError as exc:
                entry = (None, str(exc), None)
            except ArithmeticError as exc:  # vLLM's own checks can divide by 0
                entry = (None, f"vLLM 0.33 fails: {type(exc).__name__}: {exc}", None)
            plans[pkey] = entry
        p, plan_error, stats = entry
        if p is None:
            row.update(dict.fromkeys(RESULT_COLUMNS))
            row["error"] = plan_error
            rows.append(row)
            continue
        row["gpu_block_size"], row["padding_share"], row["tokens_per_gib"] = stats
        try:
            d = derive(p, OffloadOptions(**{names[i]: combo[i] for i in off_idx}))
        except ValueError as exc:
            for c in RESULT_COLUMNS[3:]:
                row[c] = None
            row["error"] = str(exc)
            rows.append(row)
            continue
        row["groups"] = d.groups.value
        row["tokens_per_block"] = tuple(t.value for t in d.tokens_per_block)
        row["sliding_window_size_in_chunks"] = tuple(w.value for w in d.sliding_window_size_in_chunks)
        row["tokens_per_hash"] = d.tokens_per_hash.value
        row["blocks_per_chunk"] = d.blocks_per_chunk.value
        row["worker_kv_bytes_per_block"] = d.worker_kv_bytes_per_block.value
        row["world_size"] = d.world_size.value
        row["replicated_layout"] = d.replicated_layout.value
        row["replicated_layout_reason"] = d.replicated_layout.rule
        row["is_parallelism_agnostic"] = d.is_parallelism_agnostic.value
        row["is_parallelism_agnostic_reason"] = d.is_parallelism_agnostic.rule
        row["canonical_layout"] = d.canonical_layout.value
        row["error"] = None
        rows.append(row)
    return pd.DataFrame(rows, columns=["model", *names, *RESULT_COLUMNS])


__all__ = ["OFFLOAD_KEYWORDS", "PLAN_KEYWORDS", "RESULT_COLUMNS", "sweep"]
