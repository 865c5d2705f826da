"""Bad input: clear ValueErrors with the numbers, inputs untouched."""

from __future__ import annotations

import pytest
import torch
from edit_layouts import (
    QWEN_PAGE,
    config,
    facts,
    legacy_mamba,
    legacy_registration,
    qwen_attn,
    qwen_gdn,
    unified_registration,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

from kvexplore import KVExploreError
from kvexplore.editing.rules import (
    MambaPageViewEdit,
    MambaUnifiedViewEdit,
    SubpagedAttentionViewEdit,
    apply_kv_cache_group_edits,
)


def run(cfg, caches, match, **kwargs):
    before = facts(caches)
    with pytest.raises(KVExploreError, match=match):
        apply_kv_cache_group_edits(cfg, caches, **kwargs)
    assert facts(caches) == before


def hybrid(attn_cache, spec=None, blocks=2):
    spec = spec or qwen_attn()
    cfg = config([(["g"], qwen_gdn()), (["a"], spec)], blocks)
    return cfg, {"g": legacy_mamba(qwen_gdn(), blocks), "a": attn_cache}


def test_stride_not_a_page():
    spec = qwen_gdn()
    raw = torch.zeros(3 * QWEN_PAGE, dtype=torch.int8)
    conv = raw.view(torch.bfloat16).as_strided(
        (2, 3, 6144), (QWEN_PAGE // 2 + 8, 6144, 1), 0
    )
    ssm = raw.view(torch.float32).as_strided(
        (2, 16, 128, 128), (QWEN_PAGE // 4, 16384, 128, 1), 36864 // 4
    )
    cfg = config([(["g"], spec)], 2)
    run(
        cfg,
        {"g": [conv, ssm]},
        r"'g'.*mamba-page-view.*per-block stride \(1114128 bytes\) does not equal the page size \(1114112 bytes\)",
    )


def test_conv_state_not_at_storage_start():
    spec = qwen_gdn()
    raw = torch.zeros(4 * QWEN_PAGE, dtype=torch.int8)
    conv, ssm = legacy_mamba(spec, 2, raw=raw)
    shifted = raw.view(torch.bfloat16).as_strided(conv.shape, conv.stride(), 64)
    run(
        config([(["g"], spec)], 2),
        {"g": [shifted, ssm]},
        r"conv state must start at its storage's first byte: its byte offset 128 "
        r"\(storage_offset=64\) is not 0 .*1114112-byte pages",
    )


def test_ssm_not_after_conv():
    spec = qwen_gdn()
    conv, ssm = legacy_mamba(spec, 2)
    moved = ssm.as_strided(ssm.shape, ssm.stride(), ssm.storage_offset() + 16)
    run(
        config([(["g"], spec)], 2),
        {"g": [conv, moved]},
        r"state 1 starts at byte 36928 of its page; expected 36864",
    )


def test_page_that_does_not_factor():
    # 1,114,116 B: a whole number of bf16 elements, but not 2 x 544 x h
    spec = MambaSpec(
        block_size=544,
        shapes=((3, 6144), (16, 128, 128)),
        dtypes=(torch.bfloat16, torch.float32),
        page_size_padded=QWEN_PAGE + 4,
        mamba_cache_mode="align",
    )
    states = legacy_mamba(spec, 2)
    with pytest.raises(
        ValueError, match=r"page \(557058 elements of 2 bytes\) does not factor"
    ):
        MambaPageViewEdit().apply(spec, states)
    run(
        config([(["g"], spec)], 2),
        {"g": states},
        r"does not factor into \(2, block_size=544",
    )


def test_mamba_list_of_wrong_length():
    conv, ssm = legacy_mamba(qwen_gdn(), 2)
    run(
        config([(["g"], qwen_gdn())], 2),
        {"g": [conv, ssm, ssm]},
        r"'g' is a list of 3 tensors; expected 2 \(\[conv_state, ssm_state\]",
    )
    run(
        config([(["g"], qwen_gdn())], 2), {"g": [conv]}, "list of 1 tensors; expected 2"
    )


def test_mamba_entry_not_a_list_or_unified_tensor():
    run(
        config([(["g"], qwen_gdn())], 2),
        {"g": torch.zeros(2, 1085440, dtype=torch.int8)},
        r"Mamba layer 'g' is one 2-D tensor \(2, 1085440\); expected a legacy list of 2",
    )
    run(
        config([(["g"], qwen_gdn())], 2),
        {"g": "conv"},
        r"layer 'g' is registered as str; expected a tensor",
    )


def test_missing_and_extra_layers():
    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a", "b"], qwen_attn())], 1, kernel=32
    )
    partial = {k: v for k, v in caches.items() if k != "b"}
    run(cfg, partial, r"lacks 1 layer\(s\) the config names: \['b'\]")
    run(
        cfg,
        {**caches, "zz": caches["a"]},
        r"holds 1 layer\(s\) no config group names: \['zz'\]",
    )


def test_tensors_on_different_devices():
    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    meta = dict(
        caches, a=torch.empty(caches["a"].shape, dtype=torch.bfloat16, device="meta")
    )
    run(
        cfg,
        meta,
        r"live on 2 devices \(cpu: \['g'\], meta: \['a'\]\); expected one device",
    )


def run_rule(cache, match):
    """The subpaged rule's own invariant, reached without the size check of
    apply_kv_cache_group_edits (which refuses these caches first)."""
    before = facts({"a": cache})
    with pytest.raises(ValueError, match=match):
        SubpagedAttentionViewEdit().apply(qwen_attn(), cache, kv_layout="NHD")
    assert facts({"a": cache}) == before
    run(*hybrid(cache), r"layer 'a' is registered as .* expected 2 blocks x 1,114,112 B")


def test_kernel_page_count_not_whole_blocks():
    cache = torch.zeros(17 * 2 + 3, 2, 32, 2, 256, dtype=torch.bfloat16)
    run_rule(cache, r"kernel page count 37 is not a multiple of the logical/kernel block ratio 17")


def test_kernel_block_not_dividing_logical():
    cache = torch.zeros(40, 2, 48, 2, 256, dtype=torch.bfloat16)
    run_rule(cache, r"logical block of 544 rows is not a multiple of the attention kernel block of 48")


def test_kernel_pages_do_not_tile_the_page():
    cache = torch.zeros(34, 2, 32, 1, 256, dtype=torch.bfloat16)  # 1 head instead of 2
    run_rule(cache, r"17 kernel pages of 32768 bytes \(557056 bytes\) do not tile the logical page \(1114112 bytes\)")


def test_a_layer_that_is_not_its_specs_cache_is_refused():
    """A right-dtype tensor of the wrong size, or caches of fewer blocks than
    the config: refused naming the layer, nothing edited."""
    cfg, caches = hybrid(torch.zeros(34, 2, 32, 2, 256, dtype=torch.bfloat16))
    apply_kv_cache_group_edits(cfg, caches)  # the right size is accepted
    run(cfg, {**caches, "a": torch.zeros(3, 3, dtype=torch.bfloat16)},
        r"layer 'a' is registered as \(3, 3\): 18 B; expected 2 blocks x 1,114,112 B")
    four = config([(["g"], qwen_gdn()), (["a"], qwen_attn())], 4)
    run(four, caches, r"layer 'g' is registered as .* expected 4 blocks x 1,085,440 B.*"
        r"layer 'a' is registered as \(34, 2, 32, 2, 256\): 2,228,224 B; expected 4 blocks")


def test_a_right_size_attention_tensor_of_another_rank_is_refused():
    """The bytes of a whole cache flattened to 1-D or 2-D are not a
    registration vLLM makes (4-D unified, 5-D legacy): refused, not passed
    through unedited."""
    cfg, caches = hybrid(torch.zeros(34, 2, 32, 2, 256, dtype=torch.bfloat16))
    run(cfg, {**caches, "a": caches["a"].reshape(-1)},
        r"layer 'a' is a 1-D tensor \(1114112,\); expected 4-D or 5-D")
    run(cfg, {**caches, "a": caches["a"].reshape(2, -1)},
        r"layer 'a' is a 2-D tensor \(2, 557056\); expected 4-D or 5-D")


def test_a_plans_layer_in_other_strides_is_refused():
    """Given the plan, every tensor must have the shape and strides vLLM
    registers for it: Qwen3.5's FlashInfer attention is 68 kernel pages of
    [2, 32, 512] with K and V of a page back to back (strides 32768, 512,
    1024, 1 by hand: 2 x 32 x 512, 512, 2 x 512, 1); the same bytes with
    tokens innermost are refused naming the layer.  The bare config cannot
    know the layout and accepts them, as LMCache does (memory order)."""
    import re

    import kvexplore
    from kvexplore import allocate

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=4, attention_backend="FLASHINFER")
    caches = allocate(p)
    attn = next(n for n in caches if "self_attn" in n)
    tokens_inside = caches[attn].transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(KVExploreError, match=(
            rf"layer '{re.escape(attn)}' is registered as \[68, 2, 32, 512\] strides "
            r"\[32768, 16384, 1, 32\] bfloat16; expected \[68, 2, 32, 512\] strides "
            r"\[32768, 512, 1024, 1\]")):
        apply_kv_cache_group_edits(p, {**caches, attn: tokens_inside})
    assert apply_kv_cache_group_edits(p, caches).counts == {
        "mamba-unified-view": 18, "subpaged-attention-view": 6}
    apply_kv_cache_group_edits(p.kv_cache_config, {**caches, attn: tokens_inside})


def test_non_contiguous_kernel_paged_tensor():
    base = torch.zeros(34, 2, 2, 32, 256, dtype=torch.bfloat16)
    permuted = base.permute(
        0, 1, 3, 2, 4
    )  # legacy HND: not contiguous in logical order
    run(
        *hybrid(permuted), r"\(34, 2, 32, 2, 256\).* is not contiguous in logical order"
    )


def test_unified_attention_not_blocks_first():
    base = torch.zeros(2, 34, 32, 512, dtype=torch.bfloat16)  # heads outside pages
    weird = base.permute(1, 0, 2, 3)
    with pytest.raises(
        ValueError, match="outermost memory dim has 2 entries, not the 34"
    ):
        SubpagedAttentionViewEdit().apply(qwen_attn(), weird)


def test_legacy_rank5_without_kv_dim():
    with pytest.raises(
        ValueError, match=r"\(34, 3, 32, 2, 256\); expected 2 \(K, V\) in dim 1"
    ):
        SubpagedAttentionViewEdit().apply(qwen_attn(), torch.zeros(34, 3, 32, 2, 256))


def test_unified_mamba_row_that_cannot_tile():
    spec = MambaSpec(
        block_size=544,
        shapes=((1, 1085440),),
        dtypes=(torch.int8,),
        page_size_padded=1085440,
        mamba_cache_mode="align",
    )
    raw = torch.zeros(2 * 1085440, dtype=torch.int8)
    view = raw.as_strided((2, 1, 1, 1085440), (1085440, 1085440, 1085440, 1))
    with pytest.raises(
        ValueError,
        match=r"cannot tile a 1085440-element state row into 544 aligned tokens within the 1085440-byte page",
    ):
        MambaUnifiedViewEdit().apply(spec, view, kv_layout="NHD")


def test_unified_mamba_needs_a_hint():
    cfg, caches = unified_registration([(["g"], qwen_gdn())], 2)
    with pytest.raises(ValueError, match="kv_layout=None"):
        MambaUnifiedViewEdit().apply(qwen_gdn(), caches["g"])


def test_view_that_would_leave_the_storage():
    spec = qwen_gdn()
    raw = torch.zeros(2 * QWEN_PAGE - 1000, dtype=torch.int8)
    conv = raw.view(torch.bfloat16).as_strided(
        (2, 3, 6144), (QWEN_PAGE // 2, 6144, 1), 0
    )
    ssm = raw.view(torch.float32).as_strided(
        (2, 16, 128, 128), (QWEN_PAGE // 4, 16384, 128, 1), 36864 // 4
    )
    with pytest.raises(
        ValueError,
        match=r"needs bytes up to 2228224 of the storage, which holds only 2227224",
    ):
        MambaPageViewEdit().apply(spec, [conv, ssm])


def test_validation_runs_first():
    cfg, caches = legacy_registration([(["g"], qwen_gdn("none"))], 1)
    run(cfg, caches, r"group 0 \(mamba\): MambaSpec with mamba_cache_mode='none'")


def test_kv_caches_must_be_a_mapping():
    with pytest.raises(ValueError, match="kv_caches is a list"):
        apply_kv_cache_group_edits(None, [torch.zeros(1)])


def test_mapping_input_not_mutated_on_success():
    spec = FullAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=8, dtype=torch.float16
    )
    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    del spec
    contents = {
        k: [t.clone() for t in ([v] if isinstance(v, torch.Tensor) else v)]
        for k, v in caches.items()
    }
    before = facts(caches)
    apply_kv_cache_group_edits(cfg, caches)
    assert facts(caches) == before
    for k, v in caches.items():
        for old, new in zip(
            contents[k], [v] if isinstance(v, torch.Tensor) else v, strict=True
        ):
            assert torch.equal(old, new)


def test_attention_view_in_another_dtype_is_refused():
    # An fp16 view of the bf16 attention cache: same bytes, other elements.
    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    caches["a"] = caches["a"].view(torch.float16)
    run(
        cfg,
        caches,
        r"layer 'a' is registered as float16; expected bfloat16, the dtype of its "
        r"FullAttentionSpec",
    )


def test_legacy_mamba_state_in_another_dtype_is_refused():
    conv, ssm = legacy_mamba(qwen_gdn(), 2)
    run(
        config([(["g"], qwen_gdn())], 2),
        {"g": [conv, ssm.view(torch.int32)]},
        r"Mamba layer 'g' state 1 is int32; expected float32 \(MambaSpec.dtypes\[1\]\)",
    )


def test_unified_mamba_row_in_another_dtype_is_refused():
    cfg, caches = unified_registration([(["g"], qwen_gdn())], 2)
    run(
        cfg,
        {"g": caches["g"].view(torch.float16)},
        r"Mamba layer 'g' is a float16 tensor; expected int8 bytes",
    )


def test_verify_roundtrip_refuses_a_dtype_mismatch_too():
    from kvexplore import KVExploreError, verify_roundtrip

    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    edited = apply_kv_cache_group_edits(cfg, caches)
    wrong = dict(caches, a=caches["a"].view(torch.float16))
    with pytest.raises(KVExploreError, match=r"'a' is registered as float16"):
        verify_roundtrip(cfg, wrong, edited)


@pytest.mark.parametrize("chunk_bytes", [0, -1, 1.5, "8", True])
def test_verify_roundtrip_refuses_a_chunk_size_that_is_not_a_positive_int(
    chunk_bytes,
):
    from kvexplore import KVExploreError, verify_roundtrip

    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    edited = apply_kv_cache_group_edits(cfg, caches)
    before = facts(caches)
    with pytest.raises(
        KVExploreError,
        match=rf"chunk_bytes={chunk_bytes!r} is invalid; expected an integer >= 1",
    ):
        verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
    assert facts(caches) == before
