"""The planner: the KV cache vLLM would build on a named GPU, offline.

``plan(model, gpu="H100", ...)`` builds the model with vLLM's own code on the
meta device while the GPU is emulated (:mod:`kvexplore.planning.worker` lists
the steps), then runs what depends on memory:

- ``get_kv_cache_configs`` (``vllm/v1/core/kv_cache_planning.py``): tensors,
  ``num_blocks``, auto-fit of ``max_model_len=-1`` and the admission check
  (``_check_enough_kv_cache_memory``), whose verdict the plan keeps
  (:class:`Admission`) instead of refusing to show the layout;
- ``prepare_kernel_block_sizes`` (``vllm/v1/worker/utils.py``) with each
  group's own backends: the kernel block of every group.

Plans and model builds are cached by the normalised inputs
(:class:`kvexplore.planning.inputs.PlanRequest`), the model by its config's
content.

Worked example: Qwen3.5-0.8B on an A100 and an H100, under vLLM 0.33.0 (the
answers are the installed release's: vLLM 0.34.0 plans 576-token blocks on
both, 0.31.0 and 0.32.0 plan 544 on both).

>>> p = plan("Qwen/Qwen3.5-0.8B", gpu="A100")
>>> p.vllm_version
'0.33.0'
>>> p.block_size
544
>>> p = plan("Qwen/Qwen3.5-0.8B", gpu="H100")
>>> p.block_size, p.mamba_page_size_padded, len(p.groups)
(576, 1179648, 4)
>>> p.derivation()["block_size"]
'576 = lcm(16, 64) x cdiv(1085440, 64 x 2048)  (H100: FlashInfer GDN prefill -> 64-token checkpoints)'
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import (
    FrozenDict,
    GiB,
    cdiv,
    jsonable,
)
from kvexplore.planning import startup
from kvexplore.planning.admission import Admission, kv_cache_config_with_admission
from kvexplore.planning.derivation import plan_derivation, smallest_kernel_block
from kvexplore.planning.drafter import Drafter
from kvexplore.planning.facts import (
    GroupInfo,
    TensorInfo,
    config_facts,
    group_infos,
    kernel_block_sizes,
    layer_kind,
    layout_facts,
    mixer,
    spec_dtypes,
)
from kvexplore.planning.failures import vllm_error, vllm_origin
from kvexplore.planning.gpus import DEFAULT_GPU, GPU, resolve_gpu
from kvexplore.planning.inputs import (
    PlanRequest,
    check_quantization,
    plan_request,
    plan_signature,
)
from kvexplore.planning.models import (
    LayerInfo,
    ModelSource,
    catalog_names,
    load_model_config,
)
from kvexplore.planning.release import installed_release, release_name

# ---------------------------------------------------------------------------
# The Plan
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, eq=False)
class Plan(Displayable):
    """The KV cache vLLM would build for one model, GPU and configuration.

    Frozen: change an input with :meth:`replace` (a new plan).  Every field is
    kvexplore's own immutable fact, read from vLLM once (``layer_specs`` and
    the groups' specs are vLLM's frozen ``KVCacheSpec`` objects); vLLM's
    mutable objects come out as fresh copies only (:attr:`vllm_config`,
    :attr:`kv_cache_config`, ...), so no caller can change a plan another holds.
    Each field is documented below, as vLLM documents its config fields.
    """

    model: ModelSource
    """The model: its config folder, Hugging Face id and architecture."""
    gpu: GPU
    """The GPU one worker runs on (:func:`kvexplore.gpus`)."""
    request: PlanRequest = field(repr=False)
    """The normalised inputs the plan was made with (:class:`PlanRequest`;
    :attr:`inputs` gives them as ``plan()`` keywords)."""
    layers: tuple[LayerInfo, ...] = field(repr=False)
    """Every layer that holds KV cache or state on this worker, in vLLM's registration
    order (drafter layers last)."""
    layer_specs: FrozenDict = field(repr=False)
    """Layer name to the ``KVCacheSpec`` the layer's own ``get_kv_cache_spec`` returned
    (vLLM's frozen dataclasses)."""
    layer_classes: FrozenDict = field(repr=False)
    """Layer name to the name of the vLLM class of the module that owns it
    (``Attention``, ``QwenGatedDeltaNetAttention``, ...)."""
    layer_backends: FrozenDict = field(repr=False)
    """Layer name to the attention or state backend its module selected on this GPU."""
    groups: tuple[GroupInfo, ...] = field(repr=False)
    """The engine core's KV cache groups (``KVCacheConfig.kv_cache_groups``), each with the
    kernel block size and backend its worker uses."""
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    """The engine core's ``KVCacheConfig.kv_cache_tensors``: each allocation, the layers
    that share it and their strides."""
    num_blocks: int
    """Blocks in the cache (``KVCacheConfig.num_blocks``), as given or as the memory held
    them."""
    kv_cache_memory_bytes: int | None
    """Bytes the cache may take per worker: as given, or what vLLM's memory profile (or the
    extensible cache) leaves; ``None`` when ``num_blocks`` was given."""
    block_size: int
    """Tokens per block (``CacheConfig.block_size`` after vLLM's alignment for hybrid
    models)."""
    kernel_block_sizes: tuple[int, ...]
    """Per group, the block size the attention kernel addresses
    (``prepare_kernel_block_sizes``): ``block_size`` or a divisor of it."""
    tensor_parallel_size: int
    """``ParallelConfig.tensor_parallel_size``."""
    decode_context_parallel_size: int
    """``ParallelConfig.decode_context_parallel_size``."""
    pipeline_parallel_size: int
    """``ParallelConfig.pipeline_parallel_size``."""
    pipeline_parallel_rank: int
    """The pipeline stage whose worker this plan is (0 without pipeline
    parallelism): :attr:`layers`, :attr:`groups` and :attr:`tensors` are that
    worker's."""
    kv_cache_dtype: str
    """``CacheConfig.cache_dtype`` (``auto``: the model dtype)."""
    model_dtype: str
    """The model's activation dtype as vLLM resolved it (``ModelConfig.dtype``)."""
    mamba_ssm_cache_dtype: str
    """``CacheConfig.mamba_ssm_cache_dtype`` as resolved for this model."""
    mamba_cache_mode: str
    """``CacheConfig.mamba_cache_mode`` as resolved (``none``, ``align`` or ``all``)."""
    enable_prefix_caching: bool
    """``CacheConfig.enable_prefix_caching`` as resolved."""
    mamba_page_size: int | None
    """Bytes of one Mamba layer's state per block before padding (sum over its state
    tensors); ``None`` without Mamba layers."""
    mamba_page_size_padded: int | None
    """``CacheConfig.mamba_page_size_padded``: the Mamba page after vLLM padded it to the
    attention page; ``None`` when not padded."""
    attention_page_bytes_per_token: int | None
    """Bytes one attention layer's page holds per token (K and V, all KV heads of this
    rank); ``None`` without attention layers."""
    kv_cache_layout: Any
    """The KV cache layout the engine resolved
    (``CacheConfig.get_resolved_kv_cache_layout()``)."""
    max_model_len: int
    """``ModelConfig.max_model_len`` as served (after ``max_model_len=-1`` auto-fit)."""
    model_max_model_len: int
    """The model's own maximum length (before any auto-fit)."""
    served_model: str
    """``ModelConfig.model``: the model name the engine serves."""
    use_mla: bool
    """``ModelConfig.use_mla``: attention layers cache a compressed latent (MLA)."""
    total_num_kv_heads: int
    """KV heads of the model (``ModelConfig.get_total_num_kv_heads``)."""
    num_kv_heads: int
    """KV heads per tensor-parallel rank (``ModelConfig.get_num_kv_heads``)."""
    head_size: int
    """``ModelConfig.get_head_size()``."""
    backend: type | None = field(repr=False)
    """The attention backend class of the first attention layer; ``None`` without attention
    layers."""
    admission: Admission | None = field(repr=False)
    """vLLM's start-up verdict: can the cache serve one request of ``max_model_len``
    tokens."""
    decisions: FrozenDict = field(repr=False)
    """Choices vLLM made while building the layers on this GPU (e.g.
    ``gdn_prefill_backend``, ``prefill_checkpoint_alignment``, ``alignment_backend``),
    by name."""
    weight_bytes: int = field(repr=False)
    """Bytes of parameters and buffers of the model built on the meta device, per rank."""
    kv_cache_size_tokens: int
    """Tokens the cache holds (``get_kv_cache_capacity``)."""
    max_concurrency: float
    """Requests of ``max_model_len`` tokens the cache holds at once
    (``get_kv_cache_capacity``)."""
    kv_tp_replicas: int = 1
    """``KVCacheConfig.kv_tp_replicas``: ranks that hold the same KV heads."""
    prefix_match_unit: int | None = None
    """``CacheConfig.prefix_match_unit``: the token unit prefix-cache hits are matched in,
    when set."""
    drafter: Drafter | None = None
    """The speculative drafter's layers and weights, when ``speculative_config`` adds one."""
    blocks_per_request: tuple[int, ...] = ()
    """Per group, the most blocks one request pins (``max_memory_usage_bytes`` over the
    page size)."""
    mla_dims: tuple[int, int] | None = None
    """``(kv_lora_rank, qk_rope_head_dim)`` of an MLA model; ``None`` otherwise."""
    kv_cache_layout_name: str = ""
    """``CacheConfig.kv_cache_layout`` by name."""
    vllm_version: str = ""
    """The vLLM release every answer came from (the installed one)."""
    extensible_kv_cache: bool = False
    """Whether the release sizes this cache after warmup with its extensible KV cache (vLLM
    0.34 on CUDA unless ``num_blocks`` or ``kv_cache_memory_bytes`` is given); it also
    decides what :func:`kvexplore.registration.allocate` hands a connector."""
    gpu_memory_utilization: float = 0.0
    """The share of the card the worker requests, as the release resolves it."""
    _vllm_config: Any = field(repr=False)
    _kv_cache_config: Any = field(repr=False)
    _build: Any = field(default=None, repr=False)
    _one_block_bytes: int = field(default=0, repr=False)

    # -- inputs ---------------------------------------------------------------
    @property
    def inputs(self) -> dict[str, Any]:
        """The keyword arguments this plan was made with (a new dict)."""
        return {"gpu": self.gpu.name, **self.request.keywords()}

    def replace(self, **changes) -> Plan:
        """A new plan with some inputs changed (``plan(**inputs | changes)``)."""
        return plan(self.model, **{**self.inputs, **changes})

    def with_num_blocks(self, num_blocks: int) -> Plan:
        """The same layout with ``num_blocks`` blocks (``--num-gpu-blocks-override``;
        a given ``kv_cache_memory_bytes`` no longer applies)."""
        return self.replace(num_blocks=num_blocks, kv_cache_memory_bytes=None)

    @property
    def sized_by_profile(self) -> bool:
        """True when neither ``num_blocks`` nor ``kv_cache_memory_bytes`` was
        given: the cache holds what vLLM's start-up profile leaves on the GPU."""
        return self.request.num_blocks is None and self.request.kv_cache_memory_bytes is None

    # -- vLLM's objects, as fresh copies ---------------------------------------
    @property
    def vllm_config(self):
        """A deep copy of the engine's ``VllmConfig`` for this plan."""
        return copy.deepcopy(self._vllm_config)

    @property
    def model_config(self):
        """A deep copy of vLLM's ``ModelConfig`` (``hf_config`` included)."""
        return copy.deepcopy(self._vllm_config.model_config)

    @property
    def cache_config(self):
        """A copy of vLLM's ``CacheConfig`` after alignment."""
        return copy.deepcopy(self._vllm_config.cache_config)

    @property
    def parallel_config(self):
        """A copy of vLLM's ``ParallelConfig``."""
        return copy.deepcopy(self._vllm_config.parallel_config)

    @property
    def kv_cache_config(self):
        """A copy of vLLM's ``KVCacheConfig`` (tensors, groups and their layer
        lists copied; the frozen specs are shared)."""
        cfg = self._kv_cache_config
        return dataclasses.replace(
            cfg,
            kv_cache_tensors=[dataclasses.replace(t, layers=list(t.layers))
                              for t in cfg.kv_cache_tensors],
            kv_cache_groups=[dataclasses.replace(g, layer_names=list(g.layer_names))
                             for g in cfg.kv_cache_groups],
        )

    # -- derived sizes ----------------------------------------------------------
    @property
    def attention_backend(self) -> str | None:
        """Name of the backend vLLM selected for the attention layers."""
        return self.backend.get_name() if self.backend is not None else None

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block id costs across the whole cache (all tensors); for a
        plan without blocks, what one block of the same layout costs (the
        one-block layout :func:`plan` computed with it)."""
        if not self.tensors:
            return 0
        if not self.num_blocks:
            return self._one_block_bytes
        return self.tensors[0].size // self.num_blocks

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
        return max(((g.page_bytes - g.real_page_bytes) * len(g.layer_names)
                    for g in self.groups), default=0)

    @property
    def padding_share(self) -> float:
        """The *padding share*: the share of a block's bytes that are padding
        (the worst group's padding over its page bytes, times its layers).  Not
        the *padding overhead* vLLM logs (padding over the state it pads,
        ``(mamba_page_size_padded - mamba_page_size) / mamba_page_size``)."""
        return self.padding_bytes_per_block / self.bytes_per_block if self.bytes_per_block else 0.0

    @property
    def loaded_weight_bytes(self) -> int:
        """Bytes the loaded model holds per rank: parameters and buffers, and a
        drafter's (:func:`kvexplore.planning.profile.weight_term`); exact."""
        from kvexplore.planning.profile import weight_term

        return weight_term(self._build).low

    def checks_after_kv_cache(self, kv_cache_config) -> tuple:
        """The start-up checks vLLM runs once a KV cache config exists
        (:func:`kvexplore.planning.startup.checks_after_kv_cache`), on this
        plan's build with ``kv_cache_config`` (this layout, other blocks)."""
        return startup.checks_after_kv_cache(self._vllm_config, kv_cache_config, self._build)

    def way_out(self) -> tuple:
        """The settings nearest to this plan that get past its first start-up
        refusal, each planned and confirmed
        (:func:`kvexplore.planning.way_out.way_out`, computed once per plan:
        the plan's text, the Explorer's status and its buttons ask for it);
        ``()`` when it starts."""
        from kvexplore.memo import per_plan
        from kvexplore.planning.way_out import way_out

        return per_plan(self, ("way_out",), lambda: way_out(self))

    def memory_profile(self):
        """:func:`kvexplore.planning.profile.profile_build` of this plan's build
        (traces the model's forward once per build)."""
        from kvexplore.planning.profile import profile_build

        return profile_build(self._build)

    def memory_terms(self):
        """:func:`kvexplore.planning.profile.memory_terms` of this plan on its GPU
        (runs :meth:`memory_profile`)."""
        from kvexplore.planning.profile import memory_terms

        return memory_terms(self._build, self.gpu)

    def derivation(self) -> FrozenDict:
        """How each size and GPU-dependent decision came about, by name (with a
        drafter, also what it changes against the same plan without one, which
        plans that one); computed once per plan."""
        from kvexplore.memo import per_plan

        return per_plan(self, ("derivation",), self._derivation)

    def _derivation(self) -> FrozenDict:
        bare = None
        if self.drafter is not None:
            try:
                bare = self.replace(speculative_config=None)
            except KVExploreError:
                bare = None
        return FrozenDict(plan_derivation(self, bare))

    def group_rows(self) -> list[dict[str, Any]]:
        """:attr:`group_table` as a list of dicts."""
        rows = []
        for g in self.groups:
            page, real = g.page_bytes, g.real_page_bytes
            rows.append({
                "group": g.index, "kind": g.kind, "spec": type(g.spec).__name__,
                "layers": len(g.layer_names), "block_size": g.kv_cache_spec.block_size,
                "kernel_block_size": g.kernel_block_size, "page_bytes": page,
                "real_page_bytes": real, "padding_bytes": page - real,
                "padding_share": (page - real) / page if page else 0.0,
                "dtype": spec_dtypes(g.spec), "backend": g.backend or "",
                "first_layer": g.layer_names[0] if g.layer_names else "",
            })
        return rows

    @property
    def group_table(self) -> pd.DataFrame:
        """One row per KV cache group: kind, layers, block and kernel block, page,
        padding, dtype, backend."""
        return pd.DataFrame(self.group_rows())

    def summary_rows(self) -> list[tuple[str, Any]]:
        """:attr:`summary` as ``(quantity, value)`` pairs."""
        return [
            ("vllm", self.vllm_version),
            ("model", self.model.name),
            ("architecture", self.model.architecture),
            ("gpu", str(self.gpu)),
            ("tensor_parallel_size", self.tensor_parallel_size),
            ("decode_context_parallel_size", self.decode_context_parallel_size),
            *([("pipeline_parallel_size", self.pipeline_parallel_size),
               ("pipeline_parallel_rank", self.pipeline_parallel_rank)]
              if self.pipeline_parallel_size > 1 else []),
            ("attention_backend", self.attention_backend or "none (attention-free)"),
            ("kv_cache_dtype", self.kv_cache_dtype),
            ("mamba_ssm_cache_dtype", self.mamba_ssm_cache_dtype),
            ("mamba_cache_mode", self.mamba_cache_mode),
            ("block_size", self.block_size),
            ("attention_page_bytes_per_token", self.attention_page_bytes_per_token),
            ("mamba_page_size", self.mamba_page_size),
            ("mamba_page_size_padded", self.mamba_page_size_padded),
            ("kernel_block_sizes", list(self.kernel_block_sizes)),
            ("groups", len(self.groups)),
            ("kv_cache_layout", self.kv_cache_layout.name),
            ("num_blocks", self.num_blocks),
            ("kv_cache_memory_bytes", self.kv_cache_memory_bytes),
            ("bytes_per_block", self.bytes_per_block),
            ("tokens_per_gib", self.tokens_per_gib),
            ("max_model_len", self.max_model_len),
            ("admitted", self.admission.ok if self.admission is not None else True),
            ("kv_cache_size_tokens", self.kv_cache_size_tokens),
            ("max_concurrency", round(self.max_concurrency, 4)),
            ("padding_share", round(self.padding_share, 6)),
        ]

    @property
    def summary(self) -> pd.DataFrame:
        """Key numbers as a two-column table (quantity, value), a new DataFrame."""
        return pd.DataFrame(self.summary_rows(), columns=["quantity", "value"])

    def explain(self) -> str:
        """:meth:`derivation`, one ``name: rule`` line each."""
        return "\n".join(f"{k}: {v}" for k, v in self.derivation().items())

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: numbers, groups, derivations and admission."""
        out = {k: jsonable(v) for k, v in self.summary_rows()}
        out["groups"] = [{k: jsonable(v) for k, v in row.items()} for row in self.group_rows()]
        out["derivation"] = dict(self.derivation())
        if self.admission is not None:
            out["admission"] = self.admission.to_dict()
        return out

    def __repr__(self) -> str:
        pad = f", mamba_page_size_padded={self.mamba_page_size_padded}" if self.mamba_page_size_padded else ""
        return (
            f"Plan({self.model.name!r}, gpu={self.gpu.name}, "
            f"tp={self.tensor_parallel_size}, dcp={self.decode_context_parallel_size}, "
            + (f"pp={self.pipeline_parallel_size} (stage {self.pipeline_parallel_rank}), "
               if self.pipeline_parallel_size > 1 else "")
            + f"backend={self.attention_backend}, block_size={self.block_size}{pad}, "
            f"groups={len(self.groups)}, kernel_block_sizes={list(self.kernel_block_sizes)}, "
            f"num_blocks={self.num_blocks})"
        )


def require_plan(value: Any, name: str = "plan") -> Plan:
    """``value`` if it is a :class:`Plan`; else a ``KVExploreError`` naming
    ``name`` and what was given."""
    if not isinstance(value, Plan):
        raise KVExploreError(
            f"{name} is a {type(value).__name__} ({value!r:.60}); expected a kvexplore.Plan "
            "(kvexplore.plan(model, ...))"
        )
    return value


# ---------------------------------------------------------------------------
# plan()
# ---------------------------------------------------------------------------


def clear_plan_cache() -> None:
    """Forget cached plans and built models (the next ``plan()`` builds again)."""
    _cached_plan.cache_clear()
    _cached_build.cache_clear()


def plan(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    gpu: str | GPU = DEFAULT_GPU,
    **keywords: Any,
) -> Plan:
    """Plan the KV cache the installed vLLM release would build for ``model``
    on one ``gpu`` worker (:attr:`Plan.vllm_version` names the release).

    Keyword names and defaults follow vLLM's engine arguments
    (``--tensor-parallel-size``, ``--decode-context-parallel-size``,
    ``--block-size``, ``--dtype``, ``--kv-cache-dtype``,
    ``--enable-prefix-caching``, ``--mamba-cache-mode``,
    ``--mamba-ssm-cache-dtype``, ``--max-model-len`` (``-1`` auto-fits),
    ``--attention-backend``, ``--speculative-config``,
    ``--num-gpu-blocks-override`` as ``num_blocks``,
    ``--kv-cache-memory-bytes``, ``--gpu-memory-utilization``,
    ``--enable-extensible-kv-cache`` (vLLM 0.34; a connector whose
    ``kv_cache_access`` is ``LEGACY_IPC``, such as ``LMCacheMPConnector``,
    turns it off as ``False`` does), ``--max-num-batched-tokens``,
    ``--max-num-seqs``: the dummy run vLLM's memory profile measures),
    ``--mamba-block-size`` (prefix caching only; in ``align`` mode vLLM sets
    it to the block size), ``--prefix-match-unit`` (checked as the engine
    core's ``resolve_kv_cache_block_sizes`` checks it),
    ``--mamba-cache-dtype``, ``--pipeline-parallel-size`` (the plan is the
    worker of stage ``pipeline_parallel_rank``: its layers, vLLM's groups
    over every stage's layers projected onto them, and the fewest blocks any
    stage's memory holds, as ``get_kv_cache_configs`` gives each worker;
    a drafter is built on the last stage only),
    ``--data-parallel-size`` and
    ``--enable-expert-parallel`` (the plan is DP rank 0's worker: MoE layers
    are sharded or, with expert parallelism, split over DP x TP ranks),
    ``--quantization`` (a quantized checkpoint's method; vLLM's online
    quantization of unquantized weights is refused, see
    :func:`~kvexplore.planning.inputs.check_quantization`) and
    ``--hf-overrides`` (a dict vLLM applies to the model's config);
    ``None`` lets vLLM decide as ``vllm serve`` does for the GPU, as an unset
    flag does.  ``kv_cache_layout`` is what ``VLLM_KV_CACHE_LAYOUT`` would request
    (``NHD``/``HND`` alias ``LBNHC``/``LBHNC``); ``None`` takes the layout the
    engine core resolves.  ``gpu`` is a name or a compute capability
    (:func:`kvexplore.gpus`).  With neither ``num_blocks`` nor
    ``kv_cache_memory_bytes`` the cache is as large as vLLM would make it on
    that GPU at ``--gpu-memory-utilization`` (``None``: the release's default,
    0.92, or 1.0 with vLLM 0.34's extensible cache): the low end of the
    start-up memory profile, or with the extensible cache of what it measures
    after warmup (:func:`kvexplore.capacity` itemises it).  When the cache cannot hold one request of ``max_model_len`` tokens
    the plan carries vLLM's refusal in :attr:`Plan.admission`.

    The keywords are :class:`~kvexplore.planning.inputs.PlanRequest`'s
    fields, with its defaults and checks; a keyword that is not one is
    refused naming the nearest spellings.  Every input is checked before any
    cache lookup; every error is a :class:`KVExploreError` naming the value
    and quoting vLLM.
    """
    installed_release()
    request = plan_request(**keywords)
    src = load_model_config(model)
    check_quantization(src, request)
    return _cached_plan(src, resolve_gpu(gpu), request)


#: ``help(plan)``, ``inspect.signature`` and notebooks' completion show every
#: keyword: the signature is :class:`PlanRequest`'s fields.
plan.__signature__ = plan_signature(
    list(inspect.signature(plan).parameters.values())[:2])


@functools.lru_cache(maxsize=1024)
def _cached_plan(src: ModelSource, gpu: GPU, request: PlanRequest) -> Plan:
    stages = _cached_build(src, gpu, request.build_request())
    return _quoting_vllm(src, gpu, request, _plan_from_build, src, gpu, request, stages)


@functools.lru_cache(maxsize=64)
def _cached_build(src: ModelSource, gpu: GPU, build_request: PlanRequest) -> tuple:
    """Every pipeline stage's build (:func:`kvexplore.planning.worker.build_stages`)."""
    from kvexplore.planning.worker import build_stages

    return _quoting_vllm(src, gpu, build_request, build_stages, str(src.config_dir), gpu,
                         build_request.engine_kwargs(), build_request.kv_cache_layout)


def _quoting_vllm(src: ModelSource, gpu: GPU, r: PlanRequest, fn, *args):
    """``fn(*args)``; vLLM's and transformers' errors re-raised by :func:`vllm_error`."""
    try:
        return fn(*args)
    except KVExploreError:
        raise
    except Exception as exc:
        raise vllm_error(src, gpu, exc, r) from exc


# ---------------------------------------------------------------------------
# From a build to a plan
# ---------------------------------------------------------------------------


def _plan_vllm_config(src: ModelSource, built, r: PlanRequest):
    """A copy of the built ``VllmConfig`` (model, cache and scheduler configs
    copied) with this plan's ``max_model_len`` (checked by
    ``ModelConfig.get_and_verify_max_len``), ``num_gpu_blocks_override`` and
    served model id (what vLLM's OffloadingConfig reports)."""
    vc = copy.copy(built.vllm_config)
    vc.model_config = copy.copy(vc.model_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.scheduler_config = copy.copy(vc.scheduler_config)
    if src.served_name is not None:
        vc.model_config.model = src.served_name
    m = r.max_model_len
    if m is not None:
        mc = vc.model_config
        mc.original_max_model_len = m
        mc.max_model_len = mc.get_and_verify_max_len(m)
    vc.cache_config.num_gpu_blocks_override = r.num_blocks
    vc.cache_config.kv_cache_memory_bytes = r.kv_cache_memory_bytes
    return vc


def _kv_cache_memory(gpu: GPU, built, r: PlanRequest, utilization: float,
                     extensible: bool) -> int | None:
    """The memory ``get_kv_cache_configs`` sizes the cache from: the given
    ``kv_cache_memory_bytes``; with neither it nor ``num_blocks``, the low end
    of the memory the release's worker leaves on ``gpu`` at ``utilization``
    (:func:`kvexplore.planning.profile.kv_cache_memory_range`: by the start-up
    profile, or after warmup with the extensible cache), at least 0; ``None``
    when ``num_blocks`` decides."""
    from kvexplore.planning.profile import kv_cache_memory_range, memory_terms

    if r.num_blocks is not None or r.kv_cache_memory_bytes is not None:
        return r.kv_cache_memory_bytes
    low, _ = kv_cache_memory_range(memory_terms(built, gpu), utilization, extensible=extensible,
                                   memory_in_use=r.gpu_memory_in_use)
    return max(low, 0)


def _sizing(gpu: GPU, vc, r: PlanRequest) -> tuple[bool, float]:
    """``(extensible, utilization)``: whether the release sizes this plan's
    cache with its extensible KV cache (:func:`release.extensible_kv_cache`)
    and the share of the card its worker requests."""
    from kvexplore.planning import release
    from kvexplore.planning.emulation import emulate

    with emulate(gpu, meta_tensors=False):
        extensible = release.extensible_kv_cache(vc, r.enable_extensible_kv_cache)
    return extensible, release.resolved_gpu_memory_utilization(
        vc.cache_config, r.gpu_memory_utilization, extensible)


def _one_block_bytes(vc, stages: tuple, rank: int) -> int:
    """Bytes one block id costs in a layout that holds no block: the first
    tensor's size in the layout ``get_kv_cache_configs`` builds with
    ``num_gpu_blocks_override=1`` (what ``plan(..., num_blocks=1)`` builds)."""
    one = copy.copy(vc)
    one.cache_config = copy.copy(vc.cache_config)
    one.cache_config.num_gpu_blocks_override = 1
    one.cache_config.kv_cache_memory_bytes = None
    cfg, _ = kv_cache_config_with_admission(one, stages, [None] * len(stages), rank)
    return int(cfg.kv_cache_tensors[0].size)


#: The most bytes a KV cache tensor can have: torch describes sizes and
#: strides in int64.
MAX_CACHE_BYTES = 2**63 - 1


def check_cache_bytes(vc, cfg) -> None:
    """Refuse a ``KVCacheConfig`` with a tensor of more than
    :data:`MAX_CACHE_BYTES` bytes (a tensor of one block, where it has no
    block), naming the block size, the blocks (and the ``kv_cache_memory_bytes``
    they were sized from) and the bound.  Each ``KVCacheTensor``'s ``size``
    is checked on its own: where a release lays its tensors over one backing
    allocation, every ``size`` is that allocation's (vLLM's offloading config
    reads ``kv_cache_tensors[0].size`` as the total), so their sum is not a
    size of anything."""
    blocks = int(cfg.num_blocks)
    largest = max((int(t.size) for t in cfg.kv_cache_tensors), default=0)
    if largest <= MAX_CACHE_BYTES:
        return
    block_size = vc.cache_config.block_size
    memory = vc.cache_config.kv_cache_memory_bytes
    given = (f" (the blocks kv_cache_memory_bytes={memory} holds)"
             if memory is not None and vc.cache_config.num_gpu_blocks_override is None else "")
    raise KVExploreError(
        f"block_size={block_size} with num_blocks={blocks}{given} gives a KV cache tensor of "
        f"{largest:,} B ({largest // max(blocks, 1):,} B per block); expected at most "
        f"{MAX_CACHE_BYTES:,} B, the largest tensor torch can describe (int64 sizes): a smaller "
        "block_size, num_blocks or kv_cache_memory_bytes"
    )


def _plan_from_build(src: ModelSource, gpu: GPU, r: PlanRequest, stages: tuple) -> Plan:
    """The plan of pipeline stage ``r.pipeline_parallel_rank``'s worker (the
    only one without pipeline parallelism): the engine core sizes every
    stage's cache from its own memory and gives each the fewest blocks."""
    from vllm.v1.core.kv_cache_utils import (
        get_kv_cache_capacity,
        resolve_kv_cache_block_sizes,
    )

    built = stages[r.pipeline_parallel_rank]
    if not built.layer_specs:
        raise KVExploreError(
            f"{src.name} ({src.architecture}) registers no KV-cache layer with {release_name()} "
            "(e.g. num_hidden_layers=0); expected at least one attention or state layer"
        )
    rank = r.pipeline_parallel_rank
    card = gpu.total_memory_range[1]
    if r.gpu_memory_in_use > card:
        raise KVExploreError(
            f"gpu_memory_in_use={r.gpu_memory_in_use:,} is more than the {gpu.name}'s "
            f"{card:,} B; expected 0 to {card:,} bytes held by other processes at start"
        )
    vc = _plan_vllm_config(src, built, r)
    extensible, utilization = _sizing(gpu, vc, r)
    memories = [_kv_cache_memory(gpu, b, r, utilization, extensible) for b in stages]
    memory = memories[rank]
    cfg, admission = kv_cache_config_with_admission(vc, stages, memories, rank)
    check_cache_bytes(vc, cfg)
    if admission is not None:
        admission = admission.with_checks(
            before=(startup.request_memory(vc.cache_config, gpu.total_memory_range[0],
                                           r.gpu_memory_in_use, utilization),),
            after=startup.checks_after_kv_cache(vc, cfg, built))
    # the engine core's next step: the scheduler and hash block sizes, which
    # refuse a prefix_match_unit the groups' block sizes do not allow
    resolve_kv_cache_block_sizes(cfg, vc)
    one_block = _one_block_bytes(vc, stages, rank) if cfg.kv_cache_tensors and not cfg.num_blocks else 0
    kernels = tuple(int(k) for k in kernel_block_sizes(cfg, built))
    tokens, concurrency = get_kv_cache_capacity(vc, cfg)
    pins = tuple(cdiv(g.kv_cache_spec.max_memory_usage_bytes(vc), g.kv_cache_spec.page_size_bytes)
                 for g in cfg.kv_cache_groups)
    specs = built.layer_specs
    # a release whose specs carry no is_draft flag still has the speculator's names
    draft_names = set(built.drafter.layer_names) if built.drafter is not None else set()
    layers = tuple(
        LayerInfo(i, name, layer_kind(spec), getattr(spec, "sliding_window", None),
                  mixer(spec), bool(getattr(spec, "is_draft", False)) or name in draft_names)
        for i, (name, spec) in enumerate(specs.items())
    )
    tensors = tuple(TensorInfo(int(t.size), tuple(t.layers), int(t.layer_stride),
                               int(t.block_stride), int(t.offset)) for t in cfg.kv_cache_tensors)
    return Plan(
        model=src, gpu=gpu, request=r, layers=layers, layer_specs=specs,
        layer_classes=built.layer_classes, layer_backends=built.backends,
        groups=group_infos(cfg, kernels, built), tensors=tensors,
        num_blocks=int(cfg.num_blocks), kv_cache_memory_bytes=memory,
        kernel_block_sizes=kernels,
        admission=admission, decisions=built.decisions, weight_bytes=built.weight_bytes,
        kv_cache_size_tokens=int(tokens), max_concurrency=float(concurrency),
        kv_tp_replicas=int(cfg.kv_tp_replicas), drafter=built.drafter, blocks_per_request=pins,
        vllm_version=installed_release().version, extensible_kv_cache=extensible,
        gpu_memory_utilization=utilization,
        _vllm_config=vc, _kv_cache_config=cfg, _build=built, _one_block_bytes=one_block,
        **config_facts(vc, built), **layout_facts(vc, built),
    )


def catalog(gpu: str | GPU = DEFAULT_GPU) -> pd.DataFrame:
    """The bundled models, one row each, as vLLM builds them on ``gpu``.

    Columns: ``model`` (Hugging Face id), ``architecture``, ``layers`` (the
    kinds of the layers vLLM registers, with counts, e.g. ``"mamba x18,
    full_attention x6"``), ``kv_heads``, ``head_size``, ``state`` (vLLM's
    Mamba backend for the state layers, empty for attention-only models).
    Every model is planned once (:func:`kvexplore.plan`, cached).
    """
    rows = []
    for name in catalog_names():
        p = plan(name, gpu=gpu)
        counts = Counter(info.kind for info in p.layers)
        mamba = {s.mamba_type.name for s in p.layer_specs.values() if hasattr(s, "mamba_type")}
        rows.append({
            "model": name,
            "architecture": p.model.architecture,
            "layers": ", ".join(f"{k} x{v}" for k, v in counts.items()),
            "kv_heads": p.total_num_kv_heads,
            "head_size": p.head_size,
            "state": "/".join(sorted(mamba)),
        })
    return pd.DataFrame(rows)


__all__ = [
    "Admission",
    "GroupInfo",
    "Plan",
    "TensorInfo",
    "MAX_CACHE_BYTES",
    "catalog",
    "check_cache_bytes",
    "clear_plan_cache",
    "layer_kind",
    "plan",
    "require_plan",
    "smallest_kernel_block",
    "vllm_error",
    "vllm_origin",
]
