"""The planner: the KV cache vLLM 0.33 would build on a named GPU, offline.

``plan(model, gpu="H100", ...)`` runs vLLM's own code in the order a GPU
worker and the engine core run it (:mod:`kvexplore.planning.worker`): the real
``VllmConfig`` from ``EngineArgs.create_engine_config``, the model built with
vLLM's own model class on PyTorch's meta device while the named GPU is
emulated (:mod:`kvexplore.planning.emulation`), ``update_block_size_for_backend``, the
runner's ``get_kv_cache_spec``, the engine core's layout resolution and
grouping, then what depends on memory:

- ``get_kv_cache_configs`` (``vllm/v1/core/kv_cache_planning.py``): tensors,
  ``num_blocks``, auto-fit of ``max_model_len=-1`` and the admission check
  (``_check_enough_kv_cache_memory``), whose verdict the plan keeps
  (:class:`Admission`) instead of refusing to show the layout;
- ``prepare_kernel_block_sizes`` (``vllm/v1/worker/utils.py``) with each
  group's own backends: the kernel block of every group.

The model build is cached by the inputs it depends on, so a plan that only
changes ``num_blocks``, ``kv_cache_memory_bytes`` or ``max_model_len`` reuses
the built layers.

Worked example (GUIDE section 4): Qwen3.5-0.8B on an A100 and an H100.

>>> plan("Qwen/Qwen3.5-0.8B", gpu="A100").block_size
544
>>> p = plan("Qwen/Qwen3.5-0.8B", gpu="H100")
>>> p.block_size, p.mamba_page_size_padded, len(p.kv_cache_config.kv_cache_groups)
(576, 1179648, 4)
>>> p.derivation["block_size"]
'576 = lcm(16, 64) x cdiv(1085440, 64 x 2048)  (H100: FlashInfer GDN prefill -> 64-token checkpoints)'
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import math
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import cdiv, check_int, jsonable, leaf_specs, real_page_bytes
from kvexplore.planning.gpus import DEFAULT_GPU, GPU, resolve_gpu
from kvexplore.planning.models import (
    CROSS,
    FULL,
    MAMBA,
    MLA,
    SLIDING,
    LayerInfo,
    ModelSource,
    catalog_names,
    load_model_config,
)

GiB = 1 << 30

#: Blocks allocated when neither ``num_blocks`` nor ``kv_cache_memory_bytes``
#: is given: small enough to allocate any catalog model on a laptop.
DEFAULT_NUM_BLOCKS = 16

MAMBA_CACHE_MODES = ("none", "align", "all")
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
MAMBA_SSM_DTYPES = ("auto", "float32", "float16", "bfloat16")




# ---------------------------------------------------------------------------
# Admission
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Admission:
    """vLLM's start-up verdict on the cache: can it serve one request of
    ``max_model_len`` tokens? (``kv_cache_planning.py:
    _check_enough_kv_cache_memory``, called by ``get_kv_cache_configs``).

    ``message`` is vLLM's own error text when it would refuse to start, and
    ``estimated_max_model_len`` the estimate that message quotes
    (``_estimate_max_model_len_from_groups``, a binary search run on first
    access). ``auto_fit_from`` is the model's length when
    ``max_model_len=-1`` made vLLM shrink it to fit.
    """

    ok: bool
    max_model_len: int
    needed_bytes: int
    available_bytes: int
    auto_fit_from: int | None = None
    _estimate: Any = field(default=None, repr=False, compare=False)
    _check: Any = field(default=None, repr=False, compare=False)

    @cached_property
    def estimated_max_model_len(self) -> int | None:
        if self.ok or self._estimate is None or self.available_bytes <= 0:
            return None
        est = self._estimate(self.available_bytes)
        return est if est > 0 else None

    @cached_property
    def message(self) -> str | None:
        if self.ok:
            return None
        estimate = self.estimated_max_model_len or 0
        try:
            self._check(
                self.available_bytes, lambda: self.needed_bytes, self.max_model_len,
                lambda _available: estimate,
            )
        except ValueError as exc:
            return " ".join(str(exc).split())
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "max_model_len": self.max_model_len,
            "needed_bytes": self.needed_bytes, "available_bytes": self.available_bytes,
            "estimated_max_model_len": self.estimated_max_model_len,
            "auto_fit_from": self.auto_fit_from, "message": self.message,
        }

    def text(self) -> str:
        if self.ok:
            out = (
                f"admitted: one request of max_model_len={self.max_model_len:,} needs "
                f"{self.needed_bytes:,} B of the {self.available_bytes:,} B the cache holds"
            )
            if self.auto_fit_from is not None:
                out += f" (auto-fit reduced max_model_len from {self.auto_fit_from:,})"
            return out
        return f"refused by vLLM 0.33 at start-up: {self.message}"


# ---------------------------------------------------------------------------
# The Plan
# ---------------------------------------------------------------------------


#: What stages further down the pipeline do with a plan, by the name of the
#: :class:`Plan` method that hands the plan over (``allocate``: the
#: registration stage; ``capacity``: the capacity answers).  Each stage
#: registers its function with :func:`provides` when it is imported, and
#: ``import kvexplore`` imports them all, so the planner never imports a
#: stage below it.
_PROVIDED: dict[str, Any] = {}


def provides(name: str):
    """Decorator: ``Plan.<name>(...)`` calls the decorated function with the plan."""

    def register(function):
        _PROVIDED[name] = function
        return function

    return register


def _provided(name: str, stage: str):
    function = _PROVIDED.get(name)
    if function is None:
        raise KVExploreError(f"Plan.{name} is provided by {stage}; import it (or kvexplore) first")
    return function


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan(Displayable):
    """The KV cache vLLM 0.33 would build for one model, GPU and configuration.

    Frozen: change an input with :meth:`replace` (a new plan).  Holds vLLM's
    own objects: ``layer_specs`` (``KVCacheSpec`` per registered layer name, as
    the model runner reports them), ``kv_cache_config`` (a real
    ``KVCacheConfig``), ``vllm_config`` (the engine's real ``VllmConfig`` after
    the build, alignment and layout resolution).
    """

    model: ModelSource
    gpu: GPU
    request: tuple = field(repr=False)
    _vllm_config: Any = field(repr=False)
    layers: tuple[LayerInfo, ...] = field(repr=False)
    layer_specs: MappingProxyType = field(repr=False)
    layer_classes: MappingProxyType = field(repr=False)
    layer_backends: MappingProxyType = field(repr=False)
    _kv_cache_config: Any = field(repr=False)
    kernel_block_sizes: tuple[int, ...]
    backend: type | None = field(repr=False)
    attention_page_bytes_per_token: int | None
    mamba_page_size: int | None
    admission: Admission | None = field(repr=False)
    decisions: MappingProxyType = field(repr=False)
    weight_bytes: int = field(repr=False)
    _built: Any = field(repr=False, compare=False)

    @cached_property
    def derivation(self) -> MappingProxyType:
        """How each size and GPU-dependent decision came about, by name."""
        return MappingProxyType(
            _derivation(
                self._vllm_config, self._built, self.gpu, self.backend,
                self.attention_page_bytes_per_token, self.mamba_page_size,
                self._kv_cache_config, self.kernel_block_sizes, self.admission,
            )
        )

    # -- inputs ---------------------------------------------------------------
    @property
    def inputs(self) -> dict[str, Any]:
        """The keyword arguments this plan was made with."""
        out = dict(self.request)
        if out.get("speculative_config") is not None:
            out["speculative_config"] = json.loads(out["speculative_config"])
        return out

    def replace(self, **changes) -> Plan:
        """A new plan with some inputs changed (``plan(**inputs | changes)``)."""
        return plan(self.model, **{**self.inputs, **changes})

    # -- derived sizes --------------------------------------------------------
    # -- vLLM's objects, copied on read ------------------------------------------
    # Plans are cached and shared by every caller that asks for the same inputs,
    # so what a caller can reach and mutate is a deep copy (the HF config objects
    # inside ``model_config`` included): changing it never changes another
    # caller's plan.  Read once and keep the copy where a loop needs many fields.
    @property
    def vllm_config(self):
        """A deep copy of the engine's ``VllmConfig``."""
        return copy.deepcopy(self._vllm_config)

    @property
    def cache_config(self):
        """A copy of vLLM's ``CacheConfig`` after alignment."""
        return copy.deepcopy(self._vllm_config.cache_config)

    @property
    def model_config(self):
        """A deep copy of vLLM's ``ModelConfig`` (``hf_config`` and
        ``hf_text_config`` copied with it)."""
        return copy.deepcopy(self._vllm_config.model_config)

    @property
    def parallel_config(self):
        """A copy of vLLM's ``ParallelConfig``."""
        return copy.deepcopy(self._vllm_config.parallel_config)

    @property
    def built(self):
        """The model-dependent half of the plan (a
        :class:`~kvexplore.planning.worker.BuiltModel`), with its ``VllmConfig``
        and groups deep-copied: the build is shared by every plan of the same
        model, GPU and build inputs."""
        b = self._built
        return dataclasses.replace(
            b, vllm_config=copy.deepcopy(b.vllm_config), groups=copy.deepcopy(b.groups)
        )

    @property
    def kv_cache_config(self):
        """A copy of vLLM's ``KVCacheConfig`` (its tensors, groups and name lists
        copied; the specs are vLLM's frozen dataclasses, shared)."""
        return copy_kv_cache_config(self._kv_cache_config)

    @property
    def block_size(self) -> int:
        """Tokens per KV cache block (the scheduler's block, after alignment)."""
        return self._vllm_config.cache_config.block_size

    @property
    def mamba_page_size_padded(self) -> int | None:
        """Padded Mamba page in bytes; None when the Mamba page needs no padding."""
        return self._vllm_config.cache_config.mamba_page_size_padded

    @property
    def mamba_cache_mode(self) -> str:
        return self._vllm_config.cache_config.mamba_cache_mode

    @property
    def num_blocks(self) -> int:
        return self._kv_cache_config.num_blocks

    @property
    def kv_cache_layout(self):
        """vLLM's ``KVCacheLayout`` the engine core resolved."""
        return self._vllm_config.cache_config.get_resolved_kv_cache_layout()

    @property
    def attention_backend(self) -> str | None:
        """Name of the backend vLLM selected for the attention layers."""
        return self.backend.get_name() if self.backend is not None else None

    @property
    def groups(self) -> tuple:
        """vLLM's ``KVCacheGroupSpec`` per group (copies, like :attr:`kv_cache_config`)."""
        return tuple(self.kv_cache_config.kv_cache_groups)

    @property
    def group_table(self) -> pd.DataFrame:
        """One row per KV cache group (a copy: see :attr:`vllm_config`)."""
        return self._group_table.copy()

    @cached_property
    def _group_table(self) -> pd.DataFrame:
        """One row per KV cache group: kind, layers, block and kernel block, page,
        padding, backend, bytes per block of the group."""
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        rows = []
        for gid, group in enumerate(self.groups):
            spec = group.kv_cache_spec
            first = next(iter(leaf_specs(spec)))
            real = real_page_bytes(first)
            backend = self.layer_backends.get(group.layer_names[0])
            rows.append(
                {
                    "group": gid,
                    "kind": get_kv_cache_spec_kind(first).value,
                    "spec": type(first).__name__,
                    "layers": len(group.layer_names),
                    "block_size": spec.block_size,
                    "kernel_block_size": self.kernel_block_sizes[gid]
                    if gid < len(self.kernel_block_sizes)
                    else None,
                    "page_bytes": first.page_size_bytes,
                    "real_page_bytes": real,
                    "padding_bytes": first.page_size_bytes - real,
                    "padding_share": (first.page_size_bytes - real)
                    / first.page_size_bytes
                    if first.page_size_bytes
                    else 0.0,
                    "dtype": _spec_dtypes(first),
                    "backend": backend.get_name() if backend is not None else "",
                    "first_layer": group.layer_names[0],
                }
            )
        return pd.DataFrame(rows)

    # -- memory facts ----------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across the whole cache (all tensors)."""
        cfg = self._kv_cache_config
        if not cfg.kv_cache_tensors or not cfg.num_blocks:
            return 0
        return cfg.kv_cache_tensors[0].size // cfg.num_blocks

    @property
    def bytes_per_token(self) -> float:
        """Bytes per token of context: block bytes over scheduler block size."""
        return self.bytes_per_block / self.block_size if self.block_size else 0.0

    @property
    def tokens_per_gib(self) -> int:
        """Tokens of context whose KV (and state snapshots) fit in one GiB."""
        if not self.bytes_per_block:
            return 0
        return (GiB // self.bytes_per_block) * self.block_size

    @property
    def padding_bytes_per_block(self) -> int:
        """Bytes of a block that hold no state (page padding), for the group with
        the most: a block id belongs to one group at a time and holds one page
        per layer of that group."""
        return int(max((r.padding_bytes * r.layers for r in self._group_table.itertuples()), default=0))

    @property
    def padding_share(self) -> float:
        """Share of a block's bytes that are padding (worst group)."""
        return self.padding_bytes_per_block / self.bytes_per_block if self.bytes_per_block else 0.0

    @cached_property
    def _capacity(self) -> tuple[int, float]:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        return get_kv_cache_capacity(self._vllm_config, self._kv_cache_config)

    @property
    def kv_cache_size_tokens(self) -> int:
        """vLLM's group-aware KV cache size in tokens, the number its log prints as
        ``GPU KV cache size: N tokens`` (``vllm/v1/core/kv_cache_utils.py:
        get_kv_cache_capacity``): max concurrency x ``max_model_len``."""
        return self._capacity[0]

    @property
    def max_concurrency(self) -> float:
        """Requests of ``max_model_len`` tokens the cache holds at once: blocks over
        the blocks one request needs in every group (Mamba groups in ``align``
        mode need 2 per request, attention groups ``cdiv(max_model_len, block)``)."""
        return self._capacity[1]

    @property
    def summary(self) -> pd.DataFrame:
        """Key numbers as a two-column table (a copy)."""
        return self._summary.copy()

    @cached_property
    def _summary(self) -> pd.DataFrame:
        """Key numbers as a two-column table (quantity, value)."""
        rows = [
            ("model", self.model.name),
            ("architecture", self.model.architecture),
            ("gpu", str(self.gpu)),
            ("tensor_parallel_size", self._vllm_config.parallel_config.tensor_parallel_size),
            ("decode_context_parallel_size", self._vllm_config.parallel_config.decode_context_parallel_size),
            ("attention_backend", self.attention_backend or "none (attention-free)"),
            ("kv_cache_dtype", self._vllm_config.cache_config.cache_dtype),
            ("mamba_ssm_cache_dtype", self._vllm_config.cache_config.mamba_ssm_cache_dtype),
            ("mamba_cache_mode", self.mamba_cache_mode),
            ("block_size", self.block_size),
            ("attention_page_bytes_per_token", self.attention_page_bytes_per_token),
            ("mamba_page_size", self.mamba_page_size),
            ("mamba_page_size_padded", self.mamba_page_size_padded),
            ("kernel_block_sizes", list(self.kernel_block_sizes)),
            ("groups", len(self.groups)),
            ("kv_cache_layout", self.kv_cache_layout.name),
            ("num_blocks", self.num_blocks),
            ("bytes_per_block", self.bytes_per_block),
            ("tokens_per_gib", self.tokens_per_gib),
            ("max_model_len", self._vllm_config.model_config.max_model_len),
            ("admitted", self.admission.ok if self.admission is not None else True),
            ("kv_cache_size_tokens", self.kv_cache_size_tokens),
            ("max_concurrency", round(self.max_concurrency, 4)),
            ("padding_share", round(self.padding_share, 6)),
        ]
        return pd.DataFrame(rows, columns=["quantity", "value"])

    def explain(self) -> str:
        """The derivation of every chosen size and GPU-dependent decision, one
        line each."""
        return "\n".join(f"{k}: {v}" for k, v in self.derivation.items())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: numbers, groups, derivations and admission."""
        out = {k: jsonable(v) for k, v in zip(self._summary.quantity, self._summary.value, strict=True)}
        out["groups"] = [
            {k: jsonable(v) for k, v in row.items()} for row in self._group_table.to_dict("records")
        ]
        out["derivation"] = dict(self.derivation)
        if self.admission is not None:
            out["admission"] = self.admission.to_dict()
        return out

    def allocate(self, device="cpu", registration: str = "unified"):
        """Allocate the registered KV caches ``{layer: tensor or [conv, ssm]}``.

        ``registration="unified"``: exactly what vLLM 0.33's worker registers
        (``vllm/v1/worker/utils.py: allocate_kv_cache`` ->
        ``create_kv_cache_views``), 4-D ``[B, H, N, C]`` views over one shared
        backing buffer. ``registration="legacy"``: the seed era (vLLM < 0.26),
        ``[num_kernel_pages, 2, kernel_block, heads, head]`` attention tensors
        and ``[conv_state, ssm_state]`` Mamba views into padded pages.
        """
        allocate = _provided("allocate", "kvexplore.registration")
        return allocate(self, device=device, registration=registration)

    def capacity(self, gpu_memory_utilization: float = 0.9, **kwargs):
        """vLLM's KV cache capacity for this plan on its GPU
        (:func:`kvexplore.capacity`; keywords as there)."""
        capacity = _provided("capacity", "kvexplore.capacity_planning")
        return capacity(self, gpu_memory_utilization=gpu_memory_utilization, **kwargs)

    def __repr__(self) -> str:
        pad = f", mamba_page_size_padded={self.mamba_page_size_padded}" if self.mamba_page_size_padded else ""
        return (
            f"Plan({self.model.name!r}, gpu={self.gpu.name}, "
            f"tp={self._vllm_config.parallel_config.tensor_parallel_size}, "
            f"dcp={self._vllm_config.parallel_config.decode_context_parallel_size}, "
            f"backend={self.attention_backend}, block_size={self.block_size}{pad}, "
            f"groups={len(self.groups)}, kernel_block_sizes={list(self.kernel_block_sizes)}, "
            f"num_blocks={self.num_blocks})"
        )


def copy_kv_cache_config(cfg):
    """A copy of a ``KVCacheConfig`` with its tensor and group lists (and their
    layer-name lists) copied; the specs are frozen and shared."""
    return dataclasses.replace(
        cfg,
        kv_cache_tensors=[dataclasses.replace(t, layers=list(t.layers)) for t in cfg.kv_cache_tensors],
        kv_cache_groups=[
            dataclasses.replace(g, layer_names=list(g.layer_names)) for g in cfg.kv_cache_groups
        ],
    )








def _spec_dtypes(spec) -> str:
    dtypes = getattr(spec, "dtypes", None)
    if dtypes is not None:
        return "/".join(str(d).removeprefix("torch.") for d in dtypes)
    return str(getattr(spec, "dtype", "")).removeprefix("torch.")


def layer_kind(spec) -> str:
    """The kind of a layer's ``KVCacheSpec``: ``mamba``, ``mla_attention``,
    ``cross_attention``, ``sliding_window``, ``full_attention``, or vLLM's own
    spec-kind name for the rarer specs."""
    from vllm.v1.kv_cache_interface import (
        CrossAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_cache_spec_kind,
    )

    for cls, kind in (
        (MambaSpec, MAMBA),
        (MLAAttentionSpec, MLA),
        (CrossAttentionSpec, CROSS),
        (SlidingWindowSpec, SLIDING),
        (FullAttentionSpec, FULL),
    ):
        if isinstance(spec, cls):
            return kind
    return get_kv_cache_spec_kind(spec).value


# ---------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------

_PLAN_CACHE: OrderedDict = OrderedDict()
_PLAN_CACHE_SIZE = 4096
_BUILD_CACHE: OrderedDict = OrderedDict()
_BUILD_CACHE_SIZE = 256
_PLAN_LOCK = threading.Lock()

#: ``plan()`` keywords the built model does not depend on.
MEMORY_KEYWORDS = ("num_blocks", "kv_cache_memory_bytes", "max_model_len")


def clear_plan_cache() -> None:
    """Forget cached plans and built models (benchmarks measure uncached planning)."""
    with _PLAN_LOCK:
        _PLAN_CACHE.clear()
        _BUILD_CACHE.clear()


def plan(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    gpu: str | GPU = DEFAULT_GPU,
    tensor_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    block_size: int | None = None,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    enable_prefix_caching: bool | None = None,
    mamba_cache_mode: str | None = None,
    mamba_ssm_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    attention_backend: str | None = None,
    speculative_config: dict | None = None,
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    kv_cache_layout: str | None = None,
) -> Plan:
    """Plan the KV cache vLLM 0.33 would build for ``model`` on one ``gpu`` worker.

    Keyword names and defaults follow vLLM's engine arguments
    (``--tensor-parallel-size``, ``--decode-context-parallel-size``,
    ``--block-size``, ``--dtype``, ``--kv-cache-dtype``,
    ``--enable-prefix-caching``, ``--mamba-cache-mode``,
    ``--mamba-ssm-cache-dtype``, ``--max-model-len`` (``-1`` auto-fits),
    ``--attention-backend``, ``--speculative-config``,
    ``--num-gpu-blocks-override`` as ``num_blocks``,
    ``--kv-cache-memory-bytes``); ``None`` lets vLLM decide, as an unset flag
    does.  ``kv_cache_layout`` is what ``VLLM_KV_CACHE_LAYOUT`` would request
    (``NHD``/``HND`` alias ``LBNHC``/``LBHNC``); ``None`` takes the layout the
    engine core resolves from the backends.  ``gpu`` is a name or a compute
    capability (:func:`kvexplore.gpus`).  With neither ``num_blocks`` nor
    ``kv_cache_memory_bytes`` the cache has :data:`DEFAULT_NUM_BLOCKS` blocks;
    when that cannot hold one request of ``max_model_len`` tokens the plan
    carries vLLM's refusal in :attr:`Plan.admission`.

    Plans are cached by their inputs; a cached plan is returned as is.  Every
    error is a :class:`KVExploreError` naming the value and quoting vLLM.
    """
    src = load_model_config(model)
    gpu_obj = resolve_gpu(gpu)
    if attention_backend is not None:
        from kvexplore.planning.backends import validate_backend_name

        attention_backend = validate_backend_name(attention_backend)
    if speculative_config is not None and not isinstance(speculative_config, dict):
        raise KVExploreError(
            f"speculative_config={speculative_config!r} is invalid; expected a dict "
            "such as {'method': 'mtp', 'num_speculative_tokens': 2}"
        )
    request = (
        ("gpu", gpu_obj.name),
        ("tensor_parallel_size", tensor_parallel_size),
        ("decode_context_parallel_size", decode_context_parallel_size),
        ("block_size", block_size),
        ("dtype", dtype),
        ("kv_cache_dtype", kv_cache_dtype),
        ("enable_prefix_caching", enable_prefix_caching),
        ("mamba_cache_mode", mamba_cache_mode),
        ("mamba_ssm_cache_dtype", mamba_ssm_cache_dtype),
        ("max_model_len", max_model_len),
        ("attention_backend", attention_backend),
        ("speculative_config", _freeze(speculative_config)),  # JSON text: hashable
        ("num_blocks", num_blocks),
        ("kv_cache_memory_bytes", kv_cache_memory_bytes),
        ("kv_cache_layout", kv_cache_layout),
    )
    key = (id(src), request)
    with _PLAN_LOCK:
        hit = _PLAN_CACHE.get(key)
        if hit is not None:
            _PLAN_CACHE.move_to_end(key)
            return hit[1]
    r = dict(request)
    r["speculative_config"] = speculative_config
    _validate_request(r)
    built = _built_model(src, gpu_obj, request, r)
    try:
        result = _plan_from_build(src, gpu_obj, request, r, built)
    except (KVExploreError, ImportError):
        raise
    except Exception as exc:  # vLLM's own checks carry the numbers
        raise _vllm_error(src, gpu_obj, exc, r) from exc
    with _PLAN_LOCK:
        _PLAN_CACHE[key] = (src, result)  # the reference keeps id(src) unique
        while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    return result


def _freeze(value: dict | None) -> str | None:
    if value is None:
        return None
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise KVExploreError(
            f"speculative_config={value!r} is invalid; expected a JSON-like dict ({exc})"
        ) from None




def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise KVExploreError(f"{name}={value!r} is invalid; expected one of {list(choices)}")


def _validate_request(r: dict) -> None:
    check_int("tensor_parallel_size", r["tensor_parallel_size"])
    check_int("decode_context_parallel_size", r["decode_context_parallel_size"])
    check_int("block_size", r["block_size"], allow_none=True)
    mml = r["max_model_len"]
    if mml is not None and mml != -1 and (isinstance(mml, bool) or not isinstance(mml, int) or mml < 1):
        raise KVExploreError(
            f"max_model_len={mml!r} is invalid; expected an integer >= 1, -1 (auto-fit to "
            "the KV cache memory, as vLLM does) or None (the model's own length)"
        )
    check_int("num_blocks", r["num_blocks"], allow_none=True)
    check_int("kv_cache_memory_bytes", r["kv_cache_memory_bytes"], allow_none=True)
    if r["num_blocks"] is not None and r["kv_cache_memory_bytes"] is not None:
        raise KVExploreError(
            f"give num_blocks ({r['num_blocks']}) or kv_cache_memory_bytes "
            f"({r['kv_cache_memory_bytes']}), not both"
        )
    _check_choice("dtype", r["dtype"], MODEL_DTYPES)
    _check_choice("mamba_ssm_cache_dtype", r["mamba_ssm_cache_dtype"], MAMBA_SSM_DTYPES)
    if r["mamba_cache_mode"] is not None:
        _check_choice("mamba_cache_mode", r["mamba_cache_mode"], MAMBA_CACHE_MODES)
    if r["kv_cache_layout"] is not None:
        _check_choice("kv_cache_layout", r["kv_cache_layout"], KV_CACHE_LAYOUTS)
    if r["enable_prefix_caching"] is not None and not isinstance(r["enable_prefix_caching"], bool):
        raise KVExploreError(
            f"enable_prefix_caching={r['enable_prefix_caching']!r} is invalid; "
            "expected True, False or None (vLLM decides)"
        )
    from vllm.config.cache import is_known_kv_cache_dtype

    if not isinstance(r["kv_cache_dtype"], str) or not is_known_kv_cache_dtype(r["kv_cache_dtype"]):
        from typing import get_args

        from vllm.config.cache import CacheDType

        raise KVExploreError(
            f"kv_cache_dtype={r['kv_cache_dtype']!r} is invalid; expected one of "
            f"{list(get_args(CacheDType))}"
        )


_DEFAULTS = {
    "tensor_parallel_size": 1, "decode_context_parallel_size": 1, "dtype": "auto",
    "kv_cache_dtype": "auto", "mamba_ssm_cache_dtype": "auto",
}


def _vllm_error(src: ModelSource, gpu: GPU, exc: BaseException, r: dict) -> KVExploreError:
    """vLLM's reason, in one line, with the model, GPU and inputs named."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    msg = re.sub(r"\s*For further information visit \S+", "", msg)
    msg = re.sub(r"\s*\[type=value_error, input_value=.*?input_type=\w+\]", "", msg)
    if len(msg) > 900:
        msg = msg[:900] + " ..."
    given = ", ".join(
        f"{k}={v!r}" for k, v in r.items()
        if k not in ("gpu", "num_blocks", "kv_cache_memory_bytes") and v is not None
        and _DEFAULTS.get(k) != v
    )
    if isinstance(exc, ZeroDivisionError) and r["decode_context_parallel_size"] > 1:
        msg = (
            f"{msg}: decode_context_parallel_size={r['decode_context_parallel_size']} "
            "shards each rank's attention KV heads, and this model has none to shard "
            f"at tensor_parallel_size={r['tensor_parallel_size']}; expected "
            "decode_context_parallel_size=1"
        )
    return KVExploreError(
        f"vLLM 0.33 rejects {src.name} ({src.architecture}) on {gpu}"
        + (f" with {given}" if given else "")
        + f": {type(exc).__name__}: {msg}"
    )


def _engine_kwargs(r: dict) -> dict:
    kw = {
        "tensor_parallel_size": r["tensor_parallel_size"],
        "decode_context_parallel_size": r["decode_context_parallel_size"],
        "dtype": r["dtype"],
        "kv_cache_dtype": r["kv_cache_dtype"],
        "mamba_ssm_cache_dtype": r["mamba_ssm_cache_dtype"],
    }
    for name in ("block_size", "enable_prefix_caching", "mamba_cache_mode",
                 "attention_backend", "speculative_config"):
        if r[name] is not None:
            kw[name] = copy.deepcopy(r[name])
    return kw


def _built_model(src: ModelSource, gpu: GPU, request: tuple, r: dict):
    from kvexplore.planning.worker import build_model

    build_request = tuple((k, v) for k, v in request if k not in MEMORY_KEYWORDS)
    key = (id(src), build_request)
    with _PLAN_LOCK:
        hit = _BUILD_CACHE.get(key)
        if hit is not None:
            _BUILD_CACHE.move_to_end(key)
            return hit[1]
    try:
        built = build_model(str(src.config_dir), gpu, _engine_kwargs(r), r["kv_cache_layout"])
    except (KVExploreError, ImportError):
        raise
    except Exception as exc:  # vLLM and transformers raise many types
        raise _vllm_error(src, gpu, exc, r) from exc
    with _PLAN_LOCK:
        _BUILD_CACHE[key] = (src, built)  # the reference keeps id(src) unique
        while len(_BUILD_CACHE) > _BUILD_CACHE_SIZE:
            _BUILD_CACHE.popitem(last=False)
    return built


def _plan_vllm_config(src: ModelSource, built, r: dict):
    """A private copy of the built ``VllmConfig`` for this plan's memory inputs.

    The model, cache and scheduler sub-configs are copied (planning writes
    ``max_model_len`` and ``num_gpu_blocks_override``; the served model id
    replaces the materialised config directory); ``max_model_len`` is checked by vLLM's own ``ModelConfig.get_and_verify_max_len``.
    """
    vc = copy.copy(built.vllm_config)
    vc.model_config = copy.copy(vc.model_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.scheduler_config = copy.copy(vc.scheduler_config)
    if src.served_name is not None:
        # vLLM knows a served model by the id it was started with
        # (``--model Qwen/Qwen3.5-0.8B``), which its OffloadingConfig reports.
        vc.model_config.model = src.served_name
    m = r["max_model_len"]
    if m is not None:
        mc = vc.model_config
        mc.original_max_model_len = m
        mc.max_model_len = mc.get_and_verify_max_len(m)
    vc.cache_config.num_gpu_blocks_override = (
        r["num_blocks"] or (None if r["kv_cache_memory_bytes"] else DEFAULT_NUM_BLOCKS)
    )
    return vc


def _kv_cache_config(vc, built, r: dict):
    """``get_kv_cache_configs`` as the engine core calls it, keeping the verdict
    of its admission check instead of raising it."""
    from vllm.v1.core import kv_cache_planning as kcp

    from kvexplore.planning.emulation import emulate, patch_attributes

    seen: list[Admission] = []
    original = kcp._check_enough_kv_cache_memory
    before = vc.model_config.max_model_len

    def check(available, get_needed, max_model_len, estimate):
        needed = get_needed()
        seen.append(
            Admission(
                ok=needed <= available and available > 0, max_model_len=max_model_len,
                needed_bytes=needed, available_bytes=available,
                _estimate=estimate, _check=original,
            )
        )

    specs = dict(built.layer_specs)
    memory = r["kv_cache_memory_bytes"] or 1  # num_gpu_blocks_override decides
    with emulate(built.gpu, meta_tensors=False), patch_attributes(
        [(kcp, "_check_enough_kv_cache_memory", check), *_dtype_size_memo()]
    ):
        cfg = kcp.get_kv_cache_configs(vc, [specs], [memory], list(built.groups))[0]
    cfg.kv_cache_layout = vc.cache_config.kv_cache_layout
    admission = seen[0] if seen else None
    if admission is not None and vc.model_config.max_model_len != before:
        admission = dataclasses.replace(admission, auto_fit_from=before)
    return cfg, admission


@functools.cache
def _element_size(dtype) -> int:
    from vllm.utils.torch_utils import get_dtype_size

    return get_dtype_size(dtype)


def _dtype_size_memo() -> list:
    """vLLM's ``get_dtype_size`` (``vllm/utils/torch_utils.py``) builds an empty
    tensor on every call, and cache planning calls it per layer, page and
    block stride (~40 % of a plan's time): the same function, memoised by
    dtype, where the planning modules look it up."""
    from vllm.v1 import kv_cache_interface
    from vllm.v1.core import kv_cache_planning

    return [
        (module, "get_dtype_size", _element_size)
        for module in (kv_cache_interface, kv_cache_planning)
        if hasattr(module, "get_dtype_size")
    ]


def _kernel_block_sizes(kv_cache_config, built) -> list[int]:
    """``prepare_kernel_block_sizes`` with every group's own layer backends."""
    from types import SimpleNamespace

    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    attn_groups = []
    for g in kv_cache_config.kv_cache_groups:
        by_backend: dict = {}
        for name in g.layer_names:
            backend = built.backends.get(name)
            if backend is not None and backend not in by_backend:
                by_backend[backend] = SimpleNamespace(
                    backend=backend, kv_cache_spec=built.layer_specs[name]
                )
        attn_groups.append(list(by_backend.values()))
    from kvexplore.planning.emulation import emulate

    with emulate(built.gpu, meta_tensors=False):
        return prepare_kernel_block_sizes(kv_cache_config, attn_groups)


def _plan_from_build(src: ModelSource, gpu: GPU, request: tuple, r: dict, built) -> Plan:
    from vllm.v1.kv_cache_interface import AttentionSpec, MambaSpec

    vc = _plan_vllm_config(src, built, r)
    kv_cache_config, admission = _kv_cache_config(vc, built, r)
    kernel_block_sizes = _kernel_block_sizes(kv_cache_config, built)
    specs = built.layer_specs
    layers = tuple(
        LayerInfo(i, name, layer_kind(spec), getattr(spec, "sliding_window", None))
        for i, (name, spec) in enumerate(specs.items())
    )
    attention_backend = next(
        (built.backends[n] for n, s in specs.items() if isinstance(s, AttentionSpec) and n in built.backends),
        None,
    )
    mamba = next((s for s in specs.values() if isinstance(s, MambaSpec)), None)
    mamba_page = (
        dataclasses.replace(mamba, page_size_padded=None).page_size_bytes if mamba else None
    )
    attn_page_1 = _attention_page_per_token(vc, attention_backend) if attention_backend else None
    return Plan(
        model=src,
        gpu=gpu,
        request=request,
        _vllm_config=vc,
        layers=layers,
        layer_specs=specs,
        layer_classes=built.layer_classes,
        layer_backends=built.backends,
        _kv_cache_config=kv_cache_config,
        kernel_block_sizes=tuple(kernel_block_sizes),
        backend=attention_backend,
        attention_page_bytes_per_token=attn_page_1,
        mamba_page_size=mamba_page,
        admission=admission,
        decisions=built.decisions,
        weight_bytes=built.weight_bytes,
        _built=built,
    )


def _attention_page_per_token(vc, backend) -> int:
    """Bytes of one token of one attention layer, as ``_align_hybrid_block_size``
    computes it (``customize_spec`` of a 1-token ``FullAttentionSpec``; MLA:
    a 1-token ``MLAAttentionSpec``)."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )

    mc, pc, cc = vc.model_config, vc.parallel_config, vc.cache_config
    dtype = kv_cache_dtype_str_to_dtype(cc.cache_dtype, mc)
    quant = get_kv_quant_mode(cc.cache_dtype)
    if mc.use_mla:
        return MLAAttentionSpec(
            block_size=1, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(),
            dtype=dtype, cache_dtype_str=cc.cache_dtype, kv_quant_mode=quant,
        ).page_size_bytes
    spec = FullAttentionSpec(
        block_size=1, num_kv_heads=mc.get_num_kv_heads(pc), head_size=mc.get_head_size(),
        dtype=dtype, kv_quant_mode=quant,
    )
    with set_current_vllm_config(vc):
        return backend.customize_spec(spec).page_size_bytes


def _smallest_kernel(backend) -> int:
    from vllm.v1.attention.backend import MultipleOf

    sizes = backend.get_supported_kernel_block_sizes()
    return min((s.base if isinstance(s, MultipleOf) else s) for s in sizes) if sizes else 1


_PREFILL_KERNELS = {"flashinfer": "FlashInfer", "triton": "Triton/FLA", "cutedsl": "CuteDSL"}


def _derivation(vc, built, gpu, backend, attn_page_1, mamba_page, kv_cache_config,
                kernel_block_sizes, admission) -> dict[str, str]:
    from vllm.v1.kv_cache_interface import AttentionSpec

    out: dict[str, str] = {}
    cc, mc, pc = vc.cache_config, vc.model_config, vc.parallel_config
    out["gpu"] = (
        f"{gpu.name}: {gpu.device_name}, compute capability {gpu.compute_capability}, "
        f"CUDA runtime {gpu.cuda_runtime_major} (emulated for vLLM's platform)"
    )
    if backend is not None:
        names = sorted({b.get_name() for n, b in built.backends.items()
                        if isinstance(built.layer_specs[n], AttentionSpec)})
        requested = vc.attention_config.backend
        requested = requested.name if requested is not None else None
        how = (
            f"--attention-backend {requested}, validated for SM {gpu.compute_capability}"
            if requested
            else f"vLLM's first valid backend for SM {gpu.compute_capability} "
            "(CudaPlatformBase.get_attn_backend_cls priority order)"
        )
        out["attention_backend"] = f"{', '.join(names)}: {how}"
    gdn = built.decisions.get("gdn_prefill_backend")
    checkpoint = built.decisions.get("prefill_checkpoint_alignment")
    if gdn is not None:
        rule = {
            "flashinfer": "SM 9.0, or SM 10.x/12.x with linear_key_head_dim 128 and CUDA >= 13",
        }.get(gdn, "FlashInfer's GDN prefill needs SM 9.0, or SM 10.x/12.x with "
              "linear_key_head_dim 128 and CUDA >= 13")
        out["gdn_prefill_backend"] = (
            f"{_PREFILL_KERNELS.get(gdn, gdn)} on {gpu.name} ({rule}; "
            "qwen_gdn_linear_attn.py: _resolve_gdn_prefill_backend)"
        )
    if mamba_page is not None:
        if cc.mamba_cache_mode == "align":
            out["prefill_checkpoint_alignment"] = (
                f"{checkpoint}: lcm of every Mamba layer's get_prefill_checkpoint_alignment"
                if checkpoint
                else "none: not every Mamba layer exports prefill checkpoints"
            )
        else:
            out["prefill_checkpoint_alignment"] = (
                f"not used: mamba_cache_mode={cc.mamba_cache_mode!r} (only 'align' aligns blocks to it)"
            )
    bs = cc.block_size
    requested_block = built.requested_block_size
    if mamba_page is not None and attn_page_1 is not None:
        smallest = _smallest_kernel(backend)
        base = max(smallest, requested_block or bs)
        align = base
        if cc.mamba_cache_mode == "align" and checkpoint:
            align = math.lcm(base, checkpoint)
        lcm_text = f"lcm({base}, {checkpoint})" if align != base else f"{align}"
        computed = align * cdiv(mamba_page, align * attn_page_1)
        formula = f"{lcm_text} x cdiv({mamba_page}, {align} x {attn_page_1})"
        why = ""
        if gdn is not None and cc.mamba_cache_mode == "align":
            why = (
                f"  ({gpu.name}: {_PREFILL_KERNELS.get(gdn, gdn)} GDN prefill -> "
                + (f"{checkpoint}-token checkpoints)" if checkpoint and checkpoint > 1
                   else "no checkpoint alignment)")
            )
        if computed == bs:
            out["block_size"] = f"{bs} = {formula}{why}"
        elif cc.user_specified_block_size and bs >= computed:
            out["block_size"] = f"{bs} (--block-size {bs}; already >= {formula} = {computed})"
        else:
            out["block_size"] = (
                f"{bs} (vLLM's _align_hybrid_block_size: {formula} = {computed}, then "
                "rounded up to every backend's kernel alignment)"
            )
        padded = cc.mamba_page_size_padded
        if padded:
            out["mamba_page_size_padded"] = (
                f"{padded} = {bs} x {attn_page_1} (Mamba page {mamba_page} padded by "
                f"{100 * (padded - mamba_page) / mamba_page:.2f}%)"
            )
        else:
            out["mamba_page_size_padded"] = f"none: attention page == Mamba page ({mamba_page})"
    elif backend is not None:
        if cc.user_specified_block_size:
            out["block_size"] = f"{bs} (--block-size {bs})"
        else:
            out["block_size"] = (
                f"{bs} ({backend.get_name()}'s preferred block size on {gpu.name}, "
                "Platform.update_block_size_for_backend)"
            )
    else:
        out["block_size"] = f"{bs} (attention-free: the Mamba block is the scheduler block)"
    if attn_page_1 is not None:
        if mc.use_mla:
            out["attention_page_bytes_per_token"] = (
                f"{attn_page_1} = 1 latent x {mc.get_head_size()} x "
                f"{attn_page_1 // max(1, mc.get_head_size())} B (MLA)"
            )
        else:
            heads = mc.get_num_kv_heads(pc)
            out["attention_page_bytes_per_token"] = (
                f"{attn_page_1} = 2 (K,V) x {heads} KV heads/rank x {mc.get_head_size()} x "
                f"{attn_page_1 // max(1, 2 * heads * mc.get_head_size())} B "
                f"(max(1, {mc.get_total_num_kv_heads()} // TP {pc.tensor_parallel_size}) heads)"
            )
    for gid, (group, kb) in enumerate(
        zip(kv_cache_config.kv_cache_groups, kernel_block_sizes, strict=False)
    ):
        spec = group.kv_cache_spec
        if not isinstance(next(iter(leaf_specs(spec))), AttentionSpec):
            continue
        b = built.backends.get(group.layer_names[0])
        sizes = ", ".join(map(str, b.get_supported_kernel_block_sizes())) if b else "?"
        name = b.get_name() if b else "?"
        if kb != spec.block_size:
            out[f"kernel_block_size[{gid}]"] = (
                f"{kb}: largest of {name}'s kernel sizes on {gpu.name} [{sizes}] dividing "
                f"{spec.block_size} ({spec.block_size // kb} kernel pages per block)"
            )
        else:
            out[f"kernel_block_size[{gid}]"] = (
                f"{kb}: {name} accepts [{sizes}] on {gpu.name}, so the "
                f"{kb}-token block runs unsplit (1 kernel page per block)"
            )
    spec_cfg = vc.speculative_config
    if spec_cfg is not None and mamba_page is not None:
        out["num_speculative_blocks"] = (
            f"{spec_cfg.num_speculative_tokens}: Mamba state slots for "
            f"{spec_cfg.num_speculative_tokens} draft tokens ({spec_cfg.method}); the "
            "drafter's own layers are not built by kvexplore"
        )
    if admission is not None:
        out["admission"] = admission.text()
    return out


def catalog(gpu: str | GPU = DEFAULT_GPU) -> pd.DataFrame:
    """The bundled models, one row each, as vLLM 0.33 builds them on ``gpu``.

    Columns: ``model`` (Hugging Face id), ``architecture``, ``layers`` (the
    kinds of the layers vLLM registers, with counts, e.g. ``"mamba x18,
    full_attention x6"``), ``kv_heads``, ``head_size``, ``state`` (vLLM's
    Mamba backend for the state layers, empty for attention-only models).
    Every model is planned once (:func:`kvexplore.plan`, cached).
    """
    rows = []
    for name in catalog_names():
        p = plan(name, gpu=gpu)
        counts: dict[str, int] = {}
        for info in p.layers:
            counts[info.kind] = counts.get(info.kind, 0) + 1
        mamba = {
            s.mamba_type.name for s in p.layer_specs.values() if hasattr(s, "mamba_type")
        }
        mc = p.model_config
        rows.append(
            {
                "model": name,
                "architecture": p.model.architecture,
                "layers": ", ".join(f"{k} x{v}" for k, v in counts.items()),
                "kv_heads": mc.get_total_num_kv_heads(),
                "head_size": mc.get_head_size(),
                "state": "/".join(sorted(mamba)),
            }
        )
    return pd.DataFrame(rows)


__all__ = [
    "DEFAULT_NUM_BLOCKS",
    "Admission",
    "Plan",
    "catalog",
    "clear_plan_cache",
    "layer_kind",
    "plan",
    "provides",
]
