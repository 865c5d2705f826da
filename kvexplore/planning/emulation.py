"""vLLM running as if on a named NVIDIA GPU, on a machine without one.

Inside :func:`emulate`, the class of vLLM's ``current_platform`` object is a
subclass of ``CudaPlatformBase`` (``vllm/platforms/cuda.py``) answering device
queries from the :class:`GPU` table, so backend selection and config checks
are vLLM's own code.  ``is_cuda()`` is True only for :data:`CUDA_GATED_DECISIONS`
and :data:`CUDA_GATED_MODULES`; FlashAttention 2/3 (when the wheel ships
them), Triton (``HAS_TRITON``, which chooses Model Runner V2) and FlashInfer's
SM count answer as on the GPU; capability-keyed caches are cleared when the
GPU changes.  Tensors placed on ``cuda`` go to the meta device, CUDA streams
and events are inert, and Triton's allocator is not registered.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import logging
import os
import sys
import threading
import types
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

from kvexplore.planning import release
from kvexplore.planning.gpus import GPU

#: ``module:function`` of the vLLM functions whose ``current_platform.is_cuda()``
#: gates a choice that changes the KV cache layout.
CUDA_GATED_DECISIONS = (
    # GDN prefill kernel -> prefill checkpoint alignment -> block size
    "vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn:_resolve_gdn_prefill_backend",
    # FLASH_ATTN_MLA availability (MLA backend choice on SM 9.0)
    "vllm.v1.attention.backends.fa_utils:flash_attn_supports_mla",
    # FlashAttention as an MLA prefill backend
    "vllm.v1.attention.backends.fa_utils:is_flash_attn_varlen_func_available",
    # whether the extensible KV cache is on (vLLM 0.34: sizing, default utilization)
    "vllm.config.vllm:VllmConfig._resolve_extensible_kv_cache",
)

#: Modules whose ``is_cuda()`` questions pick compute kernels (MoE experts,
#: quantized GEMMs): not the cache layout, but they refuse to build a layer
#: without a CUDA answer.
CUDA_GATED_MODULES = (
    "vllm.model_executor.layers.fused_moe",
    "vllm.model_executor.kernels",
    # is_fp4_marlin_supported: the W4A16 Marlin kernel NVFP4 / MXFP4 layers use below SM 10.0
    "vllm.model_executor.layers.quantization.utils.marlin_utils_fp4",
)

_LOCK = threading.RLock()
_state: dict = {"gpu": None, "log_level": logging.ERROR}


def vllm_log_level(level: int | None = None) -> int:
    """The level vLLM's log records show at while kvexplore runs vLLM's code
    (``logging.ERROR`` unless set); returns the level in force after the call."""
    if level is not None:
        _state["log_level"] = int(level)
    return _state["log_level"]


@contextlib.contextmanager
def _vllm_logs_at(level: int) -> Iterator[None]:
    logger = logging.getLogger("vllm")
    before = logger.level
    if before == level:  # setLevel clears every logger's cache, thousands in vLLM
        yield
        return
    logger.setLevel(level)
    try:
        yield
    finally:
        logger.setLevel(before)


@functools.cache
def _gated_codes() -> frozenset:
    """The code objects of :data:`CUDA_GATED_DECISIONS` the installed release has
    (a decision a release does not make is not there to gate)."""
    codes = set()
    for entry in CUDA_GATED_DECISIONS:
        module, name = entry.split(":")
        try:
            obj = importlib.import_module(module)
        except ImportError:
            continue
        for part in name.split("."):
            obj = getattr(obj, part, None)
        if obj is not None:
            codes.add(obj.__code__)
    return frozenset(codes)


@functools.cache
def _platform_class():
    # vllm.platforms.cuda loads vLLM's CUDA op library, which needs libcuda;
    # without it the ops are left out (they only run in forward)
    try:
        import vllm._C_stable_libtorch  # noqa: F401
    except (ImportError, OSError):
        sys.modules.setdefault(
            "vllm._C_stable_libtorch", types.ModuleType("vllm._C_stable_libtorch")
        )
    cuda = importlib.import_module("vllm.platforms.cuda")
    from vllm.platforms.interface import DeviceCapability

    class EmulatedCudaPlatform(cuda.CudaPlatformBase):
        """vLLM's CUDA platform with the device facts of :attr:`gpu`."""

        gpu: GPU

        def is_cuda(self) -> bool:
            caller = sys._getframe(1)
            return caller.f_code in _gated_codes() or caller.f_globals.get(
                "__name__", "").startswith(CUDA_GATED_MODULES)

        is_cuda_alike = is_cuda

        @classmethod
        def get_device_capability(cls, device_id: int = 0):
            return DeviceCapability(cls.gpu.major, cls.gpu.minor)

        @classmethod
        def get_device_name(cls, device_id: int = 0) -> str:
            return cls.gpu.device_name

        @classmethod
        def get_device_total_memory(cls, device_id: int = 0) -> int:
            return cls.gpu.total_memory_range[0]

        @classmethod
        def get_cuda_runtime_major(cls) -> int:
            return cls.gpu.cuda_runtime_major

        @classmethod
        def num_compute_units(cls, device_id: int = 0) -> int:
            return cls.gpu.sm_count

        @classmethod
        def is_fully_connected(cls, device_ids) -> bool:
            return True

        @classmethod
        def device_count(cls) -> int:
            return 1

        @classmethod
        def import_kernels(cls) -> None:
            return None

        @classmethod
        def current_device(cls):
            return torch.device("meta")

        @classmethod
        def is_integrated_gpu(cls, device_id: int = 0) -> bool:
            return False

    return EmulatedCudaPlatform


class _InertStream:
    """``torch.cuda.Stream`` / ``Event`` made during a build: never used."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


class _DeviceTensorsOnMeta(TorchFunctionMode):
    """Tensors a layer would place on ``cuda`` at construction go to ``meta``."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        dev = kwargs.get("device")
        if dev is not None and torch.device(dev).type == "cuda":
            kwargs = {**kwargs, "device": torch.device("meta")}
        return func(*args, **kwargs)


def _flash_attn_interface():
    """vLLM's FlashAttention interface module, even when its package refuses to import."""
    name = "vllm.vllm_flash_attn.flash_attn_interface"
    if name not in sys.modules:
        with contextlib.suppress(ImportError):
            importlib.import_module("vllm.vllm_flash_attn")
    return sys.modules.get(name)


def _shipped(module, ext: str) -> bool:
    return any(
        f.startswith(ext + ".") and f.endswith(".so")
        for f in os.listdir(os.path.dirname(module.__file__))
    )


_MISSING = object()


def _current(obj, name):
    """An attribute's own value: a module's or class's own entry, or an
    instance attribute."""
    if name != "__class__" and isinstance(obj, (types.ModuleType, type)):
        return vars(obj).get(name, _MISSING)
    return getattr(obj, name)


@contextlib.contextmanager
def patch_attributes(pairs) -> Iterator[None]:
    """Set ``(object, name, value)`` attributes, restore (or remove) them on exit."""
    saved = [(obj, name, _current(obj, name)) for obj, name, _ in pairs]
    try:
        for obj, name, value in pairs:
            setattr(obj, name, value)
        yield
    finally:
        for obj, name, value in reversed(saved):
            if value is _MISSING:
                with contextlib.suppress(AttributeError):
                    delattr(obj, name)
            else:
                setattr(obj, name, value)


def _clear_capability_caches() -> None:
    from vllm.v1.attention import selector

    selector._cached_get_attn_backend.cache_clear()
    with contextlib.suppress(ImportError):
        flashinfer_utils = importlib.import_module("vllm.utils.flashinfer")
        for value in vars(flashinfer_utils).values():
            # looked up on the type: vLLM's platform proxy warns on unknown attributes
            if callable(getattr(type(value), "cache_clear", None)):
                value.cache_clear()


@contextlib.contextmanager
def emulate(gpu: GPU, *, meta_tensors: bool = True) -> Iterator[None]:
    """Run the enclosed vLLM code as vLLM runs on ``gpu``; re-entrant, one
    GPU at a time.  ``meta_tensors=False`` leaves tensors placed on ``cuda``
    alone (for code that builds no layer)."""
    import vllm.platforms as platforms

    with _LOCK:
        cls = _platform_class()
        _gated_codes()  # import the gated modules before the platform changes
        platform = platforms.current_platform
        pairs = [
            (cls, "gpu", gpu),
            (platform, "__class__", cls),
            *((module, flag, True) for module, flag in release.triton_flags()),
        ]
        fai = _flash_attn_interface()
        if fai is not None:
            pairs += [
                (fai, "FA2_AVAILABLE", fai.FA2_AVAILABLE or _shipped(fai, "_vllm_fa2_C")),
                (fai, "FA3_AVAILABLE", fai.FA3_AVAILABLE or _shipped(fai, "_vllm_fa3_C")),
            ]
        with contextlib.suppress(ImportError):
            fi_backend = importlib.import_module("vllm.v1.attention.backends.flashinfer")
            pairs.append((fi_backend, "get_device_sm_count", lambda device=None: gpu.sm_count))
        if meta_tensors:
            pairs += [(torch.cuda, "Stream", _InertStream), (torch.cuda, "Event", _InertStream)]
            triton = importlib.import_module("vllm.triton_utils").triton
            if not hasattr(triton, "set_allocator"):
                pairs.append((triton, "set_allocator", lambda alloc_fn: None))
        if _state["gpu"] != gpu:
            _clear_capability_caches()
            _state["gpu"] = gpu
        meta = _DeviceTensorsOnMeta() if meta_tensors else contextlib.nullcontext()
        with patch_attributes(pairs), patch_attributes(_fa_utils_cuda_names()), \
                patch_attributes(_flash_attn_names()), meta, _vllm_logs_at(vllm_log_level()):
            yield


def _fa_utils_cuda_names() -> list:
    """The names ``vllm/v1/attention/backends/fa_utils.py`` imports only when
    ``current_platform.is_cuda()``, which MLA prefill backends import from it."""
    fa_utils = importlib.import_module("vllm.v1.attention.backends.fa_utils")
    names = (
        "compile_flash_attn_varlen_func_from_specs",
        "flash_attn_varlen_func",
        "get_scheduler_metadata",
    )
    if all(hasattr(fa_utils, n) for n in names):
        return []
    try:
        vfa = importlib.import_module("vllm.vllm_flash_attn")
    except ImportError:
        return []
    from vllm import _custom_ops

    pairs = [(fa_utils, n, getattr(vfa, n)) for n in names]
    pairs.append((fa_utils, "reshape_and_cache_flash", _custom_ops.reshape_and_cache_flash))
    return pairs


#: The names ``vllm/v1/attention/backends/flash_attn.py`` imports from
#: ``fa_utils`` only where ``is_flash_attn_varlen_func_available()`` holds
#: when it is first imported (the same five in 0.31-0.34).
FLASH_ATTN_GATED_NAMES = (
    "compile_flash_attn_varlen_func_from_specs",
    "flash_attn_supports_sinks",
    "flash_attn_varlen_func",
    "get_scheduler_metadata",
    "reshape_and_cache_flash",
)


def _flash_attn_names() -> list:
    """Where ``flash_attn.py`` was first imported outside the emulation (by the
    user's own vLLM imports, say), it lacks :data:`FLASH_ATTN_GATED_NAMES`;
    they are lent from ``fa_utils`` (itself patched by
    :func:`_fa_utils_cuda_names`) while the emulation lasts, so a plan never
    depends on what was imported before it."""
    module = sys.modules.get("vllm.v1.attention.backends.flash_attn")
    if module is None:
        return []
    fa_utils = importlib.import_module("vllm.v1.attention.backends.fa_utils")
    return [(module, n, getattr(fa_utils, n)) for n in FLASH_ATTN_GATED_NAMES
            if not hasattr(module, n) and hasattr(fa_utils, n)]


__all__ = ["CUDA_GATED_DECISIONS", "CUDA_GATED_MODULES", "emulate", "patch_attributes",
           "vllm_log_level"]
