"""What LMCache stores, timed: every hybrid-capable LMCache release asked
about one plan, and one release alone, by a new probe process per question
(the probe file run as a command: torch and vLLM imported each time) and by
the long-lived probe worker (imported once; each question forks a child per
release), and an answer asked again (kept per plan).  Prints seconds (median
of ``--repeat``) and ratios.

    python3 benchmarks/bench_lmcache_layout.py [--model M] [--gpu H100] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import time

from kvexplore import lmcache_layout, plan
from kvexplore.connectors.lmcache_layout import (
    PROBE,
    _candidates,
    _hybrid_release,
    _request,
    _run_probe,
    lmcache_package,
    probe_worker,
)
from kvexplore.editing.lmcache import LMCACHE_RELEASES


def _median(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _one_shot(releases, request) -> None:
    """The probe file as a command in a new process, for ``releases``."""
    with tempfile.TemporaryDirectory() as folder:
        req = os.path.join(folder, "request.pkl")
        with open(req, "wb") as f:
            pickle.dump(request, f)
        packages = [str(lmcache_package(r.version)) for r in releases]
        subprocess.run([sys.executable, str(PROBE), req, folder, *packages], check=True,
                       capture_output=True, env=dict(os.environ, LMCACHE_LOG_LEVEL="ERROR"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--repeat", type=int, default=3)
    ns = ap.parse_args()
    p = plan(ns.model, gpu=ns.gpu)
    releases = [_hybrid_release(v) for v, r in LMCACHE_RELEASES.items() if r.hybrid_groups]
    newest = releases[-2:-1]  # the newest stable release
    request = _request(p, _candidates(p, p.block_size), None, "default")
    t = time.perf_counter()
    _run_probe(newest, request)
    first = time.perf_counter() - t
    rows = [
        ("all releases, a new process per question", _median(
            lambda: _one_shot(releases, request), ns.repeat)),
        ("all releases, the probe worker", _median(
            lambda: _run_probe(releases, request), ns.repeat)),
        (f"{newest[0].version} alone, a new process per question", _median(
            lambda: _one_shot(newest, request), ns.repeat)),
        (f"{newest[0].version} alone, the probe worker", _median(
            lambda: _run_probe(newest, request), ns.repeat)),
    ]
    lmcache_layout(p, lmcache=newest[0].version, chunk_size=p.block_size)
    kept = _median(lambda: lmcache_layout(p, lmcache=newest[0].version,
                                          chunk_size=p.block_size), ns.repeat)
    print(f"{ns.model} on {ns.gpu}, {len(releases)} LMCache releases "
          f"({releases[0].version} .. {releases[-1].version}), median of {ns.repeat}")
    print(f"  the worker's first question ({newest[0].version}, its start included): "
          f"{first:.2f} s")
    for i in (0, 2):
        (cold_name, cold), (warm_name, warm) = rows[i], rows[i + 1]
        print(f"  {cold_name:52s}: {cold:7.2f} s")
        print(f"  {warm_name:52s}: {warm:7.2f} s  ratio {cold / warm:.1f}x")
    print(f"  one release asked again (kept per plan)             : {kept * 1e3:7.2f} ms")
    probe_worker().close()


if __name__ == "__main__":
    main()
