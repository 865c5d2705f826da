"""What vLLM's GPU worker and engine core run before the KV cache exists.

:func:`build_model` runs vLLM's own code, in vLLM's order, under the named
GPU's emulation (:mod:`kvexplore.planning.emulation`):

1. ``EngineArgs(...).create_engine_config()``: the real ``VllmConfig``, the
   per-model config hooks included (``vllm/model_executor/models/config.py``).
2. ``initialize_model`` (``vllm/model_executor/model_loader/utils.py``) on
   the meta device, and a speculative config's drafter next to it
   (:mod:`kvexplore.planning.drafter`).
3. ``current_platform.update_block_size_for_backend``.
4. The model runner's ``get_kv_cache_spec`` (Model Runner V2:
   ``vllm/v1/worker/gpu/attn_utils.py``; V1: ``GPUModelRunner``).
5. The engine core's ``_initialize_kv_caches`` up to memory profiling:
   ``resolve_kv_cache_layout``, ``get_global_kv_cache_groups``,
   ``adjust_dcp_kv_cache_interleave_size`` and ``validate_block_size``.

Tensor parallelism runs in one process: a single-rank gloo group whose TP,
DCP and DP coordinators report the requested world sizes (rank 0's view).
Pipeline parallelism builds every stage in turn (:func:`build_stages`), the
PP coordinator reporting that stage's rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict
from kvexplore.planning import release
from kvexplore.planning.drafter import Drafter, build_drafter, draft_specs
from kvexplore.planning.emulation import emulate, patch_attributes
from kvexplore.planning.gpus import GPU

_DIST_LOCK = threading.Lock()


@dataclass(frozen=True, kw_only=True, eq=False)
class BuiltModel:
    """The model-dependent half of a plan: everything before memory is known.

    ``vllm_config`` is the engine's ``VllmConfig`` after the build;
    ``layer_specs`` what the runner reports, draft layers included;
    ``decisions`` the layers' GPU-dependent choices (``gdn_prefill_backend``,
    ``prefill_checkpoint_alignment``, the block-size alignment inputs);
    ``forward_context`` vLLM's ``static_forward_context`` (emptied on the
    config), which :mod:`kvexplore.planning.profile` runs.
    """

    vllm_config: Any
    gpu: GPU
    layer_specs: FrozenDict
    layer_classes: FrozenDict
    backends: FrozenDict
    groups: tuple | None
    decisions: FrozenDict
    weight_bytes: int
    pipeline_rank: int = 0
    drafter: Drafter | None = None
    model: Any = field(default=None, repr=False)
    forward_context: FrozenDict = field(default_factory=FrozenDict, repr=False)


def _ensure_distributed() -> None:
    """A one-process gloo group, as the single-GPU executor creates."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import init_distributed_environment

    with _DIST_LOCK:
        if dist.is_initialized():
            return
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        init_distributed_environment(
            world_size=1,
            rank=0,
            distributed_init_method=f"tcp://127.0.0.1:{port}",
            local_rank=0,
            backend="gloo",
        )


#: The one-process groups :func:`parallel_groups` made last: ``"made"`` ->
#: (:func:`_group_inputs` of the config they were made for, their TP group).
_GROUPS: dict = {}


def _group_inputs(vc) -> tuple:
    """What ``initialize_model_parallel`` (``vllm/distributed/parallel_state.py``)
    reads from the current config to decide which one-process groups it makes:
    the DP size, elastic EP, whether the model has experts (the EP group), EPLB
    (its group), all-to-all on the EP group, and an Engram config with the
    architecture (the Engram TP and DP groups; read only with an Engram
    config)."""
    pc, mc = vc.parallel_config, vc.model_config
    engram = getattr(vc, "engram_config", None)
    return (
        int(pc.data_parallel_size),
        bool(getattr(pc, "enable_elastic_ep", False)),
        mc is None or bool(mc.is_moe),
        bool(getattr(pc, "enable_eplb", False)),
        bool(getattr(pc, "use_all2all", False)),
        None if engram is None else (repr(engram), None if mc is None else mc.architecture),
    )


@contextlib.contextmanager
def parallel_groups(vc, pipeline_rank: int = 0):
    """vLLM's model-parallel groups, with the view of the worker at TP rank 0
    of pipeline stage ``pipeline_rank``: the TP, DCP, DP and PP sizes as
    configured (a fused MoE layer reads the DP size: its experts are sharded,
    or with expert parallelism split, over DP x TP ranks;
    FusedMoEParallelConfig.make), and the PP group's rank, which decides the
    layers the stage builds (``make_layers`` / ``get_pp_indices``,
    ``vllm/model_executor/models/utils.py``) and whether it holds the
    embedding and the head (``is_first_rank`` / ``is_last_rank``).  The groups
    ``initialize_model_parallel`` makes are kept for the next build while
    what it reads from the config (:func:`_group_inputs`) stays the same and
    no other code has replaced them."""
    from vllm.distributed import parallel_state as ps

    pc = vc.parallel_config
    # the one-process world has one DP rank (init_distributed_environment and
    # initialize_model_parallel read the current config's DP size and would
    # wait for the other ranks); this worker's DP group is given its size
    # after the groups are made.  initialize_model_parallel also reads
    # whether the model has experts, which decides the expert-parallel group.
    with patch_attributes([(pc, "data_parallel_size", 1)]):
        _ensure_distributed()
        key = _group_inputs(vc)
        with _DIST_LOCK:
            made = _GROUPS.get("made")
            if made is None or made[0] != key or not ps.model_parallel_is_initialized() \
                    or ps.get_tp_group() is not made[1]:
                _GROUPS.pop("made", None)
                ps.destroy_model_parallel()
                ps.initialize_model_parallel(1, 1)
                _GROUPS["made"] = (key, ps.get_tp_group())
    pp = ps.get_pp_group()
    stages = int(pc.pipeline_parallel_size)
    pairs = [
        (ps.get_tp_group(), "world_size", pc.tensor_parallel_size),
        (ps.get_dcp_group(), "world_size", pc.decode_context_parallel_size),
        (ps.get_dp_group(), "world_size", pc.data_parallel_size),
        (pp, "world_size", stages),
        (pp, "ranks", list(range(stages))),
        (pp, "rank", pipeline_rank),
        (pp, "rank_in_group", pipeline_rank),
    ]
    with patch_attributes(pairs):
        yield


def _engine_config(model_dir: str, kwargs: dict):
    from vllm.config.logging import LoggingConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.usage.usage_lib import UsageContext

    if isinstance(kwargs.get("kv_transfer_config"), dict):
        # the command line parses --kv-transfer-config into vLLM's class
        from vllm.config.kv_transfer import KVTransferConfig

        kwargs = {**kwargs, "kv_transfer_config": KVTransferConfig(**kwargs["kv_transfer_config"])}
    args = EngineArgs(
        model=model_dir,
        tokenizer=model_dir,
        skip_tokenizer_init=True,
        load_format="dummy",
        # the process's logging stays as it is (kvexplore sets the level it runs vLLM at)
        logging_config=LoggingConfig(configure_logging=False),
        **kwargs,
    )
    # the defaults `vllm serve` takes (max_num_batched_tokens, max_num_seqs per GPU)
    return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


def _runner_specs(vc) -> dict:
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vc):
        return release.runner_kv_cache_spec(vc)


def _alignment_recorder(platform, record: dict) -> list:
    """Patch pairs that record the inputs of ``_align_hybrid_block_size``
    (``vllm/platforms/interface.py``): block size, backend, non-SSM backends."""
    cls = type(platform)
    original = cls._align_hybrid_block_size

    def align(vllm_config, backend_cls):
        record["pre_alignment_block_size"] = vllm_config.cache_config.block_size
        record["alignment_backend"] = backend_cls
        record["alignment_backends"] = tuple(cls._find_non_ssm_backends(vllm_config))
        return original(vllm_config, backend_cls)

    return [(cls, "_align_hybrid_block_size", staticmethod(align))]


def _resolved_groups(vc, workers: list[dict], kv_cache_layout: str | None) -> list | None:
    """Step 5 of the module docstring: the engine core's layout and, where the
    release groups layers before sizing the cache, its global groups over
    ``workers`` (one spec dict per worker)."""
    import vllm.envs as envs
    from vllm.distributed.kv_transfer.kv_connector.utils import (
        get_current_attn_backends,
    )
    from vllm.v1.attention.backends.utils import (
        get_supported_kv_cache_layouts,
        resolve_kv_cache_layout,
    )

    supported = [layout.name for layout in
                 get_supported_kv_cache_layouts(get_current_attn_backends(vc))]
    with patch_attributes([(envs, "VLLM_KV_CACHE_LAYOUT", kv_cache_layout)]):
        resolve_kv_cache_layout(vc, [supported], [s for w in workers for s in w.values()])
    groups = release.global_kv_cache_groups(vc, workers)
    release.finish_groups(vc, groups)
    return groups


def _layer_decisions(vc, model, specs: dict, record: dict) -> dict:
    """:attr:`BuiltModel.decisions`."""
    from vllm.v1.kv_cache_interface import MambaSpec

    decisions = {}
    for module in model.modules():
        backend = getattr(module, "prefill_backend", None) or getattr(
            module, "gdn_prefill_backend", None
        )
        if isinstance(backend, str):
            decisions["gdn_prefill_backend"] = backend
            break
    decisions.update(record)
    has_mamba = any(isinstance(s, MambaSpec) for s in specs.values())
    decisions["prefill_checkpoint_alignment"] = (
        release.prefill_checkpoint_alignment(vc) if has_mamba else None
    )
    return decisions


def _build_layers(vc):
    """The meta-device model and its parameter bytes per rank."""
    from vllm.model_executor.model_loader.utils import (
        get_model_architecture,
        initialize_model,
    )
    from vllm.utils.torch_utils import set_default_torch_dtype

    model_class = get_model_architecture(vc.model_config)[0]
    with set_default_torch_dtype(vc.model_config.dtype), torch.device("meta"):
        model = initialize_model(vc, model_class=model_class)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return model, int(weight_bytes)


#: The most layers :func:`build_model` builds: more than any model vLLM serves
#: has (a few hundred at most); vLLM's model classes construct every layer, so
#: a config past this would run for many minutes before any answer.
MAX_LAYERS = 1024


def check_layer_count(model_config) -> None:
    """Refuse a config of more than :data:`MAX_LAYERS` layers (vLLM's
    ``ModelConfig.get_total_num_hidden_layers``) before anything is built,
    naming the count and the limit."""
    layers = release.total_num_hidden_layers(model_config)
    if layers > MAX_LAYERS:
        raise KVExploreError(
            f"num_hidden_layers={layers} is more layers than kvexplore builds; expected at "
            f"most {MAX_LAYERS} (vLLM's model classes construct every layer on the meta "
            "device one by one; no model vLLM serves has more than a few hundred)"
        )


def build_model(
    model_dir: str, gpu: GPU, engine_kwargs: dict, kv_cache_layout: str | None,
    pipeline_rank: int = 0,
) -> BuiltModel:
    """Build pipeline stage ``pipeline_rank`` of the model on the meta device
    as vLLM's worker would on ``gpu``; ``groups`` are this stage's own (the
    engine core's over every stage come from :func:`build_stages`)."""
    from vllm.config import set_current_vllm_config
    from vllm.platforms import current_platform

    record: dict = {}
    with emulate(gpu):
        vc = _engine_config(model_dir, engine_kwargs)
        check_layer_count(vc.model_config)
        with set_current_vllm_config(vc), parallel_groups(vc, pipeline_rank):
            model, weight_bytes = _build_layers(vc)
            # the runner builds the speculator on the last pipeline stage only
            # (Model Runner V2: GPUModelRunner.__init__, is_last_pp_rank)
            last = pipeline_rank == vc.parallel_config.pipeline_parallel_size - 1
            drafter = build_drafter(vc, model) if last else None
            with patch_attributes(_alignment_recorder(current_platform, record)):
                current_platform.update_block_size_for_backend(vc)
            specs = draft_specs(_runner_specs(vc), drafter,
                                vc.parallel_config.decode_context_parallel_size)
            ctx = vc.compilation_config.static_forward_context
            backends = {name: ctx[name].get_attn_backend() for name in specs
                        if hasattr(ctx[name], "get_attn_backend")}
            groups = _resolved_groups(vc, [specs], kv_cache_layout)
            decisions = _layer_decisions(vc, model, specs, record)
            classes = {name: type(ctx[name]).__name__ for name in specs}
            forward_context = FrozenDict(ctx)
            ctx.clear()
    return BuiltModel(
        vllm_config=vc,
        gpu=gpu,
        layer_specs=FrozenDict(dict(specs)),
        layer_classes=FrozenDict(classes),
        backends=FrozenDict(backends),
        groups=None if groups is None else tuple(groups),
        decisions=FrozenDict(decisions),
        weight_bytes=weight_bytes,
        pipeline_rank=pipeline_rank,
        drafter=drafter,
        model=model,
        forward_context=forward_context,
    )


def build_stages(
    model_dir: str, gpu: GPU, engine_kwargs: dict, kv_cache_layout: str | None
) -> tuple[BuiltModel, ...]:
    """Every pipeline stage's worker, built by :func:`build_model` (one
    without pipeline parallelism), each with the engine core's global groups:
    ``get_global_kv_cache_groups`` over every stage's specs, which the engine
    core projects onto each worker (``get_kv_cache_configs``).  Refused before
    any stage is built: more stages than the model has layers (some stage
    would hold none)."""
    from vllm.config import set_current_vllm_config

    stages = int(engine_kwargs.get("pipeline_parallel_size", 1))
    if stages > 1:
        with emulate(gpu):
            layers = release.total_num_hidden_layers(
                _engine_config(model_dir, engine_kwargs).model_config)
        if stages > layers:
            raise KVExploreError(
                f"pipeline_parallel_size={stages} is more than the model's {layers} layers "
                f"(num_hidden_layers); expected at most {layers}: vLLM's get_pp_indices "
                f"would leave {stages - layers} stage(s) without a layer"
            )
    built = [build_model(model_dir, gpu, engine_kwargs, kv_cache_layout, rank)
             for rank in range(stages)]
    if stages == 1:
        return (built[0],)
    vc = built[0].vllm_config
    with emulate(gpu, meta_tensors=False), set_current_vllm_config(vc):
        groups = release.global_kv_cache_groups(vc, [dict(b.layer_specs) for b in built])
        for b in built:
            release.finish_groups(b.vllm_config, groups)
    groups = None if groups is None else tuple(groups)
    return tuple(dataclasses.replace(b, groups=groups) for b in built)


__all__ = ["MAX_LAYERS", "BuiltModel", "build_model", "build_stages", "check_layer_count",
           "parallel_groups"]
