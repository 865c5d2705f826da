"""Edits are O(1) in bytes; verify_roundtrip against a plain copy of the same bytes.

Prints, in one run (medians over ``--repeats``):

* ``apply_kv_cache_group_edits`` on a ~1 MiB and a ~1 GiB hybrid cache of the
  same shape family (8 layers in 4 overlaid groups, vLLM 0.33 unified
  registration via ``create_kv_cache_views``), their time ratio (goal <= 2:
  edits touch metadata only) and the new storage bytes the edits allocated
  (goal 0: every value is a view);
* a table, per case and ``restore`` True / False: the median seconds of a
  full ``verify_roundtrip`` (every block), the median seconds of a plain
  ``dst.copy_(src)`` of as many bytes as the verify checks, read from the
  registered buffers themselves (overlaid groups check the same buffer
  bytes once per group, so that is a multiple of the allocation), and the
  median over runs of verify seconds / copy seconds.  Verify and copy runs
  alternate, so both see the same machine load.  Cases: the ~1 GiB
  synthetic registration above, and a catalog model's own layout
  (``--model``, default Qwen/Qwen3.5-0.8B planned for the H100 with 64
  blocks and allocated by ``kvexplore.allocate``; ``--model ''`` skips it).

Usage: ``python benchmarks/bench_edits.py [--device cuda] [--repeats 5]
[--big-mib 1024] [--model ID] [--model-blocks 64] [--model-only]``.
"""

from __future__ import annotations

import argparse
import itertools
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

import kvexplore  # noqa: E402
from kvexplore.editing import verify_roundtrip  # noqa: E402
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


def seconds(fn, device: str) -> float:
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def tensors(value) -> list[torch.Tensor]:
    return [value] if isinstance(value, torch.Tensor) else list(value)


def buffers(caches) -> list[torch.Tensor]:
    """The distinct storages behind a registration, as flat uint8 tensors."""
    seen = {}
    for value in caches.values():
        for t in tensors(value):
            s = t.untyped_storage()
            seen[s.data_ptr()] = torch.empty(
                0, dtype=torch.uint8, device=t.device
            ).set_(s)
    return list(seen.values())


def new_storage_bytes(caches, edited) -> int:
    known = {b.data_ptr() for b in buffers(caches)}
    fresh = {}
    for value in edited.values():
        for t in tensors(value):
            if t.untyped_storage().data_ptr() not in known:
                fresh[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(fresh.values())


def edit_times(big_mib: int, reps: int, dev: str):
    """Edit time and new storage bytes on a ~1 MiB and a ~big_mib registration."""
    rows = []
    for label, size in (("~1 MiB", 1 << 20), (f"~{big_mib} MiB", big_mib << 20)):
        cfg, caches, raw = registration(size, dev)
        apply_kv_cache_group_edits(cfg, caches)  # warm up
        t_edit = statistics.median(
            seconds(lambda c=cfg, k=caches: apply_kv_cache_group_edits(c, k), dev)
            for _ in range(reps * 4)
        )
        edited = apply_kv_cache_group_edits(cfg, caches)
        rows.append((label, raw.numel(), t_edit, new_storage_bytes(caches, edited)))
    print(f"{'cache':>10} {'bytes':>14} {'edit median':>12} {'new storage B':>14}")
    for label, nbytes, t, fresh in rows:
        print(f"{label:>10} {nbytes:>14,} {t * 1e3:>10.3f}ms {fresh:>14}")
    print(f"edit time ratio big/small: {rows[1][2] / rows[0][2]:.2f} (goal <= 2)")
    return cfg, caches, edited


def against_copy(name, cfg, caches, edited, reps, dev):
    """Rows ``(case, bytes, verify median, copy median, per-run ratios)``, restore True/False."""
    report = verify_roundtrip(cfg, caches, edited, restore=False)  # warm up
    assert report.ok, report
    moved = report.bytes_checked
    sources = buffers(caches)
    dst = torch.empty(max(b.numel() for b in sources), dtype=torch.uint8, device=dev)

    def plain_copy() -> None:
        left = moved
        for src in itertools.cycle(sources):
            n = min(left, src.numel())
            dst[:n].copy_(src[:n])
            left -= n
            if not left:
                return

    plain_copy()  # warm up
    rows = []
    for restore in (True, False):
        verify, copy = [], []
        for _ in range(reps):
            verify.append(
                seconds(
                    lambda r=restore: verify_roundtrip(cfg, caches, edited, restore=r),
                    dev,
                )
            )
            copy.append(seconds(plain_copy, dev))
        ratios = [v / c for v, c in zip(verify, copy, strict=True)]
        rows.append((f"{name}, restore={restore}", moved, verify, copy, ratios))
    return rows


def model_case(model: str, num_blocks: int, reps: int, dev: str):
    """A catalog model's own layout, planned for the H100 and allocated."""
    plan = kvexplore.plan(model, gpu="H100", num_blocks=num_blocks)
    caches = kvexplore.allocate(plan, device=dev)
    cfg = plan.kv_cache_config
    edited = kvexplore.apply_kv_cache_group_edits(cfg, caches)
    page = cfg.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    name = f"{model} (H100 plan) x{num_blocks} blocks, page {page:,} B"
    return against_copy(name, cfg, caches, edited, reps, dev)


def print_table(rows, reps: int) -> None:
    width = max(len(row[0]) for row in rows)
    print(
        f"\nverify_roundtrip (every block) vs dst.copy_(src) of as many bytes from the "
        f"registered buffers (median of {reps} alternating runs)"
    )
    print(
        f"{'case':<{width}} {'bytes':>14} {'verify s':>9} {'copy s':>8} "
        f"{'verify/copy':>11} {'min':>6} {'max':>6}"
    )
    for name, moved, verify, copy, ratios in rows:
        print(
            f"{name:<{width}} {moved:>14,} {statistics.median(verify):>9.3f} "
            f"{statistics.median(copy):>8.3f} {statistics.median(ratios):>11.2f} "
            f"{min(ratios):>6.2f} {max(ratios):>6.2f}"
        )


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
    parser.add_argument("--model-only", action="store_true", help="only the model rows")
    args = parser.parse_args()
    dev, reps = args.device, args.repeats
    if args.model_only and not args.model:
        parser.error("--model-only needs a --model")
    print(
        f"device: {dev}, torch {torch.__version__}, intra-op threads "
        f"{torch.get_num_threads()}, repeats {reps}"
    )
    rows = []
    if args.model:
        rows += model_case(args.model, args.model_blocks, reps, dev)
    if not args.model_only:
        cfg, caches, edited = edit_times(args.big_mib, reps, dev)
        rows += against_copy(
            f"synthetic ~{args.big_mib} MiB, page {PAGE:,} B",
            cfg,
            caches,
            edited,
            reps,
            dev,
        )
    print_table(rows, reps)


if __name__ == "__main__":
    main()
