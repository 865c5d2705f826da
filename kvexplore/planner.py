"""The planner: the KV cache vLLM 0.33 would build, offline, on a CPU.

``plan(model, ...)`` runs vLLM's own code on a stand-in config
(:mod:`kvexplore.vllm_bridge`), in the order the engine does:

1. ``VllmConfig.try_verify_and_update_config``: the model's config hooks
   (``vllm/model_executor/models/config.py``; e.g. Qwen3.5 lifts HF
   ``mamba_ssm_dtype`` into ``cache_config.mamba_ssm_cache_dtype``, prefix
   caching turns ``mamba_cache_mode`` to ``align``).
2. ``Platform.update_block_size_for_backend`` with the chosen backend
   (``vllm/platforms/interface.py``: ``_preferred_block_size_for_backends``,
   ``_align_hybrid_block_size``): the block size and Mamba page padding.
3. One spec per layer, as each layer's ``get_kv_cache_spec`` builds it
   (``Attention.get_kv_cache_spec``, ``MLAAttention.get_kv_cache_spec``,
   ``CrossAttention.get_kv_cache_spec``, ``MambaBase.get_kv_cache_spec`` with
   the model class's ``get_mamba_state_shape_from_config`` /
   ``get_mamba_state_dtype_from_config``).
4. ``get_global_kv_cache_groups`` and the platform ``KVCacheConfigBuilder``
   (``vllm/v1/core/kv_cache_planning.py``): groups, tensors, ``num_blocks``.
5. ``prepare_kernel_block_sizes`` (``vllm/v1/worker/utils.py``): the kernel
   block of every group.

Worked example (GUIDE section 4), Qwen3.5-0.8B at TP=1 on FLASH_ATTN:

>>> p = plan("Qwen/Qwen3.5-0.8B")
>>> p.block_size, p.mamba_page_size_padded, len(p.kv_cache_config.kv_cache_groups)
(544, 1114112, 4)
>>> p.derivation["block_size"]
'544 = 16 x cdiv(1085440, 16 x 2048)'
"""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Any

import pandas as pd

from kvexplore.backends import backend_class, resolve_backend_name
from kvexplore.errors import KVExploreError
from kvexplore.models import (
    CROSS,
    FULL,
    MAMBA,
    MLA,
    SLIDING,
    LayerInfo,
    ModelSource,
    layer_infos,
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


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def mamba_type_of(model_config):
    """vLLM's ``MambaAttentionBackendEnum`` member for a model's state layers.

    Mirrors each layer class's ``mamba_type`` property: ``GatedDeltaNet``
    (``layers/mamba/gdn/base.py``) -> GDN_ATTN, ``ShortConv``
    (``layers/mamba/short_conv.py``) -> SHORT_CONV, ``MambaMixer``
    (``mamba_mixer.py``) -> MAMBA1, ``MambaMixer2`` -> MAMBA2.
    """
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum as E

    hf = model_config.hf_text_config
    model_type = getattr(hf, "model_type", "")
    if hasattr(hf, "linear_num_value_heads") or model_type.startswith(("qwen3_next", "qwen3_5")):
        return E.GDN_ATTN
    if model_type.startswith("lfm2") or hasattr(hf, "conv_L_cache"):
        return E.SHORT_CONV
    if model_type in ("jamba", "mamba", "falcon_mamba"):
        return E.MAMBA1
    return E.MAMBA2


# ---------------------------------------------------------------------------
# The Plan
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Plan:
    """The KV cache vLLM 0.33 would build for one model and one configuration.

    Frozen: change an input with :meth:`replace` (a new plan).  Holds vLLM's
    own objects: ``layer_specs`` (``KVCacheSpec`` per layer name),
    ``kv_cache_config`` (a real ``KVCacheConfig``), ``vllm_config`` (the
    stand-in with the real ``ModelConfig`` / ``CacheConfig`` /
    ``ParallelConfig`` after hooks and alignment ran).
    """

    model: ModelSource
    request: tuple = field(repr=False)
    vllm_config: Any = field(repr=False)
    layers: tuple[LayerInfo, ...] = field(repr=False)
    layer_specs: MappingProxyType = field(repr=False)
    kv_cache_config: Any = field(repr=False)
    kernel_block_sizes: tuple[int, ...]
    backend: type = field(repr=False)
    attention_page_bytes_per_token: int | None
    mamba_page_size: int | None
    derivation: MappingProxyType = field(repr=False)

    # -- inputs ---------------------------------------------------------------
    @property
    def inputs(self) -> dict[str, Any]:
        """The keyword arguments this plan was made with."""
        return dict(self.request)

    def replace(self, **changes) -> Plan:
        """A new plan with some inputs changed (``plan(**inputs | changes)``)."""
        return plan(self.model, **{**self.inputs, **changes})

    # -- derived sizes --------------------------------------------------------
    @property
    def cache_config(self):
        return self.vllm_config.cache_config

    @property
    def model_config(self):
        return self.vllm_config.model_config

    @property
    def parallel_config(self):
        return self.vllm_config.parallel_config

    @property
    def block_size(self) -> int:
        """Tokens per KV cache block (the scheduler's block, after alignment)."""
        return self.cache_config.block_size

    @property
    def mamba_page_size_padded(self) -> int | None:
        """Padded Mamba page in bytes; None when the Mamba page needs no padding."""
        return self.cache_config.mamba_page_size_padded

    @property
    def mamba_cache_mode(self) -> str:
        return self.cache_config.mamba_cache_mode

    @property
    def num_blocks(self) -> int:
        return self.kv_cache_config.num_blocks

    @property
    def kv_cache_layout(self):
        """vLLM's ``KVCacheLayout`` the registration uses."""
        return self.cache_config.get_resolved_kv_cache_layout()

    @property
    def attention_backend(self) -> str:
        return self.backend.get_name()

    @property
    def groups(self) -> tuple:
        return tuple(self.kv_cache_config.kv_cache_groups)

    @cached_property
    def group_table(self) -> pd.DataFrame:
        """One row per KV cache group: kind, layers, block and kernel block, page,
        padding, bytes per block of the group."""
        from vllm.v1.kv_cache_interface import get_kv_cache_spec_kind

        rows = []
        for gid, group in enumerate(self.groups):
            spec = group.kv_cache_spec
            first = next(iter(_leaf_specs(spec)))
            real = _real_page(first)
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
                    "first_layer": group.layer_names[0],
                }
            )
        return pd.DataFrame(rows)

    # -- memory facts ----------------------------------------------------------
    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across the whole cache (all tensors)."""
        cfg = self.kv_cache_config
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
        return int(max((r.padding_bytes * r.layers for r in self.group_table.itertuples()), default=0))

    @property
    def padding_share(self) -> float:
        """Share of a block's bytes that are padding (worst group)."""
        return self.padding_bytes_per_block / self.bytes_per_block if self.bytes_per_block else 0.0

    @cached_property
    def _capacity(self) -> tuple[int, float]:
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        return get_kv_cache_capacity(self.vllm_config, self.kv_cache_config)

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

    @cached_property
    def summary(self) -> pd.DataFrame:
        """Key numbers as a two-column table (quantity, value)."""
        rows = [
            ("model", self.model.name),
            ("architecture", self.model.architecture),
            ("tensor_parallel_size", self.parallel_config.tensor_parallel_size),
            ("decode_context_parallel_size", self.parallel_config.decode_context_parallel_size),
            ("attention_backend", self.attention_backend),
            ("kv_cache_dtype", self.cache_config.cache_dtype),
            ("mamba_ssm_cache_dtype", self.cache_config.mamba_ssm_cache_dtype),
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
            ("max_model_len", self.model_config.max_model_len),
            ("kv_cache_size_tokens", self.kv_cache_size_tokens),
            ("max_concurrency", round(self.max_concurrency, 4)),
            ("padding_share", round(self.padding_share, 6)),
        ]
        return pd.DataFrame(rows, columns=["quantity", "value"])

    def explain(self) -> str:
        """The derivation of every chosen size, one line each."""
        return "\n".join(f"{k}: {v}" for k, v in self.derivation.items())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: numbers, groups and derivations."""
        out = {k: _jsonable(v) for k, v in zip(self.summary.quantity, self.summary.value, strict=True)}
        out["groups"] = [
            {k: _jsonable(v) for k, v in row.items()} for row in self.group_table.to_dict("records")
        ]
        out["derivation"] = dict(self.derivation)
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
        from kvexplore.registration import allocate

        return allocate(self, device=device, registration=registration)

    def __repr__(self) -> str:
        pad = f", mamba_page_size_padded={self.mamba_page_size_padded}" if self.mamba_page_size_padded else ""
        return (
            f"Plan({self.model.name!r}, tp={self.parallel_config.tensor_parallel_size}, "
            f"dcp={self.parallel_config.decode_context_parallel_size}, "
            f"backend={self.attention_backend}, block_size={self.block_size}{pad}, "
            f"groups={len(self.groups)}, kernel_block_sizes={list(self.kernel_block_sizes)}, "
            f"num_blocks={self.num_blocks})"
        )

    def _repr_html_(self) -> str:
        from kvexplore.reprs import plan_html

        return plan_html(self)


def _jsonable(v):
    if hasattr(v, "item"):
        return v.item()
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def _leaf_specs(spec):
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, dict):
        return list(inner.values())
    return [spec]


def _real_page(spec) -> int:
    real = getattr(spec, "real_page_size_bytes", None)
    return int(real) if real is not None else int(spec.page_size_bytes)


def _spec_dtypes(spec) -> str:
    dtypes = getattr(spec, "dtypes", None)
    if dtypes is not None:
        return "/".join(str(d).removeprefix("torch.") for d in dtypes)
    return str(getattr(spec, "dtype", "")).removeprefix("torch.")


# ---------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------

_PLAN_CACHE: OrderedDict = OrderedDict()
_PLAN_CACHE_SIZE = 4096
_PLAN_LOCK = threading.Lock()


def clear_plan_cache() -> None:
    """Forget cached plans (benchmarks measure uncached planning)."""
    with _PLAN_LOCK:
        _PLAN_CACHE.clear()


def plan(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    tensor_parallel_size: int = 1,
    decode_context_parallel_size: int = 1,
    block_size: int | None = None,
    dtype: str = "auto",
    kv_cache_dtype: str = "auto",
    enable_prefix_caching: bool = True,
    mamba_cache_mode: str | None = None,
    mamba_ssm_cache_dtype: str = "auto",
    max_model_len: int | None = None,
    attention_backend: str = "FLASH_ATTN",
    num_blocks: int | None = None,
    kv_cache_memory_bytes: int | None = None,
    kv_cache_layout: str = "LBNHC",
) -> Plan:
    """Plan the KV cache vLLM 0.33 would build for ``model`` on one worker.

    Keyword names and defaults follow vLLM's engine arguments
    (``--tensor-parallel-size``, ``--decode-context-parallel-size``,
    ``--block-size``, ``--dtype``, ``--kv-cache-dtype``,
    ``--enable-prefix-caching``, ``--mamba-cache-mode``,
    ``--mamba-ssm-cache-dtype``, ``--max-model-len``,
    ``--attention-backend``, ``--num-gpu-blocks-override`` as ``num_blocks``,
    ``--kv-cache-memory-bytes``).  ``mamba_cache_mode=None`` lets vLLM
    choose (``align`` with prefix caching).  With neither ``num_blocks`` nor
    ``kv_cache_memory_bytes`` the cache has :data:`DEFAULT_NUM_BLOCKS` blocks.
    ``kv_cache_layout`` is vLLM's ``KVCacheLayout`` name (``NHD``/``HND``
    alias ``LBNHC``/``LBHNC``).

    Plans are cached by their inputs; a cached plan is returned as is (it is
    immutable).  Every error is a ``ValueError`` naming the value.
    """
    src = load_model_config(model)
    request = (
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
        ("num_blocks", num_blocks),
        ("kv_cache_memory_bytes", kv_cache_memory_bytes),
        ("kv_cache_layout", kv_cache_layout),
    )
    key = (id(src), request)
    with _PLAN_LOCK:
        hit = _PLAN_CACHE.get(key)
        if hit is not None:
            _PLAN_CACHE.move_to_end(key)
            return hit
    result = _build_plan(src, request)
    with _PLAN_LOCK:
        _PLAN_CACHE[key] = result
        while len(_PLAN_CACHE) > _PLAN_CACHE_SIZE:
            _PLAN_CACHE.popitem(last=False)
    return result


def _check_int(name: str, value, *, minimum: int = 1, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KVExploreError(
            f"{name}={value!r} is invalid; expected an integer >= {minimum}"
            + (" or None" if allow_none else "")
        )


def _check_choice(name: str, value, choices) -> None:
    if value not in choices:
        raise KVExploreError(f"{name}={value!r} is invalid; expected one of {list(choices)}")


def _validate_request(r: dict) -> None:
    _check_int("tensor_parallel_size", r["tensor_parallel_size"])
    _check_int("decode_context_parallel_size", r["decode_context_parallel_size"])
    _check_int("block_size", r["block_size"], allow_none=True)
    _check_int("max_model_len", r["max_model_len"], allow_none=True)
    _check_int("num_blocks", r["num_blocks"], allow_none=True)
    _check_int("kv_cache_memory_bytes", r["kv_cache_memory_bytes"], allow_none=True)
    if r["num_blocks"] is not None and r["kv_cache_memory_bytes"] is not None:
        raise KVExploreError(
            f"give num_blocks ({r['num_blocks']}) or kv_cache_memory_bytes "
            f"({r['kv_cache_memory_bytes']}), not both"
        )
    _check_choice("dtype", r["dtype"], MODEL_DTYPES)
    _check_choice("mamba_ssm_cache_dtype", r["mamba_ssm_cache_dtype"], MAMBA_SSM_DTYPES)
    if r["mamba_cache_mode"] is not None:
        _check_choice("mamba_cache_mode", r["mamba_cache_mode"], MAMBA_CACHE_MODES)
    _check_choice("kv_cache_layout", r["kv_cache_layout"], KV_CACHE_LAYOUTS)
    if not isinstance(r["enable_prefix_caching"], bool):
        raise KVExploreError(
            f"enable_prefix_caching={r['enable_prefix_caching']!r} is invalid; expected True or False"
        )
    from vllm.config.cache import is_known_kv_cache_dtype

    if not isinstance(r["kv_cache_dtype"], str) or not is_known_kv_cache_dtype(r["kv_cache_dtype"]):
        from typing import get_args

        from vllm.config.cache import CacheDType

        raise KVExploreError(
            f"kv_cache_dtype={r['kv_cache_dtype']!r} is invalid; expected one of "
            f"{list(get_args(CacheDType))}"
        )


def _build_plan(src: ModelSource, request: tuple) -> Plan:
    r = dict(request)
    _validate_request(r)
    try:
        return _build_plan_checked(src, request, r)
    except KVExploreError:
        raise
    except (ValueError, AssertionError, NotImplementedError) as exc:
        # vLLM's own checks (alignment, grouping, memory) carry the numbers.
        msg = str(exc).strip() or type(exc).__name__
        raise KVExploreError(f"vLLM 0.33 rejects this configuration of {src.name}: {msg}") from exc


def _build_plan_checked(src: ModelSource, request: tuple, r: dict) -> Plan:
    from vllm.config import CacheConfig
    from vllm.model_executor.models import ModelRegistry

    from kvexplore.vllm_bridge import (
        OfflinePlatform,
        VllmConfigStandIn,
        run_model_hooks,
    )

    mc = src.model_config(r["dtype"], r["max_model_len"])
    tp = r["tensor_parallel_size"]
    dcp = r["decode_context_parallel_size"]
    parallel_config = _parallel_config(tp, dcp)
    try:
        mc.verify_with_parallel_config(parallel_config)
    except ZeroDivisionError:
        # vllm/config/model.py divides by the KV head count for DCP; an
        # attention-free model has none.
        raise KVExploreError(
            f"decode_context_parallel_size={dcp} needs attention KV heads to shard; "
            f"{src.name} is attention-free (0 KV heads): expected 1"
        ) from None
    except (ValueError, NotImplementedError) as exc:
        raise KVExploreError(
            f"tensor_parallel_size={tp}, decode_context_parallel_size={dcp} "
            f"do not fit {src.name}: {exc}"
        ) from None

    cache_kwargs = dict(
        cache_dtype=r["kv_cache_dtype"],
        enable_prefix_caching=r["enable_prefix_caching"],
        mamba_ssm_cache_dtype=r["mamba_ssm_cache_dtype"],
    )
    if r["block_size"] is not None:
        cache_kwargs["block_size"] = r["block_size"]
    if r["mamba_cache_mode"] is not None:
        cache_kwargs["mamba_cache_mode"] = r["mamba_cache_mode"]
    try:
        cache_config = CacheConfig(**cache_kwargs)
    except Exception as exc:  # pydantic ValidationError
        raise KVExploreError(f"vLLM's CacheConfig rejects {cache_kwargs}: {exc}") from None
    from vllm.config.cache import _layout_from_name

    layout = _layout_from_name(r["kv_cache_layout"])
    cache_config.kv_cache_layout = layout.name

    backend_name = resolve_backend_name(r["attention_backend"], mc.use_mla)
    backend = backend_class(backend_name)
    infos = layer_infos(mc)
    has_attention = any(i.kind != MAMBA for i in infos)
    vc = VllmConfigStandIn(
        model_config=mc,
        cache_config=cache_config,
        parallel_config=parallel_config,
        attention_backends=(backend,) if has_attention else (),
    )
    derivation: dict[str, str] = {}

    # 1. model hooks
    ssm_before = cache_config.mamba_ssm_cache_dtype
    mode_before = cache_config.mamba_cache_mode
    run_model_hooks(vc)
    if cache_config.mamba_ssm_cache_dtype != ssm_before:
        derivation["mamba_ssm_cache_dtype"] = (
            f"{cache_config.mamba_ssm_cache_dtype} (set by {src.architecture}'s config "
            f"hook from {ssm_before!r})"
        )
    if cache_config.mamba_cache_mode != mode_before:
        derivation["mamba_cache_mode"] = (
            f"{cache_config.mamba_cache_mode!r} (vLLM's MambaModelConfig: prefix caching "
            f"{'on' if cache_config.enable_prefix_caching else 'off'})"
        )

    # 2. alignment (vLLM's own code)
    model_cls = None
    is_mamba = any(i.kind == MAMBA for i in infos)
    if is_mamba:
        model_cls, _ = ModelRegistry.resolve_model_cls(mc.architecture, model_config=mc)
    requested_block = cache_config.block_size
    if has_attention and not cache_config.user_specified_block_size:
        # Phase 1 of update_block_size_for_backend: the backend's preference.
        from vllm.config.vllm import set_current_vllm_config

        with set_current_vllm_config(vc):
            requested_block = backend.get_preferred_block_size(requested_block)
    OfflinePlatform.update_block_size_for_backend(vc)
    if not has_attention and cache_config.mamba_block_size is None:
        cache_config.mamba_block_size = cache_config.block_size

    kv_torch_dtype = _kv_torch_dtype(cache_config.cache_dtype, mc)
    attn_page_1 = None
    if has_attention:
        attn_page_1 = _attention_page_per_token(mc, parallel_config, cache_config, backend, kv_torch_dtype, vc)
    mamba_page = unpadded = None
    if is_mamba:
        # One call of the model's state-shape functions serves the derivation
        # (unpadded page) and every Mamba layer's spec (padded page).
        unpadded = _mamba_spec(model_cls, mc, vc, cache_config, padded=False)
        mamba_page = unpadded.page_size_bytes
    derivation.update(
        _block_size_derivation(
            requested_block, cache_config, backend, attn_page_1, mamba_page, mc, vc
        )
    )

    # 3. specs per layer
    specs: dict[str, Any] = {}
    # Layers of one kind get equal specs (vLLM builds one per layer from the same
    # config); build each kind once and share the frozen object.
    by_kind: dict[tuple, Any] = {}
    for info in infos:
        key = (info.kind, info.sliding_window)
        if key not in by_kind:
            by_kind[key] = _layer_spec(
                info, mc, parallel_config, cache_config, backend, kv_torch_dtype, unpadded, vc
            )
        specs[info.name] = by_kind[key]

    # 4. groups and tensors
    kv_cache_config = _kv_cache_config(vc, specs, r)
    # vllm/v1/engine/core.py: the engine core hands its resolved layout to workers
    kv_cache_config.kv_cache_layout = cache_config.kv_cache_layout

    # 5. kernel blocks
    from vllm.v1.kv_cache_interface import AttentionSpec

    kernel_block_sizes = _kernel_block_sizes(kv_cache_config, backend)
    for gid, (group, kb) in enumerate(zip(kv_cache_config.kv_cache_groups, kernel_block_sizes, strict=False)):
        sizes = ", ".join(map(str, backend.get_supported_kernel_block_sizes()))
        if kb != group.kv_cache_spec.block_size:
            derivation[f"kernel_block_size[{gid}]"] = (
                f"{kb}: largest of {backend.get_name()}'s kernel sizes [{sizes}] dividing "
                f"{group.kv_cache_spec.block_size} ({group.kv_cache_spec.block_size // kb} "
                "kernel pages per block)"
            )
        elif isinstance(group.kv_cache_spec, AttentionSpec):
            derivation[f"kernel_block_size[{gid}]"] = (
                f"{kb}: {backend.get_name()} accepts [{sizes}], so the "
                f"{kb}-token block runs unsplit (1 kernel page per block)"
            )
    return Plan(
        model=src,
        request=request,
        vllm_config=vc,
        layers=infos,
        layer_specs=MappingProxyType(specs),
        kv_cache_config=kv_cache_config,
        kernel_block_sizes=tuple(kernel_block_sizes),
        backend=backend,
        attention_page_bytes_per_token=attn_page_1,
        mamba_page_size=mamba_page,
        derivation=MappingProxyType(derivation),
    )


def _parallel_config(tp: int, dcp: int):
    from vllm.config import ParallelConfig

    try:
        return ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp)
    except Exception as exc:
        raise KVExploreError(
            f"vLLM's ParallelConfig rejects tensor_parallel_size={tp}, "
            f"decode_context_parallel_size={dcp}: {exc}"
        ) from None


def _kv_torch_dtype(cache_dtype: str, mc):
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype

    return kv_cache_dtype_str_to_dtype(cache_dtype, mc)


def _attention_page_per_token(mc, pc, cc, backend, kv_torch_dtype, vc) -> int:
    """Bytes of one token of one attention layer, as ``_align_hybrid_block_size``
    computes it (``customize_spec`` of a 1-token ``FullAttentionSpec``)."""
    from vllm.config.vllm import set_current_vllm_config
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        MLAAttentionSpec,
        get_kv_quant_mode,
    )

    quant = get_kv_quant_mode(cc.cache_dtype)
    if mc.use_mla:
        return MLAAttentionSpec(
            block_size=1,
            num_kv_heads=mc.get_num_kv_heads(pc),
            head_size=mc.get_head_size(),
            dtype=kv_torch_dtype,
            cache_dtype_str=cc.cache_dtype,
            kv_quant_mode=quant,
        ).page_size_bytes
    spec = FullAttentionSpec(
        block_size=1,
        num_kv_heads=mc.get_num_kv_heads(pc),
        head_size=mc.get_head_size(),
        dtype=kv_torch_dtype,
        kv_quant_mode=quant,
    )
    with set_current_vllm_config(vc):
        return backend.customize_spec(spec).page_size_bytes


def _block_size_derivation(requested, cc, backend, attn_page_1, mamba_page, mc, vc) -> dict[str, str]:
    from vllm.v1.attention.backend import MultipleOf

    out: dict[str, str] = {}
    sizes = backend.get_supported_kernel_block_sizes()
    smallest = min((s.base if isinstance(s, MultipleOf) else s) for s in sizes) if sizes else 1
    if cc.user_specified_block_size:
        start = f"--block-size {requested}"
    else:
        start = f"{backend.get_name()}'s preferred block size, get_preferred_block_size(16)"
    bs = cc.block_size
    if mamba_page is not None and attn_page_1 is not None:
        align = max(smallest, requested)
        ck = f"{align} x cdiv({mamba_page}, {align} x {attn_page_1})"
        computed = align * _cdiv(mamba_page, align * attn_page_1)
        if computed == bs:
            out["block_size"] = f"{bs} = {ck}"
        elif bs == requested:
            out["block_size"] = f"{bs} ({start}; already >= {ck} = {computed})"
        else:
            out["block_size"] = (
                f"{bs} (vLLM's _align_hybrid_block_size; {ck} = {computed}, "
                f"then rounded to the Mamba checkpoint/backend alignment)"
            )
        padded = cc.mamba_page_size_padded
        if padded:
            out["mamba_page_size_padded"] = (
                f"{padded} = {bs} x {attn_page_1} (Mamba page {mamba_page} padded by "
                f"{100 * (padded - mamba_page) / mamba_page:.2f}%)"
            )
        else:
            out["mamba_page_size_padded"] = f"none: attention page == Mamba page ({mamba_page})"
    else:
        out["block_size"] = f"{bs} ({start})"
    if attn_page_1 is not None:
        pc = vc.parallel_config
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
    return out


def _mamba_spec(model_cls, mc, vc, cc, *, padded: bool = True):
    """``MambaBase.get_kv_cache_spec`` with the model class's shape/dtype functions."""
    from vllm.v1.kv_cache_interface import MambaSpec

    try:
        shapes = model_cls.get_mamba_state_shape_from_config(vc)
        dtypes = model_cls.get_mamba_state_dtype_from_config(vc)
    except (AttributeError, KeyError, TypeError) as exc:
        raise KVExploreError(
            f"{mc.architecture}: vLLM's get_mamba_state_shape_from_config could not "
            f"read the config ({type(exc).__name__}: {exc}); a state field is missing"
        ) from None
    return MambaSpec(
        shapes=tuple(tuple(s) for s in shapes),
        dtypes=tuple(dtypes),
        block_size=cc.mamba_block_size if cc.mamba_block_size is not None else cc.block_size,
        page_size_padded=cc.mamba_page_size_padded if padded else None,
        mamba_type=mamba_type_of(mc),
        tp_replicated=False,
        mamba_cache_mode=cc.mamba_cache_mode,
        num_speculative_blocks=0,
    )


def _layer_spec(info: LayerInfo, mc, pc, cc, backend, kv_torch_dtype, mamba_unpadded, vc):
    from vllm.v1.kv_cache_interface import (
        CrossAttentionSpec,
        FullAttentionSpec,
        MLAAttentionSpec,
        SlidingWindowSpec,
        get_kv_quant_mode,
    )

    quant = get_kv_quant_mode(cc.cache_dtype)
    if info.kind == MAMBA:
        # MambaBase.get_kv_cache_spec: the state shapes, padded to vLLM's page
        return dataclasses.replace(mamba_unpadded, page_size_padded=cc.mamba_page_size_padded)
    heads = mc.get_num_kv_heads(pc)
    head = mc.get_head_size()
    if info.kind == MLA:
        return MLAAttentionSpec(
            block_size=cc.block_size,
            num_kv_heads=1,
            max_tp_shards=1,
            head_size=head,
            dtype=kv_torch_dtype,
            cache_dtype_str=cc.cache_dtype,
            kv_quant_mode=quant,
        )
    if info.kind == CROSS:
        return CrossAttentionSpec(
            block_size=cc.block_size, num_kv_heads=heads, head_size=head,
            dtype=kv_torch_dtype, kv_quant_mode=quant,
        )
    if info.kind == SLIDING:
        # Attention.get_kv_cache_spec: SW picks its own block size.
        from vllm.config.vllm import set_current_vllm_config
        from vllm.model_executor.layers.attention.attention import (
            _largest_kernel_block_within,
        )

        with set_current_vllm_config(vc):
            base = backend.customize_spec(
                SlidingWindowSpec(
                    block_size=1, num_kv_heads=heads, head_size=head, dtype=kv_torch_dtype,
                    kv_quant_mode=quant, sliding_window=info.sliding_window,
                )
            )
            per_token = base.real_page_size_bytes
            budget = cc.skip_page_size_padded or per_token * cc.block_size
            sw_block = _largest_kernel_block_within(backend, per_token, budget, cc.block_size, base)
        return SlidingWindowSpec(
            block_size=sw_block, num_kv_heads=heads, head_size=head, dtype=kv_torch_dtype,
            kv_quant_mode=quant, sliding_window=info.sliding_window,
            page_size_padded=cc.skip_page_size_padded,
        )
    assert info.kind == FULL
    return FullAttentionSpec(
        block_size=cc.block_size, num_kv_heads=heads, head_size=head,
        dtype=kv_torch_dtype, kv_quant_mode=quant,
    )


def _kv_cache_config(vc, specs: dict, r: dict):
    """Groups and tensors through vLLM's planning functions."""
    from vllm.v1.core.kv_cache_config_builder import get_kv_cache_config_builder
    from vllm.v1.core.kv_cache_planning import (
        get_global_kv_cache_groups,
        get_kv_cache_configs,
        kv_cache_groups_tp_replicas,
    )

    groups = get_global_kv_cache_groups(vc, [specs])
    if r["kv_cache_memory_bytes"] is not None:
        return get_kv_cache_configs(vc, [specs], [r["kv_cache_memory_bytes"]], groups)[0]
    builder = get_kv_cache_config_builder(vc)
    num_blocks = r["num_blocks"] or DEFAULT_NUM_BLOCKS
    cfg = builder.get_kv_cache_config_from_groups(vc, groups, num_blocks if groups else 1)
    pc = vc.parallel_config
    cfg.kv_tp_replicas = kv_cache_groups_tp_replicas(
        cfg.kv_cache_groups, pc.tensor_parallel_size, pc.decode_context_parallel_size
    )
    return cfg


def _kernel_block_sizes(kv_cache_config, backend) -> list[int]:
    """``prepare_kernel_block_sizes`` with every attention group on ``backend``."""
    from types import SimpleNamespace

    from vllm.v1.worker.utils import prepare_kernel_block_sizes

    attn_groups = [
        [SimpleNamespace(backend=backend, kv_cache_spec=g.kv_cache_spec)]
        for g in kv_cache_config.kv_cache_groups
    ]
    return prepare_kernel_block_sizes(kv_cache_config, attn_groups)


__all__ = ["DEFAULT_NUM_BLOCKS", "Plan", "clear_plan_cache", "mamba_type_of", "plan"]
