"""OffloadOptions, the one-pass derivation, fresh errors, a frozen OffloadResult,
its display forms, and the CLI's offloading flags."""

from __future__ import annotations

import dataclasses
import inspect
import json
import pathlib
import traceback

import pytest

import kvexplore
from kvexplore import KVExploreError, OffloadOptions
from kvexplore.cli import main
from kvexplore.offloading import sweep as sweep_function
from kvexplore.offloading.config import (
    OFFLOAD_KEYWORDS,
    OffloadConfigError,
    offload_config,
)
from kvexplore.offloading.derive import Derivation, Derived, derive
from kvexplore.offloading.options import DEFAULT_ENGINE_ID

QWEN = "Qwen/Qwen3.5-0.8B"
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


# -- OffloadOptions ------------------------------------------------------------------


def test_options_are_the_one_list_of_names_and_defaults():
    names = tuple(f.name for f in dataclasses.fields(OffloadOptions))
    assert OffloadOptions.names() == names == OFFLOAD_KEYWORDS
    sweep_module = inspect.getmodule(sweep_function)
    assert sweep_module.OFFLOAD_KEYWORDS == names
    o = OffloadOptions()
    assert (o.prefill_context_parallel_size, o.distributed_executor_backend, o.engine_id) == (
        1,
        "mp",
        DEFAULT_ENGINE_ID,
    )
    assert dict(o.extra_config) == {}
    assert list(o.as_dict()) == list(names)


@pytest.mark.parametrize(
    "kw, facts",
    [
        ({"prefill_context_parallel_size": 0}, ["prefill_context_parallel_size=0", "integer >= 1"]),
        ({"data_parallel_rank": -1}, ["data_parallel_rank=-1", "integer >= 0"]),
        ({"rank": "0"}, ["rank='0'", "integer >= 0"]),
        ({"nnodes_within_dp": 2.0}, ["nnodes_within_dp=2.0", "integer >= 1"]),
        ({"use_v2_model_runner": 1}, ["use_v2_model_runner=1", "True or False"]),
        ({"distributed_executor_backend": "slurm"}, ["'slurm'", "expected one of", "'mp'"]),
        ({"engine_id": 7}, ["engine_id=7", "non-empty string"]),
        ({"extra_config": "block_size=1088"}, ["'block_size=1088'", "expected a mapping"]),
    ],
)
def test_bad_option_values_name_value_and_expectation(kw, facts):
    with pytest.raises(KVExploreError) as info:
        OffloadOptions(**kw)
    for fact in facts:
        assert fact in str(info.value), (fact, str(info.value))


def test_bad_option_names_are_kvexplore_errors(qwen_a100):
    with pytest.raises(KVExploreError, match=r"unknown offload option 'pipline_parallel_size'; expected one of \["):
        OffloadOptions.from_kwargs(pipline_parallel_size=2)
    with pytest.raises(KVExploreError, match="unknown offload option 'tp'.*'prefill_context_parallel_size'"):
        offload_config(qwen_a100, tp=2)
    with pytest.raises(KVExploreError, match="unknown offload option 'rnak'"):
        OffloadOptions().replace(rnak=1)
    with pytest.raises(KVExploreError, match="expected an OffloadOptions or None"):
        offload_config(qwen_a100, {"rank": 0})


def test_options_are_frozen_and_extra_config_is_a_private_copy():
    extra = {"block_size": 1088}
    o = OffloadOptions(extra_config=extra)
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.rank = 1
    with pytest.raises(TypeError):
        o.extra_config["block_size"] = 544
    extra["block_size"] = 544
    assert o.extra_config["block_size"] == 1088
    assert o.replace(rank=0) is o or o.replace(rank=0) == o
    with pytest.raises(KVExploreError, match="rank=-2"):
        o.replace(rank=-2)


def test_options_object_and_keywords_agree(qwen_a100):
    o = OffloadOptions(extra_config={"blocks_per_chunk": 2}, nnodes_within_dp=2, rank=0)
    a = offload_config(qwen_a100, o)
    b = offload_config(qwen_a100, extra_config={"blocks_per_chunk": 2}, nnodes_within_dp=2, rank=0)
    assert a.config == b.config and a.explain() == b.explain()
    # keywords override the options object
    c = offload_config(qwen_a100, o, extra_config={"blocks_per_chunk": 3})
    assert c.config.cache.blocks_per_chunk == 3 and c.options.nnodes_within_dp == 2


# -- the derivation ----------------------------------------------------------------------


def test_derive_returns_values_with_their_rules(qwen_a100):
    d = derive(qwen_a100, OffloadOptions(extra_config={"block_size": 1088}))
    assert isinstance(d, Derivation)
    assert d.blocks_per_chunk == Derived(2, "extra_config['block_size'] 1088 // 544 tokens per block")
    assert [t.value for t in d.tokens_per_block] == [544, 544, 544, 544]
    assert d.world_size == Derived(1, "PP 1 x TP 1 x PCP 1")
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.blocks_per_chunk = Derived(3, "")


def test_each_raise_is_a_fresh_exception():
    p = kvexplore.plan(QWEN, enable_prefix_caching=False, gpu="A100")
    caught = []
    for _ in range(3):
        try:
            offload_config(p)
        except OffloadConfigError as exc:
            caught.append(exc)
    assert len(caught) == 3 and caught[0].code == "tokens_per_hash"
    assert len({id(e) for e in caught}) == 3
    assert len({str(e) for e in caught}) == 1
    depths = [len(traceback.extract_tb(e.__traceback__)) for e in caught]
    assert depths[0] == depths[1] == depths[2], depths
    assert caught[2].__context__ is None and caught[2].__cause__ is None


def test_library_code_never_changes_the_environment():
    root = pathlib.Path(kvexplore.__file__).parent / "offloading"
    for path in root.glob("*.py"):
        assert "os.environ" not in path.read_text(), path


# -- the result ----------------------------------------------------------------------------


def test_result_cannot_be_mutated(qwen_a100):
    r = offload_config(qwen_a100, extra_config={"block_size": 1088})
    for name in ("config", "options", "plan", "derivation"):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(r, name, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.config.cache.blocks_per_chunk = 3
    with pytest.raises(TypeError, match="read-only"):
        r.config.extra_config["block_size"] = 544
    with pytest.raises(TypeError, match="read-only"):
        r.config.extra_config.update(canonical_layout=True)
    assert r.config.extra_config == {"block_size": 1088}
    assert isinstance(r.rows(), tuple)
    # still a dict for vLLM's consumers, asdict and JSON
    assert json.loads(json.dumps(dataclasses.asdict(r.config)))["extra_config"] == {"block_size": 1088}


def test_text_html_and_figure(qwen_a100):
    r = offload_config(qwen_a100, extra_config={"blocks_per_chunk": 2})
    assert isinstance(r, kvexplore.display.Displayable)
    assert r.text() == r.explain()
    assert r.text().splitlines()[0].startswith("groups = (0, 1, 2, 3): 4 of 4 KV cache groups")
    html = r._repr_html_()
    assert html.startswith("<div><b>OffloadingConfig</b> for Qwen/Qwen3.5-0.8B")
    assert 'class="kvx-table"' in html and "cache.blocks_per_chunk" in html
    assert "data:image" not in html and "<img" not in html
    fig = r.figure()
    title = fig._suptitle.get_text()
    for fact in (QWEN, "A100", "TP 1", "attention backend", "executor mp"):
        assert fact in title, title
    ax_tokens, ax_bytes = fig.axes
    labels = [t.get_text() for t in ax_tokens.get_yticklabels()]
    assert labels[0] == "group 0: MambaSpec x 6" and labels[3] == "group 3: FullAttentionSpec x 6"
    notes = [t.get_text() for t in ax_tokens.texts]
    assert notes[0] == "2 x 544 = 1088 tokens; keeps 1 chunk(s)"
    assert notes[3] == "2 x 544 = 1088 tokens"
    assert f"{r.config.worker_kv_bytes_per_block:,} B" in ax_bytes.get_xlabel()
    assert [t.get_text() for t in ax_bytes.texts][0] == "6,684,672 B"


# -- the CLI ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, facts",
    [
        ("[1088]", ["--extra '[1088]'", "JSON array, not an object", "expected a JSON object"]),
        ("1088", ["--extra '1088'", "JSON number", "expected a JSON object"]),
        ("{block_size: 1088}", ["is not JSON", "expected a JSON object"]),
    ],
)
def test_cli_extra_must_be_a_json_object(capsys, extra, facts):
    assert main(["offload", QWEN, "--gpu", "A100", "--extra", extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvexplore: error:") and err.count("\n") == 1
    assert "Traceback" not in err
    for fact in facts:
        assert fact in err, (fact, err)


def test_cli_bad_option_flag(capsys):
    assert main(["offload", QWEN, "--gpu", "A100", "--rank", "two"]) == 2
    err = capsys.readouterr().err
    assert "--rank 'two' is invalid; expected an integer" in err


def test_cli_offload_options(capsys):
    argv = ["offload", QWEN, "--gpu", "A100", "--pipeline-parallel-size", "2", "--rank", "1",
            "--enable-kv-cache-events", "--extra", '{"blocks_per_chunk": 2}', "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallel"]["pp_size"] == 2 and data["parallel"]["world_size"] == 2
    assert data["parallel"]["rank"] == 1
    assert data["enable_kv_cache_events"] is True
    assert data["cache"]["blocks_per_chunk"] == 2
    assert data["inputs"]["pipeline_parallel_size"] == 2


def test_cli_sweep_offload_axes(capsys):
    argv = ["sweep", QWEN, "--gpu", "A100", "--nnodes-within-dp", "1,2",
            "--extra", '[{"blocks_per_chunk": 2}, null]', "--json"]
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["nnodes_within_dp"] for r in rows] == [1, 2, 1, 2]
    assert [r["blocks_per_chunk"] for r in rows] == [2, 2, 1, 1]
