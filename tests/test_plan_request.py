"""PlanRequest is the one spelling of plan()'s inputs: plan()'s signature,
its defaults, the checks, the cache key and the command line's options are
its fields; it is frozen, hashable and picklable."""

import dataclasses
import inspect
import json
import pickle

import numpy as np
import pytest
import torch

import kvexplore
from kvexplore import KVExploreError
from kvexplore.cli import build_parser
from kvexplore.planning import release
from kvexplore.planning.inputs import (
    PLAN_DEFAULTS,
    PLAN_KEYWORDS,
    POST_BUILD_KEYWORDS,
    PlanRequest,
    keyword_fields,
)


def test_plan_signature_is_the_request_fields_in_order_with_their_defaults():
    params = list(inspect.signature(kvexplore.plan).parameters.values())
    assert [p.name for p in params[:2]] == ["model", "gpu"]
    rest = params[2:]
    fields = [f for f in dataclasses.fields(PlanRequest) if f.init]
    assert [p.name for p in rest] == [f.name for f in fields] == list(PLAN_KEYWORDS)
    for p, f in zip(rest, fields, strict=True):
        assert p.kind is inspect.Parameter.KEYWORD_ONLY
        assert p.default == f.default, p.name


def test_defaults_are_vllm_engine_argument_defaults():
    """Every engine keyword's default is vLLM's own EngineArgs default (None
    where vLLM decides and kvexplore leaves it unset)."""
    from vllm.engine.arg_utils import EngineArgs

    engine = {f.name: f for f in dataclasses.fields(EngineArgs)}
    for f in keyword_fields():
        if not f.metadata["engine"]:
            continue
        assert f.name in engine, f.name
        theirs = engine[f.name]
        default = (theirs.default_factory() if theirs.default_factory is not dataclasses.MISSING
                   else theirs.default)
        assert f.default is None or f.default == default, (f.name, f.default, default)


def test_request_is_frozen_hashable_and_picklable():
    r = PlanRequest(tensor_parallel_size=np.int64(2), dtype=torch.bfloat16,
                    speculative_config={"num_speculative_tokens": 2, "method": "mtp"},
                    hf_overrides={"num_hidden_layers": 4})
    assert r.tensor_parallel_size == 2 and type(r.tensor_parallel_size) is int
    assert r.dtype == "bfloat16"
    # dict keys in another order: the same request
    same = PlanRequest(tensor_parallel_size=2, dtype="bfloat16",
                       speculative_config={"method": "mtp", "num_speculative_tokens": 2},
                       hf_overrides={"num_hidden_layers": 4})
    assert r == same and hash(r) == hash(same) and len({r, same}) == 1
    back = pickle.loads(pickle.dumps(r))
    assert back == r and hash(back) == hash(r)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.block_size = 16
    assert r.keywords()["speculative_config"] == {"method": "mtp", "num_speculative_tokens": 2}
    assert r.given() == {"tensor_parallel_size": 2, "dtype": "bfloat16",
                         "speculative_config": {"method": "mtp", "num_speculative_tokens": 2},
                         "hf_overrides": {"num_hidden_layers": 4}}
    assert r.replace(block_size=32).block_size == 32 and r.replace(block_size=32) != r


def test_build_request_drops_only_the_memory_keywords_and_the_stage():
    r = PlanRequest(num_blocks=8, max_model_len=4096, gpu_memory_utilization=0.5, block_size=32)
    b = r.build_request()
    assert {name: getattr(b, name) for name in POST_BUILD_KEYWORDS} == {
        name: PLAN_DEFAULTS[name] for name in POST_BUILD_KEYWORDS}
    assert b.block_size == 32
    assert set(POST_BUILD_KEYWORDS) == {"max_model_len", "num_blocks", "kv_cache_memory_bytes",
                                    "gpu_memory_utilization", "enable_extensible_kv_cache",
                                    "pipeline_parallel_rank", "gpu_memory_in_use"}
    assert b == PlanRequest(block_size=32)


def test_engine_kwargs_are_the_keywords_set_that_engine_args_takes():
    r = PlanRequest(block_size=32, num_blocks=4, hf_overrides={"num_hidden_layers": 2},
                    kv_cache_layout="HND")
    kw = r.engine_kwargs()
    assert kw["block_size"] == 32 and kw["hf_overrides"] == {"num_hidden_layers": 2}
    # not EngineArgs fields of the same meaning: applied by the planner itself
    assert not {"num_blocks", "kv_cache_layout", "max_model_len"} & set(kw)
    assert all(v is not None for v in kw.values())


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("tensor_parallel_size", 0, "an integer >= 1"),
    ("block_size", 16.0, "an integer >= 1 or None"),
    ("dtype", "int8", "one of"),
    ("enable_prefix_caching", 1, "True, False or None"),
    ("gpu_memory_utilization", 1.5, "a number in (0, 1]"),
    ("max_model_len", 0, "-1 (auto-fit"),
    ("speculative_config", "mtp", "a dict such as"),
    ("mamba_block_size", -8, "an integer >= 1 or None"),
    ("prefix_match_unit", "32", "an integer >= 1 or None"),
    ("mamba_cache_dtype", "int4", "one of"),
    ("data_parallel_size", 1.0, "an integer >= 1"),
    ("enable_expert_parallel", None, "True or False"),
    ("quantization", "fp9", "one of"),
    ("hf_overrides", "num_hidden_layers=4", "a dict such as"),
    ("hf_overrides", {"x": float("nan")}, "JSON values only"),
])
def test_each_field_refuses_bad_input_naming_it(name, value, expected):
    with pytest.raises(KVExploreError) as err:
        PlanRequest(**{name: value})
    assert f"{name}={value!r} is invalid" in str(err.value) and expected in str(err.value)
    with pytest.raises(KVExploreError, match=f"{name}="):  # the same through plan()
        kvexplore.plan("Qwen/Qwen3.5-0.8B", **{name: value})


def test_a_keyword_the_release_lacks_is_refused_naming_the_release(monkeypatch):
    names = release.engine_argument_names() - {"mamba_block_size"}
    monkeypatch.setattr(release, "engine_argument_names", lambda: names)
    with pytest.raises(KVExploreError) as err:
        PlanRequest(enable_prefix_caching=True, mamba_block_size=64)
    text = str(err.value)
    assert release.release_name() in text and "mamba_block_size=64" in text
    assert PlanRequest(mamba_block_size=None).mamba_block_size is None  # unset: fine


def _plan_parser(command="plan"):
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return sub.choices[command]


def test_cli_options_are_made_from_the_fields_metadata():
    actions = {a.dest: a for a in _plan_parser()._actions}
    for f in keyword_fields():
        a = actions[f.name]
        flags = f.metadata["flags"] or ("--" + f.name.replace("_", "-"),)
        assert set(flags) <= set(a.option_strings), f.name
        assert a.help.startswith(f.metadata["help"])
        choices = f.metadata["choices"]
        if callable(choices):
            # the release's names are checked by PlanRequest, not asked of vLLM per call
            assert a.choices is None and "installed vLLM release" in a.help
        elif choices is not None:
            assert list(a.choices) == list(choices)


def test_cli_flags_reach_the_request():
    argv = ["plan", "m", "--tp", "2", "--mamba-block-size", "64", "--prefix-match-unit", "32",
            "--dp", "2", "--enable-expert-parallel", "--quantization", "fp8",
            "--mamba-cache-dtype", "float32", "--hf-overrides", '{"num_hidden_layers": 4}']
    ns = build_parser().parse_args(argv)
    from kvexplore.cli import plan_kwargs

    r = PlanRequest(**{k: v for k, v in plan_kwargs(ns).items() if k != "gpu"})
    assert (r.tensor_parallel_size, r.mamba_block_size, r.prefix_match_unit,
            r.data_parallel_size, r.enable_expert_parallel, r.quantization,
            r.mamba_cache_dtype, json.loads(r.hf_overrides)) == (
        2, 64, 32, 2, True, "fp8", "float32", {"num_hidden_layers": 4})


def test_cli_refuses_a_choice_outside_the_field_choices(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["plan", "m", "--mamba-cache-mode", "sometimes"])
    assert "'sometimes'" in capsys.readouterr().err
    from kvexplore.cli import main

    assert main(["plan", "Qwen/Qwen3.5-0.8B", "--quantization", "fp9", "--json"]) != 0
    err = capsys.readouterr().err
    assert "quantization='fp9' is invalid; expected one of" in err and "'fp8'" in err
