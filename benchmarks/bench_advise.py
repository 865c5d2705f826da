"""The advisor's default space for one model on one GPU type, cold and warm.

Cold: a new Python process runs ``kvexplore.advise`` once (``store=False``: the
search itself) (vLLM's import and
the model's first build included); warm: the same call again in that
process (plans and their builds reused), and a second workload (a new
concurrency and shared prefix: new rows on the same builds); the command
line with an empty answer store and again (read back from the store).  Beside them,
one ``kvexplore.plan`` of vLLM's defaults in a new process, what every call
pays first.  Prints medians of ``--repeats`` runs and the ratios.

    python3 benchmarks/bench_advise.py --model nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16 --gpu H100
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import kvexplore
from kvexplore.advising import Workload, advise
model, gpu, only_plan = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
if only_plan:
    kvexplore.plan(model, gpu=gpu)
    print(json.dumps({"cold": time.perf_counter() - t0}))
    raise SystemExit
w = Workload(max_model_len=32768, concurrency=64, shared_prefix=1500)
a = advise(model, gpu=gpu, workload=w, store=False)
cold = time.perf_counter() - t0
t1 = time.perf_counter()
advise(model, gpu=gpu, workload=w, store=False)
warm = time.perf_counter() - t1
t2 = time.perf_counter()
advise(model, gpu=gpu, workload=Workload(max_model_len=32768, concurrency=16, shared_prefix=3000),
       store=False)
other = time.perf_counter() - t2
print(json.dumps({"cold": cold, "warm": warm, "other": other, "rows": len(a.rows)}))
"""


def _run(model: str, gpu: str, only_plan: bool) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, model, gpu, "1" if only_plan else "0"],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cli(model: str, gpu: str, store: str) -> float:
    """Seconds of one ``kvexplore advise`` command line with the answer
    store in ``store``."""
    import os
    import time

    argv = [sys.executable, "-m", "kvexplore", "advise", model, "--gpu", gpu,
            "--max-model-len", "32768", "--concurrency", "64", "--shared-prefix", "1500"]
    t = time.perf_counter()
    subprocess.run(argv, capture_output=True, check=True,
                   env={**os.environ, "KVEXPLORE_CACHE_DIR": store})
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args()
    runs = [_run(ns.model, ns.gpu, False) for _ in range(ns.repeats)]
    plans = [_run(ns.model, ns.gpu, True)["cold"] for _ in range(ns.repeats)]
    import tempfile

    cli = []
    for _ in range(ns.repeats):
        with tempfile.TemporaryDirectory() as store:
            cli.append((_cli(ns.model, ns.gpu, store), _cli(ns.model, ns.gpu, store)))
    med = {k: statistics.median(r[k] for r in runs) for k in ("cold", "warm", "other")}
    cli_cold = statistics.median(c for c, _ in cli)
    cli_warm = statistics.median(w for _, w in cli)
    plan_s = statistics.median(plans)
    print(f"{ns.model} on {ns.gpu}, default space ({runs[0]['rows']} rows), "
          f"medians of {ns.repeats}")
    print("| step | s | vs one plan() in a new process |")
    print("|---|---:|---:|")
    print(f"| one plan() of vLLM's defaults, new process | {plan_s:.2f} | 1.00x |")
    print(f"| advise(), new process (cold) | {med['cold']:.2f} | {med['cold'] / plan_s:.2f}x |")
    print(f"| advise() again (warm) | {med['warm']:.2f} | {med['warm'] / plan_s:.3f}x |")
    print(f"| advise(), another workload (warm builds) | {med['other']:.2f} | "
          f"{med['other'] / plan_s:.3f}x |")
    print(f"| kvexplore advise, empty answer store | {cli_cold:.2f} | {cli_cold / plan_s:.2f}x |")
    print(f"| kvexplore advise again (answer store, no vLLM import) | {cli_warm:.2f} | "
          f"{cli_warm / plan_s:.3f}x |")


if __name__ == "__main__":
    main()
