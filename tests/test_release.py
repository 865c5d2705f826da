"""kvexplore answers for the installed vLLM release, and only inside its window.

These tests run on every release of the window, each in its own environment
(``scripts/test.sh``).  The oracles are the installed release's own functions,
imported here from wherever that release keeps them (not through
kvexplore's resolver), and facts read by hand from the config and from the
release's ``CacheConfig``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math

import pytest
from reference import qwen35_hand_block_size

import kvexplore
from kvexplore.planning import release

pytestmark = pytest.mark.release

VERSION = importlib.metadata.version("vllm")
CATALOG = kvexplore.catalog_names()
GPUS = ("A100", "H100")
TPS = (1, 2)
MEMORY = 4 << 30


def _vllm_kv_cache_config(p, memory: int):
    """The release's ``get_kv_cache_configs`` on the plan's specs, called as
    that release's engine core calls it."""
    vc, specs = p.vllm_config, dict(p.layer_specs)
    try:
        planning = importlib.import_module("vllm.v1.core.kv_cache_planning")
    except ImportError:
        planning = importlib.import_module("vllm.v1.core.kv_cache_utils")
    if hasattr(planning, "get_global_kv_cache_groups"):
        groups = planning.get_global_kv_cache_groups(vc, [specs])
        return planning.get_kv_cache_configs(vc, [specs], [memory], groups)[0]
    return planning.get_kv_cache_configs(vc, [specs], [memory])[0]


# -- the window ---------------------------------------------------------------


def test_installed_release_is_in_the_window_and_named():
    assert release.installed_release().version == VERSION
    assert VERSION in release.WINDOW_RELEASES
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=16)
    assert p.vllm_version == VERSION
    assert p.to_dict()["vllm"] == VERSION
    assert f"vLLM {VERSION}" in p.explain().splitlines()[0]


@pytest.mark.parametrize("version", ["0.30.0", "0.26.1", "0.35.0", "1.0.0", "not-a-version"])
def test_a_release_outside_the_window_is_refused(monkeypatch, version):
    monkeypatch.setattr(importlib.metadata, "version", lambda name: version)
    release.installed_release.cache_clear()
    try:
        with pytest.raises(kvexplore.KVExploreError) as info:
            kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=16)
    finally:
        release.installed_release.cache_clear()
    msg = str(info.value)
    assert version in msg and "0.31.0" in msg and "0.35" in msg


def test_internals_that_do_not_match_the_version_are_refused(monkeypatch):
    """A vLLM whose modules lack get_kv_cache_configs is no release of the window."""
    for name in ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.kv_cache_utils"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        monkeypatch.delattr(module, "get_kv_cache_configs", raising=False)
    release.kv_cache_planning.cache_clear()
    try:
        with pytest.raises(kvexplore.KVExploreError) as info:
            release.kv_cache_planning()
    finally:
        release.kv_cache_planning.cache_clear()
    assert VERSION in str(info.value) and "get_kv_cache_configs" in str(info.value)


def test_requirement_declared_once_matches_the_window():
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    assert release.REQUIREMENT in (root / "pyproject.toml").read_text()
    assert release.REQUIREMENT in (root / "environment.yml").read_text()


# -- the release's own answers -----------------------------------------------


@pytest.mark.parametrize("gpu", GPUS)
def test_worked_example_follows_the_release(gpu):
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=gpu, num_blocks=16)
    assert p.block_size == qwen35_hand_block_size(gpu)
    assert p.mamba_page_size == 1085440
    assert p.mamba_page_size_padded == p.block_size * 2048
    assert p.explain().splitlines()[1].startswith("gpu:")
    assert f"{p.block_size} = " in p.derivation()["block_size"]


@pytest.mark.parametrize("name", CATALOG)
@pytest.mark.parametrize("gpu", GPUS)
@pytest.mark.parametrize("tp", TPS)
def test_catalog_plans_equal_the_releases_own_functions(name, gpu, tp):
    """Groups, tensors, num_blocks and the memory check's verdict of a 4 GiB
    cache equal the release's own get_kv_cache_configs on the same specs
    (the later start-up checks: tests/test_startup.py)."""
    p = kvexplore.plan(name, gpu=gpu, tensor_parallel_size=tp, kv_cache_memory_bytes=MEMORY)
    assert p.vllm_version == VERSION
    try:
        ref = _vllm_kv_cache_config(p, MEMORY)
    except ValueError as exc:
        assert p.admission is not None and not p.admission.ok
        assert " ".join(str(exc).split()) == p.admission.message
        return
    got = p.kv_cache_config
    assert got.num_blocks == ref.num_blocks == p.num_blocks
    assert [list(g.layer_names) for g in got.kv_cache_groups] == \
        [list(g.layer_names) for g in ref.kv_cache_groups]
    assert [g.kv_cache_spec for g in got.kv_cache_groups] == \
        [g.kv_cache_spec for g in ref.kv_cache_groups]
    assert [(t.size, list(t.layers)) for t in got.kv_cache_tensors] == \
        [(t.size, list(t.layers)) for t in ref.kv_cache_tensors]
    assert p.admission is None or p.admission.memory_ok


# -- how the release sizes and hands over the cache ----------------------------


def _has_extensible_cache() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm.v1.worker.extensible_kv_cache") is not None


def test_default_utilization_and_sizing_follow_the_release():
    """Without num_blocks / kv_cache_memory_bytes: on a release with the
    extensible KV cache, utilization 1.0 and the cache measured after warmup
    (total - resident memory - max(1 GiB, 0.75 x peak) - peak); before it, the
    release's CacheConfig default (0.92) and the start-up profile
    (total x 0.92 - every term).  Terms are the capacity report's, whose
    itemisation the 0.33 tests check against public logs."""
    from vllm.config.cache import CacheConfig

    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100")
    ext = _has_extensible_cache()
    assert p.extensible_kv_cache is ext
    if ext:
        assert p.gpu_memory_utilization == 1.0
    else:
        assert p.gpu_memory_utilization == CacheConfig().gpu_memory_utilization == 0.92
    terms = kvexplore.profile_estimates(p)
    total = terms["total_memory_bytes"][0]
    peak = terms["activation_peak_bytes"][1]
    resident = sum(terms[k][1] for k in ("weight_bytes", "non_torch_bytes", "cudagraph_bytes"))
    if ext:
        expected = total - resident - max(1 << 30, int(0.75 * peak)) - peak
    else:
        expected = math.ceil(total * 0.92) - resident - peak
    assert p.kv_cache_memory_bytes == expected
    assert p.num_blocks == expected // p.bytes_per_block
    # a given block count or memory turns the extensible cache off, as vLLM does
    assert not p.with_num_blocks(8).extensible_kv_cache
    assert p.with_num_blocks(8).gpu_memory_utilization == 0.92


def test_registration_follows_the_releases_cache():
    """An in-process connector gets per-layer storages of exactly the committed
    blocks under the extensible cache (LBNHC: one per layer region, the groups
    aliasing them), else views into one buffer."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", attention_backend="FLASHINFER")
    kv = kvexplore.allocate(p, num_blocks=4)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in kv.values()}
    page = p.mamba_page_size_padded
    if p.extensible_kv_cache:
        assert len(storages) == 6  # 24 layers in 4 groups of 6 aliasing 6 regions
        assert set(storages.values()) == {4 * page}
        assert all(t.storage_offset() == 0 for t in kv.values())
    else:
        assert len(storages) == 1
        assert set(storages.values()) == {4 * page * 6}
    small = p.with_num_blocks(4)
    edited = kvexplore.apply_kv_cache_group_edits(small.kv_cache_config, kv)
    assert kvexplore.verify_roundtrip(small.kv_cache_config, kv, edited).ok
