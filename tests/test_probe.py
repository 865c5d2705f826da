"""A property-based probe of the public API, as a hostile but realistic user.

Hypothesis draws arguments for every public entry point (``plan``,
``allocate``, the edits, ``verify_roundtrip``, ``offload_config``,
``host_sizing``, ``capacity``, ``sweep``, the page and buffer maps, the
Explorer's state), mixing valid values, near misses (floats, bools, numpy
integers, strings of numbers, negative and huge numbers, torch dtypes,
wrong types) and garbage.  Properties, for every case:

* only ``KVExploreError`` escapes, and its message names the argument;
* the caller's inputs are unchanged;
* a valid input's answer equals the answer of a cold cache.

600 cases a run (200 + 120 + 120 + 100 + 60 examples).
"""

from __future__ import annotations

import functools
import hashlib
import json

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvexplore

QWEN = "Qwen/Qwen3.5-0.8B"

#: Values a user might pass for a count, an id or a size.
NUMBERS = st.one_of(
    st.integers(-3, 70), st.sampled_from([0, 1, 2, 4, 2**62, -(2**40)]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(),
    st.sampled_from(["4", "auto", "", "1e3", "two"]),
    st.integers(0, 64).map(np.int64), st.integers(1, 8).map(np.int32),
    st.sampled_from([[1], {"a": 1}, object(), b"16", torch.bfloat16]),
)
TEXTS = st.one_of(
    st.sampled_from(["auto", "bfloat16", "float16", "fp8", "fp9", "none", "align", "all",
                     "LBNHC", "NHD", "FLASHINFER", "CPU_ATTN", "flash_attn", ""]),
    st.sampled_from([torch.bfloat16, torch.float32, torch.int8]),
    st.text(max_size=6), NUMBERS,
)

PLAN_ARGS = {
    "tensor_parallel_size": NUMBERS, "decode_context_parallel_size": NUMBERS,
    "block_size": NUMBERS, "dtype": TEXTS, "kv_cache_dtype": TEXTS,
    "enable_prefix_caching": st.one_of(st.booleans(), st.none(), TEXTS),
    "mamba_cache_mode": TEXTS, "mamba_ssm_cache_dtype": TEXTS, "max_model_len": NUMBERS,
    "attention_backend": TEXTS, "num_blocks": NUMBERS, "kv_cache_memory_bytes": NUMBERS,
    "kv_cache_layout": TEXTS, "gpu": st.sampled_from(["A100", "h100", "9.0", "sm80", "V100",
                                                     "7.5", "", 3, None]),
    "speculative_config": st.one_of(st.none(), st.sampled_from([
        {"method": "mtp", "num_speculative_tokens": 0}, {"method": "nosuch"}, "mtp", [1],
        {"method": "mtp", "num_speculative_tokens": {1, 2}}])),
}

#: Arguments whose value decides the build; the probe keeps most cases on one
#: build (valid values for these) so that it stays fast.
BUILD_ARGS = ("tensor_parallel_size", "decode_context_parallel_size", "block_size", "dtype",
              "kv_cache_dtype", "enable_prefix_caching", "mamba_cache_mode",
              "mamba_ssm_cache_dtype", "attention_backend", "kv_cache_layout", "speculative_config")


def names_argument(exc: Exception, names) -> bool:
    text = str(exc)
    return any(name in text for name in names)


def call(fn, names, *args, **kwargs):
    """``fn(*args, **kwargs)``; an error must be a KVExploreError naming one of
    ``names``; arguments must come back unchanged."""
    before = snapshot((args, kwargs))
    try:
        out = fn(*args, **kwargs)
    except kvexplore.KVExploreError as exc:
        assert names_argument(exc, names), (names, str(exc))
        out = exc
    except Exception as exc:  # anything else escaping is the failure the probe looks for
        pytest.fail(f"{type(exc).__name__} escaped {fn.__name__}{args}{kwargs}: {exc}")
    assert snapshot((args, kwargs)) == before, "an argument was modified"
    return out


def snapshot(value, storages: dict | None = None):
    """The contents of containers (dicts, lists, sets, tuples), recursively,
    and the identity of everything else: equal before and after a call
    exactly when the call changed none of its arguments.  A tensor is its
    identity, dtype, shape, stride and offset and the digest of its whole
    storage, hashed once per storage (``storages``) however many views share it."""
    storages = {} if storages is None else storages
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), snapshot(v, storages)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(snapshot(v, storages) for v in value))
    if isinstance(value, (set, frozenset)):
        return ("set", tuple(sorted(repr(v) for v in value)))
    if isinstance(value, (str, bytes, int, float, bool)) or value is None:
        return ("value", repr(value))
    if isinstance(value, np.ndarray):
        return ("array", id(value), value.dtype.str, value.shape, hashlib.sha256(value.tobytes()).hexdigest())
    if isinstance(value, torch.Tensor):
        storage = value.detach().cpu().untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        if key not in storages:
            whole = torch.empty(0, dtype=torch.uint8).set_(storage)
            storages[key] = hashlib.sha256(whole.numpy()).hexdigest()
        return ("tensor", id(value), str(value.dtype), tuple(value.shape), value.stride(),
                value.storage_offset(), storages[key])
    return ("object", id(value))


def test_snapshot_sees_a_write_through_any_view():
    """The probe's 'inputs unchanged' check can fail: a byte written through
    a view, inside or outside another view's range, changes the snapshot."""
    base = torch.zeros(64, dtype=torch.uint8)
    head, tail = base[:32], base[32:].view(torch.int32)
    before = snapshot({"head": head, "tail": tail})
    assert snapshot({"head": head, "tail": tail}) == before
    tail[0] = 1  # outside head's range, in its storage
    assert snapshot({"head": head, "tail": tail}) != before
    assert snapshot({"head": head}) != snapshot({"head": head[1:]})  # another view


@st.composite
def plan_calls(draw):
    """One plan() call: usually one argument drawn from its near misses, the
    rest at valid values, sometimes several at once."""
    kwargs = {"gpu": "A100"}
    names = draw(st.lists(st.sampled_from(sorted(PLAN_ARGS)), min_size=1, max_size=3, unique=True))
    for name in names:
        kwargs[name] = draw(PLAN_ARGS[name])
    return kwargs


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(plan_calls())
def test_plan_refuses_by_name_or_answers_as_a_cold_cache(kwargs):
    names = list(kwargs) + ["model", "config", "vLLM"]
    p = call(kvexplore.plan, names, QWEN, **kwargs)
    if isinstance(p, kvexplore.KVExploreError):
        return
    answer = json.dumps(p.to_dict(), sort_keys=True, default=str)
    # the same inputs on a cold cache: only when the build is cheap to redo
    if all(k not in kwargs for k in BUILD_ARGS):
        kvexplore.clear_plan_cache()
        cold = kvexplore.plan(QWEN, **kwargs)
        assert json.dumps(cold.to_dict(), sort_keys=True, default=str) == answer
    # what a plan hands out is a copy: changing it changes no later plan's copy
    p.cache_config.block_size = 1
    again = kvexplore.plan(QWEN, **kwargs).cache_config.block_size
    assert again == json.loads(answer)["block_size"] != 1


@functools.cache
def small():
    """Qwen3.5-0.8B with 3 blocks (not a fixture: hypothesis prints a failing
    case's arguments, and a plan's vLLM objects do not print)."""
    return kvexplore.plan(QWEN, gpu="A100", num_blocks=3)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(layer=NUMBERS, block=NUMBERS, registration=TEXTS, edited=st.sampled_from([None, True, 3]))
def test_page_and_buffer_maps(layer, block, registration, edited):
    call(kvexplore.page_layout, ["layer", "block", "registration", "edited"], small(), layer,
         block=block, registration=registration, edited=edited)
    call(kvexplore.buffer_layout, ["registration"], small(), registration=registration)
    call(kvexplore.page_layout, ["plan", "Plan"], QWEN, 0)


@settings(max_examples=120, deadline=None, suppress_health_check=list(HealthCheck))
@given(extra=st.one_of(st.none(), st.dictionaries(
    st.sampled_from(["block_size", "blocks_per_chunk", "canonical_layout", "other"]),
    NUMBERS, max_size=2), st.sampled_from(["x", [1], 3])),
       cpu=NUMBERS, tp=st.sampled_from([1, 2]))
def test_offload_and_host_sizing(extra, cpu, tp):
    p = small() if tp == 1 else kvexplore.plan(QWEN, gpu="A100", tensor_parallel_size=2)
    result = call(kvexplore.offload_config, ["extra_config", "block_size", "blocks_per_chunk",
                                              "canonical_layout", "options"], p, extra_config=extra)
    if isinstance(result, kvexplore.KVExploreError):
        return
    call(kvexplore.host_sizing, ["cpu_bytes_to_use", "blocks_per_chunk", "block_size"],
         result, cpu)


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(util=NUMBERS, total=NUMBERS, cpu=NUMBERS, n=NUMBERS)
def test_capacity(util, total, cpu, n):
    r = call(kvexplore.capacity, ["gpu_memory_utilization", "total_memory_bytes",
                                  "cpu_bytes_to_use", "num_blocks", "memory"],
             small(), gpu_memory_utilization=util, total_memory_bytes=total,
             cpu_bytes_to_use=cpu)
    if isinstance(r, kvexplore.KVExploreError):
        return
    call(r.prefix_hit_tokens, ["n", "prompt"], n)
    call(r.requests_of_length, ["n", "tokens"], n)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(blocks=st.one_of(st.none(), st.lists(NUMBERS, max_size=3),
                        st.sampled_from([np.array([0, 1]), torch.tensor([2, 0]), range(3),
                                         [np.int64(0)], "01", 5])),
       chunk=NUMBERS)
def test_edits_and_round_trip(blocks, chunk):
    kv = kvexplore.allocate(small())
    edited = call(kvexplore.apply_kv_cache_group_edits, ["kv_cache"], small().kv_cache_config, kv)
    call(kvexplore.verify_roundtrip, ["blocks", "chunk_bytes"], small().kv_cache_config, kv,
         edited, blocks=blocks, chunk_bytes=chunk)
    call(kvexplore.verify_roundtrip, ["kv_cache_config", "Plan", "plan"], small(), kv, edited)



_PLAN_FOUR = r"""
import json, os, signal, sys, threading
import kvexplore

base = json.load(open(sys.argv[1]))
configs = [dict(base, text_config=dict(base["text_config"], max_position_embeddings=n))
           for n in (4096, 8192, 16384, 32768)]
texts, errors = [None] * 4, []

def run(i):
    try:
        texts[i] = kvexplore.plan(configs[i], gpu="A100", num_blocks=8).text()
    except Exception as exc:
        errors.append(repr(exc))

if sys.argv[2] == "threads":
    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads: t.start()
    for t in threads: t.join()
else:
    for i in range(4): run(i)
print(json.dumps({"errors": errors, "texts": texts}), flush=True)
if sys.argv[2] == "threads":
    os.kill(os.getpid(), signal.SIGTERM)
"""


def test_threads_plan_as_sequential_and_sigterm_leaves_nothing(tmp_path):
    """In fresh processes: four threads planning four dict configs at once
    answer exactly as one thread planning them in turn, and a process killed by
    SIGTERM after planning leaves nothing in the temp dir: the configs live in
    the cache folder, one complete folder per content digest, no staging file."""
    import os
    import signal
    import subprocess
    import sys
    from pathlib import Path

    from kvexplore.planning.models import load_model_config

    config = tmp_path / "config.json"
    config.write_text(json.dumps(load_model_config(QWEN).config))
    script = tmp_path / "plan_four.py"
    script.write_text(_PLAN_FOUR)
    out = {}
    for mode in ("threads", "sequential"):
        tmp = tmp_path / f"tmp-{mode}"
        tmp.mkdir()
        root = str(Path(kvexplore.__file__).resolve().parent.parent)
        cache = tmp_path / f"cache-{mode}"
        env = {**os.environ, "TMPDIR": str(tmp), "KVEXPLORE_CACHE_DIR": str(cache),
               "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.run([sys.executable, str(script), str(config), mode],
                              capture_output=True, text=True, env=env, timeout=600)
        assert proc.stdout, proc.stderr[-2000:]
        out[mode] = json.loads(proc.stdout.strip().splitlines()[-1])
        assert out[mode]["errors"] == []
        leftovers = [d.name for d in tmp.iterdir() if d.name.startswith("kvexplore")]
        assert leftovers == [], (mode, leftovers)
        folders = sorted((cache / "configs").iterdir())
        assert len(folders) == 4
        assert all(sorted(f.name for f in d.iterdir()) == ["config.json"] for d in folders)
        if mode == "threads":
            assert proc.returncode == -signal.SIGTERM
    assert out["threads"]["texts"] == out["sequential"]["texts"]
    assert len(set(out["threads"]["texts"])) == 4  # four different models, four answers
