"""plan() against vLLM's own path to the same specs, side by side.

1. First plan of an architecture, in a fresh process (imports included):
   ``kvexplore.plan(model, gpu=...)`` against the bare sequence vLLM's worker
   and engine core run (``EngineArgs.create_engine_config``, model-parallel
   groups, ``initialize_model`` on the meta device,
   ``update_block_size_for_backend``, the runner's ``get_kv_cache_spec``,
   ``resolve_kv_cache_layout``, ``get_global_kv_cache_groups``,
   ``get_kv_cache_configs``), both under the
   same GPU emulation; wall time and peak RSS of each process, and the ratio.
   The speculative row plans Qwen3.5-0.8B with MTP: vLLM's side then also
   builds the drafter (``init_speculator`` + ``DraftModelSpeculator.load_model``,
   the draft created on the meta device).
2. In one process: a repeated plan (cache hit), a plan that changes only
   ``num_blocks`` / ``max_model_len`` / ``gpu_memory_utilization`` (the built
   model and its memory profile are reused), a plan that needs a new build
   (new TP), medians.

    python3 benchmarks/bench_plan.py [--models all] [--gpu H100] [--repeats 30]
"""

import argparse
import json
import statistics
import subprocess
import sys
import time

OURS = r"""
import json, resource, sys, time
t = time.perf_counter()
import kvexplore
spec = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
p = kvexplore.plan(sys.argv[1], gpu=sys.argv[2], num_blocks=64, speculative_config=spec)
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "block_size": p.block_size}))
"""

VLLM = r"""
import json, resource, sys, time
t = time.perf_counter()
import torch
from kvexplore.planning.emulation import emulate
from kvexplore.planning.gpus import resolve_gpu
from kvexplore.planning.models import load_model_config
from vllm.config import set_current_vllm_config
from vllm.distributed import parallel_state as ps
from vllm.engine.arg_utils import EngineArgs
from vllm.model_executor.model_loader.utils import get_model_architecture, initialize_model
from vllm.platforms import current_platform
from vllm.utils.torch_utils import set_default_torch_dtype
try:
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
except ImportError:  # before vLLM 0.33 the engine core groups inside get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import get_kv_cache_configs
    get_global_kv_cache_groups = None
from vllm.v1.worker.gpu.attn_utils import get_kv_cache_spec
from vllm.distributed.kv_transfer.kv_connector.utils import get_current_attn_backends
from vllm.v1.attention.backends.utils import get_supported_kv_cache_layouts, resolve_kv_cache_layout
d = str(load_model_config(sys.argv[1]).config_dir)
spec = json.loads(sys.argv[3]) if len(sys.argv) > 3 else None
with emulate(resolve_gpu(sys.argv[2])):
    vc = EngineArgs(model=d, tokenizer=d, skip_tokenizer_init=True, load_format="dummy",
                    num_gpu_blocks_override=64, speculative_config=spec).create_engine_config()
    with set_current_vllm_config(vc):
        ps.init_distributed_environment(1, 0, "tcp://127.0.0.1:29533", 0, "gloo")
        ps.initialize_model_parallel(1, 1)
        with set_default_torch_dtype(vc.model_config.dtype), torch.device("meta"):
            model = initialize_model(vc, model_class=get_model_architecture(vc.model_config)[0])
        if spec is not None:
            from vllm.model_executor.model_loader.base_loader import BaseModelLoader
            from vllm.v1.worker.gpu.spec_decode import init_speculator

            def load_model(self, vllm_config, model_config, prefix=""):
                with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
                    return self.create_model(vllm_config=vllm_config, model_config=model_config,
                                             prefix=prefix)

            BaseModelLoader.load_model = load_model
            import inspect
            extra = (None,) if "req_states" in inspect.signature(init_speculator).parameters else ()
            init_speculator(vc, torch.device("meta"), *extra).load_model(model)
        current_platform.update_block_size_for_backend(vc)
        specs = get_kv_cache_spec(vc)
        layouts = [m.name for m in get_supported_kv_cache_layouts(get_current_attn_backends(vc))]
    resolve_kv_cache_layout(vc, [layouts], specs.values())
    groups = () if get_global_kv_cache_groups is None else (get_global_kv_cache_groups(vc, [specs]),)
    try:
        get_kv_cache_configs(vc, [specs], [1], *groups)
    except ValueError:
        pass  # the admission check: kvexplore keeps it as a verdict
dt = time.perf_counter() - t
print(json.dumps({"s": dt, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "block_size": vc.cache_config.block_size}))
"""

DEFAULT_MODELS = ("Qwen/Qwen3.5-0.8B", "nvidia/Nemotron-H-56B-Base-8K", "meta-llama/Llama-3.1-8B-Instruct")
#: The speculative row: Qwen3.5-0.8B with its MTP layer as the drafter.
SPECULATIVE = ("Qwen/Qwen3.5-0.8B", {"method": "mtp", "num_speculative_tokens": 3})


def fresh(code: str, model: str, gpu: str, spec: dict | None = None,
          release: str | None = None) -> dict:
    """``code`` in a fresh process: this interpreter, or with ``release`` that
    vLLM release's environment (:func:`kvexplore.versions.run_in`)."""
    args = ["-c", code, model, gpu] + ([json.dumps(spec)] if spec else [])
    if release is None:
        out = subprocess.run([sys.executable, *args], capture_output=True, text=True, check=True)
    else:
        from kvexplore.versions import run_in

        out = run_in(release, args)
        if out.returncode != 0:
            raise RuntimeError(f"vLLM {release}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_ms(fn, repeats):
    samples = []
    for i in range(repeats):
        t = time.perf_counter()
        fn(i)
        samples.append(time.perf_counter() - t)
    return 1000 * statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS),
                    help="comma-separated catalog ids, or 'all'")
    ap.add_argument("--gpu", default="H100")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()

    import kvexplore

    models = kvexplore.catalog_names() if args.models == "all" else args.models.split(",")
    print(f"first plan of an architecture, fresh process, {args.gpu} (imports included)")
    print(f"{'model':40s} {'plan() s':>9s} {'vLLM s':>8s} {'ratio':>6s} "
          f"{'plan() MB':>10s} {'vLLM MB':>8s}  block")
    ratios = []
    rows = [(name, None) for name in models] + [SPECULATIVE]
    for name, spec in rows:
        a = fresh(OURS, name, args.gpu, spec)
        b = fresh(VLLM, name, args.gpu, spec)
        assert a["block_size"] == b["block_size"], (name, a, b)
        ratios.append(a["s"] / b["s"])
        label = name + (f" + {spec['method']} x{spec['num_speculative_tokens']}" if spec else "")
        print(f"{label:40s} {a['s']:9.2f} {b['s']:8.2f} {a['s'] / b['s']:5.2f}x "
              f"{a['rss_mb']:10.0f} {b['rss_mb']:8.0f}  {a['block_size']}")
    print(f"median ratio plan()/vLLM: {statistics.median(ratios):.2f}x (goal <= 1.2x; peak goal <= 1536 MB)")

    print(f"\nin one process, Qwen/Qwen3.5-0.8B on {args.gpu}, medians of {args.repeats}")
    kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu)
    repeat = median_ms(lambda i: kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu), args.repeats)
    blocks = median_ms(
        lambda i: kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu, num_blocks=1000 + i),
        args.repeats)
    length = median_ms(
        lambda i: kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu, max_model_len=4096 + 16 * i,
                                 num_blocks=64), args.repeats)
    util = median_ms(
        lambda i: kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu,
                                 gpu_memory_utilization=0.5 + 0.01 * i), args.repeats)
    build = median_ms(
        lambda i: kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu=args.gpu, tensor_parallel_size=(1, 2, 4)[i % 3],
                                 kv_cache_dtype=("auto", "fp8")[i // 3 % 2], block_size=16 * (1 + i)),
        max(5, args.repeats // 3))
    print(f"  repeated plan (cache hit):            {repeat:8.3f} ms (goal <= 1 ms)")
    print(f"  new num_blocks (built model reused):  {blocks:8.3f} ms (goal <= 5 ms)")
    print(f"  new max_model_len (built reused):     {length:8.3f} ms (goal <= 5 ms)")
    print(f"  new gpu_memory_utilization (sized by the cached profile): {util:8.3f} ms")
    print(f"  new build (TP / dtype / block size):  {build:8.1f} ms")


if __name__ == "__main__":
    main()
