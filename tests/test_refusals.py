"""Clear refusals: each names the argument, the value and what is allowed.

One spelling of a vLLM release before any folder is made or install runs
(release environments are placed by hand in a temporary cache folder, never
created), ``compare_versions`` given no releases or one release twice, more
pipeline stages than layers, a misspelt ``capacity()`` keyword, an
offloading ``extra_config`` no backend could use, a block size whose
cache no tensor can describe, a block size or attention backend vLLM's
backend selection refuses (the refusal names what it would accept) and a
config with zero KV heads.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import pandas as pd
import pytest

import kvexplore
from kvexplore.cli import main
from kvexplore.errors import KVExploreError
from kvexplore.offloading.config import OffloadConfigError, offload_config
from kvexplore.planning.release import canonical_release
from kvexplore.versions import compare as compare_module
from kvexplore.versions import environments

QWEN = "Qwen/Qwen3.5-0.8B"
LLAMA_1B = "meta-llama/Llama-3.2-1B-Instruct"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty kvexplore cache folder; uv is never run from it."""
    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(environments, "_uv", lambda: pytest.fail("uv would run"))
    return tmp_path


def _place_environment(cache, folder: str):
    """A release environment as a user would copy one in: bin/python."""
    python = cache / "envs" / folder / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)
    return python


@pytest.mark.parametrize("given", ["0.34", "v0.34.0", " 0.34.0", "0.34.0", "V0.34"])
def test_a_release_has_one_spelling(given, cache):
    assert canonical_release(given) == "0.34.0"
    assert environments.environment_path(given).name == "vllm-0.34.0"


@pytest.mark.parametrize("given", ["0.35", "0.30.9", "latest", "", None, 0.34])
def test_a_release_outside_the_window_is_refused(given, cache):
    with pytest.raises(KVExploreError) as info:
        environments.environment(given)
    text = str(info.value)
    assert repr(given) in text and "0.31.0 up to (not including) 0.35" in text
    assert not (cache / "envs").exists()  # no folder made


def test_an_environment_is_found_under_its_one_spelling(cache):
    _place_environment(cache, "vllm-0.34.0")  # found, checked, refused by its folder
    for given in ("0.34", "v0.34.0", " 0.34.0"):
        with pytest.raises(KVExploreError, match="vllm-0.34.0 cannot be used"):
            environments.environment(given)
    assert sorted(p.name for p in (cache / "envs").iterdir()) == [
        ".kvexplore-path",
        "vllm-0.34.0",
    ]


def test_cli_envs_lists_one_spelling_and_refuses_a_release_named_twice(cache, capsys):
    _place_environment(cache, "vllm-0.34.0")
    assert main(["envs", "0.34", "v0.32", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["release"], r["exists"]) for r in rows] == [
        ("0.34.0", True),
        ("0.32.0", False),
    ]
    assert [r["environment"].rsplit("/", 1)[-1] for r in rows] == [
        "vllm-0.34.0",
        "vllm-0.32.0",
    ]
    assert main(["envs", "v0.34.0", " 0.34.0", "--create"]) != 0
    err = capsys.readouterr().err
    assert "are the same release 0.34.0" in err and err.count("\n") == 1
    made = sorted(p.name for p in (cache / "envs").iterdir() if p.name.startswith("vllm"))
    assert made == ["vllm-0.34.0"]


@pytest.mark.parametrize(
    "vllm, facts",
    [
        (["0.33", "0.33.0"], ["'0.33' and '0.33.0' are the same release 0.33.0"]),
        (["v0.34.0", "0.33.0", " 0.34.0"], ["'v0.34.0' and ' 0.34.0'", "0.34.0"]),
        (None, ["vllm=None is invalid", "two or more different releases"]),
        (33, ["vllm=33 is invalid"]),
        (["0.33.0", None], ["vllm=['0.33.0', None] is invalid"]),
        (["0.33"], ["vllm=['0.33'] is invalid", "two or more"]),
        (["0.33.0", "0.36.0"], ["'0.36.0' is outside kvexplore's window"]),
    ],
)
def test_compare_versions_refuses_before_any_environment(vllm, facts, monkeypatch):
    monkeypatch.setattr(
        compare_module, "facts_in", lambda *a: pytest.fail("a release ran")
    )
    with pytest.raises(KVExploreError) as info:
        kvexplore.compare_versions(QWEN, vllm=vllm, gpu="A100")
    for fact in facts:
        assert fact in str(info.value), (fact, str(info.value))


def test_compare_versions_runs_each_release_once_by_its_one_name(monkeypatch):
    asked = []
    monkeypatch.setattr(
        compare_module,
        "facts_in",
        lambda release, *a: asked.append(release) or {"vllm": release},
    )
    c = kvexplore.compare_versions(QWEN, vllm="v0.33, 0.34", gpu="A100")
    assert asked == ["0.33.0", "0.34.0"] and c.releases == ("0.33.0", "0.34.0")


def test_more_pipeline_stages_than_layers_is_refused_by_name():
    layers = kvexplore.load_model_config(LLAMA_1B).config["num_hidden_layers"]
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(LLAMA_1B, gpu="H100", pipeline_parallel_size=layers + 1)
    text = str(info.value)
    assert f"pipeline_parallel_size={layers + 1}" in text
    assert f"{layers} layers (num_hidden_layers); expected at most {layers}" in text


def test_a_misspelt_capacity_keyword_offers_the_near_spelling():
    with pytest.raises(KVExploreError) as info:
        kvexplore.capacity(QWEN, gpu_memory_utilisation=0.9)
    text = str(info.value)
    assert text.startswith(
        "capacity() got an unknown keyword gpu_memory_utilisation=0.9"
    )
    assert "did you mean 'gpu_memory_utilization'" in text


@pytest.fixture(scope="module")
def qwen_a100():
    return kvexplore.plan(QWEN, gpu="A100")


@pytest.mark.parametrize(
    "extra, code, facts",
    [
        (
            {"block_size": 0},
            "block_size_not_positive",
            [
                "extra_config['block_size']=0",
                "0 blocks per chunk",
                "positive multiple",
                "(544, 1088",
            ],
        ),
        (
            {"block_size": -544},
            "block_size_not_positive",
            [
                "extra_config['block_size']=-544",
                "-1 blocks per chunk",
                "positive multiple",
            ],
        ),
        (
            {"block_size": 1088.7},
            "not_a_whole_number",
            [
                "extra_config['block_size']=1088.7",
                "expected an integer",
                "truncate it to 1088",
            ],
        ),
        (
            {"blocks_per_chunk": 2.5},
            "not_a_whole_number",
            ["extra_config['blocks_per_chunk']=2.5", "expected an integer"],
        ),
        (
            {"canonical_layout": "false"},
            "canonical_layout_not_bool",
            [
                "extra_config['canonical_layout']='false'",
                "expected true or false",
                "as True",
            ],
        ),
    ],
)
def test_an_extra_config_no_backend_could_use_is_refused(qwen_a100, extra, code, facts):
    with pytest.raises(OffloadConfigError) as info:
        offload_config(qwen_a100, extra_config=extra)
    assert info.value.code == code
    for fact in facts:
        assert fact in str(info.value), (fact, str(info.value))


def test_whole_values_are_still_taken(qwen_a100):
    assert (
        offload_config(
            qwen_a100, extra_config={"block_size": 1088.0}
        ).config.cache.blocks_per_chunk
        == 2
    )
    assert offload_config(
        qwen_a100, extra_config={"canonical_layout": 1}
    ).config.canonical_layout


def test_a_sweep_row_of_an_unusable_extra_config_carries_the_reason():
    df = kvexplore.sweep(
        QWEN,
        gpu="A100",
        store=False,
        extra_config=[{"block_size": 0}, {"block_size": 1088}],
    )
    bad, good = df.to_dict("records")
    assert "extra_config['block_size']=0" in bad["error"] and pd.isna(
        bad["blocks_per_chunk"]
    )
    assert pd.isna(good["error"]) and good["blocks_per_chunk"] == 2


def test_a_cache_no_tensor_can_describe_is_refused_with_the_bound():
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(LLAMA_1B, gpu="A100", block_size=2**62, num_blocks=2)
    text = str(info.value)
    assert f"block_size={2**62}" in text and "num_blocks=2" in text
    assert f"expected at most {2**63 - 1:,} B" in text
    assert "kv_cache_memory_bytes=" not in text  # the blocks were given


def test_a_cache_memory_no_tensor_can_describe_names_the_memory():
    """kv_cache_memory_bytes=2**70: the blocks it holds make a tensor over the
    int64 bound; the refusal names the memory the user gave, not only the
    blocks derived from it.  2**62 B plans: no tensor is larger than the
    memory its blocks were sized from (where the release lays its tensors
    over one allocation, each tensor's size is that allocation's)."""
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(QWEN, gpu="A100", kv_cache_memory_bytes=2**70)
    text = str(info.value)
    assert f"kv_cache_memory_bytes={2**70}" in text
    assert f"expected at most {2**63 - 1:,} B" in text
    p = kvexplore.plan(QWEN, gpu="A100", kv_cache_memory_bytes=2**62)
    assert 0 < max(t.size for t in p.kv_cache_config.kv_cache_tensors) <= 2**62


def test_compatibility_spells_vllm_releases_once(monkeypatch):
    with pytest.raises(KVExploreError, match="names a release twice"):
        kvexplore.compatibility(QWEN, vllm=["0.34", "v0.34.0"], gpu="A100")
    with pytest.raises(KVExploreError, match="outside kvexplore's window"):
        kvexplore.compatibility(QWEN, vllm=["0.36"], gpu="A100")


@pytest.mark.parametrize("kind", ["file", "under a file"])
def test_a_cache_folder_that_cannot_be_written_is_refused(kind, tmp_path, monkeypatch):
    blocker = tmp_path / "blocker"
    blocker.write_text("")
    given = blocker if kind == "file" else blocker / "cache"
    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(given))
    monkeypatch.setattr(environments, "_uv", lambda: pytest.fail("uv would run"))
    for call in (
        lambda: environments.environment("0.32.0"),
        lambda: kvexplore.plan({**kvexplore.load_model_config(LLAMA_1B).config,
                                "max_position_embeddings": 4097}, gpu="A100"),
    ):
        with pytest.raises(KVExploreError) as info:
            call()
        text = str(info.value)
        assert f"KVEXPLORE_CACHE_DIR={str(given)!r}" in text
        assert "expected a writable folder" in text


def test_a_plan_of_no_blocks_and_a_model_of_no_layers_are_refused():
    with pytest.raises(KVExploreError, match="num_blocks=0 is invalid; expected an integer >= 1"):
        kvexplore.plan(LLAMA_1B, gpu="A100", num_blocks=0)
    config = {**kvexplore.load_model_config(LLAMA_1B).config, "num_hidden_layers": 0}
    with pytest.raises(KVExploreError, match="registers no KV-cache layer"):
        kvexplore.plan(config, gpu="A100").text()


def _cli(*args: str, env: dict | None = None):
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "kvexplore", *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, **(env or {})})


def test_the_cli_stderr_is_one_line_on_refusal_and_empty_on_success(tmp_path):
    """torch's import warnings (its deprecations, "No CUDA runtime is found")
    stay off stderr unless --verbose is given."""
    env = {"KVEXPLORE_CACHE_DIR": str(tmp_path)}
    bad = _cli("plan", LLAMA_1B, "--gpu", "A100", "--block-size", "17", "--no-cache", env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith("kvexplore: error: ") and "block_size=17" in bad.stderr
    good = _cli("plan", LLAMA_1B, "--gpu", "A100", "--no-cache", env=env)
    assert good.returncode == 0 and good.stderr == "" and "LlamaForCausalLM" in good.stdout
    loud = _cli("plan", LLAMA_1B, "--gpu", "A100", "--no-cache", "--verbose", env=env)
    assert loud.returncode == 0 and "site-packages/torch/" in loud.stderr


def _backend(name: str):
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    return AttentionBackendEnum[name].get_class()


def test_a_block_size_no_backend_accepts_names_the_sizes_they_accept():
    """block_size=17 on H100: every backend refuses it; the refusal names
    the multiples the backends accept, each checked with vLLM's own
    ``supports_block_size``."""
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan(LLAMA_1B, gpu="H100", block_size=17)
    text = str(err.value)
    assert "block_size=17" in text
    hint = text[text.index("; expected a block_size that is "):]
    groups = re.findall(r"a multiple of ([\d or]+) \(([A-Z_, ]+)\)", hint)
    assert groups, hint
    for multiples, names in groups:
        bases = [int(b) for b in multiples.split(" or ")]
        for name in names.split(", "):
            backend = _backend(name)
            assert not backend.supports_block_size(17)
            for base in bases:
                assert backend.supports_block_size(base) and backend.supports_block_size(3 * base)
    assert "FLASH_ATTN" in hint


def test_a_backend_that_does_not_suit_the_model_names_those_that_do():
    """FLASHMLA for a model without MLA: the refusal names the backends
    vLLM's selection finds valid for that layer on H100; a plan with the
    first of them succeeds and uses it."""
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan(LLAMA_1B, gpu="H100", attention_backend="FLASHMLA")
    text = str(err.value)
    assert "attention_backend='FLASHMLA'" in text
    named = text.split("valid for this layer on this GPU: ")[1].split(" (raised")[0].split(", ")
    assert "FLASHMLA" not in named and "FLASH_ATTN" in named
    plan = kvexplore.plan(LLAMA_1B, gpu="H100", attention_backend=named[0])
    assert plan.attention_backend == named[0]


def test_a_backend_without_attention_sinks_names_those_with_them():
    """gpt-oss's attention sinks on FLASHINFER (A100): the refusal names the
    backends vLLM's selection finds valid, asked under the GPU's emulation
    with the build's config current (FlashInfer and FlashAttention read it);
    a plan with each of them succeeds and uses it."""
    with pytest.raises(KVExploreError) as err:
        kvexplore.plan("openai/gpt-oss-20b", gpu="A100", attention_backend="FLASHINFER")
    text = str(err.value)
    assert "attention sinks not supported" in text
    named = text.split("valid for this layer on this GPU: ")[1].split(" (raised")[0].split(", ")
    assert named and "FLASHINFER" not in named
    for name in named:
        assert kvexplore.plan("openai/gpt-oss-20b", gpu="A100",
                              attention_backend=name).attention_backend == name


def test_a_refused_backend_leaves_the_next_plan_as_a_fresh_process_makes_it():
    """Wording a refusal imports vLLM's backend modules; one imported outside
    the GPU's emulation (``flash_attn.py`` binds its kernel functions only
    where the platform reports them) would refuse a later plan that a fresh
    process makes; so would the user's own import of it.  In new processes:
    FLASHINFER refused, then the default plan; ``flash_attn.py`` imported by
    hand, then the default plan; both equal to a fresh process's plan."""
    code = (
        "import sys, kvexplore\n"
        "if sys.argv[1] == 'imported-first':\n"
        "    import vllm.v1.attention.backends.flash_attn  # outside any emulation\n"
        "if sys.argv[1] == 'refused-first':\n"
        "    try:\n"
        "        kvexplore.plan('openai/gpt-oss-20b', gpu='A100', attention_backend='FLASHINFER')\n"
        "    except kvexplore.KVExploreError:\n"
        "        pass\n"
        "p = kvexplore.plan('openai/gpt-oss-20b', gpu='A100')\n"
        "print(p.attention_backend, p.block_size, p.kernel_block_sizes, len(p.groups))\n"
    )
    out = {}
    for order in ("refused-first", "imported-first", "fresh"):
        done = subprocess.run([sys.executable, "-c", code, order], capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        out[order] = done.stdout.strip().splitlines()[-1]
    assert out["refused-first"] == out["imported-first"] == out["fresh"]


def test_a_config_with_zero_kv_heads_names_the_field(tmp_path):
    src = kvexplore.load_model_config(LLAMA_1B).config_dir
    shutil.copytree(src, tmp_path, dirs_exist_ok=True)
    config = json.loads((src / "config.json").read_text())
    config["num_key_value_heads"] = 0
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(KVExploreError, match=r"num_key_value_heads=0; expected a positive number"):
        kvexplore.plan(str(tmp_path), gpu="H100")


def test_a_misspelt_plan_keyword_offers_the_near_spelling():
    """Python's own refusal would be a bare TypeError naming no near spelling."""
    with pytest.raises(KVExploreError) as info:
        kvexplore.plan(QWEN, tensor_paralel_size=2)
    text = str(info.value)
    assert text.startswith("plan() got an unknown keyword tensor_paralel_size=2")
    assert "did you mean 'tensor_parallel_size'" in text


def test_a_config_of_more_layers_than_any_model_is_refused_before_the_build():
    config = dict(kvexplore.load_model_config(LLAMA_1B).config, num_hidden_layers=100_000)
    for given in ({"model": config}, {"model": LLAMA_1B, "hf_overrides": {"num_hidden_layers": 100_000}}):
        with pytest.raises(KVExploreError) as info:
            kvexplore.plan(gpu="H100", num_blocks=8, **given)
        text = str(info.value)
        assert text.startswith("num_hidden_layers=100000 is more layers than kvexplore builds")
        assert "expected at most 1024" in text
