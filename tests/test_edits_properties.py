"""Property-based: generated valid layouts round-trip; invalid ones raise ValueError."""

from __future__ import annotations

import re

import pytest
import torch
from edit_layouts import (
    byte_range,
    facts,
    legacy_registration,
    snapshot,
    storage_bytes,
    unified_registration,
)
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
from vllm.v1.kv_cache_layout import KVCacheLayout

from kvexplore import KVExploreError
from kvexplore.editing.roundtrip import verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits

SETTINGS = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ATTN_DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.uint8]
STATE_DTYPES = [torch.float16, torch.bfloat16, torch.float32]


def esize(dtype):
    return torch.empty((), dtype=dtype).element_size()


@st.composite
def hybrid_layout(draw):
    kernel = draw(st.sampled_from([1, 2, 4, 8, 16]))
    ratio = draw(st.integers(1, 4))
    block = kernel * ratio
    heads = draw(st.integers(1, 3))
    head = draw(st.sampled_from([8, 16, 24, 32, 64]))
    attn_dtype = draw(st.sampled_from(ATTN_DTYPES))
    attn = FullAttentionSpec(
        block_size=block, num_kv_heads=heads, head_size=head, dtype=attn_dtype
    )
    page = attn.page_size_bytes
    conv_dtype = draw(st.sampled_from(STATE_DTYPES))
    ssm_dtype = draw(st.sampled_from(STATE_DTYPES))
    conv = (draw(st.integers(1, 3)), draw(st.integers(1, 8)))
    ssm = (draw(st.integers(1, 4)), draw(st.integers(1, 8)))
    conv_bytes = conv[0] * conv[1] * esize(conv_dtype)
    ssm_bytes = ssm[0] * ssm[1] * esize(ssm_dtype)
    assume(conv_bytes % esize(ssm_dtype) == 0)
    # leave >= 16 B of padding per token so the unified tiling always exists
    assume(conv_bytes + ssm_bytes + 16 * block <= page)
    assume(page % (2 * block * esize(conv_dtype)) == 0)
    gdn = MambaSpec(
        block_size=block,
        shapes=(conv, ssm),
        dtypes=(conv_dtype, ssm_dtype),
        page_size_padded=page,
        mamba_cache_mode="align",
    )
    layers = draw(st.integers(1, 3))
    groups = [
        ([f"m{i}" for i in range(layers)], gdn),
        ([f"a{i}" for i in range(layers)], attn),
    ]
    blocks = draw(st.integers(1, 4))
    return groups, blocks, kernel


def tensors(value):
    return [value] if isinstance(value, torch.Tensor) else list(value)


def check_views(caches, edited):
    for name, value in edited.items():
        old = tensors(caches[name])
        for t in tensors(value):
            assert t.untyped_storage().data_ptr() == old[0].untyped_storage().data_ptr()
            lo, hi = byte_range(t)
            assert lo == min(byte_range(o)[0] for o in old)


@SETTINGS
@given(hybrid_layout(), st.sampled_from([None, 1, 700, 5000]))
def test_legacy_layouts_round_trip(layout, chunk_bytes):
    groups, blocks, kernel = layout
    cfg, caches = legacy_registration(groups, blocks, kernel=kernel)
    for i, raw in enumerate(storage_bytes(caches)):
        raw.copy_(torch.arange(raw.numel()) * (i + 3) % 256)  # not a pattern
    contents = snapshot(caches)
    before = facts(caches)
    edited = apply_kv_cache_group_edits(cfg, caches)
    assert facts(caches) == before
    check_views(caches, edited)
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
    assert report.ok, report
    assert facts(caches) == before
    after = snapshot(caches)
    assert all(torch.equal(a, b) for a, b in zip(contents, after, strict=True))


@SETTINGS
@given(
    hybrid_layout(),
    st.sampled_from(["NHD", "HND"]),
    st.sampled_from([None, 1, 700, 5000, 1 << 20]),
    st.integers(0, 2**31 - 1),
)
def test_unified_layouts_round_trip(layout, hint, chunk_bytes, seed):
    groups, blocks, kernel = layout
    cfg, caches = unified_registration(
        groups, blocks, KVCacheLayout.LBNHC, kernel=kernel
    )
    (raw,) = storage_bytes(caches)  # one allocation, groups overlaid
    noise = torch.randint(
        0,
        256,
        raw.shape,
        dtype=torch.uint8,
        generator=torch.Generator().manual_seed(seed),
    )
    raw.copy_(noise)
    before = facts(caches)
    edited = apply_kv_cache_group_edits(cfg, caches, kv_layout=hint)
    assert facts(caches) == before
    check_views(caches, edited)
    # Any tiling (one layer of one block per step up to everything at once)
    # gives the same verdicts and puts every byte back.
    report = verify_roundtrip(cfg, caches, edited, chunk_bytes=chunk_bytes)
    assert report.ok, report
    assert torch.equal(snapshot(caches)[0], noise)


BREAKAGES = [
    "stride",
    "conv_offset",
    "missing",
    "extra",
    "list_length",
    "kernel_pages",
    "non_contiguous",
]


def break_it(how, cfg, caches):
    caches = dict(caches)
    m, a = "m0", "a0"
    conv, ssm = caches[m]
    if how == "stride":
        caches[m] = [
            conv.as_strided(conv.shape, (conv.stride(0) - 1, *conv.stride()[1:])),
            ssm,
        ]
    elif how == "conv_offset":
        caches[m] = [conv.as_strided(conv.shape, conv.stride(), 1), ssm]
    elif how == "missing":
        del caches[a]
    elif how == "extra":
        caches["stray"] = caches[a]
    elif how == "list_length":
        caches[m] = [conv]
    elif how == "kernel_pages":
        t = caches[a]
        assume(t.shape[2] > 1)
        caches[a] = (
            t[:-1] if t.shape[0] > 1 else torch.zeros((3, *t.shape[1:]), dtype=t.dtype)
        )
        assume(
            caches[a].shape[0]
            * t.shape[2]
            % cfg.kv_cache_groups[1].kv_cache_spec.block_size
        )
    elif how == "non_contiguous":
        t = caches[a]
        # Heads and kernel-block tokens swapped: out of logical order only
        # when both dims hold more than one element.
        assume(
            t.shape[3] > 1
            and 1 < t.shape[2] < cfg.kv_cache_groups[1].kv_cache_spec.block_size
        )
        caches[a] = torch.zeros(
            (t.shape[0], 2, t.shape[3], t.shape[2], t.shape[4]), dtype=t.dtype
        ).transpose(2, 3)
    return caches


def expected_message(how, cfg, caches):
    """The message each breakage must raise, naming the offending value."""
    conv = caches["m0"][0]
    attn_spec = cfg.kv_cache_groups[1].kv_cache_spec
    page = cfg.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    if how == "stride":
        step = conv.stride(0) * conv.element_size()
        return (
            rf"'m0'.*Mamba state 0 per-block stride \({step} bytes\) does not "
            rf"equal the page size \({page} bytes\)"
        )
    if how == "conv_offset":
        return (
            rf"'m0'.*its byte offset {conv.element_size()} \(storage_offset=1\) "
            rf"is not 0 .*{page}-byte pages"
        )
    if how == "missing":
        return r"lacks 1 layer\(s\) the config names: \['a0'\]"
    if how == "extra":
        return r"holds 1 layer\(s\) no config group names: \['stray'\]"
    if how == "list_length":
        return r"Mamba layer 'm0' is a list of 1 tensors; expected 2"
    t = caches["a0"]
    if how == "kernel_pages":
        # whole kernel pages missing: not num_blocks pages of the layer's spec
        shape = re.escape(str(tuple(t.shape)))
        return (
            rf"layer 'a0' is registered as {shape}: .* expected {cfg.num_blocks:,} blocks x "
            rf"{attn_spec.page_size_bytes:,} B"
        )
    assert how == "non_contiguous"
    shape = re.escape(str(tuple(t.shape)))
    return rf"'a0'.*{shape}.* is not contiguous in logical order"


@SETTINGS
@given(hybrid_layout(), st.sampled_from(BREAKAGES))
def test_invalid_layouts_raise_an_error_naming_the_value(layout, how):
    groups, blocks, kernel = layout
    cfg, caches = legacy_registration(groups, blocks, kernel=kernel)
    broken = break_it(how, cfg, caches)
    assume(how != "stride" or broken["m0"][0].stride(0) > 0)
    before = facts(broken)
    with pytest.raises(KVExploreError, match=expected_message(how, cfg, broken)):
        apply_kv_cache_group_edits(cfg, broken)
    assert facts(broken) == before
