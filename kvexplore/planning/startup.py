"""vLLM's start-up checks besides the KV cache memory, each as a verdict.

Between ``create_engine_config()`` and its first request vLLM runs checks
that refuse to start a deployment.  :mod:`kvexplore.planning.admission` keeps
the KV cache memory check's verdict; this module runs the others, each by the
installed release's own function on the plan's objects (a copy where the
function rewrites its input), and returns a :class:`StartupCheck` per check
that ran, in the order vLLM runs them:

1. ``request_memory`` (``vllm/v1/worker/utils.py``), in the worker's
   ``init_device``: the card's free memory at start must cover
   ``gpu_memory_utilization`` of it (memory another process holds,
   ``gpu_memory_in_use``, is not free).
2. ``kv_cache_memory``: ``_check_enough_kv_cache_memory`` in
   ``get_kv_cache_configs`` (:class:`~kvexplore.planning.admission.Admission`).
3. ``cudagraph_mode``: ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
   (``vllm/config/compilation.py``), called by the model runner's
   ``initialize_kv_cache`` with the weakest CUDA-graph support of the
   groups' metadata builders (``get_cudagraph_support``): refuses a
   full-graph mode no backend supports, no capture size left after rounding
   for speculative decoding (Model Runner V1), and, with full CUDA graphs and
   Mamba layers, ``max_num_seqs`` above the cache's blocks (each decoding
   sequence holds one Mamba block).
4. ``context_parallel``: ``check_attention_cp_compatibility``
   (``vllm/v1/worker/cp_utils.py``), next in ``initialize_kv_cache`` with
   prefill or decode context parallelism: every attention implementation must
   return the softmax LSE for DCP, support PCP, and MTP with an interleave
   size above 1.
5. ``kv_connector_hma``: with a ``kv_transfer_config``, the connector
   factory's ``create_connector`` (``kv_connector/factory.py``) refuses a
   connector that does not support the hybrid KV cache manager while it is
   on (``KVConnectorFactory.supports_hma_config``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from kvexplore.layout import FrozenDict, requested_memory
from kvexplore.planning import release
from kvexplore.planning.emulation import emulate


@dataclass(frozen=True, kw_only=True)
class StartupCheck:
    """One check vLLM runs on the way to serving, and its verdict.

    ``name`` is kvexplore's short name (``request_memory``,
    ``kv_cache_memory``, ``cudagraph_mode``, ``kv_connector_hma``);
    ``function`` the vLLM function and file that decides it; ``stage`` where
    vLLM runs it; ``ok`` whether it passes; ``message`` vLLM's own error
    text when it refuses (``None`` when it passes); ``inputs`` the values
    that decided it, by vLLM's names; ``outcome`` what it resolved when it
    passes (the CUDA-graph mode, for one)."""

    name: str
    function: str
    stage: str
    ok: bool
    message: str | None = None
    inputs: FrozenDict = field(default_factory=FrozenDict)
    outcome: str = ""

    def summary(self) -> str:
        """One line: ``name: passed (outcome)`` or ``name: refused: message``."""
        if self.ok:
            return f"{self.name}: passed" + (f" ({self.outcome})" if self.outcome else "")
        return f"{self.name}: refused: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "function": self.function, "stage": self.stage,
                "ok": self.ok, "message": self.message, "outcome": self.outcome,
                "inputs": {k: _plain(v) for k, v in self.inputs.items()}}


def _plain(value: Any) -> Any:
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _verdict(name: str, where: tuple[str, str], inputs: FrozenDict, call,
             refusal: type[BaseException] = ValueError, outcome=None) -> StartupCheck:
    """``call()`` as check ``name`` (``where``: its vLLM function and stage):
    refused with vLLM's one-line message where it raises ``refusal``, else
    passed with ``outcome(result)``."""
    try:
        result = call()
    except refusal as exc:
        return StartupCheck(name=name, function=where[0], stage=where[1], ok=False,
                            message=_one_line(exc), inputs=inputs)
    return StartupCheck(name=name, function=where[0], stage=where[1], ok=True, inputs=inputs,
                        outcome=outcome(result) if outcome is not None else "")


#: Where each check lives in vLLM 0.33 (``vllm/``-relative), its function and stage.
REQUEST_MEMORY = ("v1/worker/utils.py: request_memory", "worker init_device")
CUDAGRAPH_MODE = ("config/compilation.py: CompilationConfig.resolve_cudagraph_mode_and_sizes",
                  "model runner initialize_kv_cache")
KV_CONNECTOR_HMA = ("distributed/kv_transfer/kv_connector/factory.py: "
                    "KVConnectorFactory.create_connector", "connector creation")


def request_memory(cache_config, total_memory: int, memory_in_use: int,
                   utilization: float) -> StartupCheck:
    """``request_memory`` of the release on a snapshot of a card of
    ``total_memory`` bytes of which ``memory_in_use`` are held by another
    process, at ``utilization`` (a copy of ``cache_config`` carries it)."""
    from vllm.utils.mem_utils import MemorySnapshot

    cc = copy.copy(cache_config)
    cc.gpu_memory_utilization = utilization
    snapshot = MemorySnapshot(device="cuda:0", auto_measure=False,
                              total_memory=int(total_memory),
                              free_memory=int(total_memory) - int(memory_in_use))
    inputs = FrozenDict(total_memory=int(total_memory), free_memory=snapshot.free_memory,
                        gpu_memory_utilization=utilization,
                        requested_memory=requested_memory(total_memory, utilization))
    return _verdict("request_memory", REQUEST_MEMORY, inputs,
                    lambda: release.request_memory_check()(snapshot, cc))


def cudagraph_support(vc, layers, backends: dict) -> tuple[Any, str | None]:
    """``(min_cg_support, min_cg_attn_backend)``: the weakest
    ``get_cudagraph_support`` of the metadata builders of ``layers``
    (``(layer name, spec)`` pairs; ``backends``: layer name -> attention
    backend class), as the model runner computes it over its groups."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.backend import AttentionCGSupport

    weakest, name = AttentionCGSupport.ALWAYS, None
    # the runner asks inside the worker's current config (FlashInfer's
    # TRT-LLM decode choice reads it)
    with set_current_vllm_config(vc):
        for layer, spec in layers:
            backend = backends.get(layer)
            if backend is None:
                continue
            support = backend.get_builder_cls().get_cudagraph_support(vc, spec)
            if support.value < weakest.value:
                weakest, name = support, backend.__name__
    return weakest, name


def group_layers(vc, cfg) -> list[tuple[str, Any]]:
    """``(layer name, spec)`` of every layer of ``cfg``'s groups, the spec
    each runner asks the builder with (V1 ``_check_and_update_cudagraph_mode``:
    the group's; V2 ``get_attn_cg_support``: the layer's own)."""
    v2 = release.uses_v2_model_runner(vc)
    out = []
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        for layer in group.layer_names:
            out.append((layer, spec.kv_cache_specs[layer]
                        if v2 and hasattr(spec, "kv_cache_specs") else spec))
    return out


def profiled_cudagraph_mode(built):
    """``(mode, capture sizes)`` the start-up memory profile captures CUDA
    graphs for: the runner's ``initialize_kv_cache(..., is_profiling=True)``
    before ``profile_cudagraph_memory`` resolves the mode with the same
    function and no Mamba-blocks rule; the configured mode where the release
    refuses it (the start-up check reports that)."""
    vc = built.vllm_config
    cc = copy.deepcopy(vc.compilation_config)
    v2 = release.uses_v2_model_runner(vc)
    with emulate(built.gpu, meta_tensors=False):
        support, backend = cudagraph_support(vc, dict(built.layer_specs).items(),
                                             dict(built.backends))
        piecewise = release.piecewise_capture_available(vc, built.model) if v2 else True
    try:
        mode = release.resolve_cudagraph_mode(
            cc, min_cg_support=support, min_cg_attn_backend=backend,
            uniform_decode_query_len=release.uniform_decode_query_len(vc),
            use_v2_model_runner=v2,
            tensor_parallel_size=int(vc.parallel_config.tensor_parallel_size),
            kv_cache_config=None, max_num_reqs=None, piecewise_capture_available=piecewise)
    except ValueError:
        return vc.compilation_config.cudagraph_mode, list(
            vc.compilation_config.cudagraph_capture_sizes or [])
    return mode, list(cc.cudagraph_capture_sizes or [])


def cudagraph_mode(vc, cfg, built) -> StartupCheck:
    """``resolve_cudagraph_mode_and_sizes`` of the release on a copy of
    ``vc``'s compilation config, for the KV cache config ``cfg`` (its
    ``num_blocks``) and ``built`` (the layers' backends and model), as the
    model runner calls it (:func:`kvexplore.planning.release.resolve_cudagraph_mode`)."""
    cc = copy.deepcopy(vc.compilation_config)
    v2 = release.uses_v2_model_runner(vc)
    max_num_reqs = int(vc.scheduler_config.max_num_seqs)
    with emulate(built.gpu, meta_tensors=False):
        support, backend = cudagraph_support(vc, group_layers(vc, cfg), dict(built.backends))
        piecewise = release.piecewise_capture_available(vc, built.model) if v2 else True
    decode_len = release.uniform_decode_query_len(vc)
    inputs = FrozenDict(
        cudagraph_mode=getattr(cc.cudagraph_mode, "name", str(cc.cudagraph_mode)),
        min_cg_support=support.name, min_cg_attn_backend=backend,
        uniform_decode_query_len=decode_len, use_v2_model_runner=v2,
        max_num_seqs=max_num_reqs, num_blocks=int(cfg.num_blocks),
        has_mamba_layers=bool(getattr(cfg, "has_mamba_layers", False)),
        piecewise_capture_available=piecewise,
        enforce_eager=bool(vc.model_config.enforce_eager),
    )
    return _verdict(
        "cudagraph_mode", CUDAGRAPH_MODE, inputs,
        lambda: release.resolve_cudagraph_mode(
            cc, min_cg_support=support, min_cg_attn_backend=backend,
            uniform_decode_query_len=decode_len, use_v2_model_runner=v2,
            tensor_parallel_size=int(vc.parallel_config.tensor_parallel_size),
            kv_cache_config=cfg, max_num_reqs=max_num_reqs,
            piecewise_capture_available=piecewise),
        outcome=lambda mode: f"cudagraph_mode {getattr(mode, 'name', mode)}")


CONTEXT_PARALLEL = ("v1/worker/cp_utils.py: check_attention_cp_compatibility",
                    "model runner initialize_kv_cache")


def context_parallel(vc, built) -> StartupCheck | None:
    """``check_attention_cp_compatibility`` of the release on ``vc`` with
    ``built``'s layers in its forward context (the target's only under Model
    Runner V2 with a draft model, as that runner passes them), or ``None``
    without prefill or decode context parallelism (the function checks
    nothing then)."""
    pc = vc.parallel_config
    pcp = int(getattr(pc, "prefill_context_parallel_size", 1) or 1)
    dcp = int(pc.decode_context_parallel_size)
    if pcp * dcp <= 1:
        return None
    probe = copy.copy(vc)
    probe.compilation_config = copy.copy(vc.compilation_config)
    probe.compilation_config.static_forward_context = dict(built.forward_context)
    target = None
    if release.uses_v2_model_runner(vc) and built.drafter is not None:
        target = set(built.layer_specs) - set(built.drafter.layer_names)
    inputs = FrozenDict(prefill_context_parallel_size=pcp, decode_context_parallel_size=dcp,
                        cp_kv_cache_interleave_size=int(
                            getattr(pc, "cp_kv_cache_interleave_size", 1) or 1),
                        speculative=vc.speculative_config is not None)
    def check():
        with emulate(built.gpu, meta_tensors=False):
            release.attention_cp_check()(probe, target)

    # the release states this rule with assert statements
    return _verdict("context_parallel", CONTEXT_PARALLEL, inputs, check, refusal=AssertionError)


def kv_connector_hma(vc) -> StartupCheck | None:
    """The connector factory's hybrid-KV-cache-manager check, or ``None``
    without a ``kv_transfer_config`` (no connector is created)."""
    ktc = vc.kv_transfer_config
    if ktc is None or not getattr(ktc, "kv_connector", None):
        return None
    disabled = bool(vc.scheduler_config.disable_hybrid_kv_cache_manager)
    supports = release.connector_supports_hma(ktc)
    inputs = FrozenDict(kv_connector=ktc.kv_connector, supports_hma=supports,
                        disable_hybrid_kv_cache_manager=disabled)
    if not disabled and not supports:
        # create_connector's refusal, worded as it words it (the connector
        # itself needs a running engine to construct)
        cls = release.connector_class(ktc)
        return StartupCheck(
            name="kv_connector_hma", function=KV_CONNECTOR_HMA[0], stage=KV_CONNECTOR_HMA[1],
            ok=False, inputs=inputs,
            message=(f"Connector {cls.__name__} does not support HMA but HMA is enabled. "
                     "Please set `--disable-hybrid-kv-cache-manager`."))
    return StartupCheck(name="kv_connector_hma", function=KV_CONNECTOR_HMA[0],
                        stage=KV_CONNECTOR_HMA[1], ok=True, inputs=inputs,
                        outcome="hybrid KV cache manager " + ("off" if disabled else "on"))


def checks_after_kv_cache(vc, cfg, built) -> tuple[StartupCheck, ...]:
    """The checks vLLM runs once the KV cache config exists, in its order:
    :func:`cudagraph_mode` and, with context parallelism,
    :func:`context_parallel` (the model runner's ``initialize_kv_cache``),
    then :func:`kv_connector_hma` where a connector is configured."""
    out = [cudagraph_mode(vc, cfg, built), context_parallel(vc, built), kv_connector_hma(vc)]
    return tuple(c for c in out if c is not None)


__all__ = ["CONTEXT_PARALLEL", "CUDAGRAPH_MODE", "KV_CONNECTOR_HMA", "REQUEST_MEMORY", "StartupCheck",
           "checks_after_kv_cache", "context_parallel", "cudagraph_mode", "cudagraph_support", "group_layers",
           "kv_connector_hma", "profiled_cudagraph_mode", "request_memory"]
