"""vLLM's start-up memory profile, estimated on the meta device.

Each term against vLLM's own function where one runs offline, against facts
countable by hand, or against a public start-up log's figure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.worker.utils import request_memory

import kvexplore
from kvexplore.planning.profile import LiveBytes

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
    r = llama_h100.capacity(0.95, cudagraph_bytes=0)
    snapshot = SimpleNamespace(total_memory=r.total_memory_bytes, free_memory=r.total_memory_bytes)
    cache = SimpleNamespace(gpu_memory_utilization=0.95)
    assert r.requested_memory_bytes == request_memory(snapshot, cache)


def test_weights_equal_what_vllm_logs_as_model_loading(llama_h100):
    # "Model loading took 14.99 GiB memory" (vLLM 0.19.0, H100, Llama-3.1-8B-Instruct)
    assert round(llama_h100.loaded_weight_bytes / GiB, 2) == 14.99
    assert llama_h100.memory_profile.weights.low == llama_h100.loaded_weight_bytes


def test_activation_range_brackets_the_logged_peak_and_the_sampler(llama_h100):
    mp = llama_h100.memory_profile
    # vLLM serve's H100 defaults: 8,192 batched tokens, 1,024 sequences
    assert (mp.max_num_batched_tokens, mp.max_num_seqs) == (8192, 1024)
    fp32_logits = 1024 * 128256 * 4
    assert mp.activation_peak.low >= 3 * fp32_logits
    assert mp.forward_peak_bytes > 8192 * 4096 * 2  # at least the output hidden states
    # "torch peak memory increase: 1.89GiB" (vLLM 0.19.0, same model, GPU and defaults)
    assert mp.activation_peak.low <= 1.89 * GiB <= mp.activation_peak.high


def test_cudagraph_estimate_scales_with_vllms_capture_sizes(llama_h100):
    sizes = llama_h100.vllm_config.compilation_config.cudagraph_capture_sizes
    term = llama_h100.memory_profile.cudagraph
    # FULL_AND_PIECEWISE: two modes, 8-260 MiB first graph, 6-8 MiB each further one
    n = len(sizes)
    assert term.low == 2 * (8 + (n - 1) * 6) << 20
    assert term.high == 2 * (260 + (n - 1) * 8) << 20


def test_kv_memory_against_the_logged_run(llama_h100):
    # vLLM 0.19.0 on an H100: "Available KV cache memory: 58.11 GiB" at
    # --gpu-memory-utilization 0.95; 0.19 did not subtract the CUDA-graph estimate
    r = llama_h100.capacity(0.95, cudagraph_bytes=0)
    low, high = (x / GiB for x in r.kv_cache_memory_range)
    assert low <= 58.11 <= high
    assert abs(low - 58.11) / 58.11 < 0.03
    assert r.kv_cache_memory == r.kv_cache_memory_range[0]


def test_non_torch_memory_grows_with_tensor_parallelism():
    one = kvexplore.plan(LLAMA, gpu="H100").memory_profile.non_torch
    two = kvexplore.plan(LLAMA, gpu="H100", tensor_parallel_size=2).memory_profile.non_torch
    assert one.high < two.low  # NCCL buffers at TP >= 2
