"""Benchmark: capacity answers for an already planned model.

Times (medians over ``--repeats``):

* one :func:`kvexplore.capacity` answer on a cached plan (goal <= 5 ms): the
  memory accounting, ``num_blocks``, vLLM's ``get_kv_cache_capacity``, its
  admission check and its ``_estimate_max_model_len_from_groups`` binary
  search, at a new ``gpu_memory_utilization`` each time;
* a sweep of 1,000 capacity rows (goal <= 5 s): 250 utilisations x 4 plans
  (Qwen3.5-0.8B on A100 and H100, TP 1 and 2), plans built before timing;
* ``prefix_hit_tokens`` for 1,000 prompt lengths on one report.

Run: ``python3 benchmarks/bench_capacity.py``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.getLogger("vllm").setLevel(logging.ERROR)

import kvexplore  # noqa: E402

MODEL = "Qwen/Qwen3.5-0.8B"


def _median(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    t = time.perf_counter()
    plans = [
        kvexplore.plan(MODEL, gpu=gpu, tensor_parallel_size=tp, max_model_len=32768)
        for gpu in ("A100", "H100") for tp in (1, 2)
    ]
    print(f"planning 4 plans (untimed setup): {time.perf_counter() - t:.1f} s")
    p = plans[0]
    p.capacity(0.9)  # vLLM imports and the plan's shared facts, once

    utils = [0.5 + 0.45 * i / 249 for i in range(250)]
    state = {"i": 0}

    def one():
        state["i"] += 1
        p.capacity(utils[state["i"] % len(utils)])

    single = statistics.median(_median(one, 50) for _ in range(args.repeats))
    print(f"one capacity answer on a planned model: {single * 1e3:.2f} ms median (goal <= 5 ms)")

    def rows():
        out = [q.capacity(u).num_blocks for q in plans for u in utils]
        assert len(out) == 1000

    sweep = _median(rows, args.repeats)
    print(f"1,000 capacity rows: {sweep:.2f} s median (goal <= 5 s)")

    r = p.capacity(0.9)
    lengths = range(1, 32769, 32)

    def hits():
        for n in lengths:
            r.prefix_hit_tokens(n)

    print(f"prefix_hit_tokens x {len(lengths)}: {_median(hits, args.repeats) * 1e3:.2f} ms median")


if __name__ == "__main__":
    main()
