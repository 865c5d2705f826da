"""vLLM's own exceptions, wrapped once at the planning boundary into one
``KVExploreError`` line (:func:`vllm_error`)."""

from __future__ import annotations

import contextlib
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


def _frames(exc: BaseException):
    """Each frame on ``exc``'s traceback, outermost first."""
    tb = exc.__traceback__
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _selector_locals(exc: BaseException) -> dict | None:
    """The locals of the platform's ``get_attn_backend_cls`` frame that raised
    ``exc`` (``vllm/platforms/cuda.py``), or ``None``."""
    found = None
    for frame in _frames(exc):
        if frame.f_code.co_name == "get_attn_backend_cls" and "attn_selector_config" in frame.f_locals:
            found = frame.f_locals
    return found


def backend_hint(exc: BaseException, gpu: GPU) -> str:
    """What vLLM's attention-backend selection would accept on ``gpu``, where
    it refused: the backends valid for the same layer on the same GPU when a named
    ``attention_backend`` is not, or the kernel block sizes of the backends
    that refuse only the ``block_size``.  Both come from the platform's own
    ``get_valid_backends`` and each backend's
    ``get_supported_kernel_block_sizes`` (a block size is accepted when it is a
    multiple of one of them: ``AttentionBackend.supports_block_size``), called
    with the selector config the refused call had, under ``gpu``'s emulation
    as the build ran (a backend module vLLM imports here, such as
    ``flash_attn.py``, binds its kernel functions only when the platform
    reports them available) and with the build's ``VllmConfig`` current (some
    backends' checks read it); ``""`` where ``exc`` is not such a refusal."""
    found = _selector_locals(exc)
    if found is None:
        return ""
    from vllm.config import set_current_vllm_config

    from kvexplore.planning.emulation import emulate

    configs = [f.f_locals["vllm_config"] for f in _frames(exc)
               if f.f_locals.get("vllm_config") is not None]
    vllm_config = configs[-1] if configs else None
    current = (contextlib.nullcontext() if vllm_config is None
               else set_current_vllm_config(vllm_config))
    with emulate(gpu, meta_tensors=False), current:
        return _backend_hint(found)


def _backend_hint(found: dict) -> str:
    try:
        valid, invalid = found["cls"].get_valid_backends(
            device_capability=found["device_capability"],
            attn_selector_config=found["attn_selector_config"],
            num_heads=found.get("num_heads"),
        )
    except Exception:  # noqa: BLE001 - a hint is never worth a second error
        return ""
    selected = found.get("selected_backend")
    if selected is not None:
        names = [c.backend.name for c in sorted(valid, key=lambda c: c.priority)]
        if names:
            return ("; expected attention_backend=None (vLLM's choice) or one valid for "
                    f"this layer on this GPU: {', '.join(names)}")
        try:
            reasons = selected.get_class().validate_configuration(
                device_capability=found["device_capability"],
                **found["attn_selector_config"]._asdict())
        except Exception:  # noqa: BLE001
            return ""
        refused = {selected: reasons}
    elif valid:
        return ""
    else:
        refused = {backend: reasons for backend, (_, reasons)
                   in sorted(invalid.items(), key=lambda kv: kv[1][0])}
    accepted: dict[str, list[str]] = {}
    for backend, reasons in refused.items():
        if list(reasons) == ["block_size not supported"]:
            multiples = _kernel_block_multiples(backend)
            if multiples:
                accepted.setdefault(multiples, []).append(backend.name)
    if not accepted:
        return ""
    return "; expected a block_size that is " + " or ".join(
        f"a multiple of {multiples} ({', '.join(names)})" for multiples, names in accepted.items())


def _kernel_block_multiples(backend) -> str:
    """The sizes whose multiples ``backend`` accepts as a block size
    (``AttentionBackend.supports_block_size``), the redundant ones left out:
    ``"16"``, ``"16 or 24"``; ``""`` where the backend cannot be loaded."""
    try:
        sizes = backend.get_class().get_supported_kernel_block_sizes()
    except Exception:  # noqa: BLE001
        return ""
    bases = sorted({getattr(size, "base", size) for size in sizes})
    kept = [b for b in bases if not any(b % smaller == 0 for smaller in bases if smaller < b)]
    return " or ".join(map(str, kept))


#: Config fields vLLM divides by when it builds a layer.
SIZE_FIELDS = ("num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
               "num_hidden_layers", "intermediate_size", "n_head", "n_heads", "num_heads")


def zero_sizes(config: dict) -> list[str]:
    """The :data:`SIZE_FIELDS` set to 0 in ``config`` or its ``text_config``,
    as ``text_config.<field>`` for the latter."""
    found = [k for k in SIZE_FIELDS if config.get(k) == 0]
    text = config.get("text_config")
    if isinstance(text, dict):
        found += [f"text_config.{k}" for k in SIZE_FIELDS if text.get(k) == 0]
    return found


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
    elif isinstance(exc, ZeroDivisionError):
        zeros = zero_sizes(src.config)
        if zeros:
            msg = (f"{msg}: the config sets {', '.join(f'{k}=0' for k in zeros)}; expected "
                   "a positive number (vLLM divides by it)")
    hint = backend_hint(exc, gpu)
    if hint:
        msg = msg.rstrip(".") + hint
    origin = vllm_origin(exc)
    return KVExploreError(
        f"{release_name()} rejects {src.name} ({src.architecture}) on {gpu}"
        + (f" with {given}" if given else "")
        + f": {type(exc).__name__}" + (f": {msg}" if msg else "")
        + (f" (raised in {origin})" if origin else "")
    )


__all__ = ["SIZE_FIELDS", "backend_hint", "vllm_error", "vllm_origin", "zero_sizes"]
