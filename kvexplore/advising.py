"""What to run: the engine arguments that start, hold a workload and reuse
its shared prefix, searched on the installed vLLM release (or others).

:func:`advise` plans every candidate setting of a search space with
:func:`kvexplore.plan` and :func:`kvexplore.capacity` (so every number of a
row is that release's own: the whole start-up verdict of
:mod:`kvexplore.planning.startup`, ``get_kv_cache_capacity``'s tokens and
concurrency, the memory profile) and runs vLLM's own ``Scheduler`` (its
``KVCacheManager`` inside) on the CPU for the prefix reuse: a first request
of the workload's prompt runs to completion, a second that shares only the
workload's shared prefix is scheduled, and the tokens vLLM computes as
cached for it are the row's ``prefix_reused_tokens``
(:func:`kvexplore.capacity_planning.shared_prefix_hit_tokens`).

:class:`Advice` holds the rows as a pandas DataFrame (engine-argument
columns under vLLM's names, ``starts`` and ``refusal``, then the metrics),
the Pareto front over (concurrent requests, prefix reuse, GPUs used), the
recommended row for an objective and its ``vllm serve`` command line, and
for each other row why it was not recommended.

Refused with a :class:`KVExploreError` naming the value: a workload field out
of range (:class:`Workload`), a GPU count or space axis kvexplore does not
search, an objective it does not know, and every error :func:`kvexplore.plan`
raises for the model or GPU.  A setting that vLLM refuses is a row (its
``refusal`` is the release's message), never an error.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict

#: The objectives :func:`advise` ranks by: the column maximised (or, for
#: ``"gpus"``, minimised) first; ties go to fewer GPUs, then more concurrent
#: requests, then more prefix reuse, then the fewest arguments changed from
#: vLLM's defaults.
OBJECTIVES = ("concurrency", "prefix_reuse", "gpus")

#: The axes a search space may name, each an engine argument of
#: :func:`kvexplore.plan` under vLLM's name.
AXES = (
    "tensor_parallel_size", "data_parallel_size", "kv_cache_dtype", "block_size",
    "mamba_block_size", "prefix_match_unit", "enable_prefix_caching", "mamba_cache_mode",
    "max_num_seqs", "gpu_memory_utilization", "max_num_batched_tokens",
)

#: The metric columns of :attr:`Advice.table`, after the axes, ``gpus``,
#: ``starts`` and ``refusal``.
METRICS = (
    "kv_cache_size_tokens", "max_concurrency", "concurrent_requests",
    "prefix_reused_tokens", "cache_hit_alignment", "block_size_resolved",
    "max_num_seqs_resolved", "host_tokens", "kv_cache_memory_per_gpu",
    "weight_bytes_per_gpu", "holds_workload",
)


#: Columns of whole numbers, shown as pandas' nullable integers (a missing
#: value is a setting refused before the number exists, or vLLM's default).
_INT_COLUMNS = ("tensor_parallel_size", "data_parallel_size", "block_size", "mamba_block_size",
                "prefix_match_unit", "max_num_seqs", "max_num_batched_tokens",
                "kv_cache_size_tokens", "concurrent_requests", "prefix_reused_tokens",
                "cache_hit_alignment", "block_size_resolved", "max_num_seqs_resolved",
                "host_tokens", "kv_cache_memory_per_gpu", "weight_bytes_per_gpu")


def _positive(name: str, value: Any, *, allow_none: bool = True, minimum: int = 1) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KVExploreError(f"Workload {name}={value!r} is invalid; expected an integer >= "
                             f"{minimum}")


@dataclass(frozen=True, kw_only=True)
class Workload:
    """What a deployment must serve, stated once.

    * ``max_model_len``: the longest request in tokens (vLLM's
      ``--max-model-len``); or ``prompt_tokens`` and ``output_tokens``, whose
      sum it then is; ``None`` for all three keeps the model's own length.
    * ``concurrency``: requests served at once (a setting holds the
      workload when ``concurrent_requests`` reaches it).
    * ``shared_prefix``: tokens every request starts with (a system prompt,
      a document header); ``reuse_prefix``: a setting that reuses none of
      it does not hold the workload.
    * ``speculative_config``: as :func:`kvexplore.plan` takes it.
    * ``cpu_bytes_to_use``: host memory for KV offloading (the CPU tier's
      tokens in each row), per engine.

    The reuse probe's requests are ``prompt_tokens`` long (or the shared
    prefix and one token more): give the prompts' real length, since with
    Mamba layers in ``align`` cache mode vLLM keeps a state only where a
    prefill chunk ends (``Scheduler._mamba_block_aligned_split``), so a
    prefix inside a longer prompt may not be reused at all.  Refused with one :class:`KVExploreError`
    naming the field: a count that is not a positive integer, a shared
    prefix not shorter than the request, ``reuse_prefix`` without a shared
    prefix, ``prompt_tokens`` without ``output_tokens`` (or the reverse), a
    ``max_model_len`` below their sum.
    """

    max_model_len: int | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    concurrency: int = 1
    shared_prefix: int = 0
    reuse_prefix: bool = False
    speculative_config: Any = None
    cpu_bytes_to_use: int | None = None

    def __post_init__(self) -> None:
        for name in ("max_model_len", "prompt_tokens", "output_tokens", "cpu_bytes_to_use"):
            _positive(name, getattr(self, name))
        _positive("concurrency", self.concurrency, allow_none=False)
        _positive("shared_prefix", self.shared_prefix, allow_none=False, minimum=0)
        if not isinstance(self.reuse_prefix, bool):
            raise KVExploreError(f"Workload reuse_prefix={self.reuse_prefix!r} is invalid; "
                                 "expected True or False")
        if (self.prompt_tokens is None) != (self.output_tokens is None):
            raise KVExploreError(
                f"Workload prompt_tokens={self.prompt_tokens!r} and output_tokens="
                f"{self.output_tokens!r} are invalid; expected both or neither")
        if self.prompt_tokens is not None:
            total = self.prompt_tokens + self.output_tokens
            if self.max_model_len is None:
                object.__setattr__(self, "max_model_len", total)
            elif self.max_model_len < total:
                raise KVExploreError(
                    f"Workload max_model_len={self.max_model_len} is invalid; expected at least "
                    f"prompt_tokens + output_tokens = {total}")
        if self.reuse_prefix and not self.shared_prefix:
            raise KVExploreError("Workload reuse_prefix=True is invalid without a shared prefix; "
                                 "expected shared_prefix > 0")
        if self.shared_prefix:
            limit = self.prompt_tokens if self.prompt_tokens is not None else self.max_model_len
            if limit is not None and self.shared_prefix >= limit:
                what = "prompt_tokens" if self.prompt_tokens is not None else "max_model_len"
                raise KVExploreError(
                    f"Workload shared_prefix={self.shared_prefix} is invalid; expected fewer "
                    f"tokens than {what}={limit}")
        spec = self.speculative_config
        if spec is not None and not isinstance(spec, (str, Mapping)):
            raise KVExploreError(f"Workload speculative_config={spec!r} is invalid; expected a "
                                 "dict or JSON text as plan() takes it")
        if isinstance(spec, Mapping):
            object.__setattr__(self, "speculative_config", json.dumps(dict(spec), sort_keys=True))

    @property
    def probe_prompt_tokens(self) -> int:
        """The length of the reuse probe's two requests."""
        return self.prompt_tokens if self.prompt_tokens is not None else self.shared_prefix + 1

    def plan_kwargs(self) -> dict[str, Any]:
        """The :func:`kvexplore.plan` keywords the workload fixes."""
        out: dict[str, Any] = {}
        if self.max_model_len is not None:
            out["max_model_len"] = self.max_model_len
        if self.speculative_config is not None:
            out["speculative_config"] = self.speculative_config
        return out

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# -- the search space ------------------------------------------------------------


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _check_space(space: Any) -> dict[str, tuple]:
    if space is None:
        return {}
    if not isinstance(space, Mapping):
        raise KVExploreError(f"space={space!r} is invalid; expected a dict of axis -> list of "
                             f"values, axes among {list(AXES)}")
    out = {}
    for axis, values in space.items():
        if axis not in AXES:
            raise KVExploreError(f"space axis {axis!r} is invalid; expected one of {list(AXES)}")
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise KVExploreError(f"space[{axis!r}]={values!r} is invalid; expected a non-empty "
                                 "list of values (None: vLLM's default)")
        out[axis] = tuple(dict.fromkeys(values))
    return out


def _hit_unit(block: int, shared_prefix: int) -> int | None:
    """The prefix-match unit to try for a shared prefix shorter than the hit
    unit ``block``: the largest multiple of 16 that divides ``block`` and
    fits in the prefix (vLLM requires every prefix-cacheable group's block
    size to be a multiple of the unit), or None."""
    units = [u for u in range(16, min(block, shared_prefix) + 1, 16) if block % u == 0]
    return units[-1] if units else None


def default_space(base, *, gpus: int, workload: Workload) -> dict[str, tuple]:
    """The space :func:`advise` searches when none is given, from ``base``
    (the plan of vLLM's defaults for the workload), chosen so the call stays
    fast: every tensor-parallel size that divides ``gpus`` (with the rest as
    data-parallel replicas, and one replica); vLLM's prefix caching default
    and its opposite; where a shared prefix is shorter than the default's
    hit unit and the release has ``--prefix-match-unit``, the largest unit
    that fits in the prefix and divides the hit unit; vLLM's
    ``max_num_seqs``, the workload's concurrency and, where the default's
    cache holds more requests than that, as many as it holds; vLLM's
    ``gpu_memory_utilization``; and, where ``base`` is refused, the values
    its way out names."""
    from kvexplore.planning import release

    tp = _divisors(gpus)
    space: dict[str, list] = {
        "tensor_parallel_size": tp,
        "data_parallel_size": sorted({1, *(gpus // t for t in tp)}),
        "enable_prefix_caching": [None],
        "max_num_seqs": [None],
        "gpu_memory_utilization": [None],
    }
    if workload.concurrency > 1:
        space["max_num_seqs"].append(workload.concurrency)
    caching = bool(base.cache_config.enable_prefix_caching)
    space["enable_prefix_caching"].append(not caching)
    cap = _capacity_or_none(base)
    alignment = cap.cache_hit_alignment if caching and cap is not None else 0
    seqs = int(base.vllm_config.scheduler_config.max_num_seqs)
    if cap is not None and math.floor(cap.max_concurrency) > seqs:
        space["max_num_seqs"].append(math.floor(cap.max_concurrency))
    if workload.shared_prefix and alignment > workload.shared_prefix and \
            "prefix_match_unit" in release.engine_argument_names():
        unit = _hit_unit(alignment, workload.shared_prefix)
        if unit is not None:
            space["prefix_match_unit"] = [None, unit]
    if base.admission is not None and not base.admission.ok:
        for way in base.way_out():
            for name, value in way.change.items():
                if name in ("max_num_seqs", "gpu_memory_utilization"):
                    space[name].append(value)
    return {axis: tuple(dict.fromkeys(values)) for axis, values in space.items()}


def _capacity_or_none(p):
    """:func:`kvexplore.capacity` of plan ``p``, None where it refuses."""
    from kvexplore.capacity_planning import capacity

    try:
        return capacity(p)
    except KVExploreError:
        return None


def _settings(space: Mapping[str, tuple], gpus: int) -> list[dict[str, Any]]:
    """Every combination of ``space``'s values that uses at most ``gpus``
    GPUs, each a dict of the axes whose value is not vLLM's default."""
    axes = list(space)
    out, seen = [], set()
    for values in itertools.product(*(space[a] for a in axes)):
        setting = {a: v for a, v in zip(axes, values, strict=True) if v is not None}
        tp = setting.get("tensor_parallel_size", 1)
        dp = setting.get("data_parallel_size", 1)
        if tp * dp > gpus:
            continue
        for a, default in (("tensor_parallel_size", 1), ("data_parallel_size", 1)):
            if setting.get(a) == default:
                del setting[a]
        if setting.get("enable_prefix_caching") is False and any(
                a in setting for a in ("prefix_match_unit", "mamba_block_size")):
            continue  # prefix-cache units of a cache without prefix caching
        key = tuple(sorted(setting.items()))
        if key not in seen:
            seen.add(key)
            out.append(setting)
    return out


# -- one row per setting -----------------------------------------------------------


def _gpus_of(setting: Mapping[str, Any]) -> int:
    return setting.get("tensor_parallel_size", 1) * setting.get("data_parallel_size", 1)


def evaluate(model: Any, gpu: Any, setting: Mapping[str, Any], workload: Workload) -> dict:
    """One row of :attr:`Advice.table` for ``setting`` (engine arguments of
    :func:`kvexplore.plan`): the plan's whole start-up verdict (``starts``,
    ``refusal``: vLLM's message of its first refusal, or the message of a
    setting refused as input), and for a setting that starts, every metric
    of :data:`METRICS` from the plan, :func:`kvexplore.capacity` and
    :func:`~kvexplore.capacity_planning.shared_prefix_hit_tokens`.  ``concurrent_requests`` is what the
    replicas serve at once: ``data_parallel_size x min(max_num_seqs,
    floor(max_concurrency))``."""
    from kvexplore.capacity_planning import capacity, shared_prefix_hit_tokens
    from kvexplore.planning.planner import plan

    row: dict[str, Any] = {a: setting.get(a) for a in AXES}
    row["gpus"] = _gpus_of(setting)
    row.update(starts=False, refusal=None, **dict.fromkeys(METRICS))
    row["holds_workload"] = False
    try:
        p = plan(model, gpu=gpu, **workload.plan_kwargs(), **setting)
        cap = capacity(p, cpu_bytes_to_use=workload.cpu_bytes_to_use)
    except KVExploreError as exc:
        row["refusal"] = str(exc)
        return row
    starts = p.admission is None or p.admission.ok
    seqs = int(p.vllm_config.scheduler_config.max_num_seqs)
    row.update(
        starts=starts, refusal=None if starts else p.admission.message,
        kv_cache_size_tokens=int(cap.kv_cache_size_tokens),
        max_concurrency=round(float(cap.max_concurrency), 2),
        cache_hit_alignment=int(cap.cache_hit_alignment) if cap.prefix_caching else None,
        block_size_resolved=int(cap.block_size), max_num_seqs_resolved=seqs,
        host_tokens=int(cap.host.tokens) if cap.host is not None else None,
        kv_cache_memory_per_gpu=int(cap.kv_cache_memory),
        weight_bytes_per_gpu=int(cap.weight_bytes),
    )
    if not starts:
        return row
    dp = setting.get("data_parallel_size", 1)
    row["concurrent_requests"] = dp * min(seqs, math.floor(cap.max_concurrency))
    try:
        row["prefix_reused_tokens"] = shared_prefix_hit_tokens(
            p, workload.shared_prefix, workload.probe_prompt_tokens)
    except KVExploreError as exc:
        row["refusal"] = str(exc)
        row["prefix_reused_tokens"] = 0
    row["holds_workload"] = bool(
        row["concurrent_requests"] >= workload.concurrency
        and (not workload.reuse_prefix or row["prefix_reused_tokens"] > 0))
    return row


def _changed(row: Mapping[str, Any]) -> int:
    return sum(row[a] is not None for a in AXES)


def _rank(objective: str):
    def key(row):
        c, r, g = row["concurrent_requests"] or 0, row["prefix_reused_tokens"] or 0, row["gpus"]
        first = {"concurrency": (c, -g, r), "prefix_reuse": (r, c, -g),
                 "gpus": (-g, c, r)}[objective]
        return (*first, -_changed(row))
    return key


def pareto_front(rows: Sequence[Mapping[str, Any]]) -> list[int]:
    """Indices of the rows that start and that no other starting row beats
    on all of (more ``concurrent_requests``, more ``prefix_reused_tokens``,
    fewer ``gpus``) while being at least as good on each; of rows equal on
    all three, the first."""
    started = [i for i, r in enumerate(rows) if r["starts"]]

    def point(i):
        r = rows[i]
        return (r["concurrent_requests"], r["prefix_reused_tokens"], -r["gpus"])

    front, seen = [], set()
    for i in started:
        a = point(i)
        dominated = any(all(x >= y for x, y in zip(point(j), a, strict=True)) and point(j) != a
                        for j in started)
        if not dominated and a not in seen:
            seen.add(a)
            front.append(i)
    return front


def _why_not(row: Mapping[str, Any], best: Mapping[str, Any] | None,
             workload: Workload) -> str | None:
    if best is not None and row is best:
        return None
    if not row["starts"]:
        return f"vLLM refuses it: {row['refusal']}"
    if not row["holds_workload"]:
        if row["concurrent_requests"] < workload.concurrency:
            return (f"serves {row['concurrent_requests']:,} requests at once; the workload "
                    f"asks {workload.concurrency:,}")
        return f"reuses none of the {workload.shared_prefix:,}-token shared prefix"
    if best is None:
        return None
    losses = []
    for column, word in (("concurrent_requests", "requests at once"),
                         ("prefix_reused_tokens", "prefix tokens reused")):
        d = (best[column] or 0) - (row[column] or 0)
        if d > 0:
            losses.append(f"{d:,} fewer {word}")
    if row["gpus"] > best["gpus"]:
        losses.append(f"{row['gpus'] - best['gpus']} more GPU(s)")
    if not losses:
        return "as good on every measure; changes more of vLLM's defaults" \
            if _changed(row) > _changed(best) else "ties with the recommended setting"
    return "; ".join(losses)


def serve_command(model_name: str, row: Mapping[str, Any], workload: Workload) -> str:
    """The ``vllm serve`` command line of ``row``'s engine arguments and the
    workload's length and speculative config (vLLM's flags: the argument
    name with dashes; a boolean as ``--x`` / ``--no-x``:
    :func:`kvexplore.planning.way_out.serve_flag`)."""
    from kvexplore.planning.way_out import serve_flag

    parts = ["vllm serve", shlex.quote(model_name)]
    for axis in AXES:
        if row.get(axis) is not None:
            parts.append(serve_flag(axis, row[axis]))
    if workload.max_model_len is not None:
        parts.append(serve_flag("max_model_len", workload.max_model_len))
    if workload.speculative_config is not None:
        parts.append(f"--speculative-config {shlex.quote(workload.speculative_config)}")
    return " ".join(parts)


# -- the answer --------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Advice(Displayable):
    """What to run for a workload: one row per searched setting, the Pareto
    front, the recommendation for ``objective`` (:func:`advise`).

    ``rows`` are the table's rows as read-only mappings; :attr:`table` is
    them as a DataFrame (the axes of :data:`AXES` under vLLM's names, a
    ``None`` being vLLM's default; ``gpus``, ``starts``, ``refusal``; the
    metrics of :data:`METRICS`; ``front``, ``recommended`` and ``why_not``).
    ``recommended`` is the row recommended, as a dict of the engine
    arguments set and the metrics, or None when no setting starts; then
    ``nearest`` holds the ways out of vLLM's defaults
    (:meth:`kvexplore.Plan.way_out`, each a dict with ``flags``, ``why``,
    ``starts``).  ``note`` says in one line what the recommendation is.
    ``release`` is the vLLM release that answered."""

    model: str
    served_name: str
    gpu: str
    gpus: int
    workload: Workload
    objective: str
    release: str
    rows: tuple = field(repr=False)
    recommended_index: int | None
    nearest: tuple = ()
    note: str = ""
    space: FrozenDict = field(default_factory=FrozenDict, repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """Every searched setting, one row each (a new DataFrame per call)."""
        t = pd.DataFrame([dict(r) for r in self.rows])
        for column in _INT_COLUMNS:
            if column in t:
                t[column] = t[column].astype("Int64")
        return t

    @property
    def front(self) -> pd.DataFrame:
        """The rows on the Pareto front (:func:`pareto_front`)."""
        t = self.table
        return t[t["front"]].reset_index(drop=True) if len(t) else t

    @property
    def recommended(self) -> dict[str, Any] | None:
        """The recommended row: its engine arguments set (vLLM's names, only
        those away from vLLM's default) and its metrics; None when no
        setting starts."""
        if self.recommended_index is None:
            return None
        row = self.rows[self.recommended_index]
        out = {a: row[a] for a in AXES if row[a] is not None}
        out.update({m: row[m] for m in ("gpus", *METRICS)})
        return out

    @property
    def command(self) -> str | None:
        """The recommended setting as a ``vllm serve`` command line."""
        if self.recommended_index is None:
            return None
        return serve_command(self.served_name, self.rows[self.recommended_index], self.workload)

    def to_dict(self) -> dict[str, Any]:
        return {"vllm": self.release, "model": self.model, "served_name": self.served_name,
                "gpu": self.gpu, "gpus": self.gpus, "workload": self.workload.to_dict(),
                "objective": self.objective, "rows": [dict(r) for r in self.rows],
                "recommended_index": self.recommended_index, "recommended": self.recommended,
                "command": self.command, "nearest": [dict(n) for n in self.nearest],
                "note": self.note, "space": {k: list(v) for k, v in self.space.items()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Advice:
        """The :class:`Advice` :meth:`to_dict` gave (another release's answer)."""
        return cls(model=d["model"], served_name=d["served_name"], gpu=d["gpu"], gpus=d["gpus"],
                   workload=Workload(**d["workload"]), objective=d["objective"],
                   release=d["vllm"], rows=tuple(FrozenDict(r) for r in d["rows"]),
                   recommended_index=d["recommended_index"],
                   nearest=tuple(FrozenDict(n) for n in d["nearest"]), note=d["note"],
                   space=FrozenDict({k: tuple(v) for k, v in d["space"].items()}))


def _check_gpus(gpus: Any) -> int:
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 1 <= gpus <= 64:
        raise KVExploreError(f"gpus={gpus!r} is invalid; expected an integer from 1 to 64 "
                             "(the GPUs of one node or a few)")
    return gpus


def _note(rows, best, workload: Workload, objective: str) -> str:
    if best is None:
        return ("no setting in the space starts; the nearest ways out of vLLM's defaults "
                "are listed")
    r = rows[best]
    what = (f"serves {r['concurrent_requests']:,} requests at once, reuses "
            f"{r['prefix_reused_tokens'] or 0:,} of {workload.shared_prefix:,} shared-prefix "
            f"tokens (in {workload.probe_prompt_tokens:,}-token prompts), on {r['gpus']} GPU(s)")
    if not r["holds_workload"]:
        return f"no setting in the space holds the workload; the best that starts {what}"
    return f"best for {objective}: {what}"


def _advise_here(model: Any, gpu: Any, gpus: int, workload: Workload,
                 space: dict[str, tuple], objective: str) -> Advice:
    from kvexplore.planning.planner import plan
    from kvexplore.planning.release import installed_release

    base = plan(model, gpu=gpu, **workload.plan_kwargs())
    searched = {**default_space(base, gpus=gpus, workload=workload), **space}
    rows = [evaluate(model, gpu, s, workload) for s in _settings(searched, gpus)]
    front = set(pareto_front(rows))
    holds = [i for i, r in enumerate(rows) if r["holds_workload"]]
    started = [i for i, r in enumerate(rows) if r["starts"]]
    pool = holds or started
    best = max(pool, key=lambda i: _rank(objective)(rows[i])) if pool else None
    best_row = rows[best] if best is not None else None
    out = []
    for i, r in enumerate(rows):
        out.append(FrozenDict({**r, "front": i in front, "recommended": i == best,
                               "why_not": _why_not(r, best_row, workload)}))
    nearest = ()
    if best is None and base.admission is not None and not base.admission.ok:
        nearest = tuple(FrozenDict({k: v for k, v in w.to_dict().items() if k != "change"})
                        for w in base.way_out())
    return Advice(model=base.model.name, served_name=base.model.served_name or base.model.name,
                  gpu=base.gpu.name, gpus=gpus, workload=workload, objective=objective,
                  release=installed_release().version, rows=tuple(out),
                  recommended_index=best, nearest=nearest,
                  note=_note(rows, best, workload, objective),
                  space=FrozenDict(searched))


def advise(model: Any = "Qwen/Qwen3.5-0.8B", *, gpu: Any = "H100", gpus: int = 1,
           workload: Workload | None = None, vllm: Any = None, space: Any = None,
           objective: str = "concurrency", store: Any = True):
    """The settings of the engine arguments that start on ``gpus`` GPUs of
    type ``gpu``, hold ``workload`` (a :class:`Workload`; default: one
    request of the model's length) and reuse its shared prefix, searched on
    vLLM's own code: an :class:`Advice` (see the module doc).

    ``space`` maps axes of :data:`AXES` to lists of values (``None``: vLLM's
    default); an axis it names replaces that axis of :func:`default_space`,
    the others stay.  ``objective`` is one of :data:`OBJECTIVES`.  ``vllm``
    names the release that answers (None: the installed one); a list of
    releases answers in each, each in its own environment
    (:func:`kvexplore.versions.environments.answer_in`), as a
    :class:`ReleaseAdvice`.

    The installed release's answer is kept in the answer store
    (:mod:`kvexplore.store`; ``store`` as :func:`kvexplore.store.answer`
    takes it, False for none) under its question: the model's name and
    config digest, the GPU, ``gpus``, the workload, the space, the objective,
    the vLLM release and kvexplore's code, so asking again in a new process
    imports no vLLM."""
    gpus = _check_gpus(gpus)
    if workload is None:
        workload = Workload()
    if not isinstance(workload, Workload):
        raise KVExploreError(f"workload={workload!r} is invalid; expected a kvexplore.Workload")
    if objective not in OBJECTIVES:
        raise KVExploreError(f"objective={objective!r} is invalid; expected one of "
                             f"{list(OBJECTIVES)}")
    checked = _check_space(space)
    releases = _releases(vllm)
    from kvexplore.planning.release import installed_release

    here = installed_release().version
    answers = {}
    for release in releases or (here,):
        if release == here:
            answers[release] = _stored_advice(model, gpu, gpus, workload, checked, objective,
                                              store)
        else:
            answers[release] = _advise_in(release, model, gpu, gpus, workload, checked, objective)
    if vllm is None or isinstance(vllm, str):
        return next(iter(answers.values()))
    return ReleaseAdvice(answers=FrozenDict(answers))


#: The answer store's kind of an :class:`Advice`.
ADVICE_KIND = "advise"


def advice_question(model: Any, *, gpu: Any, gpus: int, workload: Workload,
                    space: Mapping[str, Sequence] | None, objective: str):
    """The answer store's :class:`~kvexplore.store.Question` of the installed
    release's :func:`advise` answer (imports no vLLM): the plan's question
    (:func:`kvexplore.planning.stored.question`) of the workload's
    keywords, with ``gpus``, the workload, the space and the objective."""
    from kvexplore.planning.stored import question

    options = {"gpus": gpus, "workload": workload.to_dict(), "objective": objective,
               "space": {k: list(v) for k, v in (space or {}).items()}}
    return question(ADVICE_KIND, model, options, gpu=gpu, **workload.plan_kwargs())


def _stored_advice(model: Any, gpu: Any, gpus: int, workload: Workload,
                   space: dict[str, tuple], objective: str, store: Any) -> Advice:
    """:func:`_advise_here`'s answer, read back from the answer store when it
    holds one for the same question, else computed and stored."""
    from kvexplore.planning.stored import is_payload, payload
    from kvexplore.store import answer

    try:
        q = advice_question(model, gpu=gpu, gpus=gpus, workload=workload, space=space,
                            objective=objective)
    except KVExploreError:
        q = None  # the plan refuses these inputs: computing says why

    def compute() -> dict:
        a = _advise_here(model, gpu, gpus, workload, space, objective)
        return payload(ADVICE_KIND, json.loads(json.dumps(a.to_dict(), default=str)), a.text())

    got = answer(q, compute, store, valid=lambda value: is_payload(value, ADVICE_KIND))
    return Advice.from_dict(got["facts"])


def _releases(vllm: Any) -> tuple[str, ...]:
    """The releases ``vllm`` names (:func:`kvexplore.version.release_list`), ()
    when None."""
    from kvexplore.planning.release import WINDOW_RELEASES, canonical_release
    from kvexplore.version import release_list

    if vllm is None:
        return ()
    return release_list(vllm, what="vllm", spell=canonical_release,
                        expected=f"expected a release or a list of releases of "
                                 f"{list(WINDOW_RELEASES)}")


def _advise_in(release: str, model: Any, gpu: Any, gpus: int, workload: Workload,
               space: dict[str, tuple], objective: str) -> Advice:
    """:func:`advise` as vLLM ``release`` answers it, in its own environment."""
    from kvexplore.versions.environments import answer_in, model_argument

    gpu_name = gpu if isinstance(gpu, str) else getattr(gpu, "name", gpu)
    request = json.dumps({"model": model_argument(model), "gpu": gpu_name, "gpus": gpus,
                          "workload": workload.to_dict(), "objective": objective,
                          "space": {k: list(v) for k, v in space.items()}})
    return Advice.from_dict(answer_in(release, "kvexplore.advising", request))


@dataclass(frozen=True)
class ReleaseAdvice(Displayable):
    """:func:`advise` answered by several vLLM releases: ``answers`` maps
    release -> :class:`Advice`; :attr:`table` is every release's rows with a
    ``vllm`` column; :attr:`recommendations` one row per release."""

    answers: FrozenDict

    @property
    def table(self) -> pd.DataFrame:
        return pd.concat([a.table.assign(vllm=r) for r, a in self.answers.items()],
                         ignore_index=True)

    @property
    def recommendations(self) -> pd.DataFrame:
        """One row per release: its recommended engine arguments, metrics and
        ``vllm serve`` command (empty where no setting starts)."""
        return pd.DataFrame([{"vllm": r, **(a.recommended or {}), "command": a.command,
                              "note": a.note} for r, a in self.answers.items()])

    def to_dict(self) -> dict[str, Any]:
        return {r: a.to_dict() for r, a in self.answers.items()}


def main(argv: list[str] | None = None) -> int:
    """``python -m kvexplore.advising REQUEST``: one :func:`advise` request
    (JSON) answered by the installed release, printed as one JSON line."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    req = json.loads(args[0])
    advice = advise(req["model"], gpu=req["gpu"], gpus=req["gpus"],
                    workload=Workload(**req["workload"]), space=req["space"] or None,
                    objective=req["objective"])
    print(json.dumps(advice.to_dict(), default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["ADVICE_KIND", "AXES", "Advice", "METRICS", "OBJECTIVES", "ReleaseAdvice", "Workload", "advise",
           "advice_question", "default_space", "evaluate", "pareto_front", "serve_command"]
