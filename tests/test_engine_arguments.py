"""Every field of vLLM's EngineArgs is a plan() keyword or is listed with the
reason it is not one (kvexplore.planning.arguments).  Runs on every release
of the window: the fields are read from the installed release's EngineArgs."""

import dataclasses

import pytest

from kvexplore.planning.arguments import (
    NOT_CACHE_ARGUMENTS,
    PLANNED_AS,
    UNPLANNED_CACHE_ARGUMENTS,
)
from kvexplore.planning.inputs import PLAN_KEYWORDS, keyword_fields

pytestmark = pytest.mark.release


def _engine_fields() -> set[str]:
    from vllm.engine.arg_utils import EngineArgs

    return {f.name for f in dataclasses.fields(EngineArgs)}


def test_every_engine_argument_is_a_keyword_or_listed_with_a_reason():
    accounted = (set(PLAN_KEYWORDS) | set(PLANNED_AS) | set(NOT_CACHE_ARGUMENTS)
                 | set(UNPLANNED_CACHE_ARGUMENTS))
    assert sorted(_engine_fields() - accounted) == []


def test_cache_config_fields_users_set_are_engine_arguments():
    """CacheConfig's fields that EngineArgs takes are accounted for like the others."""
    from vllm.config.cache import CacheConfig

    users = {f.name for f in dataclasses.fields(CacheConfig) if f.init} & _engine_fields()
    assert users, "EngineArgs takes no CacheConfig field?"
    listed = (set(PLAN_KEYWORDS) | set(PLANNED_AS) | set(UNPLANNED_CACHE_ARGUMENTS)
              | set(NOT_CACHE_ARGUMENTS))
    assert sorted(users - listed) == []
    # the cache's own dtypes and sizes are keywords, never "not cache" arguments
    for name in ("block_size", "kv_cache_dtype", "mamba_block_size", "mamba_cache_dtype",
                 "mamba_ssm_cache_dtype", "prefix_match_unit", "gpu_memory_utilization"):
        assert name in PLAN_KEYWORDS and name not in NOT_CACHE_ARGUMENTS


def test_tables_are_disjoint_and_every_reason_is_said():
    tables = [set(PLAN_KEYWORDS), set(PLANNED_AS), set(NOT_CACHE_ARGUMENTS),
              set(UNPLANNED_CACHE_ARGUMENTS)]
    for i, a in enumerate(tables):
        for b in tables[i + 1:]:
            assert a & b == set()
    for table in (PLANNED_AS, NOT_CACHE_ARGUMENTS, UNPLANNED_CACHE_ARGUMENTS):
        assert all(isinstance(why, str) and len(why) > 10 for why in table.values())


def test_engine_keywords_are_engine_arguments_of_the_installed_release():
    fields = _engine_fields()
    engine = [f.name for f in keyword_fields() if f.metadata["engine"]]
    missing = [n for n in engine if n not in fields]
    assert missing == []
