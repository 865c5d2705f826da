"""Benchmark: a 10,000-row offloading sweep over one hybrid model.

Times, in one run (medians over ``--repeats``):

* ``kvexplore.offloading.sweep`` over 10,000 combinations of Qwen3.5-0.8B, plans built
  from scratch (plan cache cleared) and with plans already cached;
* vLLM 0.33's own ``build_offloading_config``
  (``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``) for
  the same rows, given ready-made inputs (stand-in ``VllmConfig`` with a real
  ``ParallelConfig`` and ``KVTransferConfig`` per row, built before timing);
* ``kvexplore.offloading.config.offload_config`` on the same ready plans and keywords,
  the like-for-like counterpart of the vLLM loop.

It also checks, untimed, that every row agrees with vLLM (equal config, or
both raise).  Run: ``python3 benchmarks/bench_offload.py``.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.getLogger("vllm").setLevel(logging.ERROR)

# vLLM's own inputs are test scaffolding (tests/offload_reference.py)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from offload_reference import vllm_offload_inputs, vllm_parallel_config  # noqa: E402

import kvexplore  # noqa: E402
from kvexplore.offloading.config import offload_config  # noqa: E402
from kvexplore.offloading.sweep import sweep  # noqa: E402

MODEL = "Qwen/Qwen3.5-0.8B"

EXTRAS = [
    None,
    {},
    {"canonical_layout": True},
    *({"blocks_per_chunk": n} for n in range(1, 9)),
    *({"block_size": t} for t in (144, 272, 288, 544, 576, 1088, 1152, 2176)),
    {"block_size": 544, "blocks_per_chunk": 2},
    {"blocks_per_chunk": 0},
    {"blocks_per_chunk": 2, "canonical_layout": True},
    {"blocks_per_chunk": 4, "canonical_layout": True},
    {"block_size": 544, "canonical_layout": True},
    {"blocks_per_chunk": "3"},
]

PLAN_AXES = {
    "tensor_parallel_size": [4, 8],
    "decode_context_parallel_size": [1, 2],
    "kv_cache_dtype": ["auto", "fp8"],
    "block_size": [None, 64],
}
OFFLOAD_AXES = {
    "extra_config": EXTRAS,
    "prefill_context_parallel_size": [1, 2, 3, 4, 5],
    "nnodes_within_dp": [1, 2, 3, 4, 5],
}


def rows():
    """(plan kwargs, offload kwargs) in the sweep's row order."""
    names = [*PLAN_AXES, *OFFLOAD_AXES]
    values = [*PLAN_AXES.values(), *OFFLOAD_AXES.values()]
    for combo in itertools.product(*values):
        kw = dict(zip(names, combo, strict=True))
        yield (
            {k: kw[k] for k in PLAN_AXES},
            {k: kw[k] for k in OFFLOAD_AXES},
        )


def timed(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
        build_offloading_config,
    )

    kvexplore.plan(MODEL)  # first load of the architecture (vLLM imports)
    all_axes = {**PLAN_AXES, **OFFLOAD_AXES}

    def cold_sweep():
        kvexplore.clear_plan_cache()
        return sweep(MODEL, store=False, **all_axes)  # built, not read back

    t_cold, df = timed(cold_sweep, args.repeats)
    t_warm, df = timed(lambda: sweep(MODEL, store=False, **all_axes), args.repeats)
    n = len(df)
    n_err = int(df.error.notna().sum())

    # ready-made inputs for vLLM's function and for offload_config (untimed)
    plans: dict[tuple, object] = {}
    pcs: dict[tuple, object] = {}
    cases = []
    for pkw, okw in rows():
        pkey = tuple(pkw.items())
        if pkey not in plans:
            try:
                plans[pkey] = kvexplore.plan(MODEL, **pkw)
            except kvexplore.KVExploreError:  # e.g. TP 8: the vision tower's 12 heads
                plans[pkey] = None
        p = plans[pkey]
        if p is None:  # vLLM rejects the plan itself: no offloading call to compare
            continue
        par = (pkey, okw["prefill_context_parallel_size"], okw["nnodes_within_dp"])
        if par not in pcs:
            try:
                pcs[par] = vllm_parallel_config(
                    p,
                    prefill_context_parallel_size=okw["prefill_context_parallel_size"],
                    nnodes_within_dp=okw["nnodes_within_dp"],
                )
            except kvexplore.KVExploreError:  # vLLM's ParallelConfig itself refuses
                pcs[par] = None
        if pcs[par] is None:
            cases.append((p, okw, None, None))  # vLLM raises before build_offloading_config
            continue
        vc, kc = vllm_offload_inputs(p, parallel_config=pcs[par], **okw)
        cases.append((p, okw, vc, kc))

    def run_vllm():
        out = []
        for _, _, vc, kc in cases:
            if vc is None:
                out.append(ValueError("vLLM's ParallelConfig refuses these sizes"))
                continue
            try:
                out.append(build_offloading_config(vc, kc))
            except Exception as exc:  # noqa: BLE001 - vLLM raises several types
                out.append(exc)
        return out

    def run_kvexplore():
        out = []
        for p, okw, _, _ in cases:
            try:
                out.append(offload_config(p, **okw).config)
            except ValueError as exc:
                out.append(exc)
        return out

    t_vllm, theirs = timed(run_vllm, args.repeats)
    t_mine, mine = timed(run_kvexplore, args.repeats)

    agree = sum(
        (isinstance(a, Exception) and isinstance(b, Exception)) or a == b
        for a, b in zip(mine, theirs, strict=True)
    )
    n_plans = sum(p is not None for p in plans.values())
    print(f"model: {MODEL}; {n} rows ({n_err} rows are errors), {n_plans} of {len(plans)} plans valid")
    print(f"rows compared with vLLM (valid plans): {len(cases)}")
    print(f"kvexplore.offloading.sweep, plans built (cache cleared): {t_cold:7.3f} s")
    print(f"kvexplore.offloading.sweep, plans cached:               {t_warm:7.3f} s")
    print(f"vLLM build_offloading_config, ready inputs:  {t_vllm:7.3f} s")
    print(f"kvexplore offload_config, same ready inputs: {t_mine:7.3f} s")
    print(f"ratio sweep (cold) / vLLM:     {t_cold / t_vllm:6.2f}")
    print(f"ratio offload_config / vLLM:   {t_mine / t_vllm:6.2f}")
    print(f"rows agreeing with vLLM: {agree} / {len(cases)}")
    ok = n == 10_000 and t_cold <= 10.0 and agree == len(cases)
    print(
        "PASS" if ok else "FAIL",
        f"(bar: 10,000 rows in <= 10 s; medians of {args.repeats})",
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
