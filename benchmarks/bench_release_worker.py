"""Answers from other vLLM releases: one process per question against the
release workers, side by side.

``compare_versions`` of one deployment over the whole window, three times in
one process (the first starts one worker per other release; the next ones
ask the same workers), against the same facts asked the old way, one new
``python -m kvexplore.versions.compare`` per other release
(``kvexplore.versions.run_in``).  Prints seconds and ratios.

    python3 benchmarks/bench_release_worker.py [--model M] [--gpu H100]
"""

from __future__ import annotations

import argparse
import json
import time

from kvexplore.planning.release import WINDOW_RELEASES, installed_release
from kvexplore.versions import compare_versions, run_in


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    ap.add_argument("--gpu", default="H100")
    ns = ap.parse_args()
    here = installed_release().version
    others = [r for r in WINDOW_RELEASES if r != here]
    t = time.perf_counter()
    request = json.dumps({"model": ns.model, "gpu": ns.gpu})
    for release in others:
        out = run_in(release, ["-m", "kvexplore.versions.compare", request])
        assert out.returncode == 0, out.stderr[-500:]
    old = time.perf_counter() - t
    calls = []
    for _ in range(3):
        t = time.perf_counter()
        compare_versions(ns.model, vllm=list(WINDOW_RELEASES), gpu=ns.gpu)
        calls.append(time.perf_counter() - t)
    print(f"{ns.model} on {ns.gpu}, the window ({', '.join(WINDOW_RELEASES)}; "
          f"{len(others)} other releases)")
    print("| path | s | vs one process per release |")
    print("|---|---:|---:|")
    print(f"| one new process per other release (the facts only) | {old:.2f} | 1.00x |")
    for i, s in enumerate(calls):
        what = "workers started" if i == 0 else "the same workers"
        print(f"| compare_versions, call {i + 1} ({what}) | {s:.2f} | {s / old:.3f}x |")


if __name__ == "__main__":
    main()
