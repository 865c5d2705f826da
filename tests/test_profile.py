"""vLLM's start-up memory profile, estimated on the meta device.

Each term against vLLM's own function where one runs offline, against facts
countable by hand, or against a public start-up log's figure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from hand_counts import llama_weight_bytes
from vllm.v1.worker.utils import request_memory

import kvexplore
from kvexplore.planning.profile import LiveBytes
from kvexplore.planning.release import release_name

GiB = 1 << 30
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


@pytest.fixture(scope="module")
def llama_h100():
    return kvexplore.plan(LLAMA, gpu="H100", max_model_len=16384, enable_prefix_caching=False)


def test_live_bytes_counts_what_is_alive_at_once():
    with LiveBytes() as live:
        a = torch.empty(1000, dtype=torch.float32, device="meta")  # 4,000 B
        b = torch.empty(500, dtype=torch.bfloat16, device="meta")  # 1,000 B
        del a
        c = torch.empty(2000, dtype=torch.int8, device="meta")  # 2,000 B
        del b, c
    assert live.peak == 4000 + 1000
    assert live.live == 0


def test_requested_memory_is_vllms_request_memory(llama_h100):
    r = kvexplore.capacity(llama_h100, gpu_memory_utilization=0.95, cudagraph_bytes=0)
    snapshot = SimpleNamespace(total_memory=r.total_memory_bytes, free_memory=r.total_memory_bytes)
    cache = SimpleNamespace(gpu_memory_utilization=0.95)
    assert r.requested_memory_bytes == request_memory(snapshot, cache)


def test_weights_equal_what_vllm_logs_as_model_loading(llama_h100):
    # "Model loading took 14.99 GiB memory" (vLLM 0.19.0, H100, Llama-3.1-8B-Instruct)
    assert round(llama_h100.loaded_weight_bytes / GiB, 2) == 14.99
    # and, to the byte, the parameters and buffers counted from config.json
    params, buffers = llama_weight_bytes(kvexplore.load_model_config(LLAMA).config)
    assert llama_h100.memory_profile().weights.low == params + buffers


def test_activation_range_brackets_the_logged_peak_and_the_sampler(llama_h100):
    mp = llama_h100.memory_profile()
    # vLLM serve's H100 defaults: 8,192 batched tokens, 1,024 sequences
    assert (mp.max_num_batched_tokens, mp.max_num_seqs) == (8192, 1024)
    fp32_logits = 1024 * 128256 * 4
    assert mp.activation_peak.low >= 3 * fp32_logits
    assert mp.forward_peak_bytes > 8192 * 4096 * 2  # at least the output hidden states
    # "torch peak memory increase: 1.89GiB" (vLLM 0.19.0, same model, GPU and defaults)
    assert mp.activation_peak.low <= 1.89 * GiB <= mp.activation_peak.high


def test_cudagraph_estimate_scales_with_vllms_capture_sizes(llama_h100):
    sizes = llama_h100.vllm_config.compilation_config.cudagraph_capture_sizes
    term = llama_h100.memory_profile().cudagraph
    # FULL_AND_PIECEWISE: two modes, 8-260 MiB first graph, 6-8 MiB each further one
    n = len(sizes)
    assert term.low == 2 * (8 + (n - 1) * 6) << 20
    assert term.high == 2 * (260 + (n - 1) * 8) << 20


def test_kv_memory_against_the_logged_run(llama_h100):
    # vLLM 0.19.0 on an H100: "Available KV cache memory: 58.11 GiB" at
    # --gpu-memory-utilization 0.95; 0.19 did not subtract the CUDA-graph estimate
    r = kvexplore.capacity(llama_h100, gpu_memory_utilization=0.95, cudagraph_bytes=0)
    low, high = (x / GiB for x in r.kv_cache_memory_range)
    assert low <= 58.11 <= high
    assert abs(low - 58.11) / 58.11 < 0.03


def test_kv_memory_is_determine_available_memorys_arithmetic(llama_h100):
    """With every measured input given, the KV cache memory is what vLLM's
    ``Worker.determine_available_memory`` computes: ``request_memory`` (vLLM's
    own function) less the non-KV memory (weights, counted here from
    config.json, + torch peak increase + non-torch increase) less the applied
    CUDA-graph estimate."""
    if llama_h100.extensible_kv_cache:
        pytest.skip(f"{release_name()} sizes this cache after warmup, not by the profile")
    total, peak, non_torch, graphs = 80 * GiB, 3 * GiB + 12345, 700 << 20, 321 << 20
    r = kvexplore.capacity(llama_h100, gpu_memory_utilization=0.93, total_memory_bytes=total,
                           activation_peak_bytes=peak, non_torch_bytes=non_torch,
                           cudagraph_bytes=graphs)
    params, buffers = llama_weight_bytes(kvexplore.load_model_config(LLAMA).config)
    snapshot = SimpleNamespace(total_memory=total, free_memory=total)
    requested = request_memory(snapshot, SimpleNamespace(gpu_memory_utilization=0.93))
    expected = requested - (params + buffers + peak + non_torch) - graphs
    assert r.kv_cache_memory == expected
    assert r.kv_cache_memory_range == (expected, expected) and r.estimated == ()


def test_non_torch_memory_grows_with_tensor_parallelism():
    one = kvexplore.plan(LLAMA, gpu="H100").memory_profile().non_torch
    two = kvexplore.plan(LLAMA, gpu="H100", tensor_parallel_size=2).memory_profile().non_torch
    assert one.high < two.low  # NCCL buffers at TP >= 2


# ---------------------------------------------------------------------------
# Default plans: the cache vLLM would size on the named GPU
# ---------------------------------------------------------------------------

QWEN = "Qwen/Qwen3.5-0.8B"


def _vllm_sizing(p, memory):
    """vLLM's own ``get_kv_cache_configs`` on the plan's specs and groups with
    ``memory``: ``(num_blocks, None)`` or ``(None, vLLM's refusal)``."""
    import copy

    from vllm.v1.core.kv_cache_planning import get_kv_cache_configs

    from kvexplore.planning.emulation import emulate

    vc = copy.copy(p.vllm_config)
    vc.cache_config = copy.copy(vc.cache_config)
    vc.cache_config.num_gpu_blocks_override = None
    try:
        with emulate(p.gpu, meta_tensors=False):
            cfg = get_kv_cache_configs(vc, [dict(p.layer_specs)], [memory],
                                       p.kv_cache_config.kv_cache_groups)[0]
    except ValueError as exc:
        return None, " ".join(str(exc).split())
    return cfg.num_blocks, None


def test_default_plan_holds_what_the_memory_profile_leaves():
    p = kvexplore.plan(QWEN, gpu="A100")
    assert p.sized_by_profile
    t = p.memory_terms()
    overheads = (t["weight_bytes"].high + t["activation_peak_bytes"].high
                 + t["non_torch_bytes"].high + t["cudagraph_bytes"].high)
    requested = -(-t["total_memory_bytes"].low * 92 // 100)  # ceil(total x 0.92)
    assert p.kv_cache_memory_bytes == requested - overheads
    # by hand from the config: 24 layers in 4 groups of 6; a block id holds one
    # 544-token page per layer of a group: 2 KV heads x 256 x (K, V) x 2 B a token
    page = 544 * 2 * 256 * 2 * 2
    assert p.mamba_page_size_padded == page and p.bytes_per_block == 6 * page
    assert p.num_blocks == p.kv_cache_memory_bytes // (6 * page) > 10_000
    assert _vllm_sizing(p, p.kv_cache_memory_bytes) == (p.num_blocks, None)
    r = kvexplore.capacity(p)
    assert (r.kv_cache_memory, r.num_blocks) == (p.kv_cache_memory_bytes, p.num_blocks)
    assert p.admission.ok and "low end of vLLM's start-up memory profile" in p.derivation()["num_blocks"]


@pytest.mark.parametrize("util, expect", [(0.92, "admitted"), (0.06, "too short"), (0.02, "no memory")])
def test_default_plan_is_admitted_exactly_when_vllm_admits_it(util, expect):
    p = kvexplore.plan(QWEN, gpu="A100", gpu_memory_utilization=util)
    num_blocks, refusal = _vllm_sizing(p, p.kv_cache_memory_bytes)
    assert p.admission.ok == (refusal is None)
    if refusal is None:
        assert p.num_blocks == num_blocks
    else:
        assert p.admission.message == refusal
    # the three utilisations cover the three verdicts
    assert expect == ("admitted" if p.admission.ok else
                      "no memory" if p.kv_cache_memory_bytes == 0 else "too short")


def test_allocate_allocates_only_what_the_caller_asks_for():
    from kvexplore.errors import KVExploreError

    p = kvexplore.plan(QWEN, gpu="A100")
    with pytest.raises(KVExploreError, match=f"{p.num_blocks:,} blocks.*num_blocks="):
        kvexplore.allocate(p)
    attn = "language_model.model.layers.3.self_attn.attn"
    assert kvexplore.allocate(p, device="meta")[attn].shape[0] == p.num_blocks  # no memory on meta
    kv = kvexplore.allocate(p, num_blocks=4)
    small = p.replace(num_blocks=4)
    assert kv[attn].shape[0] == 4 and kv[attn].untyped_storage().nbytes() == max(
        t.offset + t.size for t in small.tensors)
    edited = kvexplore.apply_kv_cache_group_edits(small.kv_cache_config, kv)
    assert kvexplore.verify_roundtrip(small.kv_cache_config, kv, edited).ok


def test_a_deployment_vllm_cannot_hold_has_no_blocks_and_says_so():
    from kvexplore.errors import KVExploreError

    p = kvexplore.plan("deepseek-ai/DeepSeek-V3", gpu="H100")  # 671B parameters on one card
    assert p.loaded_weight_bytes > p.gpu.memory_bytes
    assert (p.num_blocks, p.kv_cache_memory_bytes, p.admission.ok) == (0, 0, False)
    assert p.admission.message.startswith("No available memory for the cache blocks")
    assert p.bytes_per_block == p.replace(num_blocks=16).bytes_per_block > 0  # a layout fact
    drawn, same = kvexplore.page_layout(p, 0), kvexplore.page_layout(p.replace(num_blocks=16), 0)
    assert drawn.segments == same.segments and drawn.kind == "mla_attention"
    assert drawn.notes[-1].startswith(
        f"no blocks: {release_name()} would not start (No available memory")
    assert p.figure() is not None
    with pytest.raises(KVExploreError, match="block=1 is out of range"):
        kvexplore.page_layout(p, 0, block=1)
    tiny = kvexplore.plan(QWEN, gpu="A100", kv_cache_memory_bytes=1)  # given memory, no blocks
    assert tiny.num_blocks == 0 and tiny.bytes_per_block == 6 * 544 * 2048
    assert kvexplore.page_layout(tiny, 0).notes[-1].startswith("no blocks")


@pytest.mark.parametrize("bad", [0, 1.5, "0.9", True, -0.5])
def test_plan_refuses_a_bad_gpu_memory_utilization(bad):
    from kvexplore.errors import KVExploreError

    with pytest.raises(KVExploreError, match=f"gpu_memory_utilization={bad!r} is invalid; "
                                             "expected a number in \\(0, 1\\]"):
        kvexplore.plan(QWEN, gpu="A100", gpu_memory_utilization=bad)


def test_num_blocks_window_of_a_plan_sized_by_given_memory():
    p = kvexplore.plan(QWEN, gpu="A100", kv_cache_memory_bytes=1 << 30)
    assert p.num_blocks == (1 << 30) // (6 * 544 * 2048)  # by hand: 6 pages of 544 x 2048 B
    small = p.with_num_blocks(4)
    assert (small.num_blocks, small.block_size, small.request.kv_cache_memory_bytes) == (4, 544, None)
    kv = kvexplore.allocate(p, num_blocks=4)
    attn = "language_model.model.layers.3.self_attn.attn"
    assert kv[attn].shape[0] == 4
    assert kv[attn].untyped_storage().nbytes() == 4 * 6 * 544 * 2048


def test_cli_plan_takes_gpu_memory_utilization(capsys):
    import json

    from kvexplore.cli import main

    assert main(["plan", QWEN, "--gpu", "A100", "--gpu-memory-utilization", "0.5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    half = kvexplore.plan(QWEN, gpu="A100", gpu_memory_utilization=0.5)
    assert out["num_blocks"] == half.num_blocks < kvexplore.plan(QWEN, gpu="A100").num_blocks
    assert out["kv_cache_memory_bytes"] == half.kv_cache_memory_bytes
