"""Choosing an LMCache release: names, defaults, refusals, the round trip per
release, the vLLM x LMCache matrix and its command line.

What each release's rules do is proven against that release's own code in
``test_lmcache_oracle.py``; here, the choice of release and what is built on it.
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest

import kvexplore
from kvexplore import cli
from kvexplore.editing import lmcache as releases_module
from kvexplore.editing.lmcache import (
    LMCACHE_RELEASES,
    lmcache_release,
    lmcache_releases,
)
from kvexplore.editing.rules import apply_kv_cache_group_edits, rules_for
from kvexplore.editing.validation import check_kv_cache_groups
from kvexplore.errors import KVExploreError

QWEN = "Qwen/Qwen3.5-0.8B"


def test_every_known_release_and_its_spellings():
    assert lmcache_releases() == (
        "0.4.7", "0.5.0", "0.5.1", "0.5.2", "0.5.3", "0.5.4", "0.5.5", "0.5.6", "0.5.7rc2",
    )  # fmt: skip
    assert "0.5.7rc2" not in lmcache_releases(prereleases=False)
    for spelling in ("0.5.2", "v0.5.2", " 0.5.2 "):
        assert lmcache_release(spelling).version == "0.5.2"
    assert lmcache_release("0.5.7rc2").prerelease
    assert str(lmcache_release("0.5.7rc2")) == "LMCache 0.5.7rc2 (pre-release)"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0.4.6", "not a release kvexplore knows; expected one of 0.4.7"),
        ("0.6.0", "not a release kvexplore knows"),
        ("0.5", "names no patch release"),
        ("latest", "is not a release version"),
        (0.52, "is a float; expected a release string"),
    ],
)
def test_unknown_releases_are_refused_naming_the_known_ones(value, message):
    with pytest.raises(KVExploreError, match=message) as err:
        lmcache_release(value)
    assert "0.5.6" in str(err.value)


def test_the_default_is_the_installed_lmcache_else_the_newest_stable(monkeypatch):
    monkeypatch.setattr(releases_module, "installed_lmcache", lambda: None)
    assert lmcache_release(None).version == "0.5.6"
    monkeypatch.setattr(releases_module, "installed_lmcache", lambda: "0.5.2")
    assert lmcache_release(None).version == "0.5.2"
    assert [r.name for r in rules_for(None)] == [
        "mamba-page-view",
        "subpaged-attention-view",
    ]
    monkeypatch.setattr(releases_module, "installed_lmcache", lambda: "0.9.0")
    with pytest.raises(KVExploreError, match="the LMCache installed beside kvexplore"):
        lmcache_release(None)


def test_validation_modes_by_release(qwen_a100):
    """LMCache keeps snapshots for 'align' only up to 0.5.4, 'align' and
    'all' from 0.5.5: a group of mode 'all' is refused by the former only."""
    from dataclasses import replace

    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

    cfg = qwen_a100.kv_cache_config
    groups = [
        KVCacheGroupSpec(
            g.layer_names, replace(g.kv_cache_spec, mamba_cache_mode="all")
        )
        if hasattr(g.kv_cache_spec, "mamba_cache_mode")
        else g
        for g in cfg.kv_cache_groups
    ]
    every = KVCacheConfig(cfg.num_blocks, cfg.kv_cache_tensors, groups)
    for release in lmcache_releases():
        verdicts = check_kv_cache_groups(every, lmcache=release)["verdict"].tolist()
        refused = release in ("0.4.7", "0.5.0", "0.5.1", "0.5.2", "0.5.3", "0.5.4")
        assert verdicts[:3] == ["rejected" if refused else "accepted"] * 3, release
        assert verdicts[3] == "accepted"


@pytest.mark.parametrize("registration", ["unified", "legacy"])
def test_the_round_trip_holds_for_each_release_s_edits(
    qwen_a100_flashinfer, registration
):
    """Every release that edits the registration re-views it so that every
    byte stored through the edited views comes back (two blocks, CPU)."""
    p = qwen_a100_flashinfer
    caches = kvexplore.allocate(p, device="cpu", registration=registration)
    proven = set()
    for release in LMCACHE_RELEASES.values():
        if release.version in proven or set(release.same_rules) & proven:
            continue
        try:
            edited = apply_kv_cache_group_edits(p, caches, lmcache=release)
        except KVExploreError:
            continue  # a refusal has no views to prove
        assert edited.lmcache == release.version
        report = kvexplore.verify_roundtrip(
            p.kv_cache_config, caches, edited, blocks=[0, 1]
        )
        assert report.ok, (release.version, report.failures())
        proven.add(release.version)
    expected = 5 if registration == "legacy" else 3  # unified: refused before 0.5.5
    assert len(proven) == expected, proven


def test_the_matrix_on_the_installed_vllm():
    """Qwen3.5-0.8B on an H100, unified registration (16 blocks of 576 tokens,
    GDN pages of 1,179,648 B holding a 1,085,440-byte state row): LMCache up
    to 0.5.2 refuses the GDN groups in mamba-page-view (a tensor, not a state
    list), 0.5.3 / 0.5.4 in mamba-unified-view (vLLM 0.31-0.34 give them no
    layout hint), 0.5.5 on re-views each row as 576 tokens of
    ceil(1085440 / 576) = 1885 bytes rounded up to 16: 1888."""
    c = kvexplore.compatibility(QWEN, gpu="H100", lmcache=["0.5.2", "0.5.4", "0.5.6"])
    rows = c.rows
    assert set(rows["vllm"]) == {kvexplore.plan(QWEN, gpu="H100").vllm_version}
    assert len(rows) == 3 * 4  # 3 releases x 4 groups
    gdn = rows[rows["kind"] == "mamba"]
    attn = rows[rows["kind"] != "mamba"]
    by = {m: gdn[gdn["lmcache"] == m] for m in ("0.5.2", "0.5.4", "0.5.6")}
    assert set(by["0.5.2"]["outcome"]) == {"refused"}
    assert set(by["0.5.2"]["rule"]) == {"mamba-page-view"}
    assert set(by["0.5.4"]["rule"]) == {"mamba-unified-view"}
    assert by["0.5.4"]["reason"].str.contains("Unsupported|kv_layout").all()
    assert set(by["0.5.6"]["outcome"]) == {"edited"}
    head = math.ceil(1085440 / 576)
    head = -(-head // 16) * 16
    assert head == 1888
    assert by["0.5.6"]["shape_after"].map(tuple).tolist() == [(16, 576, 1, head)] * 3
    assert set(attn["outcome"]) == {"as registered"}
    refusals = {m: r for (_, m), r in c.deployments.items()}
    assert refusals["0.5.6"] is None and refusals["0.5.2"] and refusals["0.5.4"]
    assert "LMCache 0.5.2 refuses layer" in refusals["0.5.2"]
    diffs = c.differences()
    assert len(diffs) == 6 and all("group" in d for d in diffs)
    assert "0.5.4 -> 0.5.6" in diffs[-1]
    assert c.text().splitlines()[0].startswith(QWEN)
    assert "<table>" in c._repr_html_()
    fig = c.figure()
    assert len(fig.axes[0].patches) == 12


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lmcache": ["0.5.2", "v0.5.2"]}, "names a release twice"),
        ({"lmcache": ["0.9.9"]}, "not a release kvexplore knows"),
        ({"vllm": ["0.33.0", "0.33.0"]}, "names a release twice"),
        ({"vllm": ["0.29.0"]}, "0.29.0"),
        ({"lmcache": []}, "expected a list of release strings"),
        ({"registration": "both"}, "registration='both' is invalid"),
    ],
)
def test_the_matrix_refuses_bad_input(kwargs, message):
    with pytest.raises(KVExploreError, match=message):
        kvexplore.compatibility(QWEN, gpu="H100", **kwargs)


def test_the_command_line_edits_and_matrix(capsys):
    assert cli.main(["edits", QWEN, "--gpu", "H100", "--lmcache", "0.5.2",
                     "--registration", "legacy", "--json"]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert out["lmcache"] == "0.5.2" and out["registration"] == "legacy"
    assert {g["rule"] for g in out["groups"]} == {"mamba-page-view", None}
    assert cli.main(["edits", QWEN, "--gpu", "H100", "--lmcache", "0.5.2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("kvexplore: error: LMCache 0.5.2 refuses layer")
        and err.count("\n") == 1
    )
    assert (
        cli.main(
            ["matrix", QWEN, "--gpu", "H100", "--lmcache", "0.5.5,0.5.6", "--json"]
        )
        == 0
    )
    out = json.loads(capsys.readouterr().out)
    assert {d["lmcache"] for d in out["deployments"]} == {"0.5.5", "0.5.6"}
    assert all(d["refusal"] is None for d in out["deployments"])
    assert cli.main(["edits", QWEN, "--lmcache", "0.4.6"]) == 2
    assert "0.4.7" in capsys.readouterr().err


def test_an_oracle_that_cannot_be_fetched_leaves_nothing(tmp_path, monkeypatch):
    """The test suite's LMCache installer: without an index the failure says
    so, and no half-made folder is left in the cache."""
    sys.path.insert(0, os.path.dirname(__file__))
    from lmcache_oracle import OracleUnavailable, install

    monkeypatch.setenv("KVEXPLORE_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(tmp_path))
    monkeypatch.setenv("PIP_CONSTRAINT", "")
    with pytest.raises(OracleUnavailable, match="lmcache==0.5.2"):
        install("0.5.2")
    assert not any((tmp_path / "lmcache").iterdir())


def test_the_explorer_answers_for_the_chosen_lmcache():
    """The edits panel follows the LMCache control (a view control: the plan
    is kept), and the releases tab's matrix asks every LMCache release."""
    from kvexplore.explorer.state import ExplorerState

    state = ExplorerState(QWEN, gpu="H100", lmcache="0.5.2")
    p = state.plan
    assert not state.panels["edits"].ok
    assert "LMCache 0.5.2 refuses layer" in state.panels["edits"].text
    assert state.set(lmcache="0.5.6") == ("edits",)
    assert state.plan is p
    assert state.panels["edits"].ok and "LMCache 0.5.6" in state.panels["edits"].text
    panel = state.lmcache_matrix((p.vllm_version,))
    assert panel.ok and "0.5.7rc2" in panel.text and "<table>" in panel.html
    assert not state.lmcache_matrix(("0.29.0",)).ok
