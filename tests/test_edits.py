"""The four rules, the registry and apply_kv_cache_group_edits."""

from __future__ import annotations

import pytest
import torch
from edit_layouts import (
    QWEN_PAGE,
    byte_range,
    config,
    facts,
    legacy_attention,
    legacy_mamba,
    legacy_registration,
    qwen_attn,
    qwen_gdn,
    qwen_groups,
    unified_registration,
)
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from kvexplore.editing.rules import (
    DEFAULT_EDITS,
    EditResult,
    KVCacheGroupEdit,
    MambaPageViewEdit,
    MambaUnifiedViewEdit,
    SubpagedAttentionViewEdit,
    SubpagedMLAAttentionViewEdit,
    apply_kv_cache_group_edits,
)


def same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.fixture(scope="module")
def qwen_unified():
    return unified_registration(qwen_groups(), 64, kernel=32)


def test_registry_order_and_names():
    # LMCache 0.5.6's _EDITS, in its order
    assert [r.name for r in DEFAULT_EDITS] == [
        "mamba-unified-view",
        "mamba-page-view",
        "subpaged-mla-attention-view",
        "subpaged-attention-view",
    ]


def test_qwen_unified_registration_by_hand(qwen_unified):
    cfg, caches = qwen_unified
    gdn, attn = caches["model.layers.0.0"], caches["model.layers.3.0"]
    assert (tuple(gdn.shape), gdn.stride(), gdn.dtype) == (
        (64, 1, 1, 1085440),
        (1114112, 1085440, 1085440, 1),
        torch.int8,
    )
    assert (tuple(attn.shape), attn.stride()) == (
        (1088, 2, 32, 512),
        (32768, 512, 1024, 1),
    )
    before = facts(caches)
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    assert facts(caches) == before
    new_gdn, new_attn = result["model.layers.0.0"], result["model.layers.3.0"]
    assert (tuple(new_gdn.shape), new_gdn.stride(), new_gdn.dtype) == (
        (64, 544, 1, 2000),
        (1114112, 2000, 2000, 1),
        torch.int8,
    )
    assert (tuple(new_attn.shape), new_attn.stride(), new_attn.dtype) == (
        (64, 2, 544, 1, 512),
        (557056, 278528, 512, 512, 1),
        torch.bfloat16,
    )
    assert result.counts == {"mamba-unified-view": 18, "subpaged-attention-view": 6}
    for name, value in result.items():
        old = caches[name]
        assert value is not old and same_storage(value, old)
        assert value.storage_offset() * value.element_size() == (
            old.storage_offset() * old.element_size()
        )
        lo, hi = byte_range(value)
        old_lo, old_hi = byte_range(old)
        assert lo == old_lo
        # GDN: row plus padding of the last page; attention: exactly its bytes
        limit = old_lo + 63 * QWEN_PAGE + QWEN_PAGE
        assert old_hi <= hi <= limit


def test_qwen_unified_hnd_hint_swaps_token_and_head(qwen_unified):
    cfg, caches = qwen_unified
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="HND")
    view = result["model.layers.1.2"]
    assert tuple(view.shape) == (64, 1, 544, 2000)
    assert view.stride() == (1114112, 1088000, 2000, 1)


def test_kv_layout_defaults_to_config_layout(qwen_unified):
    cfg, caches = qwen_unified
    assert cfg.kv_cache_layout == "LBNHC"
    result = apply_kv_cache_group_edits(cfg, caches)
    assert tuple(result["model.layers.0.0"].shape) == (64, 544, 1, 2000)


def test_unknown_kv_layout_is_a_value_error(qwen_unified):
    cfg, caches = qwen_unified
    with pytest.raises(ValueError, match=r"kv_layout='XYZ'.*expected one of .*NHD"):
        apply_kv_cache_group_edits(cfg, caches, kv_layout="XYZ")


def test_qwen_legacy_views():
    cfg, caches = legacy_registration(qwen_groups(2), 64, kernel=32)
    attn = caches["model.layers.3.0"]
    assert tuple(attn.shape) == (1088, 2, 32, 2, 256)
    result = apply_kv_cache_group_edits(cfg, caches)
    assert result.counts == {"mamba-page-view": 6, "subpaged-attention-view": 2}
    for name in ("model.layers.0.1", "model.layers.3.1"):
        view = result[name]
        assert tuple(view.shape) == (64, 2, 544, 1, 512)
        assert view.stride() == (557056, 278528, 512, 512, 1)
        assert view.dtype == torch.bfloat16
        first = (
            caches[name] if isinstance(caches[name], torch.Tensor) else caches[name][0]
        )
        assert same_storage(view, first)
        assert byte_range(view) == (0, 64 * QWEN_PAGE)  # every whole page, once


def test_mamba_page_view_covers_conv_ssm_and_pad():
    spec = qwen_gdn()
    states = legacy_mamba(spec, 3)
    view = MambaPageViewEdit().apply(spec, states)
    conv, ssm = states
    assert byte_range(conv)[0] == byte_range(view)[0] == 0
    assert byte_range(ssm)[1] <= byte_range(view)[1] == 3 * QWEN_PAGE
    # the view reads what the registration wrote
    ssm[1].fill_(1.5)
    assert torch.equal(
        view[1].reshape(-1).view(torch.uint8)[36864 : 36864 + 4],
        torch.tensor([1.5], dtype=torch.float32).view(torch.uint8),
    )


def test_non_mamba_config_and_none_are_plain_copies():
    spec = FullAttentionSpec(
        block_size=16, num_kv_heads=2, head_size=8, dtype=torch.float16
    )
    cfg, caches = legacy_registration([(["a", "b"], spec)], 4)
    for c in (cfg, None):
        result = apply_kv_cache_group_edits(c, caches)
        assert isinstance(result, dict) and result == caches
        assert result is not caches
        assert all(result[k] is caches[k] for k in caches)
        assert result.counts == {}
        assert result.report["rule"].isna().all()
        assert "no rule consulted" in result.note


def test_unmatched_layers_pass_through_untouched():
    attn = FullAttentionSpec(
        block_size=544, num_kv_heads=2, head_size=256, dtype=torch.bfloat16
    )
    cfg, caches = legacy_registration([(["g"], qwen_gdn()), (["a"], attn)], 2)
    result = apply_kv_cache_group_edits(cfg, caches)  # kernel == block: no subpaging
    assert result["a"] is caches["a"]
    row = result.report.set_index("layer").loc["a"]
    assert row["rule"] is None
    assert "already paged at the logical block size (544" in row["declined"]
    assert "mamba-page-view: spec kind is full_attention" in row["declined"]


def test_report_columns_and_reprs(qwen_unified):
    cfg, caches = qwen_unified
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    report = result.report
    assert list(report.columns)[:5] == ["group", "layer", "kind", "rule", "declined"]
    row = report.set_index("layer").loc["model.layers.3.0"]
    assert row["shape_before"] == (1088, 2, 32, 512)
    assert row["stride_after"] == (557056, 278528, 512, 512, 1)
    assert row["dtype_before"] == row["dtype_after"] == "bfloat16"
    assert row["storage_offset_before"] == row["storage_offset_after"]
    assert "mamba-page-view: spec kind is full_attention" in row["declined"]
    text = repr(result)
    assert text.startswith("EditResult(LMCache 0.5.6, 24 layers: mamba-unified-view x18")
    assert "<table" in result._repr_html_()


def test_legacy_mamba_report_lists_both_states():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 2)
    row = apply_kv_cache_group_edits(cfg, caches).report.iloc[0]
    assert row["shape_before"] == ((2, 3, 6144), (2, 16, 128, 128))
    assert row["dtype_before"] == ("bfloat16", "float32")
    assert row["shape_after"] == (2, 2, 544, 1, 512)


def test_mla_subpaged_view():
    mla = MLAAttentionSpec(
        block_size=768, num_kv_heads=1, head_size=576, dtype=torch.bfloat16
    )
    gdn = MambaSpec(
        block_size=768,
        shapes=((4, 8),),
        dtypes=(torch.float32,),
        page_size_padded=mla.page_size_bytes,
        mamba_cache_mode="align",
    )
    cache = torch.zeros(3 * 12, 64, 576, dtype=torch.bfloat16)
    cfg = config([(["m"], mla), (["g"], gdn)], 3)
    caches = {"m": cache, "g": legacy_mamba(gdn, 3)}
    result = apply_kv_cache_group_edits(cfg, caches)
    assert tuple(result["m"].shape) == (3, 768, 576)
    assert same_storage(result["m"], cache)
    assert (
        result.report.set_index("layer").loc["m", "rule"]
        == "subpaged-mla-attention-view"
    )
    # unified rank 4, one head slot before the states
    unified = torch.zeros(3 * 12, 1, 64, 576, dtype=torch.bfloat16)
    view = SubpagedMLAAttentionViewEdit().apply(mla, unified)
    assert tuple(view.shape) == (3, 1, 768, 576)


def test_why_not_and_explain_match():
    rule = MambaUnifiedViewEdit()
    attn = qwen_attn()
    assert (
        rule.why_not(attn, torch.zeros(1)) == "spec kind is full_attention, not mamba"
    )
    assert rule.explain_match(qwen_gdn(), [torch.zeros(1)]).startswith(
        "mamba-unified-view: registered value is a list (legacy registration)"
    )
    assert MambaPageViewEdit().explain_match(qwen_gdn(), [torch.zeros(1)]) == (
        "mamba-page-view: matches"
    )
    # matches() is pure: a nonsense value answers False, never raises
    for r in DEFAULT_EDITS:
        assert r.matches(attn, object()) is False


def test_custom_rule_list():
    class Flatten(KVCacheGroupEdit):
        name = "flatten"

        def matches(self, spec, kv_cache):
            return isinstance(kv_cache, torch.Tensor)

        def apply(self, spec, kv_cache, *, kv_layout=None):
            return kv_cache.view(-1)

    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    result = apply_kv_cache_group_edits(cfg, caches, rules=[Flatten()])
    assert result["a"].ndim == 1 and same_storage(result["a"], caches["a"])
    assert result["g"] is caches["g"]
    assert result.counts == {"flatten": 1}
    assert "flatten: matches() returned False" in result.report.iloc[0]["declined"]
    empty = apply_kv_cache_group_edits(cfg, caches, rules=[])
    assert empty.counts == {} and all(empty[k] is caches[k] for k in caches)


def test_a_copying_rule_is_refused():
    class Copy(KVCacheGroupEdit):
        name = "copy"

        def matches(self, spec, kv_cache):
            return isinstance(kv_cache, torch.Tensor)

        def apply(self, spec, kv_cache, *, kv_layout=None):
            return kv_cache.clone()

    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    before = facts(caches)
    with pytest.raises(ValueError, match="rule 'copy'.*expected a view, never a copy"):
        apply_kv_cache_group_edits(cfg, caches, rules=[Copy()])
    assert facts(caches) == before


def test_each_layer_is_edited_as_the_group_edits_edit_it(monkeypatch):
    """``edit_each_layer`` walks the layers as ``apply_kv_cache_group_edits``
    does (same rule, same view per layer) and keeps its view check: a rule
    that copies refuses that layer, the others are still answered."""
    import kvexplore.editing.rules as rules_module
    from kvexplore.editing.rules import edit_each_layer

    cfg, caches = legacy_registration(
        [(["g"], qwen_gdn()), (["a"], qwen_attn())], 1, kernel=32
    )
    whole = apply_kv_cache_group_edits(cfg, caches, lmcache="0.5.6")
    each = edit_each_layer(cfg, caches, lmcache="0.5.6")
    assert set(each) == set(caches)
    for name, (rule, value, refusal) in each.items():
        assert refusal is None
        assert rule == whole.report.set_index("layer").loc[name, "rule"]
        assert isinstance(value, torch.Tensor) and value.shape == whole[name].shape
        source = caches[name][0] if isinstance(caches[name], list) else caches[name]
        assert value.stride() == whole[name].stride() and same_storage(value, source)

    class Copy(KVCacheGroupEdit):
        name = "copy"

        def matches(self, spec, kv_cache):
            return isinstance(kv_cache, torch.Tensor) and kv_cache.ndim == 5

        def apply(self, spec, kv_cache, *, kv_layout=None):
            return kv_cache.clone()

    monkeypatch.setattr(rules_module, "rules_for", lambda release: (Copy(),))
    before = facts(caches)
    each = edit_each_layer(cfg, caches, lmcache="0.5.6")
    rule, value, refusal = each["a"]
    assert rule == "copy" and value is None
    assert "expected a view, never a copy (group 1)" in refusal
    assert each["g"] == (None, caches["g"], None)
    assert facts(caches) == before


def test_rules_must_be_rules():
    cfg, caches = legacy_registration([(["g"], qwen_gdn())], 1)
    with pytest.raises(ValueError, match="rules is a int"):
        apply_kv_cache_group_edits(cfg, caches, rules=3)
    with pytest.raises(ValueError, match="lacks name/matches/apply"):
        apply_kv_cache_group_edits(cfg, caches, rules=["x"])


def test_subpaged_edit_on_a_small_legacy_tensor_is_a_view():
    spec = FullAttentionSpec(
        block_size=64, num_kv_heads=2, head_size=8, dtype=torch.float16
    )
    cache = legacy_attention(spec, 2, 16)
    view = SubpagedAttentionViewEdit().apply(spec, cache)
    view[1, 0, 0, 0, 0] = 7.0
    assert cache[4, 0, 0, 0, 0].item() == 7.0  # block 1 = kernel pages 4..7


def test_unified_layouts_blocks_first():
    groups = [(["g0", "g1"], qwen_gdn())]
    cfg, caches = unified_registration(groups, 4, layout=KVCacheLayout.BLNHC)
    assert caches["g1"].stride(0) == 2 * QWEN_PAGE
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="BLNHC")
    view = result["g1"]
    assert view.stride() == (2 * QWEN_PAGE, 2000, 2000, 1)
    lo, hi = byte_range(view)
    assert lo == QWEN_PAGE and hi <= 3 * 2 * QWEN_PAGE + 2 * QWEN_PAGE


def test_result_is_edit_result_dict(qwen_unified):
    cfg, caches = qwen_unified
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    assert isinstance(result, EditResult) and isinstance(result, dict)
    assert set(result) == set(caches)
    assert len(result.report) == len(caches)


def test_edit_result_is_frozen_and_hands_out_copies(qwen_unified):
    from dataclasses import FrozenInstanceError

    cfg, caches = qwen_unified
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    with pytest.raises(FrozenInstanceError):
        result.report = None
    with pytest.raises(FrozenInstanceError):
        result.counts = {}
    with pytest.raises(TypeError, match="EditResult is read-only"):
        result["model.layers.0.0"] = caches["model.layers.0.0"]
    with pytest.raises(TypeError, match="EditResult is read-only"):
        result.pop("model.layers.0.0")
    handed_out = result.report
    handed_out.loc[0, "rule"] = "tampered"
    result.counts["tampered"] = 1
    assert result.report.loc[0, "rule"] == "mamba-unified-view"
    assert "tampered" not in result.counts
    copy = dict(result)
    copy["model.layers.0.0"] = None  # a plain dict copy is the mutable form
    assert result["model.layers.0.0"] is not None


def test_edit_result_by_group_and_display_forms(qwen_unified):
    cfg, caches = qwen_unified
    result = apply_kv_cache_group_edits(cfg, caches, kv_layout="NHD")
    table = result.by_group()
    assert list(table.columns) == [
        "group",
        "kind",
        "rule",
        "layers",
        "shape_before",
        "shape_after",
        "block_bytes_before",
        "block_bytes_after",
    ]
    rows = table.set_index("group")
    assert rows.loc[0, "rule"] == "mamba-unified-view" and rows.loc[0, "layers"] == 6
    assert rows.loc[0, "shape_before"] == (64, 1, 1, 1085440)
    assert rows.loc[0, "shape_after"] == (64, 544, 1, 2000)
    assert rows.loc[0, "block_bytes_before"] == 1_085_440
    assert rows.loc[0, "block_bytes_after"] == 544 * 2000
    assert rows.loc[3, "rule"] == "subpaged-attention-view"
    assert rows.loc[3, "shape_after"] == (64, 2, 544, 1, 512)
    assert rows.loc[3, "block_bytes_before"] == rows.loc[3, "block_bytes_after"]
    assert rows.loc[3, "block_bytes_after"] == QWEN_PAGE
    text = result.text()
    assert text == repr(result) and text.startswith(result.summary())
    html = result._repr_html_()
    assert "by group" in html and "mamba-unified-view" in html
    fig = result.figure()
    assert len(fig.axes) == 1
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert "group 3 (full_attention)\nsubpaged-attention-view x6" in labels
