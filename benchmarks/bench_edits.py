"""Edits are O(1) in bytes; verify_roundtrip runs near copy speed.

Prints, side by side in one run (medians over repeats):

* ``apply_kv_cache_group_edits`` on a ~1 MiB and a ~1 GiB hybrid cache of the
  same shape family (8 layers in 4 overlaid groups, vLLM 0.33 unified
  registration via ``create_kv_cache_views``), and their time ratio (goal
  <= 2: edits touch metadata only);
* new storage bytes the edits allocated (goal 0: every value is a view);
* a ratio table: ``verify_roundtrip`` throughput vs a plain ``torch`` copy
  of the same number of bytes on the same device, the median over
  ``--repeats`` runs of copy seconds / verify seconds and the worst run
  (goal: median >= 0.6, never below 0.5), with ``restore=False`` and with
  ``restore=True`` (the default call, which runs each tile on a replica of
  its bytes, in cache, and so never reads or writes the caches' memory), on
  the CPU also at 2, 4 and 8 MiB tiles and on one intra-op thread
  (``threads=1``, skipped for a --root without that argument).
  Per tile and group the check fills (once per tile: the attention page
  holds the GDN state, whose group starts from the pattern the attention
  group left), moves every block through the edited view into another
  block (those that wrap via the store buffer) and compares; a group that
  repeats an earlier group's views exactly (here groups 1 and 2 repeat
  group 0) makes the very same calls and is run once for both; the copy
  reads and writes each byte once, from memory.  By default the CPU's
  intra-op threads split every call here (32 KiB pages) and take whole
  tiles each on the model row (1 MiB pages and up); ``threads=1`` is one;
* the same ratios (``restore`` False and True) on a catalog model's own
  layout, as planned for the planner's default GPU (``--model``, default Qwen/Qwen3.5-0.8B with 64
  blocks: 1,179,648-byte pages on the H100; ``--model ''`` skips it).

Usage: ``python benchmarks/bench_edits.py [--device cuda] [--repeats 5]
[--big-mib 1024] [--model ID] [--model-only] [--root DIR]``; ``--root`` runs
the same measurements against the kvexplore package of another checkout;
``--model-only`` times the model rows alone.  On the 2 shared cores this ran
on, the model rows came out 2-3x lower at the end of a full run (after a
minute of load on both cores) than alone, run for run: the second core
slows under sustained load, and in-cache work suffers where a copy from
memory does not.
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    create_kv_cache_views,
)
from vllm.v1.kv_cache_layout import KVCacheLayout

# ``--root DIR`` measures the kvexplore package under DIR (another checkout)
# with this same script, so two versions compare in one session.
_root = Path(__file__).resolve().parents[1]
if "--root" in sys.argv:
    _root = Path(sys.argv[sys.argv.index("--root") + 1]).resolve()
sys.path.insert(0, str(_root))

from kvexplore.editing import verify_roundtrip  # noqa: E402
from kvexplore.editing.rules import apply_kv_cache_group_edits  # noqa: E402

#: Older checkouts (``--root``) have no ``threads`` argument.
_HAS_THREADS = "threads" in inspect.signature(verify_roundtrip).parameters

# A scaled-down Qwen3.5 shape: 64-token blocks, kernel block 16, a 32 KiB
# page; GDN-like state (conv bf16 + ssm fp32) padded to the attention page.
BLOCK, KERNEL, LAYERS_PER_GROUP = 64, 16, 2
ATTN = FullAttentionSpec(
    block_size=BLOCK, num_kv_heads=2, head_size=64, dtype=torch.bfloat16
)
PAGE = ATTN.page_size_bytes  # 2 heads x 64 tokens x 256 B = 32 KiB
GDN = MambaSpec(
    block_size=BLOCK,
    shapes=((3, 1024), (4, 32, 48)),
    dtypes=(torch.bfloat16, torch.float32),
    page_size_padded=PAGE,
    mamba_cache_mode="align",
)


def registration(total_bytes: int, device: str):
    num_blocks = max(1, total_bytes // (PAGE * LAYERS_PER_GROUP))
    raw = torch.zeros(
        num_blocks * PAGE * LAYERS_PER_GROUP, dtype=torch.int8, device=device
    )
    groups, tensors, caches = [], [], {}
    for g in range(4):
        spec = ATTN if g == 3 else GDN
        names = [f"layers.{g}.{i}" for i in range(LAYERS_PER_GROUP)]
        kt = KVCacheTensor(
            size=raw.numel(),
            layers=names,
            layer_stride=num_blocks * PAGE,
            block_stride=PAGE,
        )
        views = create_kv_cache_views(
            raw, spec, num_blocks, KVCacheLayout.LBNHC, kt, KERNEL if g == 3 else None
        )
        caches.update(zip(names, views, strict=True))
        groups.append(KVCacheGroupSpec(names, spec))
        tensors.append(kt)
    cfg = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=tensors,
        kv_cache_groups=groups,
        kv_cache_layout="LBNHC",
    )
    return cfg, caches, raw


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def median_time(fn, repeats: int, device: str) -> float:
    times = []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def new_storage_bytes(caches, edited) -> int:
    known = {
        t.untyped_storage().data_ptr()
        for v in caches.values()
        for t in ([v] if isinstance(v, torch.Tensor) else v)
    }
    fresh = {}
    for v in edited.values():
        for t in [v] if isinstance(v, torch.Tensor) else v:
            ptr = t.untyped_storage().data_ptr()
            if ptr not in known:
                fresh[ptr] = t.untyped_storage().nbytes()
    return sum(fresh.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--device", default="cuda" if torch.cuda.is_available() else "cpu"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--big-mib", type=int, default=1024)
    parser.add_argument(
        "--model",
        default="Qwen/Qwen3.5-0.8B",
        help="also measure a catalog model's own layout ('' to skip)",
    )
    parser.add_argument("--model-blocks", type=int, default=64)
    parser.add_argument(
        "--model-only", action="store_true", help="only the model rows' ratios"
    )
    parser.add_argument(
        "--root", default=None, help="measure the kvexplore package under this dir"
    )
    args = parser.parse_args()
    dev, reps = args.device, args.repeats
    torch.manual_seed(0)
    if args.model_only and not args.model:
        parser.error("--model-only needs a --model")
    if args.model_only:
        print(f"device: {dev}, torch {torch.__version__}, repeats {reps}")
        print_ratios(real_model(args.model, args.model_blocks, reps, dev), reps)
        return

    rows = []
    for label, size in (
        ("~1 MiB", 1 << 20),
        (f"~{args.big_mib} MiB", args.big_mib << 20),
    ):
        cfg, caches, raw = registration(size, dev)
        apply_kv_cache_group_edits(cfg, caches)  # warm up
        mem0 = torch.cuda.memory_allocated() if dev.startswith("cuda") else 0
        t_edit = median_time(
            lambda c=cfg, k=caches: apply_kv_cache_group_edits(c, k), reps * 4, dev
        )
        edited = apply_kv_cache_group_edits(cfg, caches)
        mem1 = torch.cuda.memory_allocated() if dev.startswith("cuda") else 0
        rows.append(
            (
                label,
                raw.numel(),
                t_edit,
                new_storage_bytes(caches, edited),
                mem1 - mem0,
                cfg,
                caches,
                edited,
                raw,
            )
        )

    print(f"device: {dev}, torch {torch.__version__}, repeats {reps}")
    print(
        f"{'cache':>10} {'bytes':>14} {'edit median':>12} {'new storage B':>14} {'device alloc delta B':>21}"
    )
    for label, nbytes, t, fresh, delta, *_ in rows:
        print(f"{label:>10} {nbytes:>14,} {t * 1e3:>10.3f}ms {fresh:>14} {delta:>21}")
    print(f"edit time ratio big/small: {rows[1][2] / rows[0][2]:.2f} (goal <= 2)")

    label, nbytes, _, _, _, cfg, caches, edited, raw = rows[1]
    report = verify_roundtrip(cfg, caches, edited, restore=False)  # warm up
    assert report.ok, report
    runs = {
        f"{label}, restore=False": dict(restore=False),
        f"{label}, restore=True (default)": dict(restore=True),
    }
    if not dev.startswith("cuda"):
        runs.update(
            {
                f"{label}, restore=False, chunk {m} MiB": dict(
                    restore=False, chunk_bytes=m << 20
                )
                for m in (2, 4, 8)
            }
        )
        if _HAS_THREADS:
            runs[f"{label}, restore=False, threads=1"] = dict(restore=False, threads=1)
    table = against_copy(cfg, caches, edited, runs, reps, dev)
    if args.model:
        table.update(real_model(args.model, args.model_blocks, reps, dev))
    print_ratios(table, reps)


def print_ratios(table, reps):
    """The ratio table: per case, verify and copy throughput and their ratio.

    ``ratio`` is the median over ``reps`` runs of (copy seconds / verify
    seconds), each run timing a verify and then a copy of the same bytes, so
    both see the same machine load; ``min`` is the worst run.
    """
    width = max(len(name) for name in table)
    print(
        f"\nverify_roundtrip vs a plain dst.copy_(src) of the same bytes "
        f"(median of {reps} runs; goal: ratio >= 0.6, min >= 0.5)"
    )
    print(
        f"{'case':<{width}} {'bytes':>14} {'verify GB/s':>12} {'copy GB/s':>10} "
        f"{'ratio':>6} {'min':>6}"
    )
    for name, (moved, t_verify, t_copy, ratios) in table.items():
        print(
            f"{name:<{width}} {moved:>14,} {moved / t_verify / 1e9:>12.2f} "
            f"{moved / t_copy / 1e9:>10.2f} {statistics.median(ratios):>6.2f} "
            f"{min(ratios):>6.2f}"
        )


def against_copy(cfg, caches, edited, runs, reps, dev):
    """Per run variant: bytes, median verify and copy seconds, per-run ratios.

    Baseline: plain ``dst.copy_(src)`` of exactly the registered bytes
    ``verify_roundtrip`` checks (overlaid groups re-use the same backing
    bytes, so that is a multiple of the allocation), done as whole-buffer
    copies plus a partial one between two buffers as large as one
    ``KVCacheTensor``, so every copy streams from memory.  Copy and verify
    runs alternate, so both see the same machine load.
    """
    moved = verify_roundtrip(cfg, caches, edited, restore=False).bytes_checked
    size = max(t.size for t in cfg.kv_cache_tensors)
    src = torch.empty(size, dtype=torch.uint8, device=dev).random_(0, 255)
    dst = torch.empty_like(src)
    whole, rest = divmod(moved, size)

    def plain_copy() -> None:
        for _ in range(whole):
            dst.copy_(src)
        if rest:
            dst[:rest].copy_(src[:rest])

    plain_copy()  # warm up
    times = {name: ([], []) for name in runs}
    for _ in range(reps):
        for name, kwargs in runs.items():
            times[name][0].append(
                median_time(
                    lambda k=kwargs: verify_roundtrip(cfg, caches, edited, **k), 1, dev
                )
            )
            times[name][1].append(median_time(plain_copy, 1, dev))
    return {
        name: (
            moved,
            statistics.median(v),
            statistics.median(c),
            [ci / vi for vi, ci in zip(v, c, strict=True)],
        )
        for name, (v, c) in times.items()
    }


def real_model(model: str, num_blocks: int, reps: int, dev: str):
    """The same comparison on a catalog model's own layout (plan + allocate)."""
    import kvexplore

    plan = kvexplore.plan(model, num_blocks=num_blocks)
    caches = plan.allocate(device=dev)
    cfg = plan.kv_cache_config
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited, restore=False)
    assert report.ok, report
    page = cfg.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    gpu = str(plan.gpu).split(" (")[0]
    name = f"{model} on {gpu} x{num_blocks}, page {page:,} B"
    runs = {
        f"{name}, restore=False": dict(restore=False),
        f"{name}, restore=True (default)": dict(restore=True),
    }
    if _HAS_THREADS and not dev.startswith("cuda"):
        runs[f"{name}, restore=False, threads=1"] = dict(restore=False, threads=1)
    return against_copy(cfg, caches, edited, runs, reps, dev)


if __name__ == "__main__":
    main()
