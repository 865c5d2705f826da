"""A start-up log as a calibration: the memory terms of the machine and
release that printed it, for :func:`kvexplore.capacity` to answer other
deployments from (``capacity(..., calibration=calibrate(log))``).

What the log states is taken as measured (the breakdown's terms, ``Model
loading took``, ``Estimated CUDA graph memory``, the card's total, V0's
``peak_torch_memory`` less the weights as the activation peak).  The total
is also implied by the CUDA-graph estimate and the two utilizations of ``The
current --gpu-memory-utilization=U is equivalent to ...=E``: ``total =
CUDA graphs / (U - E)``.  What the log does not state is the residual it
implies: ``ceil(total x utilization) - KV cache memory - the stated terms``.
When one term is missing the residual is that term; when several are, every
missing term but one is kvexplore's estimate for the deployment (the high end
of :func:`kvexplore.profile_estimates`, as :func:`kvexplore.capacity`
subtracts it) and the residual less those is the last one: the weights where
the log does not state them (the checkpoint the log loaded, quantized or
not), else non-torch memory (the machine's), else the activation peak, else
the CUDA graphs.  ``sources`` says which is which.
"""

from __future__ import annotations

from typing import Any

from kvexplore.capacity_planning import CALIBRATED_TERMS, Calibration, profile_estimates
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, requested_memory
from kvexplore.logs.deployment import (
    activation_peak,
    as_log,
    planned,
    printer,
    resolve,
    resolve_gpu_of,
    subtracts_cudagraphs,
    unstated_memory,
)
from kvexplore.logs.reading import VllmLog

#: Which missing term takes the residual, in order of preference.
ABSORBERS = (
    "weight_bytes",
    "non_torch_bytes",
    "activation_peak_bytes",
    "cudagraph_bytes",
)


def _stated(log: VllmLog, name: str) -> tuple[int | None, str]:
    """``(value, source)`` of a figure the log states, ``(None, "")`` when it
    states none; a contradicted figure is refused (``VllmLog.get``).  The
    activation peak is also V0's peak less the weights (:func:`activation_peak`)."""
    figure = log.first(name)
    if figure is not None:
        value = log.get(name)
    elif name == "activation_peak_bytes" and (figure := activation_peak(log)) is not None:
        log.get("peak_torch_bytes"), log.get("weight_bytes")  # each refused if contradicted
        value = figure.value
    else:
        return None, ""
    return value, f"stated: {figure.text} (line {figure.line}: {figure.where})"


def calibrate(log: Any, model: Any = None, gpu: Any = None, **overrides) -> Calibration:
    """The :class:`~kvexplore.capacity_planning.Calibration` a start-up log
    (a :class:`VllmLog`, its text or its path) gives, as the module doc
    derives it.

    ``model`` and ``gpu`` default to what the log names
    (:func:`kvexplore.check_log`'s rules); the GPU is required.  The model is
    needed only when the log leaves two or more terms unstated (kvexplore
    estimates all but one); ``overrides`` are ``plan()`` keywords for that
    estimate, and say what the log does not (``max_num_batched_tokens``).
    A contradicted figure is refused (pass the value you trust)."""
    log = as_log(log)
    g, _ = resolve_gpu_of(log, gpu)
    util = overrides.get("gpu_memory_utilization", log.get("gpu_memory_utilization"))
    values, sources = _log_terms(log, util)
    measured = [n for n in CALIBRATED_TERMS if values[n] is not None]
    if values["total_memory_bytes"] is None:
        low, _ = g.total_memory_range
        values["total_memory_bytes"] = low
        sources["total_memory_bytes"] = (
            f"kvexplore's reading for the {g.name}, the low end as capacity() takes it "
            f"({g.total_memory_source}): the log states none"
        )
    missing = [n for n in ABSORBERS if values[n] is None]
    kv, kv_source = _stated(log, "kv_cache_memory_bytes")
    model_name, tokens, estimates = _estimates(log, model, g, util, overrides, missing)
    if kv is not None and util is not None and missing:
        for name in missing[1:] if estimates else ():
            values[name] = estimates[name]
            sources[name] = f"kvexplore's estimate for {model_name}: the log states none"
        absorber = missing[0]
        others = [values[n] or 0 for n in CALIBRATED_TERMS[1:] if n != absorber]
        values[absorber] = unstated_memory(requested_memory(values["total_memory_bytes"], util),
                                           kv, others)
        sources[absorber] = (
            f"residual: {values[absorber]:,} = ceil(total {values['total_memory_bytes']:,} x "
            f"{util}) - KV cache memory {kv:,} ({kv_source}) - the other terms"
            + ("; negative: the other terms as taken add up to more than the log leaves"
               if values[absorber] < 0 else "")
        )
        measured.append(absorber)
    elif missing and estimates:
        for name in missing:
            values[name] = estimates[name]
            sources[name] = (
                f"kvexplore's estimate for {model_name}: the log states neither it "
                "nor the KV cache memory and utilization a residual needs"
            )
    return Calibration(
        model=model_name,
        gpu=g.name,
        release=log.release,
        tensor_parallel_size=int(overrides.get("tensor_parallel_size",
                                               log.get("tensor_parallel_size") or 1)),
        quantization=_value(log, "quantization"),
        max_num_batched_tokens=tokens,
        gpu_memory_utilization=util,
        kv_cache_memory_bytes=kv,
        estimated_activation_peak_bytes=estimates.get("activation_peak_bytes"),
        measured=tuple(n for n in CALIBRATED_TERMS if n in measured),
        sources=FrozenDict(sources),
        **values,
    )


def _log_terms(log: VllmLog, util: float | None):
    """``(values, sources)`` of each calibrated term the log states or
    implies: the total from the CUDA-graph estimate and the two utilizations
    of ``is equivalent to``, CUDA graphs 0 for a release that does not
    subtract them; None where it does neither."""
    values: dict[str, int | None] = {}
    sources: dict[str, str] = {}
    for name in CALIBRATED_TERMS:
        values[name], sources[name] = _stated(log, name)
    if (
        values["total_memory_bytes"] is None
        and values["cudagraph_bytes"]
        and util
        and "equivalent_utilization" in log
    ):
        delta = util - log.get("equivalent_utilization")
        if delta > 0:
            values["total_memory_bytes"] = round(values["cudagraph_bytes"] / delta)
            sources["total_memory_bytes"] = (
                f"implied: CUDA graphs {values['cudagraph_bytes']:,} B / ({util} - "
                f"{log.get('equivalent_utilization')}) (line "
                f"{log.first('equivalent_utilization').line}: is equivalent to)"
            )
    if values["cudagraph_bytes"] is None and subtracts_cudagraphs(log) is False:
        values["cudagraph_bytes"] = 0
        sources["cudagraph_bytes"] = (
            f"0: {printer(log)} does not subtract CUDA graphs from the KV memory (the "
            "estimate is the default from v0.21.0) and the log states none"
        )
    return values, sources


def _estimates(log: VllmLog, model: Any, g, util: float | None, overrides: dict,
               missing: list[str]) -> tuple[str | None, int | None, dict[str, int]]:
    """``(model name, max_num_batched_tokens, estimates)``: kvexplore's
    estimate of each term (the high ends of :func:`profile_estimates`) for the
    log's deployment; empty when the model cannot be found and at most one
    term is missing (the residual alone gives it), refused otherwise."""
    try:
        dep = resolve(log, model, g,
                      {k: v for k, v in overrides.items() if k != "gpu_memory_utilization"})
    except KVExploreError as exc:
        if len(missing) > 1:
            raise KVExploreError(
                f"the log leaves {', '.join(missing)} unstated, and kvexplore needs the model to "
                f"estimate all but one of them: {exc}"
            ) from None
        return None, None, {}
    from kvexplore.planning.planner import plan

    kwargs = dict(dep.plan_kwargs)
    if util is not None:
        kwargs["gpu_memory_utilization"] = util
    p = planned(lambda **kw: plan(dep.model, gpu=dep.gpu, **kw), kwargs, [])
    estimates = {name: high for name, (_, high, _) in profile_estimates(p).items()}
    return p.model.name, int(p.vllm_config.scheduler_config.max_num_batched_tokens), estimates


def _value(log: VllmLog, name: str) -> Any:
    """The log's value of ``name``, None when absent or contradicted."""
    try:
        return log.get(name)
    except KVExploreError:
        return None


__all__ = ["ABSORBERS", "calibrate"]
