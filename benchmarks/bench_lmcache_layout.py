"""What LMCache stores, timed: every hybrid-capable LMCache release asked
about one plan, one process per release against one process for all (torch
and vLLM imported once, a forked child per release), and an answer asked
again (kept per plan).  Prints seconds (median of ``--repeat``) and ratios.

    python3 benchmarks/bench_lmcache_layout.py [--model M] [--gpu H100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvexplore import lmcache_layout, plan
from kvexplore.connectors.lmcache_layout import (
    _candidates,
    _hybrid_release,
    _request,
    _run_probe,
)
from kvexplore.editing.lmcache import LMCACHE_RELEASES


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    p = plan(ns.model, gpu=ns.gpu)
    releases = [_hybrid_release(v) for v, r in LMCACHE_RELEASES.items() if r.hybrid_groups]
    request = _request(p, _candidates(p, p.block_size), None, "default")
    one_each = _median(lambda: [_run_probe([r], request) for r in releases], ns.repeat)
    together = _median(lambda: _run_probe(releases, request), ns.repeat)
    lmcache_layout(p, lmcache="0.5.6", chunk_size=p.block_size)
    kept = _median(lambda: lmcache_layout(p, lmcache="0.5.6", chunk_size=p.block_size),
                   ns.repeat)
    print(f"{ns.model} on {ns.gpu}, {len(releases)} LMCache releases "
          f"({releases[0].version} .. {releases[-1].version}), median of {ns.repeat}")
    print(f"  one process per release : {one_each:7.2f} s ({one_each / len(releases):.2f} s each)")
    print(f"  one process, a child each: {together:7.2f} s  ratio {one_each / together:.1f}x")
    print(f"  one release asked again  : {kept * 1e3:7.2f} ms (kept per plan)")


if __name__ == "__main__":
    main()
