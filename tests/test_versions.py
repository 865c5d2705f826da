"""One deployment across vLLM releases, each side that release's own answer.

The comparison runs vLLM 0.33.0 (installed here) and 0.34.0 (in its own
environment, created with uv on first use).  Each side is checked against
that release's own alignment functions, run separately in its own
environment (``tests/reference.py``), and every listed difference against
the facts themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from reference import vllm_alignment

import kvexplore
from kvexplore.versions import environments

QWEN = "Qwen/Qwen3.5-0.8B"
OTHER = "0.34.0"
TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def qwen_across():
    return kvexplore.compare_versions(QWEN, vllm=["0.33.0", OTHER],
                                      gpu="A100", attention_backend="FLASHINFER")


def _reference_in(release: str, **kw) -> dict:
    """tests/reference.py's vllm_alignment run in ``release``'s environment."""
    src = kvexplore.load_model_config(QWEN)
    code = ("import json, sys; sys.path.insert(0, sys.argv[1]); from reference import "
            "vllm_alignment; r = vllm_alignment(sys.argv[2], **json.loads(sys.argv[3])); "
            "print(json.dumps([r.block_size, r.mamba_page_size_padded]))")
    out = environments.run_in(release, ["-c", code, str(TESTS), str(src.config_dir),
                                        json.dumps(kw)], timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_release_environment_runs_this_kvexplore(tmp_path):
    """From any folder, the child imports this very package, with its own vLLM."""
    code = "import kvexplore, vllm; print(kvexplore.__file__); print(vllm.__version__)"
    out = environments.run_in(OTHER, ["-c", code], cwd=tmp_path, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    where, version = out.stdout.strip().splitlines()[-2:]
    assert Path(where).resolve() == Path(kvexplore.__file__).resolve()
    assert version == OTHER


def test_each_side_is_that_releases_own_answer(qwen_across):
    here = qwen_across.facts["0.33.0"]
    there = qwen_across.facts[OTHER]
    assert here["vllm"] == "0.33.0" and there["vllm"] == OTHER
    src = kvexplore.load_model_config(QWEN)
    ref = vllm_alignment(str(src.config_dir), backend_name="FLASHINFER")
    assert (here["plan"]["block_size"], here["plan"]["mamba_page_size_padded"]) == \
        (ref.block_size, ref.mamba_page_size_padded) == (544, 1114112)
    assert [there["plan"]["block_size"], there["plan"]["mamba_page_size_padded"]] == \
        _reference_in(OTHER, backend_name="FLASHINFER") == [576, 1179648]


def test_every_listed_difference_is_real(qwen_across):
    everything = qwen_across.table(only_differences=False)
    listed = set(qwen_across.differences["fact"])
    for row in everything.to_dict("records"):
        values = [row[r] for r in qwen_across.releases]
        assert (row["fact"] in listed) == any(v != values[0] for v in values), row
    assert {"plan.block_size", "plan.extensible_kv_cache", "plan.gpu_memory_utilization",
            "plan.num_blocks"} <= listed
    assert "plan.model" not in listed and "plan.kv_cache_layout" not in listed
    # 17 FlashInfer kernel pages of 32 per 544-token block, 9 of 64 per 576
    assert qwen_across.facts["0.33.0"]["plan"]["kernel_block_sizes"] == [544, 544, 544, 32]
    assert qwen_across.facts[OTHER]["plan"]["kernel_block_sizes"] == [576, 576, 576, 64]
    edits = qwen_across.facts[OTHER]["registration"]["edits"]
    assert edits["0:mamba-unified-view"]["shape_after"] == [16, 576, 1, 1888]
    assert qwen_across.facts["0.33.0"]["registration"]["edits"]["0:mamba-unified-view"][
        "shape_after"] == [16, 544, 1, 2000]
    assert "vLLM 0.33.0" in qwen_across.text() and OTHER in qwen_across.text()


def test_each_releases_pages_are_its_blocks_bytes_by_hand(qwen_across):
    """Qwen3.5-0.8B's config by hand: conv 3 x 6,144 x 2 B, SSM 16 x 128 x 128
    x 4 B, an attention page of block x 2 KV heads x 256 x 2 (K, V) x 2 B,
    the Mamba page padded to it; FlashInfer's kernel pages of 32 (0.33) and
    64 (0.34) tokens."""
    conv, ssm = 3 * 6144 * 2, 16 * 128 * 128 * 4
    for release, block, kernel in (("0.33.0", 544, 32), (OTHER, 576, 64)):
        page = block * 2 * 256 * 2 * 2
        gdn, attn = qwen_across.pages[release][0], qwen_across.pages[release][3]
        assert [s[0] for s in gdn["segments"]] == ["conv", "ssm", "pad"]
        assert [s[2] for s in gdn["segments"]] == [conv, ssm, page - conv - ssm]
        assert attn["page_bytes"] == page and attn["kernel_pages"] == block // kernel
        assert [s[2] for s in attn["segments"]] == [page // (block // kernel)] * (block // kernel)
    rows = qwen_across.table(section="pages").set_index("fact")
    assert rows.loc["pages[3].segments"].tolist() == ["K|V x17 1,114,112 B", "K|V x9 1,179,648 B"]
    names = [t.get_text() for t in qwen_across.figure().axes[0].texts if t.get_gid() == "row-name"]
    assert names == [f"vLLM {r} · {g}" for g in ("g0-2 mamba x6 (gdn_attn)", "g3 full_attention x6")
                     for r in ("0.33.0", OTHER)][::-1]
    assert qwen_across._repr_html_().count('class="kvx-bar"') == 4


@pytest.mark.parametrize("vllm, expected", [
    (["0.33.0"], "two or more"),
    (["0.33.0", "0.33.0"], "two or more"),
    (["0.30.0", "0.33.0"], "outside kvexplore's window"),
    (["0.33.0", "0.35.0"], "outside kvexplore's window"),
])
def test_bad_releases_are_refused(vllm, expected):
    with pytest.raises(kvexplore.KVExploreError, match=expected):
        kvexplore.compare_versions(QWEN, vllm=vllm, gpu="A100")


def test_an_environment_that_cannot_be_created_leaves_nothing(tmp_path):
    """uv offline with an empty cache cannot install vLLM: one clear error,
    nothing half-created in the environments folder."""
    env = {**os.environ, "KVEXPLORE_CACHE_DIR": str(tmp_path), "UV_OFFLINE": "1",
           "UV_CACHE_DIR": str(tmp_path / "uv-cache")}
    out = subprocess.run(
        ["python3", "-m", "kvexplore", "envs", "0.32.0", "--create", "--python"],
        capture_output=True, text=True, env=env, timeout=600, check=False)
    assert out.returncode == 2
    assert "kvexplore: error:" in out.stderr and "vllm==0.32.0" in out.stderr
    leftovers = [p.name for p in (tmp_path / "envs").iterdir() if p.name != ".lock"]
    assert leftovers == []


def test_cli_versions_lists_the_differences(capsys):
    from kvexplore.cli import main

    assert main(["versions", QWEN, "--gpu", "A100", "--num-blocks", "16",
                 "--vllm", f"0.33.0,{OTHER}", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["releases"] == ["0.33.0", OTHER]
    assert [data["facts"][r]["plan"]["block_size"] for r in data["releases"]] == [544, 576]
