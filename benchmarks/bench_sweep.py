"""Benchmark: a fleet sweep, sequential, on a Dask LocalCluster, and from the store.

The sweep is catalog models x GPUs x TP x KV cache dtype (:data:`GPUS`,
:data:`TPS`, :data:`DTYPES`: 24 rows per model, the first models of the
catalog until ``--rows`` is reached), through :func:`kvexplore.sweep`, timed
side by side in one run:

* sequentially in this process (its first plan imports vLLM), filling an
  answer store in a temporary folder;
* on a ``LocalCluster`` of ``--workers`` worker processes (one thread each;
  started before timing, its workers import vLLM on their first plan), with
  the store off; the rows must equal the sequential rows;
* again from the answer store, in this process and in a fresh Python process
  (which imports neither vLLM nor torch).

Prints rows per second for each and the parallel efficiency (sequential time
over cluster time, over workers).  The progress bar shows on stderr.

Run: ``python3 benchmarks/bench_sweep.py [--rows 500] [--workers 2]``.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.getLogger("vllm").setLevel(logging.ERROR)

import pandas as pd  # noqa: E402

import kvexplore  # noqa: E402

GPUS = ("A100", "H100", "L40S")
TPS = (1, 2, 4, 8)
DTYPES = ("auto", "fp8")
ROWS_PER_MODEL = len(GPUS) * len(TPS) * len(DTYPES)


def fleet(rows: int) -> tuple[list[str], dict]:
    """The models (catalog order) and axes of a sweep of at least ``rows`` rows."""
    names = kvexplore.catalog_names()
    count = max(1, math.ceil(rows / ROWS_PER_MODEL))
    models = [names[i % len(names)] for i in range(count)]
    return models, dict(gpu=list(GPUS), tensor_parallel_size=list(TPS), kv_cache_dtype=list(DTYPES))


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def fresh_process(models: list[str], axes: dict, store: str) -> tuple[float, bool]:
    """Seconds a fresh Python takes to answer the sweep from ``store``, and
    whether it imported vLLM."""
    code = (
        "import sys, time; t = time.perf_counter(); import kvexplore; "
        f"df = kvexplore.sweep({models!r}, store={store!r}, **{axes!r}); "
        "print(time.perf_counter() - t, 'vllm' in sys.modules, len(df))"
    )
    env = {**os.environ, "TQDM_DISABLE": "1"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         check=True).stdout.split()
    return float(out[0]), out[1] == "True"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=500, help="rows of the sweep (whole models)")
    ap.add_argument("--workers", type=int, default=2, help="worker processes of the LocalCluster")
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    models, axes = fleet(args.rows)
    n = len(models) * ROWS_PER_MODEL
    print(f"{n} rows: {len(models)} models x {len(GPUS)} GPUs x TP {TPS} x KV {DTYPES}; "
          f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory() as store:
        seq, t_seq = timed(lambda: kvexplore.sweep(models, store=store, **axes))
        (cluster, client), t_start = timed(lambda: (lambda c: (c, Client(c)))(
            LocalCluster(n_workers=args.workers, threads_per_worker=1, dashboard_address=None)))
        try:
            par, t_par = timed(lambda: kvexplore.sweep(models, executor=client, store=False, **axes))
        finally:
            client.close()
            cluster.close()
        again, t_store = timed(lambda: kvexplore.sweep(models, store=store, **axes))
        t_fresh, vllm_imported = fresh_process(models, axes, store)
    try:
        pd.testing.assert_frame_equal(par, seq)
        pd.testing.assert_frame_equal(again, seq)
        equal = True
    except AssertionError:
        equal = False
    refused = int(seq.error.notna().sum())
    print(f"rows equal (cluster and store against sequential): {equal}; refused rows: {refused}")
    print(f"load average after: {os.getloadavg()[0]:.1f}; cluster start-up {t_start:.1f} s (not timed)")
    print(f"\n{'run':44s} {'s':>9s} {'rows/s':>9s}")
    for label, t in (("sequential (one process)", t_seq),
                     (f"LocalCluster, {args.workers} worker processes", t_par),
                     ("from the answer store, same process", t_store),
                     (f"from the answer store, fresh process (vLLM imported: {vllm_imported})", t_fresh)):
        print(f"{label:44s} {t:9.2f} {n / t:9.1f}")
    print(f"\nparallel efficiency: {t_seq / t_par / args.workers:.2f} "
          f"(speed-up {t_seq / t_par:.2f}x on {args.workers} workers)")


if __name__ == "__main__":
    main()
