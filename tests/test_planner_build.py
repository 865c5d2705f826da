"""The built model against facts read by hand from each catalog config.

For every catalog model on an A100 and an H100 at TP 1 and 2: which layer
indices carry which kind of cache (from the HF config's own fields, not from
kvexplore), KV heads per rank, head sizes, and the element count of every
Mamba state (from the state-shape formulas of each mixer family).  None of
these expectations comes from kvexplore's or vLLM's code.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

import kvexplore
from kvexplore.planning.models import load_model_config

GPUS = ("A100", "H100")
TPS = (1, 2)


def _config(name: str) -> dict:
    cfg = load_model_config(name).config
    return {**cfg, **(cfg.get("text_config") or {})}


def _kinds(c: dict) -> dict[int, set[str]]:
    """Layer index -> kinds of cache it carries, read from the config."""
    n = c.get("decoder_layers") or c["num_hidden_layers"]
    mt = c["model_type"]
    if mt in ("mamba", "mamba2", "falcon_mamba"):
        return {i: {"mamba"} for i in range(n)}
    if mt == "kimi_linear":  # 1-based layer lists: KDA state layers, MLA layers
        lin = c["linear_attn_config"]
        kinds = {i - 1: {"mamba"} for i in lin["kda_layers"]}
        return kinds | {i - 1: {"mla_attention"} for i in lin["full_attn_layers"]}
    if mt == "falcon_h1":
        return {i: {"full_attention", "mamba"} for i in range(n)}
    if mt == "whisper":
        return {i: {"full_attention", "cross_attention"} for i in range(n)}
    if mt == "deepseek_v3":
        return {i: {"mla_attention"} for i in range(n)}
    if mt == "llama":
        return {i: {"full_attention"} for i in range(n)}
    if mt == "jamba":
        period, offset = c["attn_layer_period"], c["attn_layer_offset"]
        return {i: {"full_attention" if i % period == offset else "mamba"} for i in range(n)}
    if mt == "nemotron_h":
        kinds = {"M": "mamba", "*": "full_attention"}
        return {i: {kinds[ch]} for i, ch in enumerate(c["hybrid_override_pattern"]) if ch in kinds}
    if mt == "qwen3_next":
        k = c["full_attention_interval"]
        return {i: {"full_attention" if (i + 1) % k == 0 else "mamba"} for i in range(n)}
    if mt == "gemma3_text":
        pattern = c.get("sliding_window_pattern", 6)
        types = c.get("layer_types") or [
            "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n)
        ]
        return {i: {"sliding_window" if t == "sliding_attention" else "full_attention"}
                for i, t in enumerate(types)}
    names = {
        "linear_attention": "mamba", "mamba": "mamba", "conv": "mamba",
        "full_attention": "full_attention", "attention": "full_attention",
        "sliding_attention": "sliding_window",
    }
    return {i: {names[t]} for i, t in enumerate(c["layer_types"])}


def _index(layer_name: str, n: int) -> int:
    """Decoder layer of a registered name. Falcon-H1 registers layer i's SSM
    mixer as ``model.{n + i}.mixer`` (vllm/model_executor/models/falcon_h1.py:
    "different index in prefix")."""
    hit = re.search(r"layers\.(\d+)\.", layer_name)
    if hit:
        return int(hit.group(1))
    return int(re.fullmatch(r"model\.(\d+)\.mixer", layer_name).group(1)) - n


def _state_elements(c: dict, tp: int) -> tuple[int, int] | None:
    """(conv elements, second state elements) per rank, by mixer family."""
    mt = c["model_type"]
    if mt.startswith(("qwen3_5", "qwen3_next")):
        hk, hv = c["linear_num_key_heads"], c["linear_num_value_heads"]
        dk, dv = c["linear_key_head_dim"], c["linear_value_head_dim"]
        conv = (c["linear_conv_kernel_dim"] - 1) * (2 * hk * dk + hv * dv) // tp
        return conv, hv // tp * dk * dv
    if mt == "lfm2":
        return (c["conv_L_cache"] - 1) * c["hidden_size"] // tp, 0
    if mt == "kimi_linear":
        return None  # KDA's four states: tests/test_real_configs.py counts them
    if mt == "falcon_mamba":  # the inner size is the config's intermediate_size
        inner = c["intermediate_size"]
        return inner // tp * (c["conv_kernel"] - 1), inner // tp * c["state_size"]
    if mt in ("jamba", "mamba"):
        inner = c.get("mamba_expand", c.get("expand")) * c["hidden_size"]
        kernel = c.get("mamba_d_conv", c.get("conv_kernel"))
        state = c.get("mamba_d_state", c.get("state_size"))
        return inner // tp * (kernel - 1), inner // tp * state
    # Mamba2 family: Codestral, Nemotron-H, Granite-4.0-H, Falcon-H1
    heads = c.get("mamba_n_heads") or c.get("mamba_num_heads") or c["num_heads"]
    head_dim = c.get("mamba_d_head") or c.get("mamba_head_dim") or c["head_dim"]
    groups = c.get("mamba_n_groups") or c["n_groups"]
    state = c.get("mamba_d_state") or c.get("ssm_state_size") or c["state_size"]
    kernel = c.get("mamba_d_conv") or c["conv_kernel"]
    inner = c.get("mamba_d_ssm") or heads * head_dim
    if groups % tp:  # groups are replicated to one per rank
        groups = tp
    conv = (kernel - 1) * (inner + 2 * groups * state) // tp
    return conv, heads // tp * head_dim * state


@pytest.mark.parametrize("tp", TPS)
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("name", kvexplore.catalog_names())
@pytest.mark.release
def test_layers_and_specs_match_the_config(name, gpu, tp):
    c = _config(name)
    p = kvexplore.plan(name, gpu=gpu, tensor_parallel_size=tp, num_blocks=8)
    expected = _kinds(c)
    found: dict[int, set[str]] = {}
    n = c.get("decoder_layers") or c["num_hidden_layers"]
    for info in p.layers:
        found.setdefault(_index(info.name, n), set()).add(info.kind)
    assert found == {i: k for i, k in expected.items() if k}, "layer kinds by index"
    assert len(p.layers) == sum(len(k) for k in expected.values())

    kv_heads = c.get("num_key_value_heads") or c.get("decoder_attention_heads")
    for info in p.layers:
        spec = p.layer_specs[info.name]
        if info.kind in ("full_attention", "sliding_window", "cross_attention"):
            assert spec.num_kv_heads == max(1, kv_heads // tp), info.name
            head = c.get("head_dim") or (c.get("hidden_size") or c["d_model"]) // (
                c.get("num_attention_heads") or c["decoder_attention_heads"])
            assert spec.head_size == head, info.name
            if info.kind == "sliding_window":
                assert spec.sliding_window == c["sliding_window"]
        elif info.kind == "mla_attention":
            assert spec.num_kv_heads == 1
            assert spec.head_size == c["kv_lora_rank"] + c["qk_rope_head_dim"]
        elif _state_elements(c, tp) is not None:
            conv, state = _state_elements(c, tp)
            sizes = [math.prod(s) for s in spec.shapes]
            assert sizes[0] == conv, (info.name, spec.shapes)
            if state:
                assert sizes[1] == state, (info.name, spec.shapes)


@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.release
def test_qwen35_state_dtypes_follow_the_hf_config(gpu):
    """HF ``mamba_ssm_dtype: float32`` reaches the recurrent state (the Qwen3.5
    config hook); the conv state keeps the model dtype."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=gpu)
    spec = p.layer_specs["language_model.model.layers.0.linear_attn"]
    assert spec.dtypes == (torch.bfloat16, torch.float32)


@pytest.mark.parametrize(
    "gpu, tp, block, checkpoints",
    [("A100", 1, 544, 0), ("H100", 1, 576, 1), ("H200", 1, 576, 1), ("A100", 4, 272, 0)],
)
def test_worked_example(gpu, tp, block, checkpoints):
    """Qwen3.5-0.8B by hand: the block size depends on the GPU's GDN prefill kernel."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=gpu, tensor_parallel_size=tp)
    assert p.block_size == block
    # hand arithmetic: page 16*128*128*4 + 3*(2*16*128 + 16*128)*2 at TP 1
    assert p.mamba_page_size == (16 * 128 * 128 * 4 + 3 * (3 * 16 * 128) * 2) // tp
    assert p.mamba_page_size_padded == block * 2 * 2 * max(1, 2 // tp) * 256
    gdn = [s for s in p.layer_specs.values() if hasattr(s, "mamba_type")]
    assert len(gdn) == 18
    assert {s.num_prefill_checkpoint_blocks for s in gdn} == {checkpoints}
    assert ("lcm(16, 64)" in p.derivation()["block_size"]) == bool(checkpoints)


def test_layer_names_are_vllms():
    """Nemotron-H registers attention inside its mixer; LFM2 its short conv."""
    nem = kvexplore.plan("nvidia/Nemotron-H-56B-Base-8K", gpu="A100", num_blocks=4)
    first_attn = _config("nvidia/Nemotron-H-56B-Base-8K")["hybrid_override_pattern"].index("*")
    assert f"model.layers.{first_attn}.mixer.attn" in nem.layer_specs
    assert "model.layers.0.mixer" in nem.layer_specs
    lfm = kvexplore.plan("LiquidAI/LFM2-2.6B", gpu="A100", num_blocks=4)
    assert "model.layers.0.short_conv" in lfm.layer_specs


def test_mamba2_mixers_export_checkpoints():
    p = kvexplore.plan("mistralai/Mamba-Codestral-7B-v0.1", gpu="H100")
    spec = next(iter(p.layer_specs.values()))
    assert (spec.num_prefill_checkpoint_blocks, spec.prefill_checkpoint_alignment) == (1, 1)


def test_admission_verdict_matches_vllms_arithmetic():
    """16 blocks of 576 tokens cannot hold one 262,144-token request; vLLM's
    message and estimate are kept, and enough blocks admit it."""
    small = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16)
    assert small.admission is not None and not small.admission.ok
    assert "To serve at least one request" in small.admission.message
    est = small.admission.estimated_max_model_len
    assert est is not None and 0 < est < 262144
    assert str(est) in small.admission.message
    # an attention group needs cdiv(len, block) blocks, each Mamba group 1 per
    # request plus the checkpoint block in align mode: admitted exactly when
    # the blocks cover the estimate (8 sequences, fewer than the blocks, so
    # the CUDA-graph check passes)
    assert kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16, max_num_seqs=8,
                          max_model_len=est).admission.ok
    assert not kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16, max_num_seqs=8,
                              max_model_len=est + 576).admission.ok
    assert "refused" in small.explain()


def test_max_model_len_auto_fit():
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=64, max_model_len=-1,
                       max_num_seqs=32)
    assert p.admission.ok and p.admission.auto_fit_from == 262144
    assert 0 < p.model_config.max_model_len < 262144


def test_memory_inputs_reuse_the_build_and_match_a_fresh_engine_config():
    """A plan that changes max_model_len reuses the built model; its config
    equals what EngineArgs gives for that length."""
    from vllm.engine.arg_utils import EngineArgs

    from kvexplore.planning.emulation import emulate
    from kvexplore.planning.gpus import resolve_gpu

    a = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", max_model_len=8192, num_blocks=32)
    b = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", max_model_len=4096, num_blocks=32)
    assert a.model_config.max_model_len == 8192 and b.model_config.max_model_len == 4096
    src = load_model_config("Qwen/Qwen3.5-0.8B")
    with emulate(resolve_gpu("A100")):
        vc = EngineArgs(model=str(src.config_dir), tokenizer=str(src.config_dir),
                        skip_tokenizer_init=True, max_model_len=4096).create_engine_config()
    assert vc.model_config.max_model_len == b.model_config.max_model_len
    assert vc.scheduler_config.max_num_batched_tokens == b.vllm_config.scheduler_config.max_num_batched_tokens


def test_gpu_decides_the_attention_backend():
    """Llama on SM 10.0 ranks FlashInfer first; on SM 8.x/9.0 FlashAttention."""
    assert kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="A100").attention_backend == "FLASH_ATTN"
    assert kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="B200").attention_backend == "FLASHINFER"


def test_named_backend_is_validated_by_vllm():
    with pytest.raises(kvexplore.KVExploreError, match="FLASHMLA"):
        kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="H100", attention_backend="FLASHMLA")
    with pytest.raises(kvexplore.KVExploreError, match="NOT_A_BACKEND"):
        kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", attention_backend="NOT_A_BACKEND")


def test_gpus_table_and_errors():
    df = kvexplore.gpus()
    for name in ("A100", "L40S", "H100", "H200", "B200", "RTX 3090", "RTX 4090", "RTX 5090"):
        assert name in set(df.gpu)
    assert (df.compute_capability == "12.0").any()
    assert kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="9.0").gpu.name == "H100"
    with pytest.raises(kvexplore.KVExploreError, match="7.5"):
        kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="7.5")
    with pytest.raises(kvexplore.KVExploreError, match="unknown gpu 'K80'"):
        kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="K80")


def test_bad_configs_quote_vllm():
    with pytest.raises(kvexplore.KVExploreError, match="tensor_parallel_size|divisible"):
        kvexplore.plan("Qwen/Qwen3.5-0.8B", tensor_parallel_size=3)
    cfg = dict(load_model_config("Qwen/Qwen3.5-0.8B").config, architectures=["NoSuchForCausalLM"])
    with pytest.raises(kvexplore.KVExploreError, match="NoSuchForCausalLM"):
        kvexplore.plan(cfg)


def test_no_temporary_directory_is_left_behind(tmp_path):
    import subprocess
    import sys

    env = {"TMPDIR": str(tmp_path / "tmp"), "PATH": "/usr/bin:/bin",
           "KVEXPLORE_CACHE_DIR": str(tmp_path / "cache")}
    (tmp_path / "tmp").mkdir()
    code = "import kvexplore; print(kvexplore.load_model_config('Qwen/Qwen3.5-0.8B').config_dir)"
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=300,
                         capture_output=True, text=True)
    assert list((tmp_path / "tmp").glob("kvexplore*")) == []
    folder = out.stdout.strip().splitlines()[-1]
    assert folder.startswith(str(tmp_path / "cache" / "configs"))


def test_speculative_tokens_add_mamba_state_slots():
    """MTP draft tokens give every GDN layer one state slot each
    (MambaSpec.num_speculative_blocks), which can move the block size."""
    base = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    for n in (1, 3):
        p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100",
                           speculative_config={"method": "mtp", "num_speculative_tokens": n})
        gdn = [s for s in p.layer_specs.values() if hasattr(s, "mamba_type")]
        assert {s.num_speculative_blocks for s in gdn} == {n}
        assert p.block_size >= base.block_size
        assert "draft tokens" in p.derivation()["num_speculative_blocks"]
        assert p.replace(num_blocks=4).layer_specs == p.layer_specs
    with pytest.raises(kvexplore.KVExploreError, match="speculative_config"):
        kvexplore.plan("Qwen/Qwen3.5-0.8B", speculative_config="mtp")


LLAMA_1B = "meta-llama/Llama-3.2-1B-Instruct"


def _llama_1b_config() -> dict:
    import json

    return json.loads((load_model_config(LLAMA_1B).config_dir / "config.json").read_text())


def test_w4a16_nvfp4_plans_on_an_a100():
    # vLLM serves W4A16 NVFP4 below SM 10.0 with the Marlin kernel
    # (is_fp4_marlin_supported: CUDA and SM >= 7.5)
    cfg = _llama_1b_config()
    cfg["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "W4A16_NVFP4",
                                  "group_size": 16, "kv_cache_quant_algo": None,
                                  "exclude_modules": ["lm_head"]}
    p = kvexplore.plan(cfg, gpu="A100", num_blocks=16)
    bf16 = kvexplore.plan(LLAMA_1B, gpu="A100", num_blocks=16)
    # the KV cache is not quantized: 16 tokens x 16 layers x (K, V) x 8 heads x 64 x 2 B
    assert p.bytes_per_block == bf16.bytes_per_block == 16 * 16 * 2 * 8 * 64 * 2
    assert p.model_config.quantization == "modelopt_fp4"
    assert p.loaded_weight_bytes < bf16.loaded_weight_bytes / 2  # 4-bit linear weights


def test_hf_quant_config_beside_config_json_is_read(tmp_path):
    # vLLM reads hf_quant_config.json when config.json has no quantization_config
    # (transformers_utils/config.py); kv_cache_quant_algo FP8 makes 'auto' an fp8 cache
    import json

    (tmp_path / "config.json").write_text(json.dumps(_llama_1b_config()))
    bare = kvexplore.plan(str(tmp_path), gpu="H100", num_blocks=16)
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({
        "producer": {"name": "modelopt", "version": "0.27.0"},
        "quantization": {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8",
                         "exclude_modules": ["lm_head"]}}))
    p = kvexplore.plan(str(tmp_path), gpu="H100", num_blocks=16)
    assert (bare.kv_cache_dtype, bare.bytes_per_block) == ("auto", 16 * 16 * 2 * 8 * 64 * 2)
    assert p.model_config.quantization == "modelopt"
    assert p.kv_cache_dtype.startswith("fp8") and p.bytes_per_block == 16 * 16 * 2 * 8 * 64 * 1
    assert p.model.config == bare.model.config and p.model.digest != bare.model.digest
    assert "LlamaForCausalLM" in p.text()
