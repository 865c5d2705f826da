"""Runs one LMCache release's own code on one registration, in its own process.

``python lmcache_probe.py REQUEST OUT_DIR RELEASE_DIR...``: each
``RELEASE_DIR`` holds one release's ``lmcache`` package (installed
``--no-deps``) and is answered in a child process of its own; ``REQUEST`` is a
pickled dict written by :mod:`kvexplore.connectors.lmcache_layout` (vLLM's
``KVCacheConfig``, ``CacheConfig``, ``SchedulerConfig``, ``ParallelConfig``,
the registered tensors as (storage, shape, stride, offset, dtype), the layout
hint, the chunk sizes, ``separate_object_groups`` and ``engine_type``);
``OUT_DIR/<release folder name>.pkl`` receives a pickled dict of plain data.

This file imports neither kvexplore nor anything but torch, vLLM and the
release's ``lmcache`` package, so every answer is the release's
own.  It calls, in the order ``LMCacheMPConnector`` does:

1. ``lmcache_mp_connector.validate_mamba_step_alignment`` and
   ``kv_cache_group_edits.validate_kv_cache_groups`` (the connector's
   ``__init__``);
2. the groups' token spans and the scheduler block:
   ``get_group_tokens_per_block`` / ``get_vllm_scheduler_block_size`` where
   the release has them, else the connector's own expressions
   (``group.kv_cache_spec.block_size`` per group,
   ``vllm_config.cache_config.block_size``);
3. ``kv_cache_group_edits.apply_kv_cache_group_edits`` and
   ``kv_cache_groups.create_engine_group_infos_from_vllm`` (the connector's
   ``register_kv_caches``);
4. per chunk size: the chunk negotiation of ``engine_context.negotiate_chunk_size``
   (releases that have it), the connector's and the scheduler adapter's chunk
   checks (their conditions and messages as each release words them), and the
   server's ``KVLayerGroupsManager`` (``v1/kv_layer_groups.py``: its kernel
   groups, object groups, ``_validate_block_chunk_size_config``,
   ``get_slots_per_chunk_in_sw``).  The bytes one chunk stores per kernel
   group follow the cache context's buffer shape
   (``(kv_size, num_layers, slots, num_heads * head_size)`` of the group's
   dtype, ``cache_context.get_kv_buffer_shape``).
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import pickle
import sys
import traceback
import types


def rebuild(storages, layers):
    """``(raw storages, {layer: tensor or list / tuple of tensors})`` from the
    plain data of :func:`kvexplore.connectors.lmcache_layout.tensors_as_data`:
    the same shapes, strides, storage offsets, dtypes and storage sharing."""
    import torch

    raw = [torch.empty(n, dtype=torch.uint8) for n in storages]
    out = {}
    for name, (container, descs) in layers.items():
        tensors = []
        for index, shape, stride, offset, dtype in descs:
            t = torch.empty(0, dtype=getattr(torch, dtype))
            t.set_(raw[index].untyped_storage(), offset, shape, stride)
            tensors.append(t)
        out[name] = (
            tensors[0]
            if container == "tensor"
            else (tensors if container == "list" else tuple(tensors))
        )
    return raw, out


def _where(fn) -> str:
    module = getattr(fn, "__module__", "") or ""
    return module.replace(".", "/") + ".py: " + getattr(fn, "__qualname__", str(fn))


def _check(checks, name, fn, *args, where=None):
    """Run ``fn(*args)``; record (name, where, ok, error type, message)."""
    try:
        value = fn(*args)
    except Exception as exc:  # the release's own refusal, kept as data
        checks.append((name, where or _where(fn), False, type(exc).__name__, str(exc)))
        return False, None
    checks.append((name, where or _where(fn), True, "", ""))
    return True, value


def _hints(mp, utils, edits, request):
    """The layout hints the release's connector passes its edits (None where
    its ``apply_kv_cache_group_edits`` takes none)."""
    if len(inspect.signature(edits.apply_kv_cache_group_edits).parameters) < 3:
        return None, ()
    if inspect.signature(utils.vllm_layout_hints).parameters:
        vc = types.SimpleNamespace(cache_config=request["cache_config"])
        hints = utils.vllm_layout_hints(vc)
    else:
        # vLLM's get_kv_cache_layout() global, which this process does not
        # hold: the engine's value is passed in.
        hints = {"kv_layout": request["hint"]}
    return hints, (hints,)


def _group_spans(mp, vllm_config, cfg):
    if hasattr(mp, "get_group_tokens_per_block"):
        spans = list(mp.get_group_tokens_per_block(vllm_config, cfg))
        where = _where(mp.get_group_tokens_per_block)
    else:
        groups = getattr(cfg, "kv_cache_groups", ()) or ()
        spans = [g.kv_cache_spec.block_size for g in groups] or [
            vllm_config.cache_config.block_size
        ]
        where = "lmcache/integration/vllm/lmcache_mp_connector.py: LMCacheMPConnector.__init__"
    if hasattr(mp, "get_vllm_scheduler_block_size"):
        block = mp.get_vllm_scheduler_block_size(vllm_config, cfg)
    else:
        block = vllm_config.cache_config.block_size
    return spans, block, where


def _negotiated_chunk(chunk, alignment):
    """The chunk the server settles on (0.5.7 and later negotiate it with
    ``engine_context._round_up_to_multiple``; earlier releases use it as set)."""
    from lmcache.v1.multiprocess import engine_context

    rounding = getattr(engine_context, "_round_up_to_multiple", None)
    if rounding is None:
        return chunk, False
    return rounding(chunk, alignment), True


def _adapter_check(adapter_source: str, chunk: int, block: int):
    """The scheduler adapter's chunk check, as the release words it."""
    if chunk % block == 0:
        return None
    if "assert self.lmcache_tokens_per_chunk % vllm_block_size == 0" in adapter_source:
        return ("AssertionError", "LMCache chunk size should be a multiple of vLLM block size")
    return (
        "ValueError",
        f"LMCache chunk size {chunk} must be a multiple of {block} (the vLLM block "
        f"size scaled by decode_context_parallel_size). Set --chunk-size to a "
        f"multiple of {block}.",
    )


def _connector_chunk_check(spans, chunk):
    for index, span in enumerate(spans):
        if span and chunk % span:
            return (
                "ValueError",
                f"LMCache chunk size {chunk} must be a multiple of group {index} "
                f"tokens_per_block {span}",
            )
    return None


def _server(normalize, manager_cls, engine_type, edited, infos, hints, chunk,
            separate, blend):
    from lmcache.v1.multiprocess.group_view import engine_group_layer_indices

    tensors = list(edited.values())
    normalized, formats = normalize(
        tensors, engine_group_layer_indices(infos), engine_type, hints
    )
    manager = manager_cls(
        normalized,
        engine_kv_formats=formats,
        engine_group_infos=infos,
        lmcache_tokens_per_chunk=chunk,
        separate_object_groups=separate,
    )
    if blend and hasattr(manager, "enable_full_sw_kv"):
        manager.enable_full_sw_kv()
    kernel = []
    for index, group in enumerate(manager.kernel_groups):
        sd = group.shape_desc
        slots = manager.get_slots_per_chunk_in_sw(index)
        element = group.dtype.itemsize
        kernel.append(
            {
                "kernel_group": index,
                "engine_group": group.engine_group_idx,
                "layer_indices": tuple(group.layer_indices),
                "kv_size": sd.kv_size,
                "num_heads": sd.nh,
                "head_size": sd.hs,
                "slots_per_block": group.slots_per_block,
                "tokens_per_block": group.tokens_per_block,
                "sw_size_tokens": group.sw_size_tokens,
                "recurrent_state": bool(getattr(group, "recurrent_state", False)),
                "window_tokens": manager.get_subchunk_sw_size_tokens(index),
                "slots_per_chunk": slots,
                "dtype": str(group.dtype).split(".")[-1],
                "element_size": element,
                "chunk_bytes": sd.kv_size * len(group.layer_indices) * slots
                * sd.nh * sd.hs * element,
            }
        )
    objects = [
        {
            "object_group": index,
            "kernel_groups": tuple(g.kernel_group_indices),
            "sw_size_chunks": getattr(g, "sw_size_chunks", -1),
            "recurrent": bool(getattr(g, "recurrent", False)),
        }
        for index, g in enumerate(manager.object_groups)
    ]
    return kernel, objects


def probe(release_dir: str, request: dict) -> dict:
    """Every answer of the release in ``release_dir`` for one registration
    (``request``): the group checks, the registration checks and, per chunk
    size asked, the chunk checks and the server's groups."""
    lm = _release_modules(release_dir)
    cfg = request["config"]
    vllm_config = types.SimpleNamespace(
        cache_config=request["cache_config"],
        scheduler_config=request["scheduler_config"],
        parallel_config=request["parallel_config"],
    )
    out: dict = {"checks": [], "chunks": {}}
    _group_answers(out, lm, vllm_config, cfg, request)
    hints, edited, infos = _registration_answers(out, lm, cfg, request)
    for chunk in request["chunk_sizes"]:
        out["chunks"][chunk] = _chunk_answer(lm, chunk, out, request, hints, edited, infos)
    return out


def _release_modules(release_dir: str) -> types.SimpleNamespace:
    """The release's modules the probe calls, imported from ``release_dir``
    (refused if another LMCache was imported) with its loggers quieted."""
    sys.path.insert(0, release_dir)
    os.environ.setdefault("LMCACHE_LOG_LEVEL", "ERROR")
    import lmcache
    from lmcache.integration.vllm import kv_cache_group_edits as edits
    from lmcache.integration.vllm import kv_cache_groups as groups
    from lmcache.integration.vllm import lmcache_mp_connector as mp
    from lmcache.integration.vllm import utils
    from lmcache.integration.vllm import vllm_multi_process_adapter as adapter
    from lmcache.utils import EngineType
    from lmcache.v1.gpu_connector.utils import normalize_and_discover_per_layer_formats
    from lmcache.v1.kv_layer_groups import KVLayerGroupsManager

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.ERROR)
    if not lmcache.__file__.startswith(release_dir):
        raise RuntimeError(f"imported {lmcache.__file__}, not the release in {release_dir}")
    return types.SimpleNamespace(
        edits=edits, groups=groups, mp=mp, utils=utils, adapter=adapter, EngineType=EngineType,
        normalize=normalize_and_discover_per_layer_formats, Manager=KVLayerGroupsManager,
    )


def _group_answers(out: dict, lm, vllm_config, cfg, request: dict) -> None:
    """The step-alignment and group checks, the groups' tokens per block, the
    scheduler block, the hit alignment, whether the lookup holds the last
    token back, and the object-group split (asked, or the release's default)."""
    step = lm.mp.validate_mamba_step_alignment
    step_args = (vllm_config, cfg) if len(inspect.signature(step).parameters) >= 2 else (vllm_config,)
    _check(out["checks"], "mamba_step_alignment", step, *step_args)
    _check(out["checks"], "kv_cache_groups", lm.edits.validate_kv_cache_groups, cfg)
    spans, block, spans_where = _group_spans(lm.mp, vllm_config, cfg)
    out["group_tokens_per_block"] = spans
    out["group_tokens_per_block_from"] = spans_where
    out["scheduler_block"] = block
    cached = [s for s in spans if s > 0]
    out["hit_alignment"] = math.lcm(*cached) if cached else 0
    out["reserve_last_token"] = (
        "_reserve_last_token_for_lookup" in inspect.getsource(lm.mp)
        and getattr(request["cache_config"], "mamba_cache_mode", "none") in ("align", "all")
    )
    default_separate = inspect.signature(lm.Manager.__init__).parameters[
        "separate_object_groups"
    ].default
    asked = request["separate_object_groups"]
    out["separate_object_groups"] = default_separate if asked is None else bool(asked)
    out["separate_object_groups_default"] = bool(default_separate)


def _registration_answers(out: dict, lm, cfg, request: dict):
    """``(hints, edited, infos)``: the layout hints, the edited caches and
    the engine groups the release builds from the registration (None from
    the first refused step on; each step's check appended to ``out``)."""
    checks = out["checks"]
    _, caches = rebuild(request["storages"], request["layers"])
    ok, hint_pair = _check(checks, "layout_hints", _hints, lm.mp, lm.utils, lm.edits, request,
                           where=_where(lm.utils.vllm_layout_hints))
    hints, extra = hint_pair if ok else (None, ())
    edited = infos = None
    if ok:
        ok, edited = _check(checks, "kv_cache_group_edits", lm.edits.apply_kv_cache_group_edits,
                            cfg, caches, *extra)
    if ok:
        create = lm.groups.create_engine_group_infos_from_vllm
        params = inspect.signature(create).parameters
        kwargs = {}
        if "layout_hints" in params:
            kwargs["layout_hints"] = hints
        if "dcp_size" in params:
            kwargs["dcp_size"] = request["dcp_size"]
        ok, infos = _check(checks, "engine_group_infos",
                           functools.partial(create, cfg, edited, **kwargs), where=_where(create))
    out["engine_groups"] = None if infos is None else [
        {f: getattr(info, f) for f in info.__struct_fields__}
        if hasattr(info, "__struct_fields__") else dict(vars(info))
        for info in infos
    ]
    return hints, edited, infos


def _chunk_answer(lm, chunk: int, out: dict, request: dict, hints, edited, infos) -> dict:
    """One chunk size's answers: the chunk the release uses (negotiated up
    where it negotiates), the scheduler adapter's and the connector's chunk
    checks, and the server's kernel and object groups."""
    one: dict = {"checks": []}
    used, negotiated = _negotiated_chunk(chunk, out["scheduler_block"])
    one["chunk_size"] = used
    one["negotiated"] = negotiated
    refusal = _adapter_check(inspect.getsource(lm.adapter), used, out["scheduler_block"])
    one["checks"].append(
        ("scheduler_chunk", "lmcache/integration/vllm/vllm_multi_process_adapter.py: "
         "LMCacheMPSchedulerAdapter.__init__", refusal is None, *(refusal or ("", "")))
    )
    refusal = _connector_chunk_check(out["group_tokens_per_block"], used)
    one["checks"].append(
        ("connector_chunk", "lmcache/integration/vllm/lmcache_mp_connector.py: "
         "LMCacheMPConnector.__init__", refusal is None, *(refusal or ("", "")))
    )
    if infos is not None:
        ok, server = _check(
            one["checks"], "server_groups",
            functools.partial(_server, lm.normalize, lm.Manager, lm.EngineType.VLLM, edited,
                              infos, hints, used, out["separate_object_groups"],
                              request["engine_type"] == "blend"),
            where="lmcache/v1/kv_layer_groups.py: KVLayerGroupsManager",
        )
        one["kernel_groups"], one["object_groups"] = server if ok else (None, None)
    return one


def _answer(release_dir: str, request: dict, out_path: str) -> None:
    try:
        result = {"ok": probe(release_dir, request)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(out_path, "wb") as f:
        pickle.dump(result, f)


def main(request_path: str, out_dir: str, *release_dirs: str) -> int:
    """Answer ``REQUEST`` for each release: this process imports torch and
    vLLM once, then forks one child per release (a release's native extension
    loads once per process, and each child imports only its own ``lmcache``);
    ``OUT_DIR/<release folder name>.pkl`` receives each answer."""
    import torch  # noqa: F401  - what every release imports, imported once here
    import vllm.config  # noqa: F401
    import vllm.v1.kv_cache_interface  # noqa: F401

    with open(request_path, "rb") as f:
        request = pickle.load(f)
    for release_dir in release_dirs:
        out_path = os.path.join(out_dir, os.path.basename(release_dir) + ".pkl")
        pid = os.fork()
        if pid == 0:  # the child: one release, then exit without the parent's cleanup
            code = 1
            try:
                _answer(release_dir, request, out_path)
                code = 0
            finally:
                os._exit(code)
        os.waitpid(pid, 0)
    return 0


def serve(idle_seconds: str) -> None:
    """The probe as a long-lived worker (``python lmcache_probe.py serve
    IDLE_S``): import torch and vLLM once, say ``{"vllm": release}``, then
    answer each question line ``{"request": REQUEST, "out": OUT_DIR,
    "releases": [RELEASE_DIR, ...]}`` as :func:`main` does (one forked child
    per release) with ``{"ok": true}`` (or ``{"ok": false, "error": ...}``),
    until the input ends or stays idle ``IDLE_S`` seconds.  Whatever else
    writes to the standard output goes to the standard error, so the pipe
    holds only answers."""
    import json
    import select
    from importlib.metadata import version

    import torch  # noqa: F401
    import vllm.config  # noqa: F401
    import vllm.v1.kv_cache_interface  # noqa: F401

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def say(value: dict) -> None:
        answers.write(json.dumps(value) + "\n")
        answers.flush()

    say({"vllm": version("vllm")})
    while True:
        ready, _, _ = select.select([sys.stdin], [], [], float(idle_seconds))
        if not ready:
            return
        line = sys.stdin.readline()
        if not line:
            return
        try:
            question = json.loads(line)
            main(question["request"], question["out"], *question["releases"])
            say({"ok": True, "answer": None})
        except Exception:  # the question's error, quoted to the asker
            say({"ok": False, "error": " ".join(traceback.format_exc().strip().splitlines()[-3:])})


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"]:
        serve(*sys.argv[2:])
        # the worker's exit: its closing garbage collections would only scan
        # what the exit frees anyway
        import gc

        gc.freeze()
    else:
        sys.exit(main(*sys.argv[1:]))
