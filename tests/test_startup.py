"""The whole start-up verdict: every check kvexplore runs equals the release's
own function called here, on the plan's objects, without kvexplore's path.

Runs on every release of the window (marker ``release``).  The oracle for the
CUDA-graph check is the release's ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
called on a copy of the plan's compilation config with the weakest
``get_cudagraph_support`` of the metadata builders of the plan's layers, as
the release's model runner computes it (written out here, not imported from
kvexplore); the hand check is the rule the check states: full CUDA graphs,
Mamba layers and ``max_num_seqs`` above the blocks refuse.
"""

import copy
import inspect

import pytest

import kvexplore
from kvexplore.errors import KVExploreError

pytestmark = pytest.mark.release

#: Every bundled model with Mamba-like state layers, and two attention-only ones.
HYBRIDS = [
    "InternScience/Agents-A1", "LiquidAI/LFM2-2.6B", "Qwen/Qwen3-Next-80B-A3B-Instruct",
    "Qwen/Qwen3.5-0.8B", "ai21labs/AI21-Jamba-1.5-Mini", "ibm-granite/granite-4.0-h-350m",
    "mistralai/Mamba-Codestral-7B-v0.1", "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia/Nemotron-H-56B-Base-8K",
    "openbmb/MiniCPM-V-4.6", "state-spaces/mamba-130m-hf", "tiiuae/Falcon-H1-0.5B-Instruct",
    "tiiuae/falcon-mamba-7b",
]
ATTENTION = ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-3-1b-it"]
GPUS = ["H100", "A100", "L40S"]
#: B200 (SM 10.0): FlashInfer's builder asks the current config for TRT-LLM decode.
B200_CASES = ["Qwen/Qwen3.5-0.8B", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"]


def _deployment(model, gpu):
    """The plan on the fewest GPUs (TP 1, 2, 4, 8) whose share of the
    weights leaves a fifth of the card, at ``vllm serve``'s defaults."""
    for tp in (1, 2, 4, 8):
        p = kvexplore.plan(model, gpu=gpu, tensor_parallel_size=tp)
        if p.weight_bytes < 0.8 * p.gpu.total_memory_range[0]:
            return p
    return p


def release_cudagraph_verdict(p):
    """(ok, message, mode name) from the release's own function, computed as
    its model runner does in ``initialize_kv_cache``."""
    from vllm.config.compilation import CompilationConfig
    from vllm.v1.attention.backend import AttentionCGSupport

    from kvexplore.planning.emulation import emulate

    vc = p.vllm_config
    cfg = p.kv_cache_config
    v2 = bool(getattr(vc, "use_v2_model_runner", True))
    weakest, name = AttentionCGSupport.ALWAYS, None
    from vllm.config import set_current_vllm_config

    with emulate(p.gpu, meta_tensors=False), set_current_vllm_config(vc):
        for group in cfg.kv_cache_groups:
            for layer in group.layer_names:
                backend = p.layer_backends.get(layer)
                if backend is None:
                    continue
                spec = group.kv_cache_spec
                if v2 and hasattr(spec, "kv_cache_specs"):
                    spec = spec.kv_cache_specs[layer]
                support = backend.get_builder_cls().get_cudagraph_support(vc, spec)
                if support.value < weakest.value:
                    weakest, name = support, backend.__name__
        piecewise = True
        if v2:
            import vllm.v1.worker.gpu.model_runner as runner
            from vllm.v1.worker.gpu.cudagraph_utils import has_compiled_submodule

            if hasattr(runner, "is_breakable_cudagraph_enabled"):
                breakable = runner.is_breakable_cudagraph_enabled(vc.compilation_config)
            else:
                import vllm.envs as envs

                breakable = envs.VLLM_USE_BREAKABLE_CUDAGRAPH
            piecewise = bool(breakable or has_compiled_submodule(p._build.model))
    cc = copy.deepcopy(vc.compilation_config)
    spec_tokens = vc.speculative_config.num_speculative_tokens if vc.speculative_config else 0
    keywords = {"uniform_decode_query_len": 1 + spec_tokens, "use_v2_model_runner": v2,
                "tensor_parallel_size": vc.parallel_config.tensor_parallel_size,
                "kv_cache_config": cfg, "max_num_reqs": vc.scheduler_config.max_num_seqs,
                "is_profiling": False}
    if v2:
        keywords["piecewise_capture_available"] = piecewise
    takes = inspect.signature(CompilationConfig.resolve_cudagraph_mode_and_sizes).parameters
    try:
        mode = cc.resolve_cudagraph_mode_and_sizes(
            weakest, name, **{k: v for k, v in keywords.items() if k in takes})
    except ValueError as exc:
        return False, " ".join(str(exc).split()), None
    return True, None, mode.name


def _check(p, name):
    return next(c for c in p.admission.checks if c.name == name)


def _assert_equal_to_release(p):
    ok, message, mode = release_cudagraph_verdict(p)
    got = _check(p, "cudagraph_mode")
    assert (got.ok, got.message) == (ok, message), (p, got)
    if ok:
        assert got.outcome == f"cudagraph_mode {mode}"
    memory = _check(p, "kv_cache_memory")
    assert p.admission.ok == (ok and memory.ok and _check(p, "request_memory").ok)
    # the rule the check states, from the plan's facts by hand
    has_mamba = any(g.kind == "mamba" for g in p.groups)
    full = mode is None or "FULL" in mode
    max_num_seqs = p.vllm_config.scheduler_config.max_num_seqs
    if has_mamba and full and not p.vllm_config.model_config.enforce_eager:
        assert ok == (max_num_seqs <= p.num_blocks), (p, max_num_seqs)
    if not has_mamba:
        assert ok
    if not p.admission.ok:
        first = p.admission.refused_by
        assert p.admission.message == first.message


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("model", HYBRIDS + ATTENTION)
def test_defaults_and_the_boundary_equal_the_releases_own_check(model, gpu):
    """At ``vllm serve``'s defaults on the GPU, and for a hybrid with the
    cache's blocks fixed at the default's count, at ``max_num_seqs`` equal to
    the blocks and one above (a batch at least that many tokens, as vLLM's
    scheduler config requires)."""
    p = _deployment(model, gpu)
    tp = p.tensor_parallel_size
    _assert_equal_to_release(p)
    if not any(g.kind == "mamba" for g in p.groups):
        return
    blocks = max(p.num_blocks, 2)
    tokens = p.vllm_config.scheduler_config.max_num_batched_tokens
    for seqs in (blocks, blocks + 1):
        q = kvexplore.plan(model, gpu=gpu, tensor_parallel_size=tp, num_blocks=blocks,
                           max_num_seqs=seqs, max_num_batched_tokens=max(seqs, tokens),
                           max_model_len=min(p.max_model_len, 4096))
        _assert_equal_to_release(q)
        assert _check(q, "cudagraph_mode").ok == (seqs <= blocks)


def _nemotron_refused():
    """Nemotron-3-Nano-30B-A3B on one H100 at ``vllm serve``'s defaults
    (vLLM 0.31-0.33: 844 blocks for 1,024 sequences), or at the first
    utilization below the default that the release refuses (vLLM 0.34's
    extensible cache takes the whole card by default)."""
    model = "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"
    for util in (None, 0.9, 0.85, 0.8):
        p = kvexplore.plan(model, gpu="H100", gpu_memory_utilization=util)
        if not p.admission.ok:
            return p
    raise AssertionError(f"{model} starts on one H100 at every utilization tried")


@pytest.mark.parametrize("model", B200_CASES)
def test_b200_equals_the_releases_own_check(model):
    _assert_equal_to_release(kvexplore.plan(model, gpu="B200", num_blocks=64, max_num_seqs=64,
                                            max_model_len=4096))
    _assert_equal_to_release(kvexplore.plan(model, gpu="B200", num_blocks=64, max_num_seqs=65,
                                            max_model_len=4096))


def test_the_worked_case_refuses_and_its_way_out_starts():
    """Nemotron-3-Nano-30B-A3B on one H100: vLLM refuses to capture CUDA
    graphs for 1,024 sequences over fewer Mamba blocks; every way out
    kvexplore names is a plan that starts, checked here again."""
    p = _nemotron_refused()
    util = p.request.gpu_memory_utilization
    assert p.vllm_config.scheduler_config.max_num_seqs == 1024
    assert p.num_blocks < 1024
    assert not p.admission.ok
    assert p.admission.refused_by.name == "cudagraph_mode"
    assert f"max_num_seqs (1024) exceeds available Mamba cache blocks ({p.num_blocks})" in \
        p.admission.message
    ways = p.way_out()
    assert ways and all(w.starts for w in ways)
    seqs = next(w for w in ways if "max_num_seqs" in w.change)
    n = seqs.change["max_num_seqs"]
    assert n >= p.num_blocks
    # the largest: one more sequence is refused by the release's own check
    more = kvexplore.plan(p.model, gpu="H100", max_num_seqs=n + 1, gpu_memory_utilization=util)
    assert release_cudagraph_verdict(more)[0] is False
    assert release_cudagraph_verdict(kvexplore.plan(
        p.model, gpu="H100", max_num_seqs=n, gpu_memory_utilization=util))[0]
    for w in ways:
        again = kvexplore.plan(p.model, gpu="H100", **{"gpu_memory_utilization": util,
                                                       **w.change})
        assert again.admission.ok and release_cudagraph_verdict(again)[0]


def test_eager_and_piecewise_capture_no_full_graph():
    for keywords in ({"enforce_eager": True},
                     {"compilation_config": {"cudagraph_mode": "PIECEWISE"}},
                     {"compilation_config": {"cudagraph_mode": "NONE"}}):
        p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=32, max_num_seqs=64,
                           max_model_len=2048, **keywords)
        ok, _, mode = release_cudagraph_verdict(p)
        assert ok and p.admission.ok, keywords
        assert "FULL" not in mode
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=32, max_num_seqs=64,
                       max_model_len=2048)
    assert not p.admission.ok and release_cudagraph_verdict(p)[0] is False


def test_memory_held_by_another_process_is_the_release_request_memory():
    """``request_memory`` of the release, called here on a snapshot of the
    card: 30 GiB held of an A100 80GB refuses 0.92 (the extensible cache of
    vLLM 0.34 only caps its budget, and passes)."""
    from vllm.utils.mem_utils import MemorySnapshot
    from vllm.v1.worker.utils import request_memory

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", gpu_memory_in_use=30 << 30)
    total = p.gpu.total_memory_range[0]
    snapshot = MemorySnapshot(device="cuda:0", auto_measure=False, total_memory=total,
                              free_memory=total - (30 << 30))
    cc = p.cache_config
    cc.gpu_memory_utilization = p.gpu_memory_utilization
    try:
        request_memory(snapshot, cc)
        expected = (True, None)
    except ValueError as exc:
        expected = (False, " ".join(str(exc).split()))
    got = _check(p, "request_memory")
    assert (got.ok, got.message) == expected
    assert got.inputs["free_memory"] == total - (30 << 30)
    if not got.ok:
        assert p.admission.refused_by.name == "request_memory"
        ways = p.way_out()
        assert ways and all(w.starts for w in ways)
        util = ways[0].change["gpu_memory_utilization"]
        assert util <= (total - (30 << 30)) / total
    assert kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100").admission.ok


@pytest.mark.parametrize("keywords, named", [
    ({"compilation_config": {"cudagraph_modes": "FULL"}}, "cudagraph_modes"),
    ({"compilation_config": {"cudagraph_mode": "SOMETIMES"}}, "SOMETIMES"),
    ({"kv_transfer_config": {"kv_connector": "NoSuchConnector", "kv_role": "kv_both"}},
     "NoSuchConnector"),
    ({"gpu_memory_in_use": -1}, "-1"),
    ({"gpu_memory_in_use": 10**15}, "1,000,000,000,000,000"),
    ({"enforce_eager": "yes"}, "'yes'"),
])
def test_bad_start_up_inputs_are_one_clear_error(keywords, named):
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", **keywords)
    assert named in str(info.value)


def test_a_connector_is_checked_with_the_releases_factory():
    """The offloading connector declares hybrid-KV-cache-manager support; the
    check names it and the release's factory agrees."""
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory

    config = {"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", kv_transfer_config=config)
    got = _check(p, "kv_connector_hma")
    assert got.inputs["kv_connector"] == "OffloadingConnector"
    assert got.inputs["supports_hma"] == KVConnectorFactory.supports_hma_config(
        KVTransferConfig(**config))
    assert got.ok


def test_capacity_carries_the_whole_verdict():
    """capacity() at a utilization sized below ``max_num_seqs`` blocks says
    refused with the CUDA-graph check's message; at the way out's
    utilization it is admitted."""
    p = _nemotron_refused()
    r = kvexplore.capacity(p)
    assert r.num_blocks == p.num_blocks
    assert not r.admitted and "exceeds available Mamba cache blocks" in r.admission_message
    util = next(w for w in p.way_out() if "gpu_memory_utilization" in w.change)
    r = kvexplore.capacity(p, gpu_memory_utilization=util.change["gpu_memory_utilization"])
    assert r.admitted and r.num_blocks >= 1024


def test_the_profiled_cuda_graph_pool_follows_the_resolved_mode():
    """The memory profile's CUDA-graph term counts the capture modes of the
    mode the runner resolves (two for FULL_AND_PIECEWISE, one for
    FULL_DECODE_ONLY or PIECEWISE, none when eager), each over the capture
    sizes vLLM's config lists."""
    from kvexplore.planning.profile import CUDAGRAPH_FIRST, CUDAGRAPH_PER_GRAPH

    def pool(**keywords):
        p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", **keywords)
        n = len(p.vllm_config.compilation_config.cudagraph_capture_sizes or [])
        return p.memory_terms()["cudagraph_bytes"].high, n

    both, n = pool()
    assert both == 2 * (CUDAGRAPH_FIRST[1] + (n - 1) * CUDAGRAPH_PER_GRAPH[1])
    for mode in ("FULL_DECODE_ONLY", "PIECEWISE"):
        one, m = pool(compilation_config={"cudagraph_mode": mode})
        assert one == CUDAGRAPH_FIRST[1] + (m - 1) * CUDAGRAPH_PER_GRAPH[1]
    assert pool(enforce_eager=True)[0] == 0


@pytest.mark.parametrize("model, keywords", [
    ("Qwen/Qwen3.5-0.8B", {"tensor_parallel_size": 4, "decode_context_parallel_size": 2}),
    ("Qwen/Qwen3.5-0.8B", {"tensor_parallel_size": 4, "decode_context_parallel_size": 2,
                           "attention_backend": "FLASHINFER"}),
    ("deepseek-ai/DeepSeek-V3", {"tensor_parallel_size": 8, "decode_context_parallel_size": 8}),
])
def test_context_parallelism_is_the_releases_own_check(model, keywords):
    """``check_attention_cp_compatibility`` of the release, called here on a
    copy of the plan's config with the built layers in its forward context."""
    from vllm.v1.worker.cp_utils import check_attention_cp_compatibility

    from kvexplore.planning.emulation import emulate

    p = kvexplore.plan(model, gpu="H100", num_blocks=64, max_model_len=4096, max_num_seqs=32,
                       **keywords)
    vc = p.vllm_config
    vc.compilation_config.static_forward_context = dict(p._build.forward_context)
    try:
        with emulate(p.gpu, meta_tensors=False):
            check_attention_cp_compatibility(vc)
        expected = (True, None)
    except AssertionError as exc:
        expected = (False, " ".join(str(exc).split()))
    got = _check(p, "context_parallel")
    assert (got.ok, got.message) == expected
    assert "context_parallel" not in [c.name for c in kvexplore.plan(
        model, gpu="H100", num_blocks=64, max_model_len=4096).admission.checks]
