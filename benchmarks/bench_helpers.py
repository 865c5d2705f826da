"""What vLLM's dependency humming-kernels' background build helpers cost a
process that plans and never runs a GPU kernel, side by side.

Importing vLLM imports ``humming.ops.utils``, which starts two helper
processes that try to build an NVRTC binary and a kernel launcher for later
GPU use.  ``HUMMING_DISABLE_PARALLEL_BUILD=1`` (read by ``humming/ops/utils.py``
and ``humming/utils/cpu.py``) keeps them from starting; a kernel that needs
them builds them on first use instead.

For each setting: ``--processes`` fresh processes, each planning one model,
run ``--parallel`` at a time (the test command runs two lines of work on a
2-core machine), then a wait until every helper has exited.  Printed: the
wall time until the last process (and helper) is gone, and the machine's busy
CPU seconds over that time (from ``/proc/stat``, so helpers that outlive
their parent are counted), and the ratio.

    python3 benchmarks/bench_helpers.py [--processes 6] [--parallel 2]
        [--model Qwen/Qwen3.5-0.8B] [--gpu H100]
"""

import argparse
import os
import subprocess
import sys
import time

CODE = r"""
import sys, kvexplore
kvexplore.plan(sys.argv[1], gpu=sys.argv[2])
"""


def busy_seconds() -> float:
    """The machine's busy CPU time so far (all cores), from ``/proc/stat``."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields) - idle) / os.sysconf("SC_CLK_TCK")


def helpers_running() -> bool:
    """Whether a humming build helper process is alive."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if b"humming" in cmd and b"import" in cmd:
            return True
    return False


def run(processes: int, parallel: int, model: str, gpu: str, disabled: bool) -> tuple[float, float]:
    env = dict(os.environ)
    env.pop("HUMMING_DISABLE_PARALLEL_BUILD", None)
    if disabled:
        env["HUMMING_DISABLE_PARALLEL_BUILD"] = "1"
    while helpers_running():
        time.sleep(0.5)
    t0, c0 = time.perf_counter(), busy_seconds()
    pending, running = processes, []
    while pending or running:
        while pending and len(running) < parallel:
            running.append(subprocess.Popen([sys.executable, "-c", CODE, model, gpu], env=env,
                                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            pending -= 1
        for p in list(running):
            if p.poll() is not None:
                if p.returncode != 0:
                    raise RuntimeError(f"a planning process exited with {p.returncode}")
                running.remove(p)
        time.sleep(0.05)
    while helpers_running():
        time.sleep(0.1)
    return time.perf_counter() - t0, busy_seconds() - c0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--processes", type=int, default=6)
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--model", default="Qwen/Qwen3.5-0.8B")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    print(f"{args.processes} fresh processes planning {args.model} on {args.gpu}, "
          f"{args.parallel} at a time; median of {args.rounds} rounds (load average "
          f"{os.getloadavg()[0]:.1f} at start)")
    results = {False: [], True: []}
    for _ in range(args.rounds):
        for disabled in (False, True):
            results[disabled].append(run(args.processes, args.parallel, args.model, args.gpu,
                                         disabled))

    def median(values):
        values = sorted(values)
        return values[len(values) // 2]

    print(f"{'helpers':10s} {'wall s':>8s} {'busy CPU s':>11s}")
    for disabled in (False, True):
        wall = median([w for w, _ in results[disabled]])
        cpu = median([c for _, c in results[disabled]])
        print(f"{'off' if disabled else 'on':10s} {wall:8.1f} {cpu:11.1f}")
    on_w = median([w for w, _ in results[False]])
    off_w = median([w for w, _ in results[True]])
    on_c = median([c for _, c in results[False]])
    off_c = median([c for _, c in results[True]])
    print(f"ratio on/off: wall {on_w / off_w:.2f}x, busy CPU {on_c / off_c:.2f}x")


if __name__ == "__main__":
    main()
