"""Edits are O(1) in bytes; verify_roundtrip runs near copy speed.

Prints, side by side in one run (medians over repeats):

* ``apply_kv_cache_group_edits`` on a ~1 MiB and a ~1 GiB hybrid cache of the
  same shape family (8 layers in 4 overlaid groups, vLLM 0.33 unified
  registration via ``create_kv_cache_views``), and their time ratio (goal
  <= 2: edits touch metadata only);
* new storage bytes the edits allocated (goal 0: every value is a view);
* ``verify_roundtrip`` throughput vs a plain ``torch`` copy of the same
  number of bytes on the same device (goal >= 0.5), with ``restore=False``
  and with ``restore=True`` (the default call, which also saves and puts
  back the caches' bytes), and on the CPU at 2 and 4 MiB tiles beside the
  default 8 MiB;
* the same ratio on a catalog model's own layout (``--model``, default
  Qwen/Qwen3.5-0.8B with 64 blocks; ``--model ''`` skips it).

Usage: ``python benchmarks/bench_edits.py [--device cuda] [--repeats 5] [--model ID]``.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvexplore.editing.roundtrip import verify_roundtrip  # noqa: E402
from kvexplore.editing.rules import apply_kv_cache_group_edits  # noqa: E402

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
    args = parser.parse_args()
    dev, reps = args.device, args.repeats
    torch.manual_seed(0)

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
    gbps = lambda b, t: b / t / 1e9  # noqa: E731
    runs = {
        "restore=False": dict(restore=False),
        "restore=True (the default)": dict(restore=True),
    }
    if not dev.startswith("cuda"):
        runs.update(
            {
                f"restore=False, chunk {m} MiB": dict(
                    restore=False, chunk_bytes=m << 20
                )
                for m in (2, 4)
            }
        )
    results = against_copy(cfg, caches, edited, runs, reps, dev)
    moved = report.bytes_checked
    print(
        f"verify_roundtrip on {label}: {moved:,} registered bytes "
        "(4 overlaid groups), medians, each run next to a plain dst.copy_(src) "
        "of the same bytes:"
    )
    for name, (t_verify, t_copy) in results.items():
        print(
            f"  {name:>28}: {gbps(moved, t_verify):6.2f} GB/s vs copy "
            f"{gbps(moved, t_copy):6.2f} GB/s, ratio {t_copy / t_verify:.2f} (goal >= 0.5)"
        )
    if args.model:
        real_model(args.model, args.model_blocks, reps, dev)


def against_copy(cfg, caches, edited, runs, reps, dev):
    """Median seconds of each ``verify_roundtrip`` variant and of a copy.

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
        name: (statistics.median(v), statistics.median(c))
        for name, (v, c) in times.items()
    }


def real_model(model: str, num_blocks: int, reps: int, dev: str) -> None:
    """The same comparison on a catalog model's own layout (plan + allocate)."""
    import kvexplore

    plan = kvexplore.plan(model, num_blocks=num_blocks)
    caches = plan.allocate(device=dev)
    cfg = plan.kv_cache_config
    edited = apply_kv_cache_group_edits(cfg, caches)
    report = verify_roundtrip(cfg, caches, edited, restore=False)
    assert report.ok, report
    results = against_copy(
        cfg, caches, edited, {"restore=False": dict(restore=False)}, reps, dev
    )
    t_verify, t_copy = results["restore=False"]
    moved = report.bytes_checked
    print(
        f"verify_roundtrip on {model} ({num_blocks} blocks, unified registration, "
        f"{len(report.table)} layers, page {cfg.kv_cache_groups[0].kv_cache_spec.page_size_bytes:,} B, "
        "restore=False): "
        f"{moved / t_verify / 1e9:.2f} GB/s vs copy {moved / t_copy / 1e9:.2f} GB/s, "
        f"ratio {t_copy / t_verify:.2f}"
    )


if __name__ == "__main__":
    main()
