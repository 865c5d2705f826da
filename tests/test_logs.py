"""Start-up logs: read (every figure each public excerpt holds, exactly),
checked against kvexplore, calibrated.

Every file under ``tests/data/logs`` is an excerpt of a public vLLM start-up
log (its first lines name the source URL and the release).  The expected
figures below were read by eye from those files: a figure as printed (memory,
percentages, concurrency) or as a number (tokens, sizes, names)."""

from __future__ import annotations

import json
import math
import pathlib

import pytest

import kvexplore
from kvexplore.errors import KVExploreError
from kvexplore.logs.reading import FIGURES, read_log

LOGS = pathlib.Path(__file__).parent / "data" / "logs"
GiB = 1 << 30

#: Figures shown as printed (the rest as values).
PRINTED = {"max_concurrency", "mamba_padding_percent", "padding_layers_waste_percent"}

EXPECTED = {
    "admission-refused-pp2.log": {
        "max_model_len": 262144,
        "needed_kv_cache_bytes": "24.0 GiB",
        "kv_cache_memory_bytes": "3.18 GiB",
        "estimated_max_model_len": 34736,
    },
    "breakdown-workers-3090.log": {
        "weight_bytes": "21.21GiB",
        "non_torch_bytes": "0.20GiB",
        "activation_peak_bytes": "0.37GiB",
        "kv_cache_memory_bytes": "1.57GiB",
        "total_memory_bytes": "23.58GiB",
        "gpu_memory_utilization": 0.99,
        "requested_memory_bytes": "23.35GiB",
    },
    "cudagraph-estimate-gb300.log": {"cudagraph_bytes": "118.65 GiB"},
    "cudagraph-estimate-tp2.log": {
        "cudagraph_bytes": "0.36 GiB",
        "gpu_memory_utilization": 0.82,
        "equivalent_utilization": 0.8048,
        "suggested_utilization": 0.8352,
        "kv_cache_memory_bytes": "6.87 GiB",
    },
    "gemma4-26b-a100.log": {
        "weight_bytes": "48.5 GiB",
        "kv_cache_memory_bytes": "21.5 GiB",
    },
    "glm5next-block-7808-wrapped.log": {"attention_block_size": 7808},
    "gpt-oss-20b-a100.log": {
        "weight_bytes": "13.72 GiB",
        "kv_cache_memory_bytes": "36.56 GiB",
        "vllm_version": "0.19.0",
        "model": "openai/gpt-oss-20b",
        "gpu_memory_utilization": 0.65,
        "max_model_len": 131072,
    },
    "journald-v100-tp4.log": {
        "kv_cache_memory_bytes": "5.35 GiB",
        "kv_cache_size_tokens": 215401,
        "max_model_len": 8192,
        "max_concurrency": "26.29x",
    },
    "kimi-linear-awq-tp2.log": {
        "kv_cache_memory_bytes": "2.30 GiB",
        "padding_layers": 1,
        "padding_layers_waste_percent": "5.00%",
        "kv_cache_size_tokens": 75840,
        "max_model_len": 120000,
        "max_concurrency": "2.48x",
    },
    "kv-size-tokens-first.log": {
        "kv_cache_size_tokens": 2042016,
        "max_model_len": 2048,
        "max_concurrency": "997.08x",
    },
    "llama31-8b-3090-20k.log": {
        "weight_bytes": "14.9888 GB (vLLM's bytes / 2**30)",
        "total_memory_bytes": "23.58GiB",
        "peak_torch_bytes": "17.06GiB",
        "non_torch_bytes": "0.35GiB",
        "kv_cache_memory_bytes": "3.81GiB",
        "gpu_memory_utilization": 0.9,
        "num_gpu_blocks": 1952,
        "max_model_len": 20000,
        "max_concurrency": "1.56x",
    },
    "llama31-8b-3090-29k.log": {
        "weight_bytes": "14.9888 GB (vLLM's bytes / 2**30)",
        "total_memory_bytes": "23.58GiB",
        "peak_torch_bytes": "17.98GiB",
        "non_torch_bytes": "0.35GiB",
        "kv_cache_memory_bytes": "2.89GiB",
        "gpu_memory_utilization": 0.9,
        "num_gpu_blocks": 1478,
        "max_model_len": 29000,
        "max_concurrency": "0.82x",
    },
    "llama32-1b-args-only.log": {"max_model_len": 1024, "max_num_batched_tokens": 8192},
    "llama70b-w8a8-gpu-blocks.log": {
        "weight_bytes": "67.7229 GB (vLLM's bytes / 2**30)",
        "num_gpu_blocks": 1381,
        "max_model_len": 2048,
        "max_concurrency": "10.79x",
    },
    "nvfp4-kv-5090-laptop.log": {
        "kv_cache_memory_bytes": "2.97 GiB",
        "kv_cache_size_tokens": 150745,
    },
    "qwen3-235b-fp8-tp4.log": {
        "kv_cache_memory_bytes": "8.11 GiB",
        "kv_cache_size_tokens": 178880,
    },
    "qwen3-8b-gguf-v0180-logo.log": {
        "vllm_version": "0.18.0",
        "model": "/models/unsloth/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf",
        "kv_cache_dtype": "fp8",
        "gpu_memory_utilization": 0.79,
        "max_num_seqs": 16,
        "max_model_len": 16384,
    },
    "qwen3-8b-lmcache-v0102.log": {
        "vllm_version": "0.10.2",
        "engine": "V1",
        "model": "Qwen/Qwen3-8B",
        "dtype": "bfloat16",
        "max_model_len": 16384,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "quantization": None,
        "enforce_eager": False,
        "kv_cache_dtype": "auto",
        "enable_prefix_caching": False,
        "speculative_config": None,
    },
    "qwen38-dummy-h100-block-544.log": {
        "max_model_len": 2048,
        "max_num_batched_tokens": 16384,
        "attention_backend": "FLASH_ATTN",
        "attention_block_size": 544,
        "mamba_padding_percent": "2.64%",
    },
    "qwen3-next-awq-gfx906-args.log": {
        "vllm_version": "0.10.2.dev756+gfx906.update1.gcdfcd781c",
        "model": "/mnt/models/vllm_models/Qwen3-Next-80B-A3B-Thinking-AWQ-8bit/",
        "tensor_parallel_size": 4,
        "gpu_memory_utilization": 0.95,
        "max_num_batched_tokens": 7168,
        "max_num_seqs": 80,
        "max_model_len": 131072,
    },
    "qwen35-122b-gptq-logo-dev.log": {
        "vllm_version": "0.1.dev14845+g57a314d15.d20260316",
        "model": "Qwen/Qwen3.5-122B-A10B-GPTQ-Int4",
        "tensor_parallel_size": 2,
        "enable_prefix_caching": True,
        "max_num_seqs": 16,
        "max_model_len": 131072,
    },
    "qwen3-model-loading-v085-docker.log": {"weight_bytes": "14.2474 GiB"},
    "qwen3-next-kv-fp8.log": {
        "kv_cache_size_tokens": 90048,
        "max_model_len": 215040,
        "max_concurrency": "1.66x",
    },
    "qwen35-nvfp4-5090-1m.log": {
        "attention_backend": "FLASHINFER",
        "padding_layers": 3,
        "padding_layers_waste_percent": "6.25%",
        "kv_cache_size_tokens": 1823372,
        "max_model_len": 1048576,
        "max_concurrency": "1.74x",
    },
    "qwen36-27b-3090-tp0.log": {"kv_cache_memory_bytes": "10.55 GiB"},
    "qwen36-27b-mtp-dual3090.log": {
        "kv_cache_size_tokens": 620944,
        "max_model_len": 262144,
        "max_concurrency": "2.37x",
        "model": "~/.cache/huggingface/qwen3.6-27b-autoround-int4",
        "dtype": "float16",
        "tensor_parallel_size": 2,
        "quantization": "auto_round",
        "kv_cache_dtype": "fp8_e5m2",
        "enable_prefix_caching": True,
        "speculative_config": {"method": "mtp", "num_speculative_tokens": 3},
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 2,
    },
    "qwen36-35b-autoround-dual5090-banner.log": {
        "model": "~/.cache/huggingface/qwen3.6-35b-a3b-autoround-int4",
        "dtype": "float16",
        "tensor_parallel_size": 2,
        "quantization": "auto_round",
        "kv_cache_dtype": "fp8_e4m3",
        "enable_prefix_caching": True,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 1,
        "max_model_len": 262144,
        "vllm_version": "0.25.1",
        "engine": "V1",
        "speculative_config": None,
    },
    "qwen36-35b-nvfp4-5090-a.log": {
        "kv_cache_memory_bytes": "5.98 GiB",
        "kv_cache_size_tokens": 567978,
        "max_model_len": 131072,
        "max_concurrency": "4.33x",
        "model": "~/.cache/huggingface/qwen3.6-35b-a3b-nvfp4",
        "dtype": "bfloat16",
        "quantization": "modelopt",
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": True,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 1,
        "vllm_version": "0.24.0",
        "engine": "V1",
    },
    "qwen36-35b-nvfp4-5090-b.log": {
        "kv_cache_memory_bytes": "6.01 GiB",
        "kv_cache_size_tokens": 569878,
        "max_model_len": 131072,
        "max_concurrency": "4.35x",
        "model": "~/.cache/huggingface/qwen3.6-35b-a3b-nvfp4",
        "dtype": "bfloat16",
        "quantization": "modelopt",
        "kv_cache_dtype": "fp8",
        "enable_prefix_caching": True,
        "max_num_batched_tokens": 8192,
        "max_num_seqs": 1,
        "vllm_version": "0.24.0",
        "engine": "V1",
    },
    "qwen38-27b-3090-arm1.log": {
        "attention_block_size": 480,
        "mamba_padding_percent": "1.27%",
    },
    "qwen38-27b-3090-arm2.log": {
        "attention_block_size": 864,
        "mamba_padding_percent": "1.09%",
    },
    "qwen38-27b-5090-block-1648.log": {
        "attention_block_size": 1648,
        "mamba_padding_percent": "0.73%",
    },
    "qwen38-27b-dual3090-dflash.log": {
        "kv_cache_size_tokens": 344579,
        "max_model_len": 163840,
        "max_concurrency": "2.10x",
    },
    "qwen38-27b-fp8-tp2.log": {
        "kv_cache_size_tokens": 302921,
        "max_model_len": 131072,
        "max_concurrency": "2.31x",
    },
    "qwen38-27b-nvfp4-a6000.log": {
        "weight_bytes": "19.75 GiB",
        "attention_block_size": 1568,
        "mamba_padding_percent": "0.13%",
    },
    "qwen3vl-a800-failed.log": {"kv_cache_memory_bytes": "13.69 GiB"},
    "v054-banner-split.log": {
        "vllm_version": "0.5.4",
        "model": "/mnt/models/models--meta-llama--llama-3-1-70b-instruct",
        "dtype": "float16",
        "max_model_len": 131072,
        "tensor_parallel_size": 2,
        "speculative_config": None,
    },
    "v064-breakdown-t4.log": {
        "total_memory_bytes": "15.77GiB",
        "gpu_memory_utilization": 0.9,
        "requested_memory_bytes": "14.20GiB",
        "weight_bytes": "7.51GiB",
        "non_torch_bytes": "0.39GiB",
        "activation_peak_bytes": "2.53GiB",
        "kv_cache_memory_bytes": "3.76GiB",
        "num_gpu_blocks": 3852,
        "max_model_len": 40000,
        "max_concurrency": "1.54x",
    },
    "v064-opt125m-banner.log": {
        "vllm_version": "0.6.4.post2.dev395+g02222a02.d20241217",
        "engine": "V0",
        "model": "/home/cmq/.cache/huggingface/hub/models--facebook--opt-125m/snapshots/27dcfa74d334bc871f3234de431e71c6eeba5dd6",
        "dtype": "float16",
        "max_model_len": 2048,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 1,
        "quantization": None,
        "enforce_eager": True,
        "kv_cache_dtype": "auto",
        "speculative_config": None,
    },
    "v066-qwen2-pp2-banner.log": {
        "vllm_version": "0.6.6",
        "model": "/workspace/models/models--Qwen--Qwen2-0.5B",
        "dtype": "bfloat16",
        "max_model_len": 131072,
        "tensor_parallel_size": 1,
        "pipeline_parallel_size": 2,
        "quantization": None,
        "enforce_eager": False,
        "kv_cache_dtype": "auto",
        "enable_prefix_caching": False,
        "speculative_config": None,
    },
    "v074-dsv2-lite-banner.log": {
        "max_num_batched_tokens": 8192,
        "vllm_version": "0.7.4.dev713+gb4961126",
        "engine": "V1",
        "model": "/disc/data1/deepseek/DeepSeek-V2-Lite-Chat/",
        "dtype": "bfloat16",
        "max_model_len": 32768,
        "tensor_parallel_size": 1,
        "speculative_config": None,
    },
    "v083-banner-tp8-pp2.log": {
        "vllm_version": "0.8.3",
        "engine": "V0",
        "model": "nvidia/Llama-3_1-Nemotron-Ultra-253B-v1",
        "dtype": "bfloat16",
        "max_model_len": 1024,
        "tensor_parallel_size": 8,
        "pipeline_parallel_size": 2,
        "quantization": None,
        "enforce_eager": True,
        "kv_cache_dtype": "auto",
        "speculative_config": None,
    },
    "xpu-block-size-528.log": {
        "attention_block_size": 528,
        "mamba_padding_percent": "0.76%",
    },
}

#: Lines each excerpt names a figure on without a readable value (a cut-off paste).
UNREAD = {
    "nvfp4-kv-5090-laptop.log": [5, 6],
    "qwen3-next-awq-gfx906-args.log": [6],
    "qwen3-8b-lmcache-v0102.log": [4],
    "qwen36-35b-autoround-dual5090-banner.log": [4],
    "qwen36-35b-nvfp4-5090-a.log": [8],
    "qwen36-35b-nvfp4-5090-b.log": [8],
    "v054-banner-split.log": [4],
    "v064-opt125m-banner.log": [3],
    "v066-qwen2-pp2-banner.log": [3],
    "v083-banner-tp8-pp2.log": [4],
}


def _shown(figure):
    if figure.name.endswith("_bytes") or figure.name in PRINTED:
        return figure.text
    return figure.value


def test_the_excerpts_are_public_and_many():
    files = sorted(LOGS.glob("*.log"))
    releases = set()
    for path in files:
        head = path.read_text().splitlines()[:2]
        assert head[0].startswith("# source: https://"), path.name
        assert head[1].startswith("# vllm: "), path.name
        release = head[1].removeprefix("# vllm: ").split()[0]
        if release[0].isdigit():
            releases.add(release)
    assert len(files) >= 30
    assert len(releases) >= 8
    assert set(EXPECTED) | {"sglang-qwen3-235b.log"} == {p.name for p in files}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_excerpt_gives_exactly_its_figures(name):
    log = read_log(LOGS / name)
    got = {}
    for figure in log.figures:
        got.setdefault(figure.name, _shown(figure))
        assert figure.source.strip() in (LOGS / name).read_text()
    assert got == EXPECTED[name]
    assert [n for n, _ in log.unread] == UNREAD.get(name, [])
    assert len(log.contradictions) == 0
    assert log.name == name


def test_values_are_read_strictly():
    log = read_log(LOGS / "llama31-8b-3090-20k.log")
    assert log.get("kv_cache_memory_bytes") == round(3.81 * GiB)
    assert log.first("kv_cache_memory_bytes").resolution == pytest.approx(0.005 * GiB)
    assert log.get("weight_bytes") == round(
        14.9888 * GiB
    )  # vLLM's "GB" is bytes / 2**30
    assert (
        read_log(LOGS / "kv-size-tokens-first.log").get("kv_cache_size_tokens")
        == 2042016
    )
    # a grouping that is not thousands, a concurrency without its x: not read
    odd = read_log(
        "GPU KV cache size: 2,63,1546 tokens\nMaximum concurrency for 8,192 tokens "
        "per request: 10.04\nAvailable KV cache memory: 1.5 GiB"
    )
    assert [f.name for f in odd.figures] == ["kv_cache_memory_bytes"]
    assert [n for n, _ in odd.unread] == [1, 2]
    with pytest.raises(KVExploreError, match="no vLLM start-up figure"):
        read_log("Available KV cache memory: 1.5 GB")  # vLLM prints this one in GiB


def test_one_line_capacity_of_newer_releases():
    log = read_log(
        "(EngineCore_DP0 pid=123) INFO 11-02 10:00:00 [kv_cache_utils.py:1147] GPU KV "
        "cache size: 2,631,546 tokens, Maximum concurrency for 262,144 tokens per "
        "request: 10.04x"
    )
    assert (
        log.get("kv_cache_size_tokens"),
        log.get("max_model_len"),
        log.get("max_concurrency"),
    ) == (2631546, 262144, 10.04)
    assert log.first("max_concurrency").process == "EngineCore_DP0 pid=123"


def test_colours_and_interleaved_workers():
    text = (LOGS / "breakdown-workers-3090.log").read_text()
    coloured = "".join(f"\x1b[32m{line}\x1b[0m\n" for line in text.splitlines())
    plain, ansi = read_log(text), read_log(coloured)
    assert [(f.name, f.value) for f in ansi.figures] == [
        (f.name, f.value) for f in plain.figures
    ]
    assert len(plain.statements("weight_bytes")) == 3  # three workers, one value
    assert {f.process for f in plain.statements("weight_bytes")} == {
        "VllmWorkerProcess pid=521",
        "VllmWorkerProcess pid=507",
        "VllmWorkerProcess pid=577",
    }
    assert plain.get("weight_bytes") == round(21.21 * GiB)
    docker = read_log(LOGS / "qwen3-model-loading-v085-docker.log")
    assert len(docker.statements("weight_bytes")) == 4
    assert len(docker.contradictions) == 0


def test_deployment_and_what_it_leaves_out():
    log = read_log(LOGS / "qwen3-8b-lmcache-v0102.log")
    assert log.release == "0.10.2"
    assert log.deployment["model"] == "Qwen/Qwen3-8B"
    assert log.deployment["tensor_parallel_size"] == 1
    assert "gpu_name" in log.not_stated and "gpu_memory_utilization" in log.not_stated
    assert "model" not in log.not_stated


def test_contradicting_numbers_are_reported_never_averaged():
    a = (LOGS / "qwen36-35b-nvfp4-5090-a.log").read_text()
    b = (LOGS / "qwen36-35b-nvfp4-5090-b.log").read_text()
    log = read_log(a + b)
    rows = log.contradictions.set_index("figure")
    assert "5.98 GiB" in rows.loc["kv_cache_memory_bytes", "values"]
    assert "6.01 GiB" in rows.loc["kv_cache_memory_bytes", "values"]
    assert "kv_cache_size_tokens" in rows.index
    with pytest.raises(
        KVExploreError, match="contradicts itself on kv_cache_memory_bytes"
    ):
        log.get("kv_cache_memory_bytes")
    assert log.get("max_model_len") == 131072  # the same in both: no contradiction


def _written(path: pathlib.Path, data: bytes) -> pathlib.Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda d: _written(d / "empty.log", b""), "empty"),
        (lambda d: _written(d / "b.log", b"\x7fELF\x00\x01\x02" * 50), "binary"),
        (lambda d: LOGS / "sglang-qwen3-235b.log", "SGLang"),
        (lambda d: d / "missing.log", "not a file"),
        (lambda d: "hello world\nnothing here", "no vLLM start-up figure"),
    ],
)
def test_bad_input_is_one_clear_error(tmp_path, make, match):
    with pytest.raises(KVExploreError, match=match):
        read_log(make(tmp_path))


def test_unknown_figure_name_is_refused():
    with pytest.raises(KVExploreError, match="figure 'kv_blocks' is unknown"):
        read_log(LOGS / "kv-size-tokens-first.log").get("kv_blocks")
    assert "kv_cache_size_tokens" in FIGURES


# ---------------------------------------------------------------------------
# check_log and calibrate: plan with the installed vLLM
# ---------------------------------------------------------------------------


def test_a_model_kvexplore_cannot_find_is_named():
    with pytest.raises(KVExploreError, match=r"qwen3\.6-35b-a3b-nvfp4.*--model PATH"):
        kvexplore.check_log(LOGS / "qwen36-35b-nvfp4-5090-a.log", gpu="RTX 5090")
    with pytest.raises(KVExploreError, match="does not name its model"):
        kvexplore.check_log(LOGS / "qwen3-next-kv-fp8.log", gpu="H100")
    with pytest.raises(KVExploreError, match="does not name a GPU"):
        kvexplore.check_log(LOGS / "gpt-oss-20b-a100.log")


def test_check_log_on_a_catalog_model():
    c = kvexplore.check_log(LOGS / "gpt-oss-20b-a100.log", gpu="A100")
    rows = c.rows.set_index("figure")
    own = kvexplore.capacity(
        "openai/gpt-oss-20b",
        gpu="A100",
        max_model_len=131072,
        gpu_memory_utilization=0.65,
        cudagraph_bytes=0,
    )
    assert rows.loc["weight_bytes", "log"] == "13.72 GiB"
    assert rows.loc["weight_bytes", "kvexplore"] == f"{own.weight_bytes / GiB:.2f} GiB"
    assert rows.loc["weight_bytes", "term"] == "weights"
    # kvexplore's meta-device weights are within 1% of what vLLM 0.19.0 loaded
    assert abs(own.weight_bytes - round(13.72 * GiB)) / (13.72 * GiB) < 0.01
    assert (
        rows.loc["kv_cache_memory_bytes", "kvexplore"]
        == f"{own.kv_cache_memory / GiB:.2f} GiB"
    )
    assert abs(own.kv_cache_memory - round(36.56 * GiB)) / (36.56 * GiB) < 0.01
    assert bool(rows.loc["max_model_len", "equal"]) is True
    assert "0.19.0" in c.release_note and c.installed in c.release_note
    assert any("does not subtract CUDA graphs" in n for n in c.notes)
    assert "determine_available_memory" in rows.loc["kv_cache_memory_bytes", "rule"]
    text, html, fig = c.text(), c._repr_html_(), c.figure()
    assert "13.72 GiB" in text and "<table" in html
    assert len(fig.axes) == 1 and len(fig.axes[0].patches) >= 3


def test_check_log_of_a_hybrid_at_the_log_s_memory():
    """Kimi-Linear (KDA + MLA) on two RTX 3090s: the AWQ checkpoint does not
    match the catalog's bf16 config, so kvexplore's own memory estimate refuses
    it; the capacity figures are answered at the log's KV memory.  The flags
    are the issue's command line."""
    c = kvexplore.check_log(
        LOGS / "kimi-linear-awq-tp2.log",
        model="moonshotai/Kimi-Linear-48B-A3B-Instruct",
        gpu="RTX 3090",
        tensor_parallel_size=2,
        gpu_memory_utilization=0.95,
        enable_prefix_caching=True,
        max_num_batched_tokens=64000,
        max_num_seqs=8,
    )
    rows = c.rows.set_index("figure")
    assert c.report is None and any("refuses" in n for n in c.notes)
    at = c.at_log_memory
    assert at.kv_cache_memory == round(2.30 * GiB)
    assert (
        rows.loc["max_concurrency", "kvexplore at the log's KV memory"]
        == f"{round(at.max_concurrency, 2):.4g}"
    )
    assert abs(at.max_concurrency - 2.48) / 2.48 < 0.05
    assert "num_blocks x block_size" in rows.loc["kv_cache_size_tokens", "term"]


def test_check_log_reports_a_contradiction(tmp_path):
    path = tmp_path / "two.log"
    path.write_text(
        (LOGS / "gpt-oss-20b-a100.log").read_text()
        + "Available KV cache memory: 30.00 GiB\n"
    )
    c = kvexplore.check_log(path, gpu="A100")
    row = c.rows.set_index("figure").loc["kv_cache_memory_bytes"]
    assert row["log"] == "contradicts itself" and row["equal"] is None
    assert "30.00 GiB" in c.contradictions.values[0][1]


def test_calibration_predicts_another_log_of_the_same_model_and_gpu():
    """Llama-3.1-8B on an RTX 3090 (vLLM V0, no chunked prefill: the dummy
    forward is max_model_len tokens): calibrated on the 20,000-token log, the
    29,000-token log's KV cache memory is predicted within 2%; uncalibrated,
    kvexplore's estimate is further off."""
    kw = {"max_model_len": 20000, "max_num_batched_tokens": 20000}
    cal = kvexplore.calibrate(
        LOGS / "llama31-8b-3090-20k.log",
        model="meta-llama/Llama-3.1-8B-Instruct",
        gpu="RTX 3090",
        **kw,
    )
    assert cal.total_memory_bytes == round(23.58 * GiB)
    assert cal.weight_bytes == round(14.9888 * GiB)
    assert cal.activation_peak_bytes == round(17.06 * GiB) - round(14.9888 * GiB)
    model = "meta-llama/Llama-3.1-8B-Instruct"
    same = kvexplore.capacity(model, calibration=cal, **kw)
    assert abs(same.kv_cache_memory - round(3.81 * GiB)) <= 0.005 * GiB
    assert set(same.calibrated.values()) == {"carried"}
    other = kvexplore.capacity(
        model, calibration=cal, max_model_len=29000, max_num_batched_tokens=29000
    )
    actual = round(2.89 * GiB)
    error = (other.kv_cache_memory - actual) / actual
    assert abs(error) < 0.02
    assert other.calibrated["activation_peak_bytes"] == "rescaled"
    plain = kvexplore.capacity(
        model,
        gpu="RTX 3090",
        gpu_memory_utilization=0.9,
        max_model_len=29000,
        max_num_batched_tokens=29000,
    )
    assert abs(plain.kv_cache_memory - actual) / actual > abs(error)


def test_a_calibration_carries_machine_terms_to_another_model():
    cal = kvexplore.calibrate(LOGS / "gpt-oss-20b-a100.log", gpu="A100")
    assert "non_torch_bytes" in cal.measured and "weight_bytes" in cal.measured
    assert cal.release == "0.19.0" and cal.model == "openai/gpt-oss-20b"
    r = kvexplore.capacity("Qwen/Qwen3.5-0.8B", calibration=cal)
    assert r.calibrated["non_torch_bytes"] == "carried"
    assert r.calibrated["weight_bytes"] == "recomputed"
    assert r.non_torch_bytes == cal.non_torch_bytes
    assert r.sources["non_torch_bytes"].startswith("carried")
    assert r.gpu_memory_utilization == 0.65  # the log's
    with pytest.raises(KVExploreError, match="measures a A100"):
        kvexplore.capacity("Qwen/Qwen3.5-0.8B", calibration=cal, gpu="H100")
    assert "calibration" in cal.text() and "<table" in cal._repr_html_()
    cal.figure()


def test_command_line(capsys):
    from kvexplore.cli import main

    assert (
        main(
            ["check-log", str(LOGS / "gpt-oss-20b-a100.log"), "--gpu", "A100", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert out["release"] == "0.19.0"
    assert {r["figure"] for r in out["rows"]} >= {
        "weight_bytes",
        "kv_cache_memory_bytes",
    }
    assert (
        main(["check-log", str(LOGS / "sglang-qwen3-235b.log"), "--gpu", "A100"]) == 2
    )
    err = capsys.readouterr().err
    assert (
        err.startswith("kvexplore: error:")
        and "SGLang" in err
        and len(err.splitlines()) == 1
    )


def test_a_read_log_displays():
    log = kvexplore.read_log(LOGS / "v064-breakdown-t4.log")
    assert "3.76GiB" in log.text() and "not stated" in log.text()
    assert "<table" in log._repr_html_()
    assert len(log.figure().axes[0].patches) == 4


def test_the_lines_of_newer_releases():
    """Lines as vLLM 0.33's source prints them (``logger`` format strings in
    ``gpu_model_runner.py``, ``platforms/interface.py``, ``kv_cache_utils.py``,
    ``kv_cache_planning.py``, ``gpu_worker.py``, ``attention/backends/utils.py``)."""
    text = "\n".join(
        [
            "(Worker_TP1 pid=7) INFO [gpu_model_runner.py:5089] Model loading took 38.8 GiB memory "
            "and 41.200000 seconds",
            "(EngineCore_DP0 pid=3) INFO [interface.py:1109] Setting attention block size to 640 "
            "tokens to ensure that attention page size is >= mamba page size.",
            "(EngineCore_DP0 pid=3) INFO [interface.py:1133] Padding mamba page size by 20.75% to "
            "ensure that mamba page size and attention page size are exactly equal.",
            "(EngineCore_DP0 pid=3) INFO [kv_cache_utils.py:865] kv cache group sizes (640, 640, 640)",
            "(EngineCore_DP0 pid=3) INFO [kv_cache_utils.py:866] kv lcm block sizes 640",
            "(EngineCore_DP0 pid=3) INFO [utils.py:381] Using BLHNC KV cache layout.",
            "(Worker_TP0 pid=6) INFO [cuda.py:448] Using FLASH_ATTN backend.",
            "(EngineCore_DP0 pid=3) WARNING [kv_cache_planning.py:538] Add 6 padding layers, may "
            "waste at most 15.38% KV cache memory",
            "(Worker_TP0 pid=6) INFO [gpu_worker.py:790] CUDA graph memory profiling is enabled "
            "(default since v0.21.0). The current --gpu-memory-utilization=0.9000 is equivalent to "
            "--gpu-memory-utilization=0.8874 without CUDA graph memory profiling. To maintain the "
            "same effective KV cache size as before, increase --gpu-memory-utilization to 0.9126. "
            "To disable, set VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=0.",
            "[rank0]: the current vLLM instance can use total_gpu_memory (79.19GiB) x "
            "gpu_memory_utilization (0.90) = 71.27GiB",
            "GPU 0: NVIDIA H200 (139.81 GiB)",
            "kv cache group sizes [16, 32]",
        ]
    )
    log = read_log(text)
    assert log.get("weight_bytes") == round(38.8 * GiB)
    assert log.get("attention_block_size") == 640
    assert log.first("mamba_padding_percent").text == "20.75%"
    assert log.statements("kv_cache_group_block_sizes")[0].value == (640, 640, 640)
    assert log.statements("kv_cache_group_block_sizes")[1].value == (16, 32)
    assert "kv_cache_group_block_sizes" in set(log.contradictions.figure)
    assert log.get("kv_lcm_block_size") == 640
    assert log.get("kv_cache_layout") == "BLHNC"
    assert log.get("attention_backend") == "FLASH_ATTN"
    assert (log.get("padding_layers"), log.get("padding_layers_waste_percent")) == (
        6,
        15.38,
    )
    assert (log.get("equivalent_utilization"), log.get("suggested_utilization")) == (
        0.8874,
        0.9126,
    )
    assert log.statements("gpu_memory_utilization")[0].value == 0.9
    assert log.statements("total_memory_bytes")[0].text == "79.19GiB"
    assert log.first("total_memory_bytes").process == "rank0"
    assert log.get("gpu_name") == "NVIDIA H200"
    from kvexplore.logs.deployment import resolve_gpu_of

    assert resolve_gpu_of(log, None)[0].name == "H200"


def test_calibrate_without_a_model_when_the_log_states_every_term():
    cal = kvexplore.calibrate(LOGS / "breakdown-workers-3090.log", gpu="RTX 3090")
    assert cal.model is None and cal.gpu == "RTX 3090"
    assert (cal.total_memory_bytes, cal.weight_bytes, cal.non_torch_bytes) == (
        round(23.58 * GiB),
        round(21.21 * GiB),
        round(0.20 * GiB),
    )
    assert cal.activation_peak_bytes == round(0.37 * GiB)
    # the older breakdown predates the CUDA-graph estimate: that term is 0
    assert cal.cudagraph_bytes == 0
    assert "does not subtract CUDA graphs" in cal.sources["cudagraph_bytes"]
    with pytest.raises(KVExploreError, match="needs the model"):
        kvexplore.calibrate(LOGS / "cudagraph-estimate-tp2.log", gpu="RTX 4090")


def test_capacity_command_takes_a_calibration_log(capsys):
    from kvexplore.cli import main

    log = str(LOGS / "gpt-oss-20b-a100.log")
    argv = [
        "capacity",
        "openai/gpt-oss-20b",
        "--gpu",
        "A100",
        "--calibration",
        log,
        "--json",
        "--no-cache",
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    # at the log's own settings the calibrated answer gives back the log's KV cache memory
    assert abs(out["kv_cache_memory"] - round(36.56 * GiB)) <= 0.005 * GiB
    assert "weight_bytes carried" in out["derivation"]["calibration"]


def _log_of(release: str) -> str:
    """gpt-oss-20b on an A100 (a vLLM 0.19.0 log) as if ``release`` printed it."""
    text = (LOGS / "gpt-oss-20b-a100.log").read_text()
    assert "version 0.19.0" in text
    return text.replace("0.19.0", release)


def test_a_log_of_a_release_with_an_environment_is_checked_by_that_release():
    """A log printed by another release of the window whose environment
    exists: that release's own code checks it, in its environment; each
    memory figure kvexplore shows is that release's capacity() of the same
    deployment, asked of its environment apart from check_log."""
    import importlib.metadata

    from kvexplore.versions import environment, run_in

    installed = importlib.metadata.version("vllm")
    other = "0.34.0" if installed != "0.34.0" else "0.32.0"
    environment(other)  # made if missing
    c = kvexplore.check_log(_log_of(other), gpu="A100")
    assert (c.release, c.planned, c.installed) == (other, other, installed)
    assert f"{other}'s own code" in c.release_note and c.plan is None
    code = (
        "import json, kvexplore; r = kvexplore.capacity('openai/gpt-oss-20b', gpu='A100', "
        "max_model_len=131072, gpu_memory_utilization=0.65); "
        "print(json.dumps([r.weight_bytes, r.kv_cache_memory]))"
    )
    assert not any("does not subtract CUDA graphs" in n for n in c.notes)
    out = run_in(other, ["-c", code])
    assert out.returncode == 0, out.stderr[-2000:]
    weights, kv = json.loads(out.stdout.strip().splitlines()[-1])
    rows = c.rows.set_index("figure")
    assert rows.loc["weight_bytes", "kvexplore"] == f"{weights / GiB:.2f} GiB"
    assert rows.loc["kv_cache_memory_bytes", "kvexplore"] == f"{kv / GiB:.2f} GiB"
    bars = c.memory_bars.set_index("term")
    assert bars.loc["weight_bytes", "kvexplore"] == weights
    text, html, fig = c.text(), c._repr_html_(), c.figure()
    assert f"planned with vLLM {other}" in text and "<table" in html
    assert len(fig.axes[0].patches) >= 3
    # the installed release when asked
    here = kvexplore.check_log(_log_of(other), gpu="A100", vllm=installed)
    assert here.planned == installed and "(as asked)" in here.release_note
    assert here.plan is not None


def test_a_log_of_a_release_without_an_environment_is_checked_by_the_installed_one(
        tmp_path, monkeypatch):
    import importlib.metadata

    installed = importlib.metadata.version("vllm")
    other = "0.34.0" if installed != "0.34.0" else "0.32.0"
    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(tmp_path))
    c = kvexplore.check_log(_log_of(other), gpu="A100")
    assert c.planned == installed and c.release == other
    assert f"there is no environment for {other} here" in c.release_note
    assert f"kvexplore envs {other} --create" in c.release_note
    with pytest.raises(KVExploreError, match=r"'0\.2' is outside kvexplore's window"):
        kvexplore.check_log(_log_of(other), gpu="A100", vllm="0.2")


def test_a_number_past_pythons_integer_limit_is_an_unread_line():
    """A 'Maximum concurrency for N tokens' line whose N has 100,000 digits:
    Python refuses to read it (its integer-string limit), so the line is
    listed in ``unread`` and the other figures are read."""
    text = ("INFO 01-01 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens\n"
            "INFO 01-01 [kv_cache_utils.py:2] Maximum concurrency for " + "9" * 100_000
            + " tokens per request: 3.00x\n")
    log = read_log(text)
    assert log.get("kv_cache_size_tokens") == 100_000
    assert [n for n, _ in log.unread] == [2]
    assert "max_concurrency" not in [f.name for f in log.figures]


def test_a_concurrency_wrapped_onto_the_next_line_is_read():
    """A pasted capacity line cut after 'Maximum concurrency' reads with its
    continuation; cut with no continuation, it is listed in ``unread``."""
    log = read_log("INFO 01-01 GPU KV cache size: 100,000 tokens, Maximum concurrency\n"
                   "for 4,096 tokens per request: 39.08x\n")
    assert (log.get("max_concurrency"), log.get("max_model_len")) == (39.08, 4096)
    assert log.unread == ()
    cut = read_log("INFO 01-01 GPU KV cache size: 100,000 tokens, Maximum concurrency\n"
                   "INFO 01-01 Starting the API server\n")
    assert [n for n, _ in cut.unread] == [1]


#: Each rule of a figure stated after a phrase, and its line cut after the phrase
#: (the value lost: a terminal's width, a paste) or cut before its values.
CUT_LINES = {
    "Model loading took": "Model loading took",
    "Loading model weights took": "Loading model weights took",
    "Available KV cache memory": "Available KV cache memory:",
    "total_gpu_memory x gpu_memory_utilization": "total_gpu_memory (",
    "model weights take ...": "model weights take",
    "Memory profiling results": "Memory profiling results:",
    "Free memory on device": "Free memory on device (",
    "Estimated CUDA graph memory": "Estimated CUDA graph memory:",
    "Graph capturing finished": "Graph capturing finished in",
    "is equivalent to --gpu-memory-utilization": "--gpu-memory-utilization=0.9 is equivalent to",
    "Setting attention block size": "Setting attention block size to",
    "Padding mamba page size": "Padding mamba page size by",
    "kv cache group sizes": "kv cache group sizes",
    "kv lcm block sizes": "kv lcm block sizes",
    "Add N padding layers": "Add 2 padding layers",
    "GPU KV cache size": "GPU KV cache size:",
    "Maximum concurrency for": "Maximum concurrency for",
    "# GPU blocks": "# GPU blocks:",
    "Using max model len": "Using max model len",
    "Chunked prefill is enabled": "Chunked prefill is enabled with max_num_batched_tokens=",
    # the refusal wrapped: its second half, without the length and the need
    "To serve at least one request": "KV cache is needed, which is larger than the available "
                                     "KV cache memory (3.18 GiB).",
    "vLLM API server version": "vLLM API server version",
}
#: Rules whose phrase is the value itself (a backend's, a layout's, a card's
#: name; the logo's key and value): no line states them without it.
NO_PHRASE = {"Using X backend", "Using X KV cache layout", "the card", "the logo"}


def test_every_figure_cut_after_its_phrase_is_unread():
    """Each rule's line cut after its phrase is listed in ``unread`` (a new
    rule without a cut line here fails: every figure kind is covered)."""
    from kvexplore.logs.reading import RULES

    wheres = [rule.where for rule in RULES]
    assert set(wheres) == set(CUT_LINES) | NO_PHRASE
    for where, cut in CUT_LINES.items():
        log = read_log("INFO 01-01 [kv_cache_utils.py:1] GPU KV cache size: 100,000 tokens\n"
                       f"INFO 01-01 [x.py:2] {cut}\n")
        assert [n for n, _ in log.unread] == [2], where


def test_the_banner_the_installed_vllm_prints_is_read_from_the_records():
    """The engine banner as the installed vLLM prints it (``v1/engine/core.py``
    logs ``str(vllm_config)``): every figure whose record names a key vLLM
    prints is read with the config's own value."""
    from kvexplore.logs.figures import BANNER_KEYS

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", tensor_parallel_size=2,
                       enforce_eager=True, max_model_len=4096)
    config = p.vllm_config
    banner = str(config)
    log = read_log(f"INFO 01-01 [core.py:1] Initializing a V1 LLM engine (v0.33.0) with config: "
                   f"{banner}\n")
    printed = {key: name for key, name in BANNER_KEYS.items() if f" {key}=" in f" {banner}"}
    assert {"model", "max_seq_len", "tensor_parallel_size", "enforce_eager", "dtype"} <= set(printed)
    expected = {
        "model": config.model_config.model,
        "max_model_len": 4096,
        "tensor_parallel_size": 2,
        "pipeline_parallel_size": 1,
        "data_parallel_size": 1,
        "decode_context_parallel_size": 1,
        "enforce_eager": True,
        "dtype": "bfloat16",
        "kv_cache_dtype": "auto",
        "enable_prefix_caching": bool(config.cache_config.enable_prefix_caching),
        "quantization": None,
        "speculative_config": None,
    }
    for key, name in printed.items():
        assert name in log, key
        assert log.get(name) == expected[name], (key, log.get(name))
    assert log.unread == ()


def test_the_figure_lists_follow_the_records():
    """The plan keywords a log gives are exactly the deployment figures named
    as ``plan()`` keywords (kvexplore.planning.inputs; ``enforce_eager``
    aside, which zeroes the CUDA-graph term), every byte figure is in
    bytes, every line rule's keyword is in its own pattern's words, and the
    compared figures are the ones with a rule."""
    from kvexplore.logs import checking, figures
    from kvexplore.logs.reading import RULES
    from kvexplore.planning.inputs import PLAN_KEYWORDS

    deployment = {f.name for f in figures.RECORDS if f.kind == "deployment"}
    # enforce_eager is taken as the deployment's (its CUDA-graph term 0), not planned
    assert set(figures.PLAN_FIGURES) == deployment & set(PLAN_KEYWORDS) - {"enforce_eager"}
    assert all(f.unit == "bytes" for f in figures.RECORDS if f.name.endswith("_bytes"))
    assert {f.kind for f in figures.RECORDS} == set(figures.KINDS)
    assert list(checking.RULES) == [f.name for f in figures.CHECKED]
    assert all((f.term is None) == (f.rule is None) == (f.answer is None) for f in figures.RECORDS)
    for rule in RULES:
        if rule.keyword is not None:
            assert rule.keyword.lower() in rule.pattern.pattern.replace("\\", "").lower(), rule.where
    with pytest.raises(KVExploreError, match="unknown"):
        read_log(LOGS / "gpt-oss-20b-a100.log").get("kv_cache_bytes")


def test_the_residual_a_log_implies_is_ceil_of_the_request():
    """The memory the log leaves to the terms it does not state: ``ceil(total x
    utilization)`` (vLLM's ``request_memory``) less the KV memory and the
    stated terms, in the memory bars and in the KV row's explanation alike
    (gpt-oss-20b on an A100: the log states the weights and the KV memory at
    utilization 0.65; the total is kvexplore's reading of the card)."""
    from kvexplore.planning.gpus import resolve_gpu

    c = kvexplore.check_log(LOGS / "gpt-oss-20b-a100.log", gpu="A100")
    log = c.log
    assert log.get("gpu_memory_utilization") == 0.65 and "total_memory_bytes" not in log
    requested = math.ceil(resolve_gpu("A100").total_memory_range[0] * 0.65)
    residual = requested - log.get("kv_cache_memory_bytes") - log.get("weight_bytes")
    bars = c.memory_bars.set_index("term")
    assert bars.loc["requested", "log"] == requested
    assert bars.loc["not stated (residual)", "log"] == residual
    term = c.rows.set_index("figure").loc["kv_cache_memory_bytes", "term"]
    assert f"it implies {residual / GiB:.2f} GiB for them" in term
