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

import itertools
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvexplore.errors import KVExploreError
from kvexplore.fleet import RowFile, check_executor, resumable_sweep, run_tasks
from kvexplore.layout import jsonable
from kvexplore.offloading.options import OffloadOptions
from kvexplore.planning.inputs import PLAN_DEFAULTS
from kvexplore.planning.models import load_model_config
from kvexplore.planning.release import release_name
from kvexplore.planning.stored import question
from kvexplore.store import answer_store

if TYPE_CHECKING:
    import pandas as pd

#: ``plan()`` keywords a sweep can vary.
PLAN_KEYWORDS = ("gpu", *PLAN_DEFAULTS)

#: ``offload_config()`` keywords a sweep can vary (the ``OffloadOptions`` fields).
OFFLOAD_KEYWORDS = OffloadOptions.names()

#: The answer store's kind for one sweep row.
SWEEP_KIND = "sweep-row"

#: The column an output file adds after the row's: the key of the row's
#: question less its releases (:func:`row_question`), which resuming checks.
KEY_COLUMN = "key"


def make_plan(model: Any, **kwargs: Any):
    """:func:`kvexplore.plan` (the planner is imported on the first call)."""
    from kvexplore.planning.planner import plan

    return plan(model, **kwargs)


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
    from kvexplore.offloading.derive import derive

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


def row_question(model: Any, cells: Mapping[str, Any]):
    """The :class:`~kvexplore.store.Question` of one sweep row: ``model`` (as
    ``plan()`` takes it) and the row's input ``cells`` (``plan()`` keywords
    and ``offload_config()`` keywords as the row holds them, ``extra_config``
    as JSON text).  A value ``plan()`` refuses raises its :class:`KVExploreError`."""
    planned = {n: v for n, v in cells.items() if n in PLAN_KEYWORDS}
    options = {n: json.loads(v) if n == "extra_config" and isinstance(v, str) else v
               for n, v in cells.items() if n in OFFLOAD_KEYWORDS}
    return question(SWEEP_KIND, model, options, **planned)


def _file_key(model: Any, cells: Mapping[str, Any]) -> str | None:
    """:data:`KEY_COLUMN` of a row of ``model`` with input ``cells``; None
    when the row cannot be keyed (a refused input: computed on every run)."""
    try:
        return row_question(model, cells).replace(releases=None).key()
    except (KVExploreError, TypeError, ValueError):
        return None


def sweep(model: Any = "Qwen/Qwen3.5-0.8B", *, executor=None, output=None, store: Any = True,
          **axes) -> pd.DataFrame:
    """One row per combination of ``model`` and ``axes``: inputs, sizes, flags and reasons.

    ``model`` is one model (as :func:`kvexplore.plan` takes it) or a list of
    them, the first axis.  Every keyword is a ``kvexplore.plan`` keyword (``tensor_parallel_size``,
    ``block_size`` ...) or an :func:`~kvexplore.offloading.config.offload_config`
    keyword (``extra_config``, ``data_parallel_rank`` ...); the parallel sizes
    (``pipeline_parallel_size``, ``data_parallel_size`` ...) are the plan's,
    a PP row describing its stage-0 worker; a list, tuple
    or range is an axis, any other value is held fixed; rows come in
    ``itertools.product`` order.  A plan is built once per distinct set of
    ``plan`` keywords, on ``executor`` when given: any
    ``concurrent.futures.Executor`` or a ``dask.distributed.Client``
    (:func:`kvexplore.fleet.run_tasks`, which batches a model's plans onto
    one worker).

    ``store`` (default ``True``: the user's answer store, :mod:`kvexplore.store`;
    ``False``: none; or a folder): each row is stored for its own
    :func:`row_question`; a plan whose rows were all answered before is not
    built.  ``output`` (a ``.parquet`` or
    ``.csv`` path, checked before any work): the rows are written as they
    come (:class:`kvexplore.fleet.RowFile`), each with its key
    (:data:`KEY_COLUMN`) and the installed vLLM release in a ``vllm`` column
    after the others; when the file already holds rows of this sweep written
    under the installed release (an interrupted run, a lost worker), those
    whose key, computed again from the row's own model and input cells, is
    the one asked for are kept and only the missing plans run (a row whose
    cells were edited is computed again).  Rows another release wrote are not taken: their plans run
    again, and the file keeps both releases' rows (the returned frame holds
    this release's only, without the ``vllm`` column).

    Columns: ``model``, one per keyword given, then :data:`RESULT_COLUMNS`
    (per-group values are tuples in ``groups`` order; ``error`` is missing,
    i.e. ``pd.isna``, when the row is valid, else vLLM's or kvexplore's
    reason; ``extra_config`` cells are JSON).
    """
    unknown = [k for k in axes if k not in PLAN_KEYWORDS and k not in OFFLOAD_KEYWORDS]
    if unknown:
        raise KVExploreError(
            f"sweep got unknown keyword(s) {unknown}; expected plan keywords "
            f"{list(PLAN_KEYWORDS)} or offload_config keywords {list(OFFLOAD_KEYWORDS)}"
        )
    check_executor(executor)  # a closed executor is refused before any work
    names = list(axes)
    values = [_axis(n, axes[n]) for n in names]
    models = list(model) if isinstance(model, list) else [model]
    if not models:
        raise KVExploreError("model=[] is an empty list; expected at least one model")
    portables, model_names = [], []
    for m in models:
        src = load_model_config(m)  # an unknown model is an error, not rows
        portable = m if isinstance(m, (str, Mapping)) else src.config
        portables.append(portable)
        model_names.append(load_model_config(portable).name)  # the model column a worker writes
    columns = ["model", *names, *RESULT_COLUMNS]
    out = RowFile(output, [*columns, KEY_COLUMN], [KEY_COLUMN]) if output is not None else None
    by_name = dict(zip(model_names, portables, strict=True))

    def checked(key: str | None):
        """A file row is taken for ``key`` only when the key computed again
        from its own input cells is ``key``."""
        def check(row: dict) -> bool:
            m = by_name.get(row.get("model"))
            cells = {n: row.get(n) for n in names}
            return m is not None and _file_key(m, cells) == key
        return check

    groups: dict[Any, tuple[int, dict, list[dict]]] = {}
    order = []
    for index in range(len(models)):
        for combo in itertools.product(*values):
            given = dict(zip(names, combo, strict=True))
            plan_kwargs = {n: v for n, v in given.items() if n in PLAN_KEYWORDS}
            key = (index, _key(tuple(plan_kwargs.values())))
            groups.setdefault(key, (index, plan_kwargs, []))[2].append(given)
            order.append((key, len(groups[key][2]) - 1))
    keys = list(groups)
    position = {k: n for n, k in enumerate(keys)}
    cells = [[{n: _cell(n, v) for n, v in given.items()} for given in groups[k][2]] for k in keys]
    file_keys = [[_file_key(portables[groups[k][0]], c) for c in rows]
                 for k, rows in zip(keys, cells, strict=True)]
    questions = []
    for k, rows in zip(keys, cells, strict=True):
        try:
            questions.append([row_question(portables[groups[k][0]], c) for c in rows])
        except (KVExploreError, TypeError, ValueError):
            questions.append(None)  # a refused input: its row carries the reason
    results = resumable_sweep(
        _rows_of_plan, [(portables[groups[k][0]], *groups[k][1:]) for k in keys],
        columns=columns, key_column=KEY_COLUMN, questions=questions, file_keys=file_keys,
        checks=[[checked(f) for f in fs] for fs in file_keys], executor=executor, output=out,
        store=answer_store(store), what="sweep",
        order=[(position[key], i) for key, i in order])
    by_key = dict(zip(keys, results, strict=True))
    import pandas as pd

    rows = [by_key[key][i] for key, i in order]
    return pd.DataFrame(rows, columns=columns)


__all__ = [
    "KEY_COLUMN",
    "OFFLOAD_KEYWORDS",
    "PLAN_KEYWORDS",
    "RESULT_COLUMNS",
    "SWEEP_KIND",
    "make_plan",
    "row_question",
    "run_tasks",
    "sweep",
]
