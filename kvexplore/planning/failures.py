"""vLLM's own exceptions, wrapped once at the planning boundary into one
``KVExploreError`` line (:func:`vllm_error`)."""

from __future__ import annotations

import re
import traceback

from kvexplore.errors import KVExploreError
from kvexplore.planning.gpus import GPU
from kvexplore.planning.inputs import PlanRequest
from kvexplore.planning.models import ModelSource
from kvexplore.planning.release import release_name


def vllm_origin(exc: BaseException) -> str:
    """Where in vLLM ``exc`` was raised: ``"vllm/v1/kv_cache_interface.py:
    page_size_bytes"`` (the innermost vLLM frame), with the failing condition
    of an ``assert``; ``""`` when no vLLM frame raised it."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "/vllm/" in f.filename]
    if not frames:
        return ""
    f = frames[-1]
    where = f"{f.filename[f.filename.rindex('/vllm/') + 1:]}: {f.name}"
    line = (f.line or "").strip()
    if isinstance(exc, AssertionError) and line.startswith("assert "):
        where += f", which asserts `{line.removeprefix('assert ').split(', ')[0]}`"
    return where


def vllm_error(src: ModelSource, gpu: GPU, exc: BaseException,
               request: PlanRequest) -> KVExploreError:
    """vLLM's reason, in one line, with the model, GPU, the keywords the
    request sets away from their defaults (:meth:`PlanRequest.given`, but
    ``num_blocks`` and ``kv_cache_memory_bytes``) and the vLLM function that
    raised named."""
    msg = " ".join(str(exc).split())
    msg = re.sub(r"\s*For further information visit \S+", "", msg)
    msg = re.sub(r"\s*\[type=value_error, input_value=.*?input_type=\w+\]", "", msg)
    if len(msg) > 900:
        msg = msg[:900] + " ..."
    given = ", ".join(
        f"{k}={v!r}" for k, v in request.given().items()
        if k not in ("num_blocks", "kv_cache_memory_bytes") and v is not None
    )
    if isinstance(exc, ZeroDivisionError) and request.decode_context_parallel_size > 1:
        msg = (
            f"{msg}: decode_context_parallel_size={request.decode_context_parallel_size} "
            "shards each rank's attention KV heads, and this model has none to shard "
            f"at tensor_parallel_size={request.tensor_parallel_size}; expected "
            "decode_context_parallel_size=1"
        )
    origin = vllm_origin(exc)
    return KVExploreError(
        f"{release_name()} rejects {src.name} ({src.architecture}) on {gpu}"
        + (f" with {given}" if given else "")
        + f": {type(exc).__name__}" + (f": {msg}" if msg else "")
        + (f" (raised in {origin})" if origin else "")
    )


__all__ = ["vllm_error", "vllm_origin"]
