"""Runs LMCache releases' own edits on registrations described by the parent.

``python lmcache_worker.py CASES OUT_DIR WORKERS RELEASE_DIR...``: each
``RELEASE_DIR`` holds one release's ``lmcache`` package (installed
``--no-deps``), ``CASES`` a pickled list of cases (see
``tests/lmcache_oracle.py``); ``OUT_DIR/<folder name>.out`` receives a pickled
list of outcomes per release.  Each case's registration is rebuilt here with
the exact shapes, strides, storage offsets, dtypes and storage sharing of the
parent's tensors (contents are never read by the rules), then LMCache's
``validate_kv_cache_groups``, its layout hints, its rules one layer at a time
and its ``apply_kv_cache_group_edits`` run on it.

One process per release: LMCache's native extension cannot be loaded twice in
one process.  Each is forked (at most ``WORKERS`` at a time) from this
process after it has imported torch and the vLLM modules every release
imports, and before any ``lmcache`` module is imported, so each child imports
only its own release's ``lmcache`` (checked by its files' path).
"""

from __future__ import annotations

import inspect
import logging
import os
import pickle
import sys
import traceback
import types


def rebuild(storages, layers):
    """The registration of a case (kvexplore's own transport of tensors as
    data, ``kvexplore/connectors/lmcache_probe.py: rebuild``, a file that
    imports nothing of kvexplore)."""
    import importlib.util

    probe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                         "kvexplore", "connectors", "lmcache_probe.py")
    spec = importlib.util.spec_from_file_location("_kvexplore_lmcache_probe", probe)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.rebuild(storages, layers)


def describe(value, raw):
    """A registered or edited value as plain data: per tensor its storage index,
    shape, stride, storage offset and dtype."""
    import torch

    ptrs = [r.untyped_storage().data_ptr() for r in raw]

    def one(t):
        ptr = t.untyped_storage().data_ptr()
        index = ptrs.index(ptr) if ptr in ptrs else -1
        return (
            index,
            tuple(t.shape),
            tuple(t.stride()),
            t.storage_offset(),
            str(t.dtype).split(".")[-1],
        )

    if isinstance(value, torch.Tensor):
        return ("tensor", [one(value)])
    if isinstance(value, (list, tuple)) and all(
        isinstance(t, torch.Tensor) for t in value
    ):
        return ("list" if isinstance(value, list) else "tuple", [one(t) for t in value])
    return (type(value).__name__, [])


def error(exc):
    return (type(exc).__name__, str(exc))


def run_release(release_dir, cases, out_path):
    """One release's outcomes on ``cases``, pickled to ``out_path``."""
    sys.path.insert(0, release_dir)
    from lmcache.integration.vllm import kv_cache_group_edits as edits
    from lmcache.integration.vllm import utils

    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.ERROR)
    assert edits.__file__.startswith(release_dir), edits.__file__
    takes_hints = (
        len(inspect.signature(edits.apply_kv_cache_group_edits).parameters) == 3
    )
    hints_take_config = bool(inspect.signature(utils.vllm_layout_hints).parameters)
    per_layer_specs = "kv_cache_specs" in inspect.getsource(
        edits.apply_kv_cache_group_edits
    )
    outcomes = []
    for case in cases:
        cfg = case["config"]
        raw, caches = rebuild(case["storages"], case["layers"])
        result = {"rules": [r.name for r in edits._EDITS]}
        try:
            edits.validate_kv_cache_groups(cfg)
            result["validate"] = None
        except Exception as exc:
            result["validate"] = error(exc)
        hints, extra = None, ()
        if takes_hints:
            try:
                if "hint" in case:
                    hints = {"kv_layout": case["hint"]}
                elif hints_take_config:
                    vllm_config = types.SimpleNamespace(
                        cache_config=case["cache_config"]
                    )
                    hints = utils.vllm_layout_hints(vllm_config)
                else:
                    hints = utils.vllm_layout_hints()
                result["hints"] = dict(hints)
            except Exception as exc:
                result["hints"] = error(exc)
                hints = None
            extra = (hints,)
        layers = {}
        if (
            cfg is not None
            and cfg.has_mamba_layers
            and not isinstance(result.get("hints"), tuple)
        ):
            for group in cfg.kv_cache_groups:
                inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
                for name in group.layer_names:
                    spec = (
                        inner[name]
                        if (inner and per_layer_specs)
                        else group.kv_cache_spec
                    )
                    value = caches[name]
                    rule = next(
                        (r for r in edits._EDITS if r.matches(spec, value)), None
                    )
                    if rule is None:
                        layers[name] = (None, None, None)
                        continue
                    try:
                        layers[name] = (
                            rule.name,
                            describe(rule.apply(spec, value, *extra), raw),
                            None,
                        )
                    except Exception as exc:
                        layers[name] = (rule.name, None, error(exc))
        result["layers"] = layers
        if isinstance(result.get("hints"), tuple):
            result["apply"] = ("refused", result["hints"])
        else:
            try:
                edited = edits.apply_kv_cache_group_edits(cfg, caches, *extra)
                result["apply"] = (
                    "ok",
                    {
                        name: "same"
                        if edited[name] is caches[name]
                        else describe(edited[name], raw)
                        for name in caches
                    },
                )
            except Exception as exc:
                result["apply"] = ("refused", error(exc))
        outcomes.append(result)
        del raw, caches
    with open(out_path, "wb") as f:
        pickle.dump(outcomes, f)


def main(cases_path, out_dir, workers, *release_dirs):
    """Fork one child per release (at most ``workers`` running); exit 1 naming
    every release whose child failed (its traceback is on stderr)."""
    os.environ["LMCACHE_LOG_LEVEL"] = "ERROR"
    import torch  # noqa: F401  - what every release imports, imported once here
    import vllm.config  # noqa: F401
    import vllm.v1.kv_cache_interface  # noqa: F401

    assert not any(m == "lmcache" or m.startswith("lmcache.") for m in sys.modules)
    with open(cases_path, "rb") as f:
        cases = pickle.load(f)
    pending, running, failed = list(release_dirs), {}, []
    while pending or running:
        while pending and len(running) < int(workers):
            release_dir = pending.pop(0)
            out = os.path.join(out_dir, os.path.basename(release_dir) + ".out")
            pid = os.fork()
            if pid == 0:  # the child: one release, then exit without the parent's cleanup
                code = 1
                try:
                    run_release(release_dir, cases, out)
                    code = 0
                except BaseException:
                    traceback.print_exc()
                finally:
                    sys.stdout.flush()
                    sys.stderr.flush()
                    os._exit(code)
            running[pid] = release_dir
        pid, status = os.wait()
        release_dir = running.pop(pid)
        if os.waitstatus_to_exitcode(status) != 0:
            failed.append(os.path.basename(release_dir))
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
