"""A first plan on every vLLM release of the window, against that release's
own build path, side by side.

For each release (its environment made with ``kvexplore envs --create``) and
model: ``kvexplore.plan`` in a fresh process against the bare sequence that
release's worker and engine core run (``bench_plan.VLLM``: its own
``get_kv_cache_configs`` wherever the release keeps it), wall time and peak
RSS of each process, the ratio, and the block size both give.

    python3 benchmarks/bench_releases.py [--releases 0.31.0,0.32.0,0.33.0,0.34.0]
        [--models Qwen/Qwen3.5-0.8B,...] [--gpu H100]
"""

import argparse
import statistics

from bench_plan import OURS, VLLM, fresh

from kvexplore.planning.release import WINDOW_RELEASES

DEFAULT_MODELS = ("Qwen/Qwen3.5-0.8B", "nvidia/Nemotron-H-56B-Base-8K",
                  "meta-llama/Llama-3.1-8B-Instruct")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--releases", default=",".join(WINDOW_RELEASES))
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS))
    ap.add_argument("--gpu", default="H100")
    args = ap.parse_args()
    print(f"first plan of an architecture, fresh process, {args.gpu} (imports included)")
    print(f"{'release':8s} {'model':36s} {'plan() s':>9s} {'vLLM s':>8s} {'ratio':>6s} "
          f"{'plan() MB':>10s} {'vLLM MB':>8s}  block")
    ratios = {}
    for release in args.releases.split(","):
        for name in args.models.split(","):
            a = fresh(OURS, name, args.gpu, release=release)
            b = fresh(VLLM, name, args.gpu, release=release)
            assert a["block_size"] == b["block_size"], (release, name, a, b)
            ratios.setdefault(release, []).append(a["s"] / b["s"])
            print(f"{release:8s} {name:36s} {a['s']:9.2f} {b['s']:8.2f} {a['s'] / b['s']:5.2f}x "
                  f"{a['rss_mb']:10.0f} {b['rss_mb']:8.0f}  {a['block_size']}")
    for release, rs in ratios.items():
        print(f"vLLM {release}: median ratio plan()/vLLM {statistics.median(rs):.2f}x")


if __name__ == "__main__":
    main()
