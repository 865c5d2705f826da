"""Validation verdicts exactly as LMCache 0.5.6's ``validate_kv_cache_groups`` gives them."""

from __future__ import annotations

import pytest
import torch
from edit_layouts import config, qwen_attn, qwen_gdn
from vllm.v1.kv_cache_interface import (
    CrossAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)

from kvexplore.editing.validation import check_kv_cache_groups, validate_kv_cache_groups


def cross():
    return CrossAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=64, dtype=torch.float16
    )


def compressed_mla():
    return MLAAttentionSpec(
        block_size=256,
        num_kv_heads=1,
        head_size=576,
        dtype=torch.bfloat16,
        tokens_per_state=4,
    )


def test_none_passes_and_gives_empty_table():
    assert validate_kv_cache_groups(None) is None
    table = check_kv_cache_groups(None)
    assert list(table.columns) == ["group", "kind", "verdict", "reason"]
    assert table.empty


def test_hybrid_align_is_accepted():
    cfg = config([(["g0"], qwen_gdn()), (["a3"], qwen_attn())], 4)
    assert validate_kv_cache_groups(cfg) is None
    table = check_kv_cache_groups(cfg)
    assert table["verdict"].tolist() == ["accepted", "accepted"]
    assert table["kind"].tolist() == ["mamba", "full_attention"]


def test_mamba_none_is_rejected_and_all_is_accepted():
    # LMCache 0.5.6: only 'align' and 'all' keep reusable state snapshots
    cfg = config([(["g0"], qwen_gdn("none")), (["a3"], qwen_attn())], 4)
    with pytest.raises(
        ValueError, match=r"group 0 \(mamba\).*mamba_cache_mode='none'; expected 'align' or 'all'"
    ):
        validate_kv_cache_groups(cfg)
    table = check_kv_cache_groups(cfg)
    assert table["verdict"].tolist() == ["rejected", "accepted"]
    every = config([(["g0"], qwen_gdn("all")), (["a3"], qwen_attn())], 4)
    assert validate_kv_cache_groups(every) is None
    assert check_kv_cache_groups(every)["verdict"].tolist() == ["accepted", "accepted"]


def test_every_offending_group_is_listed_in_one_error():
    cfg = config(
        [
            (["c0"], cross()),
            (["a1"], qwen_attn()),
            (["g2"], qwen_gdn("none")),
            (["c3"], cross()),
        ],
        4,
    )
    with pytest.raises(ValueError) as info:
        validate_kv_cache_groups(cfg)
    text = str(info.value)
    assert text.startswith("3 KV-cache group(s)")
    for group in ("group 0 (cross_attention)", "group 2 (mamba)", "group 3"):
        assert group in text
    assert "group 1" not in text
    table = check_kv_cache_groups(cfg)
    assert table["verdict"].tolist() == ["rejected", "accepted", "rejected", "rejected"]


def test_slot_compressed_spec_passes_with_reason():
    cfg = config([(["m0"], compressed_mla())], 4)
    assert validate_kv_cache_groups(cfg) is None
    row = check_kv_cache_groups(cfg).iloc[0]
    assert row["verdict"] == "accepted"
    assert "slot compression" in row["reason"] and "4" in row["reason"]


def test_uniform_type_group_judged_leaf_by_leaf():
    swa = SlidingWindowSpec(
        block_size=16,
        num_kv_heads=2,
        head_size=64,
        dtype=torch.float16,
        sliding_window=128,
    )
    spec = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": swa, "b": swa})
    cfg = config([(["a", "b"], spec)], 4)
    table = check_kv_cache_groups(cfg)
    assert table["verdict"].tolist() == ["accepted"]
    assert table["kind"].tolist() == ["sliding_window"]
    assert table["reason"][0] == "SlidingWindowSpec"  # deduplicated


@pytest.mark.parametrize("bad", [42, "config", {"kv_cache_groups": 3}])
def test_non_config_is_a_value_error(bad):
    with pytest.raises(ValueError, match="expected a vllm.v1.kv_cache_interface"):
        check_kv_cache_groups(bad)
    with pytest.raises(ValueError, match=type(bad).__name__):
        validate_kv_cache_groups(bad)
