"""One ``kvexplore plan`` command, side by side: the command as installed
(:func:`kvexplore.cli.console`: the heap frozen before the exit) against the
same :func:`kvexplore.cli.main` run and exited without freezing it.

Each run is a fresh process (``--runs`` of each, alternating, so the machine's
noise falls on both); the answer store is bypassed (``--no-cache``) so every
run imports vLLM and builds the plan.  Printed: each run's seconds, the
medians and their ratio.

    python3 benchmarks/bench_cli_exit.py [--runs 5] [--model Qwen/Qwen3.5-0.8B] [--gpu A100]
"""

import argparse
import statistics
import subprocess
import sys
import time

UNFROZEN = "import sys\nfrom kvexplore.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def seconds(argv: list[str]) -> float:
    t = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--model", default="Qwen/Qwen3.5-0.8B")
    ap.add_argument("--gpu", default="A100")
    ns = ap.parse_args()
    command = ["plan", ns.model, "--gpu", ns.gpu, "--no-cache"]
    frozen, unfrozen = [], []
    for _ in range(ns.runs):
        frozen.append(seconds([sys.executable, "-m", "kvexplore", *command]))
        unfrozen.append(seconds([sys.executable, "-c", UNFROZEN, *command]))
    print("run  console (frozen) s  main, unfrozen s")
    for i, (a, b) in enumerate(zip(frozen, unfrozen, strict=True), 1):
        print(f"{i:3d}  {a:19.2f}  {b:16.2f}")
    fm, um = statistics.median(frozen), statistics.median(unfrozen)
    print(f"median  {fm:.2f} s vs {um:.2f} s: the unfrozen exit takes {um / fm:.2f}x")


if __name__ == "__main__":
    main()
