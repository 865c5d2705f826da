"""Integration: every bundled model, both registrations, TP 1 and 4.

Validation verdicts follow LMCache 0.5.6's ``validate_kv_cache_groups``
(checked against an independent reading of each group's specs); every
accepted model round-trips byte-exactly on all layers through the edited
views.
"""

from __future__ import annotations

import functools

import pytest
import torch
from vllm.v1.kv_cache_interface import (
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
    iter_layer_specs,
)

from kvexplore import allocate, plan
from kvexplore.editing.roundtrip import verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits
from kvexplore.editing.validation import check_kv_cache_groups
from kvexplore.planning.models import catalog_names

NUM_BLOCKS = 3
CASES = [(name, tp) for name in catalog_names() for tp in (1, 4)]


@functools.cache
def planned(name: str, tp: int):
    """Every catalog model plans at TP 1 and 4 on an A100 (vLLM refuses none
    of them), so a planning error here is a failure, never a skip."""
    return plan(name, tensor_parallel_size=tp, num_blocks=NUM_BLOCKS, gpu="A100")


def seed_verdict(spec) -> str:
    for leaf in iter_layer_specs(spec):
        kind = get_kv_cache_spec_kind(leaf)
        if kind == KVCacheSpecKind.CROSS_ATTENTION:
            return "rejected"
        if kind == KVCacheSpecKind.MAMBA and leaf.mamba_cache_mode != "align":
            return "rejected"
    return "accepted"


def test_catalog_is_not_empty():
    assert len(catalog_names()) >= 10


@pytest.mark.parametrize(("name", "tp"), CASES)
def test_validation_verdicts(name, tp):
    cfg = planned(name, tp).kv_cache_config
    table = check_kv_cache_groups(cfg)
    expected = [seed_verdict(g.kv_cache_spec) for g in cfg.kv_cache_groups]
    assert table["verdict"].tolist() == expected


@pytest.mark.parametrize("registration", ["unified", "legacy"])
@pytest.mark.parametrize(("name", "tp"), CASES)
def test_round_trip_every_accepted_model(name, tp, registration):
    p = planned(name, tp)
    cfg = p.kv_cache_config
    if (check_kv_cache_groups(cfg)["verdict"] == "rejected").any():
        caches = allocate(p, device="cpu", registration=registration)
        with pytest.raises(ValueError, match="cannot be served"):
            apply_kv_cache_group_edits(cfg, caches)
        return
    caches = allocate(p, device="cpu", registration=registration)
    # the plan itself: every registered tensor is checked against its layout too
    edited = apply_kv_cache_group_edits(p, caches, kv_layout=p.kv_cache_layout)
    for layer, value in edited.items():
        old = caches[layer]
        new = [value] if isinstance(value, torch.Tensor) else value
        first = old if isinstance(old, torch.Tensor) else old[0]
        assert all(
            t.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
            for t in new
        ), layer
    report = verify_roundtrip(cfg, caches, edited)
    assert report.ok, report
    assert len(report.table) == sum(len(g.layer_names) for g in cfg.kv_cache_groups)
    if cfg.has_mamba_layers:
        assert edited.counts, edited
