"""Every LMCache release's own edits, run beside kvexplore's on the same registrations.

Each release's wheel is installed ``--no-deps`` into
``<kvexplore cache>/oracles/lmcache-<release>`` (once; atomically) and run in
a process of its own (``lmcache_worker.py`` forks one per release: LMCache's
native extension loads once per process).  A case travels as plain data: the
``KVCacheConfig``, the ``CacheConfig`` (LMCache 0.5.5 and later read the resolved layout from it)
and each layer's tensors as (storage, shape, stride, storage offset, dtype);
both sides rebuild identical tensors from it, so every shape, stride, offset
and storage they report is comparable as data.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kvexplore.editing.lmcache import lmcache_release
from kvexplore.editing.rules import (
    apply_kv_cache_group_edits,
    layout_hint,
    rules_for,
)
from kvexplore.editing.validation import check_kv_cache_groups, validate_kv_cache_groups

WORKER = Path(__file__).with_name("lmcache_worker.py")
sys.path.insert(0, str(WORKER.parent))
from lmcache_worker import describe, rebuild  # noqa: E402


class OracleUnavailable(RuntimeError):
    """A release's wheel could not be installed or run."""


def install(release: str) -> Path:
    """LMCache ``release``'s package folder (kvexplore's own wheel install,
    shared with :func:`kvexplore.lmcache_layout`); ``OracleUnavailable`` when
    the wheel cannot be installed."""
    from kvexplore.connectors.lmcache_layout import lmcache_package
    from kvexplore.errors import KVExploreError

    try:
        return lmcache_package(release)
    except KVExploreError as exc:
        raise OracleUnavailable(f"{exc}; these tests need it as an oracle") from None


def case_of(config, cache_config, caches: dict) -> dict:
    """A registration as plain data (see the module doc;
    :func:`kvexplore.connectors.lmcache_layout.tensors_as_data`)."""
    from kvexplore.connectors.lmcache_layout import tensors_as_data

    storages, layers = tensors_as_data(caches)
    return {
        "config": config,
        "cache_config": cache_config,
        "storages": storages,
        "layers": layers,
    }


def run_oracles(releases, cases: list[dict], workers: int = 3) -> dict[str, list[dict]]:
    """``{release: [outcome per case]}`` from each release's own code: the
    wheels installed (``workers`` at a time), then one worker process that
    forks a process per release (``lmcache_worker.py``)."""
    with ThreadPoolExecutor(workers) as pool:
        targets = dict(zip(releases, pool.map(install, releases), strict=True))
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "cases.pkl")
        with open(path, "wb") as f:
            pickle.dump(cases, f)
        done = subprocess.run(
            [sys.executable, str(WORKER), path, folder, str(workers),
             *map(str, targets.values())],
            capture_output=True,
            text=True,
            timeout=1800,
        )
        if done.returncode:
            raise OracleUnavailable(
                f"the LMCache worker exited {done.returncode}:\n{done.stderr[-3000:]}"
            )
        outcomes = {}
        for release, target in targets.items():
            with open(os.path.join(folder, target.name + ".out"), "rb") as f:
                outcomes[release] = pickle.load(f)
        return outcomes


def _error(exc: Exception) -> tuple[str, str]:
    return (type(exc).__name__, str(exc))


def kvexplore_outcome(release: str, case: dict) -> dict:
    """kvexplore's answer for ``release`` on ``case``, in the worker's format."""
    r = lmcache_release(release)
    cfg = case["config"]
    raw, caches = rebuild(case["storages"], case["layers"])
    result: dict = {"rules": [rule.name for rule in rules_for(r)]}
    try:
        validate_kv_cache_groups(cfg, lmcache=r)
        result["validate"] = None
    except Exception as exc:
        result["validate"] = _error(exc)
    result["rejected_groups"] = (
        []
        if cfg is None
        else [
            int(g)
            for g in check_kv_cache_groups(cfg, lmcache=r)
            .query("verdict == 'rejected'")["group"]
            .tolist()
        ]
    )
    hint = None
    if r.layout_hint != "none":
        layout = getattr(case["cache_config"], "kv_cache_layout", None)
        try:
            hint = layout_hint(r, case.get("hint"), layout)
            result["hints"] = {} if hint is None else {"kv_layout": hint}
        except Exception as exc:
            result["hints"] = _error(exc)
    layers = {}
    if (
        cfg is not None
        and cfg.has_mamba_layers
        and not isinstance(result.get("hints"), tuple)
    ):
        rules = rules_for(r)
        for group in cfg.kv_cache_groups:
            inner = getattr(group.kv_cache_spec, "kv_cache_specs", None)
            for name in group.layer_names:
                spec = (
                    inner[name]
                    if (inner and r.per_layer_specs)
                    else group.kv_cache_spec
                )
                value = caches[name]
                rule = next((x for x in rules if x.matches(spec, value)), None)
                if rule is None:
                    layers[name] = (None, None, None)
                    continue
                try:
                    view = rule.apply(spec, value, kv_layout=hint)
                    layers[name] = (rule.name, describe(view, raw), None)
                except Exception as exc:
                    layers[name] = (rule.name, None, _error(exc))
    result["layers"] = layers
    try:
        edited = apply_kv_cache_group_edits(
            cfg, caches, lmcache=r, kv_layout=case.get("hint")
        )
        result["apply"] = (
            "ok",
            {
                name: "same"
                if edited[name] is caches[name]
                else describe(edited[name], raw)
                for name in caches
            },
        )
        result["report_rules"] = {
            row["layer"]: row["rule"] for row in edited.report.to_dict("records")
        }
        result["named"] = edited.lmcache
    except Exception as exc:
        result["apply"] = ("refused", _error(exc))
    return result
