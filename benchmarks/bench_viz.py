"""Renderer cost and Explorer update latency.

1. The largest page in the catalog (Nemotron-H-56B's 16.9 MB Mamba page) and
   the page with the most segments (its attention layer on FLASHINFER, legacy:
   129 kernel pages x K/V) render (``page_map`` + Agg draw) in <= 50 ms:
   segments are drawn, never bytes, and rows are capped.
2. Explorer update latency after a control change, for every catalog model,
   headless (the widget as it starts: HTML panels and the page-map figure,
   drawn to PNG, no browser): a change that needs no new model build (view
   controls, memory inputs, cached plans) median <= 100 ms; one that builds
   vLLM's model anew on the meta device (GPU, TP, dtype, backend ...) median
   <= 500 ms.  Each model is loaded once before timing (the first load costs
   seconds); the control sequence below then visits new plans and view-only
   changes, as a user would.  No-build changes are also split by whether
   they drew a new page map (an Agg draw) or reused a memoised PNG.  The
   process CPU time of each change is reported beside the wall time: on a
   shared machine the wall time grows with the load, the CPU time much less.

Run: ``python benchmarks/bench_viz.py [--repeats 7] [--models a,b]``.
Prints one line per measurement and a verdict; exit status 1 on a miss.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import matplotlib

matplotlib.use("Agg")

PAGE_BUDGET_S = 0.050
UPDATE_BUDGET_S = 0.100

#: One user session: (control, value) in order.  Plan-changing controls come
#: back to their defaults, so later visits hit the plan cache as in real use.
#: A control change that builds a new model (GPU, TP, dtype, backend ...).
BUILD_BUDGET_S = 0.5

SEQUENCE = [
    ("gpu", "A100"),
    ("tensor_parallel_size", 2),
    ("layer", "attn"),
    ("attention_backend", "FLASHINFER"),
    ("block", 1),
    ("registration", "legacy"),
    ("kv_cache_dtype", "fp8"),
    ("registration", "unified"),
    ("tensor_parallel_size", 1),
    ("block", 0),
    ("kv_cache_dtype", "auto"),
    ("attention_backend", "FLASH_ATTN"),
    ("layer", 0),
    ("dtype", "float16"),
    ("dtype", "auto"),
    ("gpu", "H100"),
]


def _median_time(fn, repeats: int) -> tuple[float, float]:
    """(median, min) seconds; the min shows the cost without CPU contention."""
    fn()  # warm
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), min(times)


def bench_pages(repeats: int) -> bool:
    import kvexplore
    from kvexplore.rendering import layouts as viz

    best = None
    for name in kvexplore.catalog_names():
        p = kvexplore.plan(name)
        for pos, info in enumerate(p.layers):
            size = p.layer_specs[info.name].page_size_bytes
            if best is None or size > best[0]:
                best = (size, name, pos)
    size, name, pos = best
    p = kvexplore.plan(name, attention_backend="FLASHINFER")
    attn = next((i for i, info in enumerate(p.layers) if info.kind != "mamba"), pos)
    ok = True
    cases = [
        (f"largest page: {name} layer {pos} ({size:,} B), unified + edited", p, pos, "unified"),
        (f"most segments: {name} layer {attn} FLASHINFER legacy + edited "
         f"({viz.page_layout(p, attn).kernel_pages} kernel pages)", p, attn, "legacy"),
    ]
    from kvexplore.rendering.figures import page_figure

    for label, plan, layer, reg in cases:
        lay = viz.page_layout(plan, layer, registration=reg, edited=True)

        def full(lay=lay):  # the notebook figure: title and legend drawn
            page_figure(lay).canvas.draw()

        def image(lay=lay):  # the Explorer's image: title and legend are its HTML
            page_figure(lay, title=False, legend_row=False).canvas.draw()

        for what, render in (("figure", full), ("Explorer image", image)):
            t, fastest = _median_time(render, repeats)
            verdict = "ok" if t <= PAGE_BUDGET_S else "MISS"
            ok &= t <= PAGE_BUDGET_S
            print(f"page_map {label}, {what}: median {1000 * t:.1f} ms, min {1000 * fastest:.1f} ms "
                  f"(budget {1000 * PAGE_BUDGET_S:.0f}) {verdict}")
    return ok


def bench_explorer(models: list[str]) -> bool:
    from kvexplore.explorer.widgets import Explorer

    ok = True
    all_times = []
    builds: list[float] = []
    views: list[float] = []
    drew: list[float] = []
    reused: list[float] = []
    cpu_views: list[float] = []
    cpu_builds: list[float] = []
    for name in models:
        t0 = time.perf_counter()
        ex = Explorer(name)
        load = time.perf_counter() - t0
        attn = next((i for i, info in enumerate(ex.state.plan.layers) if info.kind != "mamba"), 0)
        times = []
        model_builds: list[float] = []
        model_views: list[float] = []
        errors = 0
        for control, value in SEQUENCE:
            if value == "attn":
                value = attn
            before = _builds()
            pngs = set(_png_keys(ex))
            t, c = time.perf_counter(), time.process_time()
            ex.controls[control].value = value
            dt = time.perf_counter() - t
            dc = time.process_time() - c
            times.append(dt)
            built = _builds() > before
            (builds if built else views).append(dt)
            (cpu_builds if built else cpu_views).append(dc)
            if not built:
                (drew if set(_png_keys(ex)) - pngs else reused).append((dt, dc))
            (model_builds if built else model_views).append(dt)
            errors += ex.state.error is not None
        all_times += times
        view_med = statistics.median(model_views) if model_views else 0.0
        build_med = statistics.median(model_builds) if model_builds else 0.0
        good = view_med <= UPDATE_BUDGET_S and build_med <= BUILD_BUDGET_S
        ok &= good
        print(f"explorer {name}: no-build median {1000 * view_med:.1f} ms ({len(model_views)}), "
              f"build median {1000 * build_med:.0f} ms ({len(model_builds)}), "
              f"max {1000 * max(times):.0f} ms ({errors} showed an error), "
              f"first load {load:.1f} s {'ok' if good else 'MISS'}")
    print(f"explorer all models: median {1000 * statistics.median(all_times):.1f} ms")
    if builds:
        print(f"explorer changes that built a model: median {1000 * statistics.median(builds):.0f} ms "
              f"over {len(builds)} (goal <= 500 ms)")
    print(f"explorer changes that needed no build: median {1000 * statistics.median(views):.1f} ms "
          f"over {len(views)} (goal <= 100 ms)")
    print(f"explorer process CPU time per change: no build median {1000 * statistics.median(cpu_views):.1f} ms, "
          f"build median {1000 * statistics.median(cpu_builds or [0.0]):.0f} ms")
    for label, values in (("drew a new page map", drew), ("drew none (memoised or an error)", reused)):
        if values:
            wall = statistics.median(v[0] for v in values)
            cpu = statistics.median(v[1] for v in values)
            print(f"  of which {label}: median {1000 * wall:.1f} ms (CPU {1000 * cpu:.1f} ms) over {len(values)}")
    return ok


def _png_keys(ex):
    from kvexplore.memo import keys

    return [k for k in keys(ex.state.plan) if k[:2] == ("explorer", "png")]


def _builds() -> int:
    """How many model builds the planner has run (its build cache's misses)."""
    from kvexplore.planning import planner

    return planner._cached_build.cache_info().misses


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--models", default="", help="comma-separated catalog ids (default: all)")
    args = ap.parse_args(argv)
    import os

    import kvexplore

    models = [m for m in args.models.split(",") if m] or kvexplore.catalog_names()
    try:
        load = os.getloadavg()[0]
        print(f"load average (1 min) at start: {load:.2f} on {os.cpu_count()} CPUs")
    except OSError:
        pass
    ok = bench_pages(args.repeats)
    ok &= bench_explorer(models)
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
