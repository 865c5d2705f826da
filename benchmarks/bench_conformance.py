"""Benchmark: the offload conformance fixture, one checkout against another.

``tests/test_offload_conformance.py``'s module fixture ``outcomes`` compares
kvexplore's ``offload_config`` with vLLM's own ``build_offloading_config`` on
random plans.  For each checkout named (a git ref, exported with
``git archive``, or ``.`` for the working tree), a fresh process imports that
checkout's kvexplore and test module, runs the fixture once and then the
module's tests that read it, and reports: comparisons, ``plan()`` calls,
distinct plans, model builds (``build_stages`` calls, and pipeline stages
built), seconds in all, in builds and in the memory profile's traced forward
(``_traced_forward``), and CPU seconds of the process.  Checkouts run in
turn, ``--rounds`` times (A B A B ...), so a ratio compares runs made under
the same load.

    python3 benchmarks/bench_conformance.py [REF ...] [--rounds 1]

(default refs: ``main`` and ``.``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUN = r"""
import json, logging, os, sys, time
root = sys.argv[1]
sys.path[:0] = [root, os.path.join(root, "tests")]
logging.getLogger("vllm").setLevel(logging.ERROR)
import kvexplore.planning.planner as planner
import kvexplore.planning.profile as profile
import kvexplore.planning.worker as worker

counts = {"plan_calls": 0, "builds": 0, "stage_builds": 0, "build_s": 0.0, "forward_s": 0.0}

def timed(module, name, count, seconds):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            if count:
                counts[count] += 1
            if seconds:
                counts[seconds] += time.perf_counter() - t
    setattr(module, name, wrapper)

timed(worker, "build_stages", "builds", "build_s")
timed(worker, "build_model", "stage_builds", None)
timed(profile, "_traced_forward", None, "forward_s")
import kvexplore
original_plan = kvexplore.plan
def counted_plan(*args, **kwargs):
    counts["plan_calls"] += 1
    return original_plan(*args, **kwargs)
kvexplore.plan = counted_plan

import test_offload_conformance as t

cpu, wall = time.process_time(), time.perf_counter()
records = t.outcomes.__wrapped__()
fixture_s = time.perf_counter() - wall
fixture_cpu = time.process_time() - cpu
tests = {}
for name in ("test_at_least_500_offload_comparisons", "test_kvexplore_equals_vllm",
             "test_coverage_of_the_issue_cases"):
    try:
        getattr(t, name)(records)
        tests[name] = "passed"
    except AssertionError as exc:
        tests[name] = "FAILED " + " ".join(str(exc).split())[:300]
compared = [r for r in records if r[3] is not None]
print(json.dumps({
    **counts, "comparisons": len(compared),
    "distinct_plans": len({id(r[3]) for r in compared}),
    "fixture_s": fixture_s, "fixture_cpu_s": fixture_cpu, "tests": tests,
}))
"""


def checkout(ref: str, tmp: Path) -> Path:
    """The tree of ``ref`` (``.``: the working tree itself)."""
    if ref == ".":
        return ROOT
    dest = tmp / ref.replace("/", "_")
    dest.mkdir()
    data = subprocess.run(
        ["git", "-C", str(ROOT), "archive", ref], check=True, capture_output=True
    ).stdout
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        with tarfile.open(fileobj=f) as tar:
            tar.extractall(dest, filter="data")
    return dest


def run_once(tree: Path) -> dict:
    env = {
        **os.environ,
        "PYTHONPATH": str(tree),
        "VLLM_LOGGING_LEVEL": "ERROR",
        "HUMMING_DISABLE_PARALLEL_BUILD": "1",
        "TQDM_DISABLE": "1",
    }
    with tempfile.TemporaryDirectory() as store:
        env["KVEXPLORE_STORE_DIR"] = store
        out = subprocess.run(
            [sys.executable, "-c", RUN, str(tree)],
            env=env,
            cwd=tree,
            capture_output=True,
            text=True,
        )
    if out.returncode:
        raise SystemExit(f"{tree}: exit {out.returncode}\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("refs", nargs="*", default=["main", "."])
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    results: dict[str, list[dict]] = {ref: [] for ref in args.refs}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {ref: checkout(ref, Path(tmp)) for ref in args.refs}
        for _ in range(args.rounds):
            for ref in args.refs:
                r = run_once(trees[ref])
                results[ref].append(r)
                print(ref, json.dumps(r), flush=True)
    print(
        "\n| checkout | comparisons | plan() calls | distinct plans | builds (stages) "
        "| fixture s | builds s | traced forward s | CPU s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for ref, rs in results.items():
        med = {
            k: statistics.median(r[k] for r in rs)
            for k in ("fixture_s", "build_s", "forward_s", "fixture_cpu_s")
        }
        r = rs[0]
        print(
            f"| {ref} | {r['comparisons']} | {r['plan_calls']} | {r['distinct_plans']} "
            f"| {r['builds']} ({r['stage_builds']}) | {med['fixture_s']:.0f} "
            f"| {med['build_s']:.0f} | {med['forward_s']:.0f} | {med['fixture_cpu_s']:.0f} |"
        )
    base = args.refs[0]
    for ref in args.refs[1:]:
        ratio = statistics.median(
            r["fixture_s"] for r in results[base]
        ) / statistics.median(r["fixture_s"] for r in results[ref])
        print(f"fixture time {base} / {ref}: {ratio:.2f}x")
    for ref, rs in results.items():
        print(ref, rs[0]["tests"])


if __name__ == "__main__":
    main()
