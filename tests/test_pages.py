"""The page model against vLLM's own objects and hand counts from the configs.

Every expected offset, size and stride here comes from vLLM (the spec's
``page_size_bytes`` / ``real_page_size_bytes``,
``compute_layer_kv_cache_shape_bytes``, ``MambaBase.bind_kv_cache``'s
unpacking of the unified row, FlashAttention's ``split(head_size)`` of the
unified view) or from the model's ``config.json``, never from the page model.
"""

import json
import math
from importlib.resources import files
from types import SimpleNamespace

import pytest
import torch
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    MambaSpec,
    compute_layer_kv_cache_shape_bytes,
)

from kvexplore import plan
from kvexplore.errors import KVExploreError
from kvexplore.pages import describe_page, page_facts, page_regions
from kvexplore.registration import allocate

BLOCKS = 4


def _config(repo: str) -> dict:
    name = repo.replace("/", "--") + ".json"
    return json.loads(files("kvexplore.model_configs").joinpath(name).read_text())


def _first_layer(p, kind: str):
    for g in p.groups:
        name = g.layer_names[0]
        spec = p.layer_specs[name]
        if (kind == "mamba") == isinstance(spec, MambaSpec):
            return g, name, spec
    raise AssertionError(f"no {kind} group")


@pytest.mark.parametrize(
    "model",
    ["Qwen/Qwen3.5-0.8B", "ibm-granite/granite-4.0-h-350m", "LiquidAI/LFM2-2.6B"],
)
def test_mamba_states_are_where_vllm_bind_kv_cache_unpacks_them(model):
    p = plan(model, gpu="A100")
    _, name, spec = _first_layer(p, "mamba")
    row = allocate(p, device="meta", num_blocks=BLOCKS)[name]
    layer = SimpleNamespace(
        get_state_shape=lambda: spec.shapes, get_state_dtype=lambda: spec.dtypes
    )
    MambaBase.bind_kv_cache(layer, row)  # vLLM's own unpacking of the unified row
    base = row.storage_offset() * row.element_size()
    expected = [
        (
            t.storage_offset() * t.element_size() - base,
            t[0].numel() * t.element_size(),
            str(t.dtype).removeprefix("torch."),
        )
        for t in layer.kv_cache
    ]

    page = describe_page(spec, row)
    states = [s for s in page.segments if s.label != "pad"]
    assert [(s.start, s.size, s.dtype) for s in states] == expected
    pad = [s for s in page.segments if s.label == "pad"]
    padding = spec.page_size_bytes - spec.real_page_size_bytes
    assert [s.size for s in pad] == ([padding] if padding else [])
    assert page.page_bytes == spec.page_size_bytes

    regions = page_regions(spec, row, BLOCKS, name)
    assert [label for label, _ in regions] == [s.label for s in states]
    for (_, view), state, (start, size, _) in zip(
        regions, layer.kv_cache, expected, strict=True
    ):
        assert view.shape[0] == BLOCKS and view[0].numel() == size
        assert view.storage_offset() == base + start
        assert view.stride(0) == state.stride(0) * state.element_size()


def test_qwen35_gdn_states_from_the_config():
    cfg = _config("Qwen/Qwen3.5-0.8B")
    text = cfg.get("text_config", cfg)
    k_dim = text["linear_num_key_heads"] * text["linear_key_head_dim"]
    v_dim = text["linear_num_value_heads"] * text["linear_value_head_dim"]
    conv = (text["linear_conv_kernel_dim"] - 1) * (2 * k_dim + v_dim) * 2  # bf16
    ssm = (
        text["linear_num_value_heads"]
        * text["linear_key_head_dim"]
        * text["linear_value_head_dim"]
        * 4
    )
    p = plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    _, name, spec = _first_layer(p, "mamba")
    row = allocate(p, device="meta", num_blocks=BLOCKS)[name]
    segs = describe_page(spec, row).segments
    assert [(s.label, s.start, s.size) for s in segs[:2]] == [
        ("conv", 0, conv),
        ("ssm", conv, ssm),
    ]


def test_unified_attention_k_and_v_are_flash_attentions_split(qwen_a100):
    _, name, spec = _first_layer(qwen_a100, "attention")
    view = allocate(qwen_a100, device="meta", num_blocks=BLOCKS)[name]
    # vLLM's FlashAttentionImpl: key_cache, value_cache = kv_cache.transpose(1, 2).split(head_size, -1)
    key, value = view.transpose(1, 2).split(spec.head_size, dim=-1)
    elem = view.element_size()
    regions = dict(page_regions(spec, view, BLOCKS, name))
    assert list(regions) == ["K", "V"]
    assert regions["K"].storage_offset() == key.storage_offset() * elem
    assert regions["V"].storage_offset() == value.storage_offset() * elem
    assert regions["K"].shape[-1] == key.shape[-1] * elem
    assert regions["V"].shape[-1] == value.shape[-1] * elem
    page = describe_page(spec, view, kernel_block_size=qwen_a100.kernel_block_sizes[0])
    k_cell, v_cell = page.cells[:2]
    assert (k_cell.start, k_cell.size) == (0, key.shape[-1] * elem)
    assert (v_cell.start, v_cell.size) == (
        (value.storage_offset() - key.storage_offset()) * elem,
        value.shape[-1] * elem,
    )


def test_kernel_pages_tile_the_page_as_vllm_shapes_it(qwen_a100_flashinfer):
    p = qwen_a100_flashinfer
    g, name, spec = _first_layer(p, "attention")
    kernel = p.kernel_block_sizes[g.index]
    view = allocate(p, device="meta", num_blocks=BLOCKS)[name]
    pages, heads, tokens, c_bytes = compute_layer_kv_cache_shape_bytes(spec, 1, kernel)
    page = describe_page(spec, view, kernel_block_size=kernel)
    kv = [s for s in page.segments if s.label != "pad"]
    assert page.kernel_pages == pages == len(kv) > 1
    assert all(s.size == heads * tokens * c_bytes for s in kv)
    assert [s.start for s in kv] == [
        i * view.stride(0) * view.element_size() for i in range(pages)
    ]
    assert sum(s.size for s in kv) == spec.real_page_size_bytes
    assert page.page_offset(3) == 3 * pages * view.stride(0) * view.element_size()


def test_legacy_attention_halves_are_the_kernel_page_shape(qwen_a100_flashinfer):
    p = qwen_a100_flashinfer
    g, name, spec = _first_layer(p, "attention")
    kernel = p.kernel_block_sizes[g.index]
    view = allocate(p, device="meta", registration="legacy", num_blocks=BLOCKS)[name]
    _, heads, tokens, c_bytes = compute_layer_kv_cache_shape_bytes(spec, 1, kernel)
    half = heads * tokens * spec.head_size * view.element_size()
    assert 2 * half == heads * tokens * c_bytes
    page = describe_page(spec, view, kernel_block_size=kernel)
    assert [(s.label, s.start, s.size) for s in page.segments[:4]] == [
        ("K p0", 0, half),
        ("V p0", half, half),
        ("K p1", 2 * half, half),
        ("V p1", 3 * half, half),
    ]
    regions = dict(page_regions(spec, view, BLOCKS, name))
    assert list(regions) == ["K", "V"]
    assert regions["V"].storage_offset() - regions["K"].storage_offset() == half


def test_mla_row_is_c_kv_then_k_pe_from_the_config():
    cfg = _config("deepseek-ai/DeepSeek-V3")
    rank, rope = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
    p = plan(
        "deepseek-ai/DeepSeek-V3", gpu="H100", tensor_parallel_size=8, num_blocks=BLOCKS
    )
    g, name, spec = _first_layer(p, "attention")
    view = allocate(p, device="meta", num_blocks=BLOCKS)[name]
    page = describe_page(
        spec, view, kernel_block_size=p.kernel_block_sizes[g.index], mla_dims=p.mla_dims
    )
    elem = 2  # bf16 latent cache
    assert [(c.label, c.start, c.size) for c in page.cells[:3]] == [
        ("c_kv t0", 0, rank * elem),
        ("k_pe t0", rank * elem, rope * elem),
        ("c_kv t1", (rank + rope) * elem, rank * elem),
    ]
    latent = [s for s in page.segments if s.label.startswith("latent")]
    assert sum(s.size for s in latent) == spec.real_page_size_bytes
    assert [label for label, _ in page_regions(spec, view, BLOCKS, name)] == ["latent"]


def test_page_facts_bytes_are_the_specs(qwen_a100):
    facts = page_facts(qwen_a100)
    assert len(facts) == len(qwen_a100.groups)
    for fact, g in zip(facts, qwen_a100.groups, strict=True):
        spec = qwen_a100.layer_specs[g.layer_names[0]]
        assert fact["layer"] == g.layer_names[0]
        assert fact["page_bytes"] == spec.page_size_bytes
        assert fact["real_bytes"] == spec.real_page_size_bytes
        sizes = [size for _, _, size, _ in fact["segments"]]
        assert sum(sizes) == spec.page_size_bytes  # the segments cover the page once


def test_an_undescribable_page_is_refused_naming_what_is_missing():
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16
    )
    with pytest.raises(KVExploreError, match="expected a tensor or a list of tensors"):
        describe_page(spec, "not a tensor")
    with pytest.raises(KVExploreError, match="3-D tensor"):
        describe_page(spec, torch.zeros(4, 16, 32, dtype=torch.float16))
    with pytest.raises(KVExploreError, match="no usable page_size_bytes"):
        describe_page(object(), torch.zeros(4, 2, 16, 32, dtype=torch.float16))
    with pytest.raises(KVExploreError, match="no usable block_size"):
        describe_page(SimpleNamespace(page_size_bytes=2048),
                      torch.zeros(4, 2, 16, 32, dtype=torch.float16))
    with pytest.raises(KVExploreError, match="num_blocks=3"):
        page_regions(spec, torch.zeros(4, 2, 16, 32, dtype=torch.float16), 3)
    strided = torch.zeros(4, 2, 16, 64, dtype=torch.float16)[..., ::2]
    with pytest.raises(KVExploreError, match="strided last dim"):
        page_regions(spec, strided, 4)


def test_a_page_larger_than_its_states_is_padded_to_page_size_bytes():
    spec = MambaSpec(
        block_size=16,
        shapes=((3, 8), (4, 4)),
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=256,
    )
    row = torch.zeros(2 * 256, dtype=torch.int8).as_strided(
        (2, 1, 1, 112), (256, 112, 112, 1)
    )
    # by hand: conv 3 * 8 * 2 = 48 B, ssm 4 * 4 * 4 = 64 B, 256 - 112 = 144 B padding
    assert [(s.label, s.start, s.size) for s in describe_page(spec, row).segments] == [
        ("conv", 0, 48),
        ("ssm", 48, 64),
        ("pad", 112, 144),
    ]
    assert math.prod(page_regions(spec, row, 2)[1][1].shape[1:]) == 64
