"""The deployment a :class:`~kvexplore.logs.reading.VllmLog` describes, as
``plan()`` keywords: the model kvexplore can build, the GPU, and every plan
keyword the log states (each checked by :class:`PlanRequest`'s own rule; one
kvexplore cannot plan is left out with the reason)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, GiB
from kvexplore.logs.figures import PLAN_FIGURES
from kvexplore.logs.reading import LogFigure, VllmLog, read_log
from kvexplore.planning.gpus import GPU, resolve_gpu
from kvexplore.planning.inputs import PlanRequest
from kvexplore.planning.models import catalog_names
from kvexplore.version import parse_release

T = TypeVar("T")


#: The first release whose memory profile subtracts a CUDA-graph estimate by
#: default, as vLLM's own log line says ("CUDA graph memory profiling is
#: enabled (default since v0.21.0)").
CUDAGRAPH_PROFILING_SINCE = (0, 21)


def release_numbers(release: str | None) -> tuple[int, ...] | None:
    """``"0.19.0"`` -> ``(0, 19, 0)``; a pre-release or development suffix is
    dropped (``"0.29.1rc1.dev339"`` -> ``(0, 29, 1)``); None when not a
    release (:func:`kvexplore.version.parse_release`) or with fewer than two
    numbers."""
    v = parse_release(release)
    if v is None or len(v.release) < 2:
        return None
    return tuple(v.release[:3])


def printer(log: VllmLog) -> str:
    """``"vLLM 0.19.0"``, or ``"the release that printed it"`` when the log does not say."""
    return f"vLLM {log.release}" if log.release else "the release that printed it"


def subtracts_cudagraphs(log: VllmLog) -> bool | None:
    """Whether the release that printed ``log`` subtracts CUDA graphs from
    the KV memory: True when the log states the estimate; False for a release
    before :data:`CUDAGRAPH_PROFILING_SINCE` that states none, a V0 engine, and
    a log in the memory formats of those releases (V0's ``Memory profiling
    results``, the ``total_gpu_memory (..) x gpu_memory_utilization (..)``
    breakdown); else None."""
    if "cudagraph_bytes" in log or "equivalent_utilization" in log:
        return True
    if "peak_torch_bytes" in log or "requested_memory_bytes" in log:
        return False  # V0's profile and the older breakdown: printed only before v0.21
    if "engine" in log and log.first("engine").value == "V0":
        return False
    numbers = release_numbers(log.release)
    if numbers is None:
        return None
    return numbers[:2] >= CUDAGRAPH_PROFILING_SINCE


def activation_peak(log: VllmLog) -> LogFigure | None:
    """The log's first statement of the activation peak; where it states none,
    V0's ``peak_torch_memory`` less the weights (``Memory profiling results``
    counts the weights in the peak), as a figure on the peak's line; None when
    the log states neither."""
    figure = log.first("activation_peak_bytes")
    if figure is not None:
        return figure
    peak, weights = log.first("peak_torch_bytes"), log.first("weight_bytes")
    if peak is None or weights is None:
        return None
    value = peak.value - weights.value
    return dataclasses.replace(
        peak,
        name="activation_peak_bytes",
        value=value,
        text=f"{value / GiB:.2f} GiB (peak_torch_memory {peak.text} less the weights)",
        resolution=peak.resolution + weights.resolution,
    )


def unstated_memory(requested: int, kv_cache_memory: int, stated: Iterable[int]) -> int:
    """The bytes a log implies for the memory terms it does not state: the
    memory requested (as the log states it, else
    :func:`~kvexplore.layout.requested_memory`, vLLM's ``request_memory``)
    less the KV cache memory and every term it states
    (``determine_available_memory`` subtracts them all from what is
    requested)."""
    return requested - kv_cache_memory - sum(stated)


def planned(call: Callable[..., T], kwargs: dict[str, Any], notes: list[str]) -> T:
    """``call(**kwargs)``; when it refuses and ``kwargs`` hold a
    ``quantization`` (a quantized checkpoint of a config kvexplore plans
    unquantized), ``call`` again without it, with a note saying so.
    ``kwargs`` then no longer holds the quantization, for later calls."""
    try:
        return call(**kwargs)
    except KVExploreError as exc:
        if "quantization" not in kwargs:
            raise
        q = kwargs.pop("quantization")
        notes.append(f"quantization={q!r}: not planned ({exc}); weights differ from the log's")
        return call(**kwargs)


@dataclass(frozen=True)
class Deployment:
    """What to plan for a log: ``model`` (what ``plan()`` takes), ``gpu``,
    ``plan_kwargs`` and ``notes`` (one line per choice: where a keyword came
    from, or why one the log states is left out)."""

    model: Any
    model_name: str
    gpu: GPU
    plan_kwargs: FrozenDict
    enforce_eager: bool | None
    notes: tuple[str, ...]


def as_log(log: Any) -> VllmLog:
    """``log`` if it is a :class:`VllmLog`, else :func:`read_log` of it."""
    return log if isinstance(log, VllmLog) else read_log(log)


def _catalog_match(name: str) -> str | None:
    """The catalog id a log's model names: itself, or a path or hub cache
    folder ending in it (``.../models--Qwen--Qwen3-8B``)."""
    names = catalog_names()
    if name in names:
        return name
    tail = name.rstrip("/").replace("models--", "").replace("--", "/").lower()
    for known in names:
        if tail.endswith(known.lower()) or tail.endswith(
            "/" + known.split("/")[-1].lower()
        ):
            return known
    return None


def resolve_model(log: VllmLog, model: Any) -> tuple[Any, str, str]:
    """``(model for plan(), its name, note)``: ``model`` when given, else the
    model the log names if kvexplore can find it (a catalog id, a config
    path here); else a :class:`KVExploreError` naming what to give."""
    if model is not None:
        name = model if isinstance(model, str) else type(model).__name__
        return model, name, f"model: {name} (given)"
    named = log.get("model")
    if named is None:
        raise KVExploreError(
            "the log does not name its model (no engine banner, no non-default args); "
            "expected model= a catalog id (kvexplore.catalog_names()), a config.json or its "
            "directory (command line: --model PATH)"
        )
    hit = _catalog_match(str(named))
    if hit is not None:
        return (
            hit,
            hit,
            f"model: {hit} (the log's {named!r}, kvexplore's catalog config)",
        )
    path = Path(str(named)).expanduser()
    if (path / "config.json").is_file() or (path.suffix == ".json" and path.is_file()):
        return str(path), str(named), f"model: {named} (the config found at that path)"
    raise KVExploreError(
        f"the log's model {named!r} is not one kvexplore can find: not in "
        "kvexplore.catalog_names() and no config.json at that path here; expected model= its "
        "config.json, a directory holding it or a catalog id (command line: --model PATH)"
    )


def resolve_gpu_of(log: VllmLog, gpu: Any) -> tuple[GPU, str]:
    """The GPU to plan on: ``gpu`` when given, else the card the log names."""
    if gpu is not None:
        g = resolve_gpu(gpu)
        return g, f"gpu: {g.name} (given)"
    named = log.get("gpu_name")
    if named is not None:
        try:
            g = resolve_gpu(named)
        except KVExploreError:
            g = None
        if g is None:
            from kvexplore.planning.gpus import gpus

            table = gpus()
            rows = table[table.device_name.str.lower() == str(named).lower()]
            if len(rows):
                g = resolve_gpu(rows.gpu.iloc[0])
        if g is not None:
            return g, f"gpu: {g.name} (the log's {named!r})"
    raise KVExploreError(
        "the log does not name a GPU kvexplore knows"
        + (f" ({named!r})" if named else "")
        + "; expected gpu= one of kvexplore.gpus() (command line: --gpu H100)"
    )


def _plannable(name: str, value: Any) -> str | None:
    """Why ``name=value`` cannot be planned (None: it can)."""
    if (
        name == "speculative_config"
        and value is not None
        and not isinstance(value, dict)
    ):
        return f"{value!r} is not a dict the log spells out"
    try:
        PlanRequest(**{name: dict(value) if isinstance(value, FrozenDict) else value})
    except (KVExploreError, TypeError, ValueError) as exc:
        return str(exc)
    return None


def resolve(log: VllmLog, model: Any, gpu: Any, overrides: dict) -> Deployment:
    """The :class:`Deployment` ``log`` describes, with ``overrides``
    (``plan()`` keywords) taking precedence over the log."""
    src, name, model_note = resolve_model(log, model)
    g, gpu_note = resolve_gpu_of(log, gpu)
    notes = [model_note, gpu_note]
    kwargs: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(PlanRequest)}
    for key in PLAN_FIGURES:
        if key in overrides or key not in log:
            continue
        try:
            value = log.get(key)
        except KVExploreError as exc:
            notes.append(f"{key}: not planned from the log ({exc})")
            continue
        if value is None:
            continue
        if isinstance(value, FrozenDict):
            value = dict(value)
        why = _plannable(key, value) if key in fields else "not a plan() keyword"
        if why is None:
            kwargs[key] = value
            line = log.first(key).line
            notes.append(f"{key}={value!r} (line {line})")
        else:
            notes.append(f"{key}={value!r}: not planned ({why})")
    for key, value in overrides.items():
        kwargs[key] = value
        notes.append(f"{key}={value!r} (given)")
    eager = None
    if "enforce_eager" in log:
        try:
            eager = bool(log.get("enforce_eager"))
        except KVExploreError:
            eager = None
    return Deployment(src, name, g, FrozenDict(kwargs), eager, tuple(notes))


__all__ = [
    "PLAN_FIGURES",
    "Deployment",
    "activation_peak",
    "as_log",
    "planned",
    "resolve",
    "resolve_gpu_of",
    "resolve_model",
    "unstated_memory",
]
