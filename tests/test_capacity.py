"""Capacity answers against the installed vLLM's own functions, called here independently
of kvexplore's code path, and against hand-computed cases."""

import copy
import dataclasses
import json
import unittest.mock

import pytest
from hand_counts import llama_weight_bytes

import kvexplore
from kvexplore import KVExploreError, capacity, plan

QWEN = "Qwen/Qwen3.5-0.8B"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
GiB = 1 << 30


@pytest.fixture(scope="module")
def qwen_32k_a100():
    return plan(QWEN, gpu="A100", max_model_len=32768)


@pytest.fixture(scope="module")
def qwen_32k_h100():
    return plan(QWEN, gpu="H100", max_model_len=32768)


@pytest.fixture(scope="module")
def gemma():
    return plan("google/gemma-3-1b-it", gpu="H100", max_model_len=8192)


@pytest.fixture(scope="module")
def llama():
    return plan(LLAMA, gpu="H100", max_model_len=8192)


# ---------------------------------------------------------------------------
# vLLM's functions, called directly
# ---------------------------------------------------------------------------


def _vllm_kv_cache_config(p, memory, max_model_len=None):
    """``get_kv_cache_configs`` on a copy of the plan's config with ``memory``."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs

    from kvexplore.planning.emulation import emulate

    vc = copy.copy(p.vllm_config)
    vc.model_config = copy.copy(vc.model_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.num_gpu_blocks_override = None
    if max_model_len is not None:
        vc.model_config.max_model_len = max_model_len
    with emulate(p.gpu, meta_tensors=False):
        cfg = get_kv_cache_configs(vc, [dict(p.layer_specs)], [memory], p.kv_cache_config.kv_cache_groups)[0]
    return vc, cfg


@pytest.mark.parametrize("which", ["qwen_32k_a100", "qwen_32k_h100", "llama"])
@pytest.mark.parametrize("util", [0.5, 0.9])
def test_blocks_tokens_concurrency_match_get_kv_cache_configs(which, util, request):
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_kv_cache_capacity,
    )

    p = request.getfixturevalue(which)
    r = kvexplore.capacity(p, gpu_memory_utilization=util)
    vc, cfg = _vllm_kv_cache_config(p, r.kv_cache_memory)
    assert r.num_blocks == cfg.num_blocks
    assert r.bytes_per_block == cfg.kv_cache_tensors[0].size // cfg.num_blocks
    tokens, concurrency = get_kv_cache_capacity(vc, generate_scheduler_kv_cache_config([cfg]))
    assert r.kv_cache_size_tokens == tokens
    assert r.max_concurrency == pytest.approx(concurrency)
    assert r.admitted


@pytest.mark.parametrize("which, memory", [
    ("llama", 1 << 20), ("llama", 64 << 20), ("llama", 2 << 30),
    ("qwen_32k_a100", 40 << 20), ("qwen_32k_h100", 3 << 30)])
def test_admission_is_vllms_own_verdict(which, memory, request):
    """Capacity, the plan and vLLM's own ``get_kv_cache_configs`` (called
    directly, unpatched) give one verdict and one message for the same memory:
    a refusal is vLLM's ValueError text (less than a block, too little for
    one request), an admission raises nothing."""
    p = request.getfixturevalue(which)
    try:
        _vllm_kv_cache_config(p, memory)
        refusal = None
    except ValueError as exc:
        refusal = " ".join(str(exc).split())
    r = kvexplore.capacity(p, kv_cache_memory_bytes=memory)
    q = p.replace(kv_cache_memory_bytes=memory)
    memory_check = next(c for c in q.admission.checks if c.name == "kv_cache_memory")
    assert memory_check.message == refusal and memory_check.ok is (refusal is None)
    # vLLM checks the memory first; past it, the model runner's CUDA-graph
    # check refuses max_num_seqs above the blocks of a hybrid
    # (tests/test_startup.py holds it against the release's own function)
    graphs = next(c for c in q.admission.checks if c.name == "cudagraph_mode")
    if any(g.kind == "mamba" for g in q.groups):
        assert graphs.ok is (q.vllm_config.scheduler_config.max_num_seqs <= q.num_blocks)
    else:
        assert graphs.ok
    expected = refusal if refusal is not None else graphs.message
    assert r.admission_message == expected == q.admission.message
    assert r.admitted is q.admission.ok is (expected is None)
    assert r.num_blocks == q.num_blocks


def test_memory_accounting_adds_up(qwen_32k_a100):
    from vllm.v1.worker.utils import request_memory

    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.8, activation_peak_bytes=1 << 28, non_torch_bytes=1 << 29, cudagraph_bytes=0)
    # the card's mem_get_info total is estimated: below its nominal 80 GiB (what
    # the driver and the CUDA context keep), above 79 GiB (every public reading)
    assert set(r.estimated) == {"total_memory_bytes"}
    total = r.total_memory_bytes
    assert 79 * GiB < total < 80 * GiB
    cache = unittest.mock.Mock(gpu_memory_utilization=0.8)

    def requested(card: int) -> int:  # vLLM's own
        return request_memory(unittest.mock.Mock(total_memory=card, free_memory=card), cache)

    assert r.requested_memory_bytes == requested(total)
    assert r.kv_cache_memory == requested(total) - r.weight_bytes - (1 << 28) - (1 << 29)
    # the range spans the estimated total only, whose readings lie within 1/8 GiB
    low, high = r.kv_cache_memory_range
    assert 0 < high - low <= requested(total + GiB // 8) - requested(total)
    exact = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.8, total_memory_bytes=total - (1 << 30), activation_peak_bytes=1,
                               non_torch_bytes=1, cudagraph_bytes=1)
    assert exact.estimated == () and exact.kv_cache_memory_range[0] == exact.kv_cache_memory_range[1]
    assert exact.num_blocks < r.num_blocks + (1 << 30) // r.bytes_per_block + 1
    # every estimate is named in the derivation as an ESTIMATE with its source
    for name in r.estimated:
        assert "ESTIMATE" in r.derivation[name]


def test_kv_cache_memory_bytes_skips_accounting(qwen_32k_a100):
    r = capacity(QWEN, gpu="A100", max_model_len=32768, kv_cache_memory_bytes=10 * GiB,
                 gpu_memory_utilization=0.1)
    assert r.kv_cache_memory == 10 * GiB and r.kv_cache_memory_given
    assert r.num_blocks == _vllm_kv_cache_config(qwen_32k_a100, 10 * GiB)[1].num_blocks


def test_llama_hand_computed():
    """Pure attention: tokens = memory // (bytes per token per layer x layers),
    rounded down to whole blocks; weights from the config's shapes."""
    cfg = kvexplore.load_model_config(LLAMA).config
    layers, hidden, inter = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
    kv_heads, heads, vocab = cfg["num_key_value_heads"], cfg["num_attention_heads"], cfg["vocab_size"]
    head = cfg.get("head_dim") or hidden // heads
    per_token = 2 * kv_heads * head * 2 * layers  # K and V, bf16, every layer
    memory = 20 * GiB + 12345
    r = capacity(LLAMA, gpu="H100", max_model_len=8192, kv_cache_memory_bytes=memory)
    block = r.block_size
    assert r.bytes_per_block == block * per_token
    assert r.num_blocks == memory // (block * per_token)
    assert r.kv_cache_size_tokens == r.num_blocks * block  # 8192 is a whole number of blocks
    assert r.blocks_per_request == 8192 // block
    assert r.requests_of_length(8192) == pytest.approx(r.num_blocks / (8192 // block))
    norms = (2 * layers + 1) * hidden
    params = (2 * vocab * hidden + norms
              + layers * (2 * hidden * hidden + 2 * hidden * kv_heads * head + 3 * hidden * inter))
    assert r.plan.weight_bytes == 2 * params  # bf16, untied embeddings
    # what the loaded model holds: the parameters, one rotary cos/sin cache of
    # max_position_embeddings x head_dim bf16 shared by every layer, and four
    # fp32 scales per attention layer
    buffers = cfg["max_position_embeddings"] * head * 2 + 4 * 4 * layers
    assert r.weight_bytes == 2 * params + buffers


def test_llama_tp2_weights_per_rank():
    cfg = kvexplore.load_model_config(LLAMA).config
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    p1 = plan(LLAMA, gpu="H100", max_model_len=8192)
    p2 = plan(LLAMA, gpu="H100", max_model_len=8192, tensor_parallel_size=2)
    norms = (2 * layers + 1) * hidden * 2  # replicated on every rank
    assert p2.weight_bytes == (p1.weight_bytes - norms) // 2 + norms
    r1, r2 = kvexplore.capacity(p1, gpu_memory_utilization=0.9), kvexplore.capacity(p2, gpu_memory_utilization=0.9)
    params, buffers = llama_weight_bytes(cfg, tensor_parallel_size=2)
    assert p2.weight_bytes == params
    assert r2.weight_bytes == params + buffers
    assert r2.kv_cache_memory - r1.kv_cache_memory == (
        r1.weight_bytes - r2.weight_bytes + r1.activation_peak_bytes - r2.activation_peak_bytes
        + r1.non_torch_bytes - r2.non_torch_bytes)


def test_dcp_scales_attention_groups_only():
    from vllm.v1.core.kv_cache_utils import resolve_dcp_kv_block_size

    p = plan(QWEN, gpu="A100", tensor_parallel_size=4, decode_context_parallel_size=2,
             max_model_len=32768)
    r = kvexplore.capacity(p, kv_cache_memory_bytes=4 * GiB)
    t = r.group_table
    for row, group in zip(t.itertuples(), p.kv_cache_config.kv_cache_groups, strict=True):
        spec = group.kv_cache_spec
        assert row.tokens_per_block == resolve_dcp_kv_block_size(spec, 2)
        assert row.dcp_scaled == (row.kind == "full_attention")
        # one request pins 2 state blocks per GDN group, cdiv(len, block x DCP) attention blocks
        expected = 2 if row.kind == "mamba" else -(-32768 // (2 * spec.block_size))
        assert row.blocks_per_request == expected
    assert "DCP 2: groups [3]" in r.derivation["dcp"]
    assert any("dcp_world_size == 1" in w for w in r.warnings)


def test_hybrid_groups_dcp_and_pinned_blocks(qwen_32k_a100):
    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9)
    t = r.group_table
    # three GDN groups pin 2 state blocks each in align mode, attention cdiv(len, block)
    assert list(t.kind) == ["mamba", "mamba", "mamba", "full_attention"]
    assert list(t.blocks_per_request) == [2, 2, 2, -(-32768 // 544)]
    assert not t.dcp_scaled.any()
    # "GPU KV cache size" is not num_blocks x block_size for a hybrid
    assert r.kv_cache_size_tokens < r.num_blocks * r.block_size


def test_largest_max_model_len_is_vllms_estimate(qwen_32k_a100):
    """A length that does not fit: vLLM refuses with the estimate kvexplore reports."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs

    from kvexplore.planning.emulation import emulate

    memory = 1 * GiB
    r = capacity(QWEN, gpu="A100", max_model_len=262144, kv_cache_memory_bytes=memory)
    assert not r.admitted and r.warnings
    vc = copy.copy(r.plan.vllm_config)
    vc.model_config = copy.copy(vc.model_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.num_gpu_blocks_override = None
    with emulate(r.plan.gpu, meta_tensors=False), pytest.raises(ValueError) as err:
        get_kv_cache_configs(vc, [dict(r.plan.layer_specs)], [memory], r.plan.kv_cache_config.kv_cache_groups)
    assert f"estimated maximum model length is {r.largest_max_model_len}." in str(err.value)
    # and that length is admitted, one more token is not
    # (16 sequences: at vLLM's default 256, more than these blocks, the
    # CUDA-graph check would refuse before any length is asked)
    assert capacity(QWEN, gpu="A100", max_model_len=r.largest_max_model_len,
                    kv_cache_memory_bytes=memory, max_num_seqs=16).admitted
    assert not capacity(QWEN, gpu="A100", max_model_len=r.largest_max_model_len + 1,
                        kv_cache_memory_bytes=memory, max_num_seqs=16).admitted
    # auto-fit (max_model_len=-1) lands on the same length
    auto = plan(QWEN, gpu="A100", max_model_len=-1, kv_cache_memory_bytes=memory)
    assert auto.model_config.max_model_len == r.largest_max_model_len


# ---------------------------------------------------------------------------
# Prefix caching: a real vLLM Scheduler runs a prompt, then its repeat
# ---------------------------------------------------------------------------


def _repeat_hit(p, n, *, enable_caching=True, shared=None):
    """num_computed_tokens vLLM's Scheduler gives the second of two n-token
    prompts, the first having run to completion (chunked as vLLM chunks it):
    identical prompts, or with ``shared`` only their first ``shared`` tokens
    in common.  The scheduler's block size is the one
    ``EngineCore._initialize_kv_caches`` sets (the smallest prefix-cacheable
    group's)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import (
        generate_scheduler_kv_cache_config,
        get_request_block_hasher,
        init_none_hash,
        resolve_kv_cache_block_sizes,
    )
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    init_none_hash(sha256)
    vc = copy.copy(p.vllm_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.enable_prefix_caching = enable_caching
    cfg = generate_scheduler_kv_cache_config([copy.deepcopy(p.kv_cache_config)])
    cfg = dataclasses.replace(cfg, num_blocks=4000)
    vc.cache_config.num_gpu_blocks = cfg.num_blocks
    sizes = [g.kv_cache_spec.block_size for g in cfg.kv_cache_groups
             if g.kv_cache_spec.prefix_cacheable]
    vc.cache_config.block_size = min(sizes or [g.kv_cache_spec.block_size
                                               for g in cfg.kv_cache_groups])
    sb, hb = resolve_kv_cache_block_sizes(cfg, vc)
    no_mm = unittest.mock.patch.object(
        type(vc.model_config), "supports_multimodal_inputs", property(lambda self: False)
    )
    with no_mm:
        s = Scheduler(vllm_config=vc, kv_cache_config=cfg,
                      structured_output_manager=StructuredOutputManager(vc),
                      block_size=sb, hash_block_size=hb)
    hasher = get_request_block_hasher(hb, sha256)
    hits = []
    prompts = [list(range(1, n + 1))] * 2
    if shared is not None:
        prompts[1] = prompts[0][:shared] + [t + 10**6 for t in prompts[0][shared:]]
    for rep, tokens in enumerate(prompts):
        req = Request(f"r{rep}", tokens, SamplingParams(max_tokens=1), None,
                      block_hasher=hasher)
        s.add_request(req)
        first = True
        while s.has_unfinished_requests():
            out = s.schedule()
            if first:
                hits.append(out.scheduled_new_reqs[0].num_computed_tokens)
                first = False
            ids = list(out.num_scheduled_tokens)
            done = req.num_computed_tokens >= n  # schedule() advanced it
            s.update_from_output(out, ModelRunnerOutput(
                req_ids=ids, req_id_to_index={i: k for k, i in enumerate(ids)},
                sampled_token_ids=[[7] if done else [] for _ in ids]))
    assert hits[0] == 0
    return hits[1]


def _lengths(unit):
    return sorted({1, unit - 1, unit, unit + 1, unit + 2, 2 * unit, 2 * unit + 1,
                   3 * unit + 5, 2048, 2049, 3000, 5000})


@pytest.mark.parametrize("which", ["qwen_32k_a100", "qwen_32k_h100", "llama", "gemma"])
def test_prefix_hits_match_vllm_scheduler(which, request):
    p = request.getfixturevalue(which)
    r = kvexplore.capacity(p, kv_cache_memory_bytes=8 * GiB)
    assert r.prefix_caching
    unit = r.cache_hit_alignment
    got = {n: r.prefix_hit_tokens(n) for n in _lengths(unit)}
    seen = {n: _repeat_hit(p, n) for n in _lengths(unit)}
    assert got == seen
    assert r.smallest_hit_prompt == unit + 1
    assert _repeat_hit(p, unit) == 0 and _repeat_hit(p, unit + 1) == unit


def test_prefix_hits_gpu_dependent(qwen_32k_a100, qwen_32k_h100):
    a, h = kvexplore.capacity(qwen_32k_a100), kvexplore.capacity(qwen_32k_h100)
    assert (a.cache_hit_alignment, h.cache_hit_alignment) == (544, 576)
    # 544 tokens: no hit on either; 576 + 1: a hit of 544 on A100, 576 on H100
    assert (a.prefix_hit_tokens(544), h.prefix_hit_tokens(544)) == (0, 0)
    assert (a.prefix_hit_tokens(577), h.prefix_hit_tokens(577)) == (544, 576)
    table = a.prefix_table([544, 545, 2096])
    assert list(table.cached_tokens) == [0, 544, 1632]
    assert list(table.recomputed_tokens) == [544, 1, 464]


def test_prefix_caching_off_and_block_larger_than_max_model_len(qwen_32k_a100):
    off = capacity(QWEN, gpu="A100", max_model_len=32768, enable_prefix_caching=False,
                   kv_cache_memory_bytes=8 * GiB)
    assert not off.prefix_caching and off.prefix_hit_tokens(5000) == 0
    assert any("prefix caching is off" in w for w in off.warnings)
    assert _repeat_hit(off.plan, 5000, enable_caching=False) == 0
    short = capacity(QWEN, gpu="A100", max_model_len=512, kv_cache_memory_bytes=8 * GiB)
    assert short.block_size > short.max_model_len
    assert short.smallest_hit_prompt is None
    assert any("can never hit" in w for w in short.warnings)
    assert max(short.prefix_hit_tokens(n) for n in range(1, 513)) == 0


# ---------------------------------------------------------------------------
# CPU offloading and LMCache chunk sizes
# ---------------------------------------------------------------------------


def _cpu_spec(result, cpu_bytes):
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    config = dataclasses.replace(result.config, extra_config={
        **dict(result.config.extra_config), "cpu_bytes_to_use": cpu_bytes})
    with unittest.mock.patch.object(CPUOffloadingSpec, "_uses_shared_region", lambda self: True):
        return CPUOffloadingSpec(config)


@pytest.mark.parametrize("extra", [None, {"blocks_per_chunk": 3}])
@pytest.mark.parametrize("cpu_bytes", [10 * GiB, 123_456_789])
def test_host_sizing_matches_cpu_offloading_spec(qwen_32k_a100, extra, cpu_bytes):
    from kvexplore import host_sizing, offload_config

    result = offload_config(qwen_32k_a100, extra_config=extra)
    h = host_sizing(result, cpu_bytes)
    spec = _cpu_spec(result, cpu_bytes)
    assert h.num_chunks == spec.num_chunks
    assert h.aligned_kv_bytes_per_chunk == spec.kv_bytes_per_chunk
    # 4 groups of 544-token blocks: every span of blocks_per_chunk x 544 tokens
    # costs one chunk per group
    span = 544 * result.config.cache.blocks_per_chunk
    assert h.chunks_per_span == 4 and h.span_tokens == span
    assert h.tokens == spec.num_chunks // 4 * span
    assert h.host_bytes_per_token == pytest.approx(4 * spec.kv_bytes_per_chunk / span)
    assert h.naive_tokens > h.tokens  # GPU bytes per token of one group over-promise


def test_capacity_with_cpu_bytes(qwen_32k_a100):
    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9, cpu_bytes_to_use=10 * GiB)
    assert r.host is not None and r.host.num_chunks == _cpu_spec(
        kvexplore.offload_config(qwen_32k_a100), 10 * GiB).num_chunks
    assert "host.num_chunks" in r.explain()


def test_lmcache_chunk_sizes(qwen_32k_a100, qwen_32k_h100, llama):
    from kvexplore import lmcache_chunk_sizes, offload_config

    a = lmcache_chunk_sizes(offload_config(qwen_32k_a100), check=(256, 544, 1088))
    assert a.hybrid_block_size == qwen_32k_a100.block_size == 544
    assert dict(a.checked) == {256: False, 544: True, 1088: True}
    h = lmcache_chunk_sizes(offload_config(qwen_32k_h100))
    assert h.hybrid_block_size == 576 and not h.checked[256]
    assert all(v % 576 == 0 for v in h.valid)
    lm = lmcache_chunk_sizes(offload_config(llama))
    assert lm.checked[256] == (256 % llama.block_size == 0)


# ---------------------------------------------------------------------------
# Display, CLI and bad input
# ---------------------------------------------------------------------------


def test_display_trio(qwen_32k_a100):
    from matplotlib.figure import Figure

    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9, cpu_bytes_to_use=GiB)
    text = r.text()
    assert f"{r.num_blocks:,} blocks of 544 tokens" in text
    assert "kv_cache_memory:" in text
    assert "<table" in r._repr_html_()
    assert isinstance(r.figure(), Figure)
    assert isinstance(r.host.figure(), Figure)
    assert f"{r.host.tokens:,} tokens" in r.host.text()
    assert isinstance(kvexplore.prefix_cache_figure([r]), Figure)
    json.dumps(r.to_dict())


def test_cli_capacity_json(qwen_32k_a100, capsys):
    from kvexplore.cli import main

    rc = main(["capacity", QWEN, "--gpu", "A100", "--max-model-len", "32768",
               "--gpu-memory-utilization", "0.9", "--cpu-bytes-to-use", str(GiB),
               "--prompt-tokens", "544,545", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9, cpu_bytes_to_use=GiB)
    assert out["num_blocks"] == r.num_blocks
    assert out["kv_cache_size_tokens"] == r.kv_cache_size_tokens
    assert out["host"]["num_chunks"] == r.host.num_chunks
    assert out["prefix_hits"] == {"544": 0, "545": 544}


def test_cli_capacity_bad_utilisation(capsys):
    from kvexplore.cli import main

    assert main(["capacity", QWEN, "--gpu", "A100", "--gpu-memory-utilization", "1.5"]) == 2
    assert "gpu_memory_utilization=1.5" in capsys.readouterr().err


@pytest.mark.parametrize("bad", [0, -0.1, 1.01, "0.9", True, float("nan")])
def test_bad_utilisation(qwen_32k_a100, bad):
    with pytest.raises(KVExploreError, match="gpu_memory_utilization=.*expected a number in \\(0, 1\\]"):
        kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=bad)


def test_memory_smaller_than_weights(qwen_32k_a100):
    with pytest.raises(KVExploreError, match="weights per rank"):
        kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.01)
    with pytest.raises(KVExploreError, match="weights per rank"):
        kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9, total_memory_bytes=qwen_32k_a100.weight_bytes)


@pytest.mark.parametrize("kwargs,name", [
    ({"total_memory_bytes": -1}, "total_memory_bytes"),
    ({"activation_peak_bytes": 1.5}, "activation_peak_bytes"),
    ({"non_torch_bytes": "1"}, "non_torch_bytes"),
    ({"cpu_bytes_to_use": 0}, "cpu_bytes_to_use"),
])
def test_bad_byte_counts(qwen_32k_a100, kwargs, name):
    with pytest.raises(KVExploreError, match=name):
        kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9, **kwargs)


@pytest.mark.parametrize("n", [0, -5, 1.5, "100", 10**9])
def test_bad_prompt_lengths(qwen_32k_a100, n):
    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9)
    with pytest.raises(KVExploreError, match="n"):
        r.prefix_hit_tokens(n)


def test_bad_host_inputs(qwen_32k_a100):
    from kvexplore import host_sizing, lmcache_chunk_sizes, offload_config

    with pytest.raises(KVExploreError, match="OffloadResult"):
        host_sizing(qwen_32k_a100, GiB)
    with pytest.raises(KVExploreError, match="cpu_bytes_to_use=-1"):
        host_sizing(offload_config(qwen_32k_a100), -1)
    with pytest.raises(KVExploreError, match="chunk_size=0"):
        lmcache_chunk_sizes(offload_config(qwen_32k_a100), check=(0,))
    with pytest.raises(KVExploreError, match="num_blocks"):
        capacity(QWEN, gpu="A100", num_blocks=10)
    # vLLM's OffloadingConfig takes a chunk of 0 or -1 blocks; kvexplore refuses
    # such an extra config, and no host region can hold such a chunk
    ok = offload_config(qwen_32k_a100)
    for tokens in (0, -544):
        with pytest.raises(KVExploreError, match=f"extra_config\\['block_size'\\]={tokens} "):
            offload_config(qwen_32k_a100, extra_config={"block_size": tokens})
        with pytest.raises(KVExploreError, match=f"extra_config\\['block_size'\\]={tokens} "):
            capacity(qwen_32k_a100, cpu_bytes_to_use=GiB, offload_extra_config={"block_size": tokens})
        cache = dataclasses.replace(ok.config.cache, blocks_per_chunk=tokens // 544)
        cfg = dataclasses.replace(ok, config=dataclasses.replace(ok.config, cache=cache))
        with pytest.raises(KVExploreError, match=f"blocks_per_chunk={tokens // 544} "):
            host_sizing(cfg, GiB)


def test_canonical_layout_string_is_refused(qwen_32k_a100):
    from kvexplore import offload_config

    # vLLM's bool() would read "false" as True
    with pytest.raises(KVExploreError) as info:
        offload_config(qwen_32k_a100, extra_config={"canonical_layout": "false"})
    assert info.value.code == "canonical_layout_not_bool"
    assert "would read it as True" in str(info.value)


def test_report_is_frozen(qwen_32k_a100):
    r = kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.9)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.num_blocks = 1
    assert isinstance(r.plan, kvexplore.Plan)
    with pytest.raises(TypeError, match="read-only"):
        r.sources["weight_bytes"] = "changed"


def test_capacity_sweep_rows(qwen_32k_a100, qwen_32k_h100):
    df = kvexplore.capacity_sweep([qwen_32k_a100, qwen_32k_h100], gpu_memory_utilization=0.8)
    assert list(df.gpu) == ["A100", "H100"]
    assert list(df.num_blocks) == [kvexplore.capacity(qwen_32k_a100, gpu_memory_utilization=0.8).num_blocks, kvexplore.capacity(qwen_32k_h100, gpu_memory_utilization=0.8).num_blocks]
    assert list(df.cache_hit_alignment) == [544, 576]


@pytest.mark.parametrize("value", [-5, 0, 1.5, "4096"])
def test_bad_max_model_len(value):
    with pytest.raises(KVExploreError, match=f"max_model_len={value!r}"):
        capacity(QWEN, gpu="A100", max_model_len=value)


def test_cli_capacity_text(capsys):
    from kvexplore.cli import main

    assert main(["capacity", QWEN, "--gpu", "A100", "--max-model-len", "32768",
                 "--kv-cache-memory-bytes", str(8 * GiB), "--prompt-tokens", "544,2096"]) == 0
    out = capsys.readouterr().out
    r = capacity(QWEN, gpu="A100", max_model_len=32768, kv_cache_memory_bytes=8 * GiB)
    assert f"{r.num_blocks:,} blocks of 544 tokens" in out
    assert "kv_cache_memory: given: kv_cache_memory_bytes=8,589,934,592" in out
    assert "1632" in out.split("prompt_tokens")[-1]
