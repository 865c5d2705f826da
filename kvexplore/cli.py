"""``kvexplore`` command line: the Python API, one subcommand per function.

    kvexplore catalog [--gpu G]
    kvexplore gpus
    kvexplore plan MODEL [--gpu G --tp N --dcp N --block-size N --kv-cache-dtype D --backend B --json]
    kvexplore offload MODEL [--tp N --dcp N --extra JSON --pipeline-parallel-size N ... --json]
    kvexplore sweep MODEL --tp 1,2,4,8 [--dcp 1,2 --block-size none,64 --nnodes-within-dp 1,2 --csv out.csv]
    kvexplore capacity MODEL [--gpu G --gpu-memory-utilization 0.9 --max-model-len N --cpu-bytes-to-use N --json]

``--gpu`` names the GPU the answer is for (``kvexplore gpus``; default H100).
Flags mirror vLLM's engine arguments (``--tensor-parallel-size`` / ``--tp``,
``--decode-context-parallel-size`` / ``--dcp``, ``--block-size``,
``--kv-cache-dtype``, ``--attention-backend`` / ``--backend``, ...); the
offloading flags are the fields of ``OffloadOptions``
(``--pipeline-parallel-size``, ``--distributed-executor-backend``, ...).  Errors
print one line to stderr and exit with status 2.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys

import pandas as pd


def _quiet() -> None:
    logging.getLogger("vllm").setLevel(logging.ERROR)


def _add_plan_args(p: argparse.ArgumentParser, *, lists: bool = False) -> None:
    kind = str if lists else int
    p.add_argument("model", help="catalog id (see `kvexplore catalog`), config.json or its directory")
    p.add_argument("--gpu", default=None, help="GPU name or compute capability (see `kvexplore gpus`)")
    p.add_argument("--tp", "--tensor-parallel-size", dest="tensor_parallel_size", type=kind, default=None)
    p.add_argument("--dcp", "--decode-context-parallel-size", dest="decode_context_parallel_size", type=kind, default=None)
    p.add_argument("--block-size", dest="block_size", type=str, default=None)
    p.add_argument("--dtype", default=None)
    p.add_argument("--kv-cache-dtype", dest="kv_cache_dtype", default=None)
    p.add_argument("--backend", "--attention-backend", dest="attention_backend", default=None)
    p.add_argument("--mamba-cache-mode", dest="mamba_cache_mode", default=None)
    p.add_argument("--mamba-ssm-cache-dtype", dest="mamba_ssm_cache_dtype", default=None)
    p.add_argument("--max-model-len", dest="max_model_len", type=int, default=None)
    p.add_argument("--num-blocks", dest="num_blocks", type=int, default=None)
    p.add_argument("--kv-cache-memory-bytes", dest="kv_cache_memory_bytes", type=int, default=None)
    p.add_argument("--kv-cache-layout", dest="kv_cache_layout", default=None)
    p.add_argument("--no-enable-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None)
    if not lists:
        p.add_argument("--speculative-config", "-sc", dest="speculative_config", type=_json_object, default=None,
                       help='as vLLM takes it, e.g. \'{"method": "mtp", "num_speculative_tokens": 2}\'')


_PLAN_KEYS = (
    "gpu", "tensor_parallel_size", "decode_context_parallel_size", "block_size", "dtype",
    "kv_cache_dtype", "attention_backend", "mamba_cache_mode", "mamba_ssm_cache_dtype",
    "max_model_len", "num_blocks", "kv_cache_memory_bytes", "enable_prefix_caching",
    "kv_cache_layout", "speculative_config",
)


def _json_object(value: str) -> dict:
    try:
        out = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not JSON: {exc.msg}") from None
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"{value!r} must be a JSON object")
    return out


def _add_offload_args(p: argparse.ArgumentParser, *, lists: bool = False) -> None:
    """One flag per ``OffloadOptions`` field (``extra_config`` is ``--extra``)."""
    import dataclasses

    from kvexplore.offloading.options import OffloadOptions

    for f in dataclasses.fields(OffloadOptions):
        flag = "--extra" if f.name == "extra_config" else "--" + f.name.replace("_", "-")
        more = {"action": "store_true"} if f.type == "bool" and not lists else {}
        if f.name == "extra_config":
            what = "a JSON object, or a JSON array of them (one row each)" if lists else "a JSON object"
            p.add_argument(flag, dest=f.name, default=None, help=f"{f.metadata['help']}: {what}")
        else:
            help_text = f.metadata["help"] + (" (comma-separated)" if lists else "")
            p.add_argument(flag, dest=f.name, default=None, help=help_text, **more)


def _extra(value: str, *, lists: bool = False) -> list | dict:
    """``--extra``: a JSON object (or, for a sweep, a JSON array of objects / null)."""
    from kvexplore.errors import KVExploreError

    example = '\'{"block_size": 1088}\''
    try:
        out = json.loads(value)
    except json.JSONDecodeError as exc:
        raise KVExploreError(f"--extra {value!r} is not JSON ({exc.msg}); expected a JSON object such as {example}") from None
    if lists and isinstance(out, list) and all(v is None or isinstance(v, dict) for v in out) and out:
        return out
    if not isinstance(out, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(out), "null")
        raise KVExploreError(
            f"--extra {value!r} is a JSON {kind}, not an object; expected a JSON object "
            f"such as {example}" + (" or a non-empty array of them" if lists else "")
        )
    return [out] if lists else out


def _offload_kwargs(ns: argparse.Namespace, *, lists: bool = False) -> dict:
    """The offload options given on the command line (lists of values for a sweep)."""
    from kvexplore.offloading.options import OffloadOptions

    out = {}
    for name in OffloadOptions.names():
        raw = getattr(ns, name, None)
        if raw is None or raw is False:
            continue
        if name == "extra_config":
            out[name] = _extra(raw, lists=lists)
        elif not lists:
            out[name] = _option_value(name, raw)
        else:
            out[name] = _split(raw, lambda part, name=name: _option_value(name, part))
    return out


def _option_value(name: str, raw):
    """A flag's text as the option's type (``int``, ``bool`` or ``str``; 'none' -> None)."""
    import dataclasses

    from kvexplore.errors import KVExploreError
    from kvexplore.offloading.options import OffloadOptions

    kind = next(f.type for f in dataclasses.fields(OffloadOptions) if f.name == name)
    if not isinstance(raw, str):  # a store_true flag
        return raw
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            pass
    elif kind == "bool":
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
    else:
        return None if raw.lower() == "none" and "None" in kind else raw
    flag = "--" + name.replace("_", "-")
    raise KVExploreError(f"{flag} {raw!r} is invalid; expected {'an integer' if kind == 'int' else 'true or false'}")


def _block_size(value: str | None):
    if value is None or value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        from kvexplore.errors import KVExploreError

        raise KVExploreError(f"--block-size {value!r} is invalid; expected an integer or 'none'") from None


def _plan_kwargs(ns: argparse.Namespace) -> dict:
    out = {k: getattr(ns, k) for k in _PLAN_KEYS if getattr(ns, k, None) is not None}
    if "block_size" in out:
        out["block_size"] = _block_size(out["block_size"])
    return out


def _print_table(df: pd.DataFrame) -> None:
    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
        print(df.to_string(index=False))


def cmd_catalog(ns) -> int:
    from kvexplore.planning.planner import catalog

    df = catalog(**({"gpu": ns.gpu} if ns.gpu else {}))
    if ns.json:
        print(df.to_json(orient="records", indent=2))
    else:
        _print_table(df)
    return 0


def cmd_gpus(ns) -> int:
    from kvexplore.planning.gpus import gpus

    df = gpus()
    if ns.json:
        print(df.to_json(orient="records", indent=2))
    else:
        _print_table(df)
    return 0


def cmd_plan(ns) -> int:
    from kvexplore.planning.planner import plan

    p = plan(ns.model, **_plan_kwargs(ns))
    if ns.json:
        print(json.dumps(p.to_dict(), indent=2, default=str))
        return 0
    print(p.text())
    return 0


def cmd_offload(ns) -> int:
    from kvexplore.offloading.config import offload_config
    from kvexplore.planning.planner import plan

    options = _offload_kwargs(ns)  # before planning: a bad flag fails fast
    result = offload_config(plan(ns.model, **_plan_kwargs(ns)), **options)
    if ns.json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
    else:
        _print_table(result.table())
        print()
        print(result.explain())
    return 0


def _split(value: str | None, conv):
    if value is None:
        return None
    out = []
    for part in value.split(","):
        part = part.strip()
        try:
            out.append(conv(part))
        except ValueError:
            from kvexplore.errors import KVExploreError

            raise KVExploreError(f"list item {part!r} in {value!r} is invalid") from None
    return out


def cmd_sweep(ns) -> int:
    from kvexplore.offloading.sweep import sweep

    axes = {}
    for key in _PLAN_KEYS:
        raw = getattr(ns, key, None)
        if raw is None:
            continue
        if key in ("tensor_parallel_size", "decode_context_parallel_size", "max_model_len", "num_blocks",
                   "kv_cache_memory_bytes"):
            axes[key] = _split(str(raw), int)
        elif key == "block_size":
            axes[key] = _split(raw, _block_size)
        elif key == "enable_prefix_caching":
            axes[key] = [raw]
        elif key == "gpu":
            axes[key] = [part.strip() for part in raw.split(",")]
        else:
            axes[key] = _split(raw, str)
    axes.update(_offload_kwargs(ns, lists=True))
    df = sweep(ns.model, **axes)
    if ns.csv:
        df.to_csv(ns.csv, index=False)
        print(f"wrote {len(df)} rows to {ns.csv}")
    elif ns.json:
        print(df.to_json(orient="records", indent=2, default_handler=str))
    else:
        _print_table(df)
    return 0


def cmd_capacity(ns) -> int:
    from kvexplore.capacity_planning import capacity

    kwargs = _plan_kwargs(ns)
    for key in ("total_memory_bytes", "activation_peak_bytes", "non_torch_bytes",
                "cudagraph_bytes", "cpu_bytes_to_use"):
        if getattr(ns, key) is not None:
            kwargs[key] = getattr(ns, key)
    r = capacity(ns.model, gpu_memory_utilization=ns.gpu_memory_utilization, **kwargs)
    if ns.prompt_tokens:
        lengths = _split(ns.prompt_tokens, int)
        for n in lengths:
            # validated here so that a bad length fails before any output
            r.prefix_hit_tokens(n)
    if ns.json:
        out = r.to_dict()
        if ns.prompt_tokens:
            out["prefix_hits"] = {str(n): r.prefix_hit_tokens(n) for n in lengths}
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(r.text())
    if ns.prompt_tokens:
        print()
        _print_table(r.prefix_table(lengths))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kvexplore", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("catalog", help="list the bundled model configs")
    c.add_argument("--gpu", default=None)
    c.add_argument("--json", action="store_true")
    c.set_defaults(func=cmd_catalog)
    g = sub.add_parser("gpus", help="the GPUs kvexplore answers for")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=cmd_gpus)
    p = sub.add_parser("plan", help="the KV cache vLLM 0.33 builds for MODEL")
    _add_plan_args(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_plan)
    o = sub.add_parser("offload", help="the OffloadingConfig vLLM hands an offloading backend")
    _add_plan_args(o)
    _add_offload_args(o)
    o.add_argument("--json", action="store_true")
    o.set_defaults(func=cmd_offload)
    s = sub.add_parser("sweep", help="plans and offloading configs over comma-separated axes")
    _add_plan_args(s, lists=True)
    _add_offload_args(s, lists=True)
    s.add_argument("--csv", help="write the table to this CSV file")
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_sweep)
    k = sub.add_parser("capacity", help="KV cache memory, tokens, concurrency and prefix-cache hits on a GPU")
    _add_plan_args(k)
    k.add_argument("--gpu-memory-utilization", dest="gpu_memory_utilization", type=float, default=0.9)
    k.add_argument("--total-memory-bytes", dest="total_memory_bytes", type=int, default=None,
                   help="the card's torch.cuda.mem_get_info() total (default: nominal memory, an estimate)")
    k.add_argument("--activation-peak-bytes", dest="activation_peak_bytes", type=int, default=None)
    k.add_argument("--non-torch-bytes", dest="non_torch_bytes", type=int, default=None)
    k.add_argument("--cudagraph-bytes", dest="cudagraph_bytes", type=int, default=None)
    k.add_argument("--cpu-bytes-to-use", dest="cpu_bytes_to_use", type=int, default=None,
                   help="host bytes of the native CPU offloading tier")
    k.add_argument("--prompt-tokens", dest="prompt_tokens", default=None,
                   help="comma-separated prompt lengths: tokens a repeat reuses")
    k.add_argument("--json", action="store_true")
    k.set_defaults(func=cmd_capacity)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    _quiet()
    try:
        return ns.func(ns)
    except ValueError as exc:
        print(f"kvexplore: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
