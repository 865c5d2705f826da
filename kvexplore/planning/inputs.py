"""The checks every ``plan()`` keyword gets before anything is looked up or built.

:func:`plan_request` turns ``plan()``'s keywords into one hashable, normalised
request (a tuple of ``(name, value)`` in signature order): the key of the plan
cache.  It accepts what vLLM's own engine arguments accept, spelled the ways
Python users have them (ints and numpy ints, ``torch.bfloat16`` or
``"bfloat16"``), and refuses the rest with a :class:`KVExploreError` naming
the argument, the value and what was expected.  vLLM itself checks the
combinations later (a TP that does not divide the heads, a backend that does
not suit the model) and its reasons are quoted then.

>>> dict(plan_request(tensor_parallel_size=2))["tensor_parallel_size"]
2
>>> plan_request(block_size=16.0)
Traceback (most recent call last):
...
kvexplore.errors.KVExploreError: block_size=16.0 is invalid; expected an integer >= 1 or None
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping
from typing import Any

from kvexplore.errors import KVExploreError

#: ``plan()`` keywords with vLLM's engine-argument defaults (``None``: vLLM decides).
PLAN_DEFAULTS: dict[str, Any] = {
    "tensor_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "block_size": None,
    "dtype": "auto",
    "kv_cache_dtype": "auto",
    "enable_prefix_caching": None,
    "mamba_cache_mode": None,
    "mamba_ssm_cache_dtype": "auto",
    "max_model_len": None,
    "attention_backend": None,
    "speculative_config": None,
    "num_blocks": None,
    "kv_cache_memory_bytes": None,
    "gpu_memory_utilization": None,
    "enable_extensible_kv_cache": None,
    "kv_cache_layout": None,
    "max_num_batched_tokens": None,
    "max_num_seqs": None,
}

#: ``plan()`` keywords the model build does not depend on (a plan that changes
#: only these reuses the build).
MEMORY_KEYWORDS = ("num_blocks", "kv_cache_memory_bytes", "gpu_memory_utilization",
                   "enable_extensible_kv_cache", "max_model_len")

MAMBA_CACHE_MODES = ("none", "align", "all")
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
MAMBA_SSM_DTYPES = ("auto", "float32", "float16", "bfloat16")


def as_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None,
           allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` (``numpy`` integers accepted; bools, floats and
    strings refused), checked against ``[minimum, maximum]``."""
    if value is None and allow_none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum and (maximum is None or number <= maximum):
            return number
    bound = f"an integer >= {minimum}" + (f" and <= {maximum:,}" if maximum else "")
    raise KVExploreError(
        f"{name}={value!r} is invalid; expected {bound}" + (" or None" if allow_none else "")
    )


def as_fraction(name: str, value: Any) -> float:
    """``value`` as a float in ``(0, 1]`` (vLLM's ``CacheConfig`` bounds on
    ``gpu_memory_utilization``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise KVExploreError(f"{name}={value!r} is invalid; expected a number in (0, 1]")
    return float(value)


def as_choice(name: str, value: Any, choices: tuple[str, ...], *, allow_none: bool = False):
    """``value`` if it is one of ``choices`` (a ``torch.dtype`` counts by its
    name: ``torch.bfloat16`` is ``"bfloat16"``)."""
    if value is None and allow_none:
        return None
    text = _dtype_text(value)
    if isinstance(text, str) and text in choices:
        return text
    raise KVExploreError(
        f"{name}={value!r} is invalid; expected one of {list(choices)}"
        + (" or None" if allow_none else "")
    )


def _dtype_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    import torch

    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


def _bool_or_none(name: str, value: Any) -> bool | None:
    if value is None or value is True or value is False:
        return value
    raise KVExploreError(f"{name}={value!r} is invalid; expected True, False or None (vLLM decides)")


def _max_model_len(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if int(value) == -1 or int(value) >= 1:
            return int(value)
    raise KVExploreError(
        f"max_model_len={value!r} is invalid; expected an integer >= 1, -1 (auto-fit to "
        "the KV cache memory, as vLLM does) or None (the model's own length)"
    )


def _speculative_config(value: Any) -> str | None:
    """The config as canonical JSON text (hashable); refused unless a JSON object."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise KVExploreError(
            f"speculative_config={value!r} is invalid; expected a dict such as "
            "{'method': 'mtp', 'num_speculative_tokens': 2}"
        )
    try:
        return json.dumps(dict(value), sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise KVExploreError(
            f"speculative_config={value!r} is invalid; expected JSON values only ({exc})"
        ) from None


def _draft_model(spec: Mapping | None):
    """The :class:`~kvexplore.planning.models.ModelSource` of a speculative
    config's draft ``model`` (a catalog id, ``config.json``, directory or hub
    id, as ``plan()``'s ``model``), or None: the request is keyed by the draft
    config's content, and vLLM reads it from the materialised directory."""
    if not spec or spec.get("model") is None:
        return None
    from kvexplore.planning.models import load_model_config

    try:
        return load_model_config(spec["model"])
    except KVExploreError as exc:
        raise KVExploreError(f"speculative_config['model']={spec['model']!r}: {exc}") from None


def plan_request(*, vllm_checks: bool = True, **kwargs: Any) -> tuple[tuple[str, Any], ...]:
    """Checked, normalised ``plan()`` keywords (every name of
    :data:`PLAN_DEFAULTS`, in order, then ``draft_model``: the draft config a
    ``speculative_config`` names, see :func:`_draft_model`) as a hashable tuple.

    ``vllm_checks=False`` skips the two checks that import vLLM (the
    ``kv_cache_dtype`` among the release's ``CacheDType`` values, the
    ``attention_backend`` among its ``AttentionBackendEnum``; both are kept as
    given, text): the key the answer store looks a request up by, which only
    requests ``plan()`` accepted were stored under."""
    unknown = [k for k in kwargs if k not in PLAN_DEFAULTS]
    if unknown:
        raise KVExploreError(
            f"unknown plan() keyword(s) {unknown}; expected {list(PLAN_DEFAULTS)}"
        )
    r = {**PLAN_DEFAULTS, **kwargs}
    if vllm_checks:
        from kvexplore.planning.release import kv_cache_dtypes

        dtypes = kv_cache_dtypes()
        if r["attention_backend"] is not None:
            from kvexplore.planning.backends import validate_backend_name

            r["attention_backend"] = validate_backend_name(r["attention_backend"])
    else:
        text = _dtype_text(r["kv_cache_dtype"])
        dtypes = (text,) if isinstance(text, str) else ()
        if r["attention_backend"] is not None and not isinstance(r["attention_backend"], str):
            raise KVExploreError(f"attention_backend={r['attention_backend']!r} is invalid; "
                                 "expected a backend name")
    out = {
        "tensor_parallel_size": as_int("tensor_parallel_size", r["tensor_parallel_size"]),
        "decode_context_parallel_size": as_int(
            "decode_context_parallel_size", r["decode_context_parallel_size"]
        ),
        "block_size": as_int("block_size", r["block_size"], allow_none=True),
        "dtype": as_choice("dtype", r["dtype"], MODEL_DTYPES),
        "kv_cache_dtype": as_choice("kv_cache_dtype", r["kv_cache_dtype"], dtypes),
        "enable_prefix_caching": _bool_or_none("enable_prefix_caching",
                                               r["enable_prefix_caching"]),
        "mamba_cache_mode": as_choice("mamba_cache_mode", r["mamba_cache_mode"],
                                      MAMBA_CACHE_MODES, allow_none=True),
        "mamba_ssm_cache_dtype": as_choice("mamba_ssm_cache_dtype", r["mamba_ssm_cache_dtype"],
                                           MAMBA_SSM_DTYPES),
        "max_model_len": _max_model_len(r["max_model_len"]),
        "attention_backend": r["attention_backend"],
        "speculative_config": _speculative_config(r["speculative_config"]),
        "num_blocks": as_int("num_blocks", r["num_blocks"], allow_none=True),
        "kv_cache_memory_bytes": as_int("kv_cache_memory_bytes", r["kv_cache_memory_bytes"],
                                        allow_none=True),
        "gpu_memory_utilization": (None if r["gpu_memory_utilization"] is None else
                                   as_fraction("gpu_memory_utilization",
                                               r["gpu_memory_utilization"])),
        "enable_extensible_kv_cache": _bool_or_none("enable_extensible_kv_cache",
                                                    r["enable_extensible_kv_cache"]),
        "kv_cache_layout": as_choice("kv_cache_layout", r["kv_cache_layout"],
                                     KV_CACHE_LAYOUTS, allow_none=True),
        "max_num_batched_tokens": as_int("max_num_batched_tokens", r["max_num_batched_tokens"],
                                         allow_none=True),
        "max_num_seqs": as_int("max_num_seqs", r["max_num_seqs"], allow_none=True),
    }
    out["draft_model"] = _draft_model(r["speculative_config"])
    if out["num_blocks"] is not None and out["kv_cache_memory_bytes"] is not None:
        raise KVExploreError(
            f"give num_blocks ({out['num_blocks']}) or kv_cache_memory_bytes "
            f"({out['kv_cache_memory_bytes']}), not both"
        )
    return tuple(out.items())


def engine_kwargs(request: Mapping[str, Any]) -> dict[str, Any]:
    """``EngineArgs`` keywords for a request (what a ``vllm serve`` command line
    with the same flags sets; unset flags are left to vLLM)."""
    kw = {name: request[name] for name in (
        "tensor_parallel_size", "decode_context_parallel_size", "dtype",
        "kv_cache_dtype", "mamba_ssm_cache_dtype")}
    for name in ("block_size", "enable_prefix_caching", "mamba_cache_mode", "attention_backend",
                 "max_num_batched_tokens", "max_num_seqs"):
        if request[name] is not None:
            kw[name] = request[name]
    if request["speculative_config"] is not None:
        spec = json.loads(request["speculative_config"])
        draft = request.get("draft_model")
        if draft is not None:
            spec["model"] = str(draft.config_dir)
        kw["speculative_config"] = spec
    return kw


__all__ = [
    "KV_CACHE_LAYOUTS",
    "MAMBA_CACHE_MODES",
    "MAMBA_SSM_DTYPES",
    "MEMORY_KEYWORDS",
    "MODEL_DTYPES",
    "PLAN_DEFAULTS",
    "as_choice",
    "as_fraction",
    "as_int",
    "engine_kwargs",
    "plan_request",
]
