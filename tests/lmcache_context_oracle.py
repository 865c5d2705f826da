"""The bytes one LMCache chunk stores, from the release's own cache context.

``python lmcache_context_oracle.py RELEASE_DIR CASE OUT``: rebuilds the
registration of ``CASE`` (``tests/lmcache_oracle.py: case_of``, plus
``chunk_size`` and ``hints``), runs the release's edits and engine-group
conversion, builds its ``CPUCacheContext`` (``v1/platform/devices/cpu``, the
server's context on a host without CUDA) and writes, per kernel group,
the bytes of ``get_kv_buffer_shape(chunk_size, group)`` (the CPU context's
staging, the whole chunk) and of the CUDA context's
``_TempGPUBuffer._get_shape_for_kernel_group(chunk_size, group)`` (what one
chunk transfers and stores on a GPU: the group's window of the chunk), the CPU
context's ``tmp_chunk_bytes_`` and the transfer buffer's
``get_cache_size_per_token()``, pickled.
Only releases with a CPU cache context (0.5.6 and later) can answer.
"""

from __future__ import annotations

import os
import pickle
import sys
import types


def main(release_dir, case_path, out_path):
    os.environ["LMCACHE_LOG_LEVEL"] = "ERROR"
    sys.path.insert(0, release_dir)
    sys.path.insert(1, os.path.dirname(__file__))
    import torch
    import vllm.config  # noqa: F401
    from lmcache.integration.vllm.kv_cache_group_edits import apply_kv_cache_group_edits
    from lmcache.integration.vllm.kv_cache_groups import (
        create_engine_group_infos_from_vllm,
    )
    from lmcache.v1.platform.devices.cpu.cache_context import CPUCacheContext
    from lmcache.v1.platform.devices.cuda.cache_context import _TempGPUBuffer
    from lmcache_worker import rebuild

    with open(case_path, "rb") as f:
        case = pickle.load(f)
    _, caches = rebuild(case["storages"], case["layers"])
    edited = apply_kv_cache_group_edits(case["config"], caches, case["hints"])
    infos = create_engine_group_infos_from_vllm(case["config"], edited, case["hints"])
    # The server receives each registered tensor wrapped for shared memory
    # (CpuShmTensorWrapper) and unwraps it with to_tensor().
    wrapped = [types.SimpleNamespace(to_tensor=lambda t=t: t) for t in edited.values()]
    context = CPUCacheContext(
        wrapped,
        lmcache_tokens_per_chunk=case["chunk_size"],
        layout_hints=case["hints"],
        engine_group_infos=infos,
        separate_object_groups=case["separate_object_groups"],
    )
    manager = context.kv_layer_groups_manager
    # The CUDA context's temporary transfer buffer, built on the CPU (its
    # device is an argument) over the same kernel groups.
    transfer = _TempGPUBuffer(manager, case["chunk_size"], torch.device("cpu"), max_batch_size=1)
    cpu_staging, gpu_transfer = [], []
    for index, group in enumerate(manager.kernel_groups):
        shape = context.get_kv_buffer_shape(case["chunk_size"], index)
        cpu_staging.append(shape.numel() * group.dtype.itemsize)
        shape = transfer._get_shape_for_kernel_group(case["chunk_size"], index)
        gpu_transfer.append(shape.numel() * group.dtype.itemsize)
    with open(out_path, "wb") as f:
        pickle.dump({"cpu_staging": cpu_staging, "gpu_transfer": gpu_transfer,
                     "tmp_chunk_bytes": context.tmp_chunk_bytes_,
                     "cache_size_per_token": transfer.get_cache_size_per_token()}, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
