"""The Explorer's releases tab: first, second and third click, side by side.

``Explorer(MODEL, gpu=GPU)``'s releases control compares the deployment its
controls describe across the installed vLLM and every other release of the
window whose environment exists here (each answered by that release's own
long-lived worker).  Clicked three times in one process: the first starts the
workers (each imports its vLLM and builds the model), the second asks again,
the third after a control changed (``max_num_seqs``: a new plan in each
release).  Prints seconds per click and each click's ratio to the first.

    python benchmarks/bench_explorer_releases.py [MODEL] [--gpu H100]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", nargs="?", default="Qwen/Qwen3.5-0.8B")
    parser.add_argument("--gpu", default="H100")
    args = parser.parse_args()
    from kvexplore.explorer.widgets import Explorer

    ex = Explorer(args.model, gpu=args.gpu)
    if ex.releases is None:
        raise SystemExit("no other release's environment here: `kvexplore envs 0.34.0 --create`")
    ex.releases.value = tuple(ex.releases.options)
    times = []
    for click in ("first", "second", "after max_num_seqs changed"):
        if click.startswith("after"):
            ex.state.set(max_num_seqs="64")  # the control, as its dropdown sets it
        t = time.perf_counter()
        ex.releases_button.click()
        times.append(time.perf_counter() - t)
        ok = "across vLLM" in ex.releases_panel.value
        print(f"{click}: {times[-1]:.2f} s ({'answered' if ok else 'not answered'}; "
              f"{', '.join(ex.releases.value)}; vs first {times[-1] / times[0]:.3f}x)")


if __name__ == "__main__":
    main()
