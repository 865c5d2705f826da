"""Sweeps: one offloading configuration per combination of inputs, as a table.

Every row is vLLM's ``build_offloading_config`` through
:func:`kvexplore.offloading.derive.derive` (the derivation ``offload_config``
runs, without building vLLM's dataclasses); a combination vLLM rejects, in
planning or in ``build_offloading_config``, is a row whose ``error`` holds the
reason.

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
import os
from collections.abc import Mapping
from typing import Any

import pandas as pd

from kvexplore.errors import KVExploreError
from kvexplore.layout import jsonable
from kvexplore.offloading.config import OFFLOAD_KEYWORDS
from kvexplore.offloading.derive import derive
from kvexplore.offloading.options import OffloadOptions
from kvexplore.planning.models import load_model_config
from kvexplore.planning.planner import plan as make_plan
from kvexplore.planning.release import release_name

#: ``plan()`` keywords a sweep can vary.
PLAN_KEYWORDS = tuple(
    name for name in inspect.signature(make_plan).parameters if name != "model"
)


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


def _result_cells(p, options: dict) -> dict:
    """The :data:`RESULT_COLUMNS` of one row whose plan vLLM accepts."""
    cells = {"gpu_block_size": p.block_size, "padding_share": p.padding_share, "tokens_per_gib": p.tokens_per_gib}
    try:
        d = derive(p, OffloadOptions(**options))
    except ValueError as exc:
        return {**cells, **dict.fromkeys(RESULT_COLUMNS[3:]), "error": str(exc)}
    return {
        **cells,
        "groups": d.groups.value,
        "tokens_per_block": tuple(t.value for t in d.tokens_per_block),
        "sliding_window_size_in_chunks": tuple(w.value for w in d.sliding_window_size_in_chunks),
        "tokens_per_hash": d.tokens_per_hash.value,
        "blocks_per_chunk": d.blocks_per_chunk.value,
        "worker_kv_bytes_per_block": d.worker_kv_bytes_per_block.value,
        "world_size": d.world_size.value,
        "replicated_layout": d.replicated_layout.value,
        "replicated_layout_reason": d.replicated_layout.rule,
        "is_parallelism_agnostic": d.is_parallelism_agnostic.value,
        "is_parallelism_agnostic_reason": d.is_parallelism_agnostic.rule,
        "canonical_layout": d.canonical_layout.value,
        "error": None,
    }


def _rows_of_plan(model: Any, plan_kwargs: dict, combos: list[dict]) -> list[dict]:
    """The rows of every combination that shares one plan: the plan is built
    once (in the process that runs this, a worker of an executor or this one)."""
    src = load_model_config(model)
    p = plan_error = None
    try:
        p = make_plan(src, **plan_kwargs)
    except ValueError as exc:
        plan_error = str(exc)
    except ArithmeticError as exc:  # vLLM's own checks can divide by 0
        plan_error = f"{release_name()} fails: {type(exc).__name__}: {exc}"
    rows = []
    for given in combos:
        row = {"model": src.name, **{n: _cell(n, v) for n, v in given.items()}}
        if p is None:
            row.update(dict.fromkeys(RESULT_COLUMNS), error=plan_error)
        else:
            row.update(_result_cells(p, {n: v for n, v in given.items() if n in OFFLOAD_KEYWORDS}))
        rows.append(row)
    return rows


def run_groups(function, tasks: list[tuple], executor=None, what: str = "plans") -> list:
    """``[function(*task) for task in tasks]``, on ``executor`` when given (any
    ``concurrent.futures.Executor``: a ``ProcessPoolExecutor``, or a cluster's,
    such as ``dask.distributed.Client.get_executor()``), with a tqdm progress
    bar that appears once a sweep has run for two seconds."""
    from tqdm.auto import tqdm

    # tqdm's notebook bar ignores TQDM_DISABLE, which the console bar honours
    off = os.getenv("TQDM_DISABLE", "").lower() not in ("", "0", "false")
    with tqdm(total=len(tasks), desc=what, delay=2, leave=False, disable=off) as bar:
        if executor is None:
            out = []
            for task in tasks:
                out.append(function(*task))
                bar.update()
            return out
        futures = [executor.submit(function, *task) for task in tasks]
        for future in futures:
            future.add_done_callback(lambda _f: bar.update())
        return [future.result() for future in futures]


def sweep(model: Any = "Qwen/Qwen3.5-0.8B", *, executor=None, **axes) -> pd.DataFrame:
    """One row per combination of ``axes``: inputs, sizes, flags and reasons.

    Every keyword is a ``kvexplore.plan`` keyword (``tensor_parallel_size``,
    ``block_size`` ...) or an :func:`~kvexplore.offloading.config.offload_config`
    keyword (``extra_config``, ``pipeline_parallel_size`` ...); a list, tuple
    or range is an axis, any other value is held fixed; rows come in
    ``itertools.product`` order.  A plan is built once per distinct set of
    ``plan`` keywords, on ``executor`` when given (:func:`run_groups`).

    Columns: ``model``, one per keyword given, then :data:`RESULT_COLUMNS`
    (per-group values are tuples in ``groups`` order; ``error`` is missing,
    i.e. ``pd.isna``, when the row is valid; ``extra_config`` cells are JSON).
    """
    unknown = [k for k in axes if k not in PLAN_KEYWORDS and k not in OFFLOAD_KEYWORDS]
    if unknown:
        raise KVExploreError(
            f"sweep got unknown keyword(s) {unknown}; expected plan keywords "
            f"{list(PLAN_KEYWORDS)} or offload_config keywords {list(OFFLOAD_KEYWORDS)}"
        )
    names = list(axes)
    values = [_axis(n, axes[n]) for n in names]
    src = load_model_config(model)  # an unknown model is an error, not rows
    portable = model if isinstance(model, (str, Mapping)) else src.config
    groups: dict[Any, tuple[dict, list[dict]]] = {}
    order = []
    for combo in itertools.product(*values):
        given = dict(zip(names, combo, strict=True))
        plan_kwargs = {n: v for n, v in given.items() if n in PLAN_KEYWORDS}
        key = _key(tuple(plan_kwargs.values()))
        groups.setdefault(key, (plan_kwargs, []))[1].append(given)
        order.append((key, len(groups[key][1]) - 1))
    keys = list(groups)
    results = run_groups(_rows_of_plan, [(portable, *groups[k]) for k in keys], executor)
    by_key = dict(zip(keys, results, strict=True))
    rows = [by_key[key][i] for key, i in order]
    return pd.DataFrame(rows, columns=["model", *names, *RESULT_COLUMNS])


__all__ = ["OFFLOAD_KEYWORDS", "PLAN_KEYWORDS", "RESULT_COLUMNS", "run_groups", "sweep"]
