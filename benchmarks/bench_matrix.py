"""The vLLM x LMCache matrix for one deployment: cold and warm, side by side.

``kvexplore.compatibility`` over every vLLM release of the window (each other
release in its own environment, answering in a process of its own, side by
side) and every LMCache release kvexplore knows; run twice in one process
(the second: the installed release's build is cached, the other releases'
processes start again).  Prints seconds per run and the ratio.

    python benchmarks/bench_matrix.py [MODEL] [--gpu H100]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16")
    parser.add_argument("--gpu", default="H100")
    args = parser.parse_args()
    import kvexplore
    from kvexplore.planning.release import WINDOW_RELEASES
    from kvexplore.versions.environments import existing_environments

    installed = kvexplore.plan(args.model, gpu=args.gpu, num_blocks=4).vllm_version
    at_hand = [r for r in WINDOW_RELEASES if r == installed or r in existing_environments()]
    times = []
    for run in ("cold", "warm"):
        t = time.perf_counter()
        c = kvexplore.compatibility(args.model, gpu=args.gpu, vllm=at_hand)
        times.append(time.perf_counter() - t)
        print(f"{run}: {times[-1]:.1f} s for vLLM {', '.join(at_hand)} x "
              f"{len(c.lmcache_releases)} LMCache releases ({len(c.rows)} rows)")
    print(f"warm / cold: {times[1] / times[0]:.2f}")
    print(c.text())


if __name__ == "__main__":
    main()
