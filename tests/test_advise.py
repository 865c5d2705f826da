"""The advisor: every row is the release's own plan, capacity and scheduler;
the recommendation is the best setting that starts, by brute force here.

The brute force re-plans every setting of the searched space with
``kvexplore.plan`` and ``kvexplore.capacity`` and ranks them here by the
objective (not with the advisor's ranking); the recommended setting's start
is checked with the release's own ``resolve_cudagraph_mode_and_sizes``
called as its model runner calls it (``test_startup.release_cudagraph_verdict``)
and by hand (one Mamba block per decoding sequence, a cache that holds one
request); the prefix reuse equals vLLM's ``KVCacheManager`` driven directly
(attention-only) and the hit unit's arithmetic by hand (hybrids) or vLLM's Scheduler driven in
the test (``test_capacity._repeat_hit``) for longer prompts.
"""

import itertools
import json
import math
import re
import subprocess
import sys

import pytest
from test_capacity import _repeat_hit

import kvexplore
from kvexplore.advising import AXES, Workload, advise, pareto_front
from kvexplore.capacity_planning import shared_prefix_hit_tokens
from kvexplore.errors import KVExploreError

#: Five catalog hybrids, each on a GPU of its own (two GPUs where the weights need them).
CASES = [
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "H100", 1,
     Workload(max_model_len=32768, concurrency=64, shared_prefix=1500)),
    ("ibm-granite/granite-4.0-h-350m", "L40S", 2,
     Workload(max_model_len=8192, concurrency=32, shared_prefix=1500)),
    ("Qwen/Qwen3.5-0.8B", "A100", 1,
     Workload(prompt_tokens=3000, output_tokens=1000, concurrency=16, shared_prefix=2000)),
    ("mistralai/Mamba-Codestral-7B-v0.1", "L40S", 1,
     Workload(max_model_len=16384, concurrency=8, shared_prefix=600)),
    ("tiiuae/Falcon-H1-0.5B-Instruct", "H100", 2,
     Workload(max_model_len=16384, concurrency=128, shared_prefix=3000, reuse_prefix=True)),
]


def _key(objective, r):
    c, p, g = r["concurrent_requests"], r["prefix_reused_tokens"], r["gpus"]
    return {"concurrency": (c, -g, p), "prefix_reuse": (p, c, -g), "gpus": (-g, c, p)}[objective]


def _brute_force(model, gpu, gpus, workload, space):
    """Every setting of ``space`` planned here, its row computed here."""
    rows, seen = [], set()
    axes = list(space)
    for values in itertools.product(*(space[a] for a in axes)):
        setting = {a: v for a, v in zip(axes, values, strict=True) if v is not None}
        tp, dp = setting.get("tensor_parallel_size", 1), setting.get("data_parallel_size", 1)
        if tp * dp > gpus:
            continue
        # one replica on one GPU is vLLM's default; units of a prefix cache
        # that is off are not settings of their own
        setting = {k: v for k, v in setting.items()
                   if not (k in ("tensor_parallel_size", "data_parallel_size") and v == 1)}
        if setting.get("enable_prefix_caching") is False and "prefix_match_unit" in setting:
            continue
        if json.dumps(setting, sort_keys=True) in seen:
            continue
        seen.add(json.dumps(setting, sort_keys=True))
        try:
            p = kvexplore.plan(model, gpu=gpu, **workload.plan_kwargs(), **setting)
            cap = kvexplore.capacity(p)
        except KVExploreError:
            rows.append({"setting": setting, "starts": False})
            continue
        starts = p.admission.ok
        seqs = p.vllm_config.scheduler_config.max_num_seqs
        rows.append({"setting": setting, "starts": starts, "plan": p, "gpus": tp * dp,
                     "concurrent_requests": dp * min(seqs, math.floor(cap.max_concurrency)),
                     "alignment": cap.cache_hit_alignment if cap.prefix_caching else None})
    return rows


@pytest.fixture(scope="module", params=CASES, ids=[c[0].split("/")[1] for c in CASES])
def case(request):
    model, gpu, gpus, workload = request.param
    return model, gpu, gpus, workload, advise(model, gpu=gpu, gpus=gpus, workload=workload)


def test_every_row_is_the_plans_and_the_recommendation_is_the_best(case):
    model, gpu, gpus, workload, a = case
    t = a.table
    assert list(t.columns[:len(AXES)]) == list(AXES)
    brute = _brute_force(model, gpu, gpus, workload, a.space)
    started = [b for b in brute if b["starts"]]
    assert len(brute) == len(t)
    assert t["starts"].sum() == len(started) > 0
    by_setting = {json.dumps(b["setting"], sort_keys=True): b for b in brute}
    for row in a.rows:
        setting = {k: row[k] for k in AXES if row[k] is not None}
        b = by_setting[json.dumps(setting, sort_keys=True)]
        assert row["starts"] == b["starts"]
        if b["starts"]:
            assert row["concurrent_requests"] == b["concurrent_requests"]
            if workload.prompt_tokens is None:
                # requests of the prefix and one token: whole hit units of it, by hand
                unit = b["alignment"]
                hand = 0 if unit is None else workload.shared_prefix // unit * unit
            else:
                p = b["plan"]
                hand = min(workload.shared_prefix, _repeat_hit(
                    p, workload.prompt_tokens, shared=workload.shared_prefix,
                    enable_caching=p.cache_config.enable_prefix_caching))
            assert row["prefix_reused_tokens"] == hand, (setting, b["alignment"])
            b["prefix_reused_tokens"] = hand
            b["holds"] = (b["concurrent_requests"] >= workload.concurrency
                          and (not workload.reuse_prefix or hand > 0))
    pool = [b for b in started if b["holds"]] or started
    best = max(_key(a.objective, b) for b in pool)
    rec = a.recommended
    assert rec is not None
    assert _key(a.objective, rec) == best
    # the recommended setting starts, by the release's own function and by hand
    from test_startup import release_cudagraph_verdict

    chosen = by_setting[json.dumps({k: rec[k] for k in AXES if k in rec}, sort_keys=True)]
    p = chosen["plan"]
    ok, message, _ = release_cudagraph_verdict(p)
    assert ok, message
    has_mamba = any(g.kind == "mamba" for g in p.groups)
    if has_mamba and "FULL" in str(p.vllm_config.compilation_config.cudagraph_mode):
        assert p.vllm_config.scheduler_config.max_num_seqs <= p.num_blocks
    assert rec["max_concurrency"] >= 1
    # the command names every argument of the recommended setting
    for axis in AXES:
        if axis in rec and not isinstance(rec[axis], bool):
            assert f"--{axis.replace('_', '-')} {rec[axis]}" in a.command
    assert a.command.startswith(f"vllm serve {model}")


def test_the_front_is_every_setting_no_other_beats(case):
    *_, a = case
    rows = [r for r in a.rows if r["starts"]]
    pts = {(r["concurrent_requests"], r["prefix_reused_tokens"], -r["gpus"]) for r in rows}
    undominated = {x for x in pts
                   if not any(y != x and all(u >= v for u, v in zip(y, x, strict=True)) for y in pts)}
    front = {(r["concurrent_requests"], r["prefix_reused_tokens"], -r["gpus"])
             for r in a.rows if r["front"]}
    assert front == undominated
    assert sum(r["front"] for r in a.rows) == len(undominated)
    for r in a.rows:
        if not r["recommended"]:
            assert r["why_not"]


def test_the_default_refused_is_the_worked_case():
    """A 30B hybrid on one H100 at its defaults: vLLM's default row is
    refused with vLLM's message, the recommendation starts and the shared
    prefix shorter than the default hit unit hits with a finer match unit."""
    model, gpu, gpus, workload = CASES[0]
    a = advise(model, gpu=gpu, gpus=gpus, workload=workload)
    default = next(r for r in a.rows if all(r[k] is None for k in AXES))
    assert not default["starts"]
    assert "exceeds available Mamba cache blocks" in default["refusal"]
    assert a.recommended is not None and a.table["starts"].any()
    reused = a.table["prefix_reused_tokens"].max()
    assert reused > 0 and reused <= workload.shared_prefix


def test_prefix_reuse_equals_vllms_kv_cache_manager():
    """An attention-only model: the advisor's scheduler run equals
    ``KVCacheManager`` driven directly (allocate the first request, cache
    it, free it, then ``get_computed_blocks`` of the second)."""
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    p = kvexplore.plan("meta-llama/Llama-3.2-1B-Instruct", gpu="H100", num_blocks=512,
                       max_model_len=8192)
    init_none_hash(sha256)
    bs = p.kv_cache_config.kv_cache_groups[0].kv_cache_spec.block_size
    for shared, prompt in [(1, 40), (bs - 1, 3 * bs), (bs, 3 * bs), (bs + 1, 3 * bs),
                           (5 * bs + 3, 8 * bs)]:
        manager = KVCacheManager(p.kv_cache_config, max_model_len=8192, scheduler_block_size=bs,
                                 hash_block_size=bs,
                                 enable_caching=True)
        hasher = get_request_block_hasher(bs, sha256)
        first = list(range(1, prompt + 1))
        second = first[:shared] + [t + prompt for t in first[shared:]]
        r1 = Request("a", first, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        manager.allocate_slots(r1, prompt)
        manager.free(r1)
        r2 = Request("b", second, SamplingParams(max_tokens=1), None, block_hasher=hasher)
        hit = manager.get_computed_blocks(r2)[1]
        assert shared_prefix_hit_tokens(p, shared, prompt) == hit == shared // bs * bs


def test_no_setting_starts_says_so_and_gives_the_nearest():
    """Requests longer than the cache holds on every searched setting: no
    recommendation, and the way out of vLLM's defaults names the longest
    max_model_len that starts (vLLM's own estimate)."""
    a = advise("meta-llama/Llama-3.1-8B-Instruct", gpu="L4",
               workload=Workload(max_model_len=131072, concurrency=4))
    assert not a.table["starts"].any()
    assert a.recommended is None and a.command is None
    assert "no setting" in a.note
    lengths = [w for w in a.nearest if "--max-model-len" in w["flags"]]
    assert lengths and lengths[0]["starts"]
    n = int(lengths[0]["flags"].split()[-1])
    assert n < 131072
    assert kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="L4",
                          max_model_len=n).admission.ok
    assert not kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", gpu="L4",
                              max_model_len=n + 1024).admission.ok
    assert "refused" not in a.text() or "way out" in a.text()


@pytest.mark.parametrize("fields, named", [
    ({"concurrency": 0}, "concurrency"),
    ({"max_model_len": -5}, "max_model_len"),
    ({"prompt_tokens": 100}, "prompt_tokens"),
    ({"shared_prefix": 5000, "max_model_len": 4096}, "shared_prefix"),
    ({"reuse_prefix": True}, "reuse_prefix"),
    ({"reuse_prefix": "yes", "shared_prefix": 10}, "reuse_prefix"),
    ({"prompt_tokens": 100, "output_tokens": 10, "max_model_len": 50}, "max_model_len"),
    ({"speculative_config": 3}, "speculative_config"),
    ({"cpu_bytes_to_use": 1.5}, "cpu_bytes_to_use"),
])
def test_a_bad_workload_is_one_error_naming_the_field(fields, named):
    with pytest.raises(KVExploreError, match=named):
        Workload(**fields)


@pytest.mark.parametrize("keywords, named", [
    ({"gpus": 0}, "gpus"),
    ({"objective": "speed"}, "objective"),
    ({"space": {"tensor_parallel": [1]}}, "tensor_parallel"),
    ({"space": {"max_num_seqs": []}}, "max_num_seqs"),
    ({"space": [1, 2]}, "space"),
    ({"workload": {"concurrency": 2}}, "workload"),
    ({"vllm": ["0.33.0", "0.33"]}, "twice"),
    ({"vllm": "0.2"}, "0.2"),
])
def test_bad_advise_inputs_are_one_clear_error(keywords, named):
    with pytest.raises(KVExploreError, match=named):
        advise("Qwen/Qwen3.5-0.8B", gpu="H100", **keywords)


def test_pareto_front_by_hand():
    rows = [{"starts": True, "concurrent_requests": c, "prefix_reused_tokens": p, "gpus": g}
            for c, p, g in [(10, 0, 1), (5, 100, 1), (5, 50, 1), (20, 0, 2), (10, 0, 1)]]
    rows.append({"starts": False, "concurrent_requests": None, "prefix_reused_tokens": None,
                 "gpus": 1})
    assert pareto_front(rows) == [0, 1, 3]


def test_forms_and_the_command_line(case, capsys):
    from kvexplore.cli import main

    model, gpu, gpus, workload, a = case
    text = a.text()
    assert a.command in text and a.note in text
    assert "<table" in a._repr_html_()
    fig = a.figure()
    points = sum(len(c.get_offsets()) for c in fig.axes[0].collections)
    assert points == int(a.table["starts"].sum()) + 1  # every start, and the circle
    if model != CASES[0][0]:
        return
    argv = [sys.executable, "-m", "kvexplore", "advise", model, "--gpu", gpu, "--gpus", str(gpus),
            "--max-model-len", str(workload.max_model_len), "--concurrency",
            str(workload.concurrency), "--shared-prefix", str(workload.shared_prefix), "--json"]
    capsys.readouterr()
    assert main(argv[3:]) == 0  # answered here, and stored
    out = capsys.readouterr()
    assert out.err == ""
    got = json.loads(out.out)
    # asked again in a new process: the stored answer, printed the same, without importing vLLM
    again = subprocess.run([sys.executable, "-X", "importtime", *argv[1:]],
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and again.stdout == out.out
    assert "import time:" in again.stderr
    assert not re.search(r"\|\s+vllm$", again.stderr, re.M)
    assert got["command"] == a.command
    assert got["rows"] == [json.loads(json.dumps(dict(r), default=str)) for r in a.rows]


def test_two_releases_answer_side_by_side():
    """vllm=[installed, another]: each answered by its own release, side by
    side; the installed one's answer equals a plain call."""
    from kvexplore.planning.release import WINDOW_RELEASES, installed_release

    here = installed_release().version
    other = next(r for r in reversed(WINDOW_RELEASES) if r != here)
    w = Workload(max_model_len=8192, concurrency=8, shared_prefix=1000)
    both = advise("Qwen/Qwen3.5-0.8B", gpu="H100", workload=w, vllm=[here, other])
    assert list(both.answers) == [here, other]
    assert both.answers[other].release == other
    assert both.answers[here].rows == advise("Qwen/Qwen3.5-0.8B", gpu="H100", workload=w).rows
    r = both.recommendations
    assert list(r["vllm"]) == [here, other] and r["command"].str.startswith("vllm serve").all()
    assert set(both.table["vllm"]) == {here, other}


def test_asked_again_the_answer_comes_from_the_store(tmp_path, monkeypatch):
    """The installed release's answer is stored under its question: asked
    again it is read back without planning (the search is not run), equal
    to the first; another workload is a new question."""
    import kvexplore.advising as advising

    w = Workload(max_model_len=8192, concurrency=8, shared_prefix=1000)
    first = advise("Qwen/Qwen3.5-0.8B", gpu="H100", workload=w, store=tmp_path)

    def unplanned(*args, **kwargs):
        raise AssertionError("planned again")

    monkeypatch.setattr(advising, "_advise_here", unplanned)
    again = advise("Qwen/Qwen3.5-0.8B", gpu="H100", workload=w, store=tmp_path)
    assert again == first and again.command == first.command
    with pytest.raises(AssertionError, match="planned again"):
        advise("Qwen/Qwen3.5-0.8B", gpu="H100", store=tmp_path,
               workload=Workload(max_model_len=8192, concurrency=9, shared_prefix=1000))
