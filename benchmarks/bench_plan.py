"""plan() against vLLM's own path, per catalog model, side by side.

Prints, for every bundled model: the median uncached ``plan()`` time once the
model's config is loaded, the median time of vLLM's own path to the same block
size (``kvexplore.reference.vllm_alignment``: a fresh ``ModelConfig`` plus the
hooks and ``Platform.update_block_size_for_backend``), and their ratio; then a
1,000-plan sweep (uncached, varied TP / kv dtype / block size / backend).

    python3 benchmarks/bench_plan.py [--repeats 15]
"""

import argparse
import itertools
import logging
import statistics
import time

import kvexplore
from kvexplore.reference import vllm_alignment

logging.getLogger("vllm").setLevel(logging.ERROR)


def median_ms(fn, repeats):
    samples = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return 1000 * statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    print(f"{'model':42s} {'plan() ms':>10s} {'vLLM path ms':>13s} {'ratio':>8s}")
    rows = []
    for name in kvexplore.catalog_names():
        src = kvexplore.load_model_config(name)
        kvexplore.plan(src)  # first load: imports the model class

        def ours(src=src):
            kvexplore.clear_plan_cache()
            kvexplore.plan(src)

        def theirs(src=src):
            vllm_alignment(str(src.config_dir))

        a = median_ms(ours, args.repeats)
        b = median_ms(theirs, max(3, args.repeats // 3))
        rows.append((a, b))
        print(f"{name:42s} {a:10.2f} {b:13.2f} {b / a:7.1f}x")
    ours_med = statistics.median(r[0] for r in rows)
    theirs_med = statistics.median(r[1] for r in rows)
    print(f"{'median over catalog':42s} {ours_med:10.2f} {theirs_med:13.2f} {theirs_med / ours_med:7.1f}x")

    src = kvexplore.load_model_config("Qwen/Qwen3.5-0.8B")
    combos = list(itertools.product(
        [1, 2], ["auto", "fp8"], [None, 16, 32, 64, 128, 256, 512],
        ["FLASH_ATTN", "FLASHINFER", "TRITON_ATTN", "CPU_ATTN"],
        [True, False], range(1, 10),
    ))[:1000]
    kvexplore.clear_plan_cache()
    t = time.perf_counter()
    errors = 0
    for tp, kvd, bs, be, prefix, nb in combos:
        try:
            kvexplore.plan(src, tensor_parallel_size=tp, kv_cache_dtype=kvd, block_size=bs,
                           attention_backend=be, enable_prefix_caching=prefix, num_blocks=nb)
        except ValueError:
            errors += 1
    dt = time.perf_counter() - t
    print(f"1,000-plan sweep (Qwen3.5-0.8B, uncached): {dt:.2f} s "
          f"({1000 * dt / len(combos):.2f} ms/plan, {errors} rejected; goal <= 5 s)")


if __name__ == "__main__":
    main()
