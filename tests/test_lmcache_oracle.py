"""Differential oracle: LMCache 0.5.6's own KV-cache-group edits against kvexplore's.

LMCache's ``validate_kv_cache_groups`` and ``apply_kv_cache_group_edits``
(``lmcache.integration.vllm.kv_cache_group_edits``) run on exactly what its
vLLM connector hands them (``LMCacheMPConnector.register_kv_caches``): the
plan's ``KVCacheConfig``, the caches :func:`kvexplore.allocate` registers and
the layout hints of LMCache's ``vllm_layout_hints(vllm_config)``.  kvexplore's
functions of the same names run on the same inputs, and the two must agree:

* verdict by verdict: one refuses exactly when the other does, validation
  rejects the same groups, and a rule's refusal names the same layer and rule;
* view by view: every layer's value is the same object where neither edits it,
  and where one does, both hold a view of the same storage with the same
  shape, strides, storage offset, dtype and device, made by the same rule.

Cases: every bundled model on A100 and H100, TP 1 and 2, both registrations,
on the default attention backend and on FLASHINFER (kernel pages smaller than
the logical block), and a few hybrids under each other KV-cache layout vLLM
resolves; then registrations derived from these that LMCache's rules refuse,
leave alone or re-view beyond what a catalog plan registers.

LMCache is never a dependency of kvexplore (its own requirements conflict
with vLLM's): the ``lmcache`` fixture installs the wheel ``--no-deps`` into
kvexplore's cache folder once and puts it on ``sys.path`` for these tests
only.  Without the package index the tests fail, saying so.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import torch
from vllm.v1.kv_cache_interface import KVCacheSpecKind

from kvexplore import allocate, plan
from kvexplore.editing.registered import spec_kind
from kvexplore.editing.rules import DEFAULT_EDITS, apply_kv_cache_group_edits
from kvexplore.editing.validation import check_kv_cache_groups, validate_kv_cache_groups
from kvexplore.errors import KVExploreError
from kvexplore.paths import cache_dir
from kvexplore.planning.models import catalog_names

LMCACHE_VERSION = "0.5.6"
NUM_BLOCKS = 4
GPUS = ("A100", "H100")
TENSOR_PARALLEL = (1, 2)
REGISTRATIONS = ("unified", "legacy")
#: Catalog models vLLM 0.33 refuses to run on FLASHINFER on both GPUs
#: (MLA, attention sinks, encoder-decoder); test_flashinfer_exclusions_hold
#: keeps this list true.
FLASHINFER_REFUSED = frozenset(
    {
        "deepseek-ai/DeepSeek-V3",
        "moonshotai/Kimi-Linear-48B-A3B-Instruct",
        "openai/gpt-oss-20b",
        "openai/whisper-small",
    }
)
BACKENDS = (None, "FLASHINFER")

#: Layouts vLLM 0.33 resolves besides its default (LBNHC): LMCache's hints
#: HND, BLNHC, BLHNC; tried on A100 at TP 1 on these hybrids (attention
#: group last, first, MLA, and a kernel block of 16 under FLASHINFER).
LAYOUTS = ("LBHNC", "BLNHC", "BLHNC")
LAYOUT_MODELS = (
    "Qwen/Qwen3.5-0.8B",
    "tiiuae/Falcon-H1-0.5B-Instruct",
    "moonshotai/Kimi-Linear-48B-A3B-Instruct",
    "ibm-granite/granite-4.0-h-350m",
)


def _case(name, gpu, tp, backend, layout=None):
    label = "-".join(filter(None, (name, gpu, f"tp{tp}", backend or "default", layout)))
    return pytest.param(name, gpu, tp, backend, layout, id=label)


CASES = [
    _case(name, gpu, tp, backend)
    for backend in BACKENDS
    for gpu in GPUS
    for tp in TENSOR_PARALLEL
    for name in catalog_names()
    if backend is None or name not in FLASHINFER_REFUSED
] + [
    _case(name, "A100", 1, backend, layout)
    for layout in LAYOUTS
    for backend in BACKENDS
    for name in LAYOUT_MODELS
    if backend is None or name not in FLASHINFER_REFUSED
]


# ---------------------------------------------------------------- the oracle


def _install(target: Path) -> None:
    """``pip install --no-deps --target`` LMCache into ``target``, atomically:
    into a temporary sibling first, then renamed into place; a failed or
    concurrent install leaves no half-made ``target``."""
    if target.is_dir():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        command = [
            sys.executable, "-m", "pip", "install", "--quiet",
            "--disable-pip-version-check", "--no-deps", "--target", str(staging),
            f"lmcache=={LMCACHE_VERSION}",
        ]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=900)
        except subprocess.TimeoutExpired:
            pytest.fail(f"`{' '.join(command)}` did not finish in 900 s", pytrace=False)
        if done.returncode:
            pytest.fail(
                f"LMCache {LMCACHE_VERSION}, the oracle of these tests, could not be "
                f"installed: `{' '.join(command)}` exited {done.returncode}:\n"
                f"{(done.stderr or done.stdout)[-3000:]}\nThese tests need the package "
                f"index (or a pip configuration naming a mirror with lmcache=={LMCACHE_VERSION}).",
                pytrace=False,
            )
        try:
            os.replace(staging, target)
        except OSError:
            if not target.is_dir():  # not a concurrent install that got there first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@pytest.fixture(scope="session")
def lmcache():
    """LMCache's edit module, its vLLM layout hints and its rule registry, from
    ``<cache>/oracles/lmcache-<version>``; ``sys.path``, ``sys.modules`` and the
    log level variable are restored afterwards."""
    target = cache_dir() / "oracles" / f"lmcache-{LMCACHE_VERSION}"
    _install(target)
    saved_path, saved_level = list(sys.path), os.environ.get("LMCACHE_LOG_LEVEL")
    sys.path.insert(0, str(target))
    os.environ["LMCACHE_LOG_LEVEL"] = "ERROR"  # LMCache logs at INFO on import
    try:
        from lmcache.integration.vllm import kv_cache_group_edits as edits
        from lmcache.integration.vllm.utils import vllm_layout_hints
    except Exception as exc:
        sys.path[:] = saved_path
        pytest.fail(f"LMCache installed in {target} does not import: {exc!r}", pytrace=False)
    finally:
        if saved_level is None:
            os.environ.pop("LMCACHE_LOG_LEVEL", None)
        else:
            os.environ["LMCACHE_LOG_LEVEL"] = saved_level
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("lmcache"):
            logging.getLogger(name).setLevel(logging.ERROR)
    assert Path(edits.__file__).is_relative_to(target), edits.__file__
    yield types.SimpleNamespace(
        apply=edits.apply_kv_cache_group_edits,
        validate=edits.validate_kv_cache_groups,
        rules=edits._EDITS,
        layout_hints=vllm_layout_hints,
    )
    sys.path[:] = saved_path
    for name in [m for m in sys.modules if m == "lmcache" or m.startswith("lmcache.")]:
        del sys.modules[name]


# ------------------------------------------------------------------- inputs


@functools.cache
def planned(name: str, gpu: str, tp: int, backend: str | None, layout: str | None = None):
    return plan(
        name,
        gpu=gpu,
        tensor_parallel_size=tp,
        num_blocks=NUM_BLOCKS,
        attention_backend=backend,
        kv_cache_layout=layout,
    )


def layer_specs(cfg):
    """``(layer, spec)`` in LMCache's order: group by group, per-layer specs unwrapped."""
    for group in cfg.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            yield name, per_layer[name] if per_layer else group.kv_cache_spec


def first_match(rules, spec, value):
    """The first rule of ``rules`` (in their priority order) matching the layer."""
    return next((rule for rule in rules if rule.matches(spec, value)), None)


def outcome(function, *args, **kwargs):
    """``(value, None)``, or ``(None, exception)`` when ``function`` raises."""
    try:
        return function(*args, **kwargs), None
    except Exception as exc:
        return None, exc


def per_layer(lmcache, p, caches, hints) -> dict:
    """Layer by layer, each side's first matching rule applied on its own:
    ``{layer: ((their rule, view, error), (our rule, view, error))}``; every
    rule is ``None`` without Mamba layers (neither apply consults one then)."""
    cfg = p.kv_cache_config
    out = {}
    for name, spec in layer_specs(cfg):
        value = caches[name]
        sides = []
        for rules, extra in ((lmcache.rules, (hints,)), (DEFAULT_EDITS, ())):
            rule = first_match(rules, spec, value) if cfg.has_mamba_layers else None
            if rule is None:
                sides.append((None, None, None))
                continue
            kwargs = {} if extra else {"kv_layout": p.kv_cache_layout}
            sides.append((rule.name, *outcome(rule.apply, spec, value, *extra, **kwargs)))
        out[name] = tuple(sides)
    return out


def tensor_facts(t: torch.Tensor) -> dict:
    return {
        "shape": tuple(t.shape),
        "stride": tuple(t.stride()),
        "storage_offset": t.storage_offset(),
        "dtype": t.dtype,
        "device": t.device,
        "storage": t.untyped_storage().data_ptr(),
    }


def storage_of(value) -> int:
    first = value if isinstance(value, torch.Tensor) else value[0]
    return first.untyped_storage().data_ptr()


def assert_agree(lmcache, p, caches) -> dict:
    """Both sides' validation, rules and edits on ``caches`` (a registration of
    ``p``) agree; returns what was compared: ``views`` (edited layers),
    ``refusals`` (refusals of either side, each met by the other's) and
    ``lmcache_refused`` (whether LMCache's apply refused)."""
    cfg = p.kv_cache_config
    compared = {"views": 0, "refusals": 0}
    # Validation: refused by both or neither, the same groups rejected.
    _, their_verdict = outcome(lmcache.validate, cfg)
    _, our_verdict = outcome(validate_kv_cache_groups, cfg)
    assert our_verdict is None or isinstance(our_verdict, KVExploreError), repr(our_verdict)
    assert (their_verdict is None) == (our_verdict is None), (their_verdict, our_verdict)
    table = check_kv_cache_groups(cfg)
    rejected = table.loc[table["verdict"] == "rejected", "group"].tolist()
    assert sorted(int(g) for g in re.findall(r"group (\d+):", str(their_verdict or ""))) == (
        rejected
    )
    compared["refusals"] += their_verdict is not None

    # Rule by rule: the same rule matches each layer and refuses it, or both
    # views are alike, over the registered storage.
    hints = lmcache.layout_hints(p.vllm_config)
    layers = per_layer(lmcache, p, caches, hints)
    for layer, (theirs, ours) in layers.items():
        (their_rule, their_view, their_error), (our_rule, our_view, our_error) = theirs, ours
        assert our_rule == their_rule, (layer, their_rule, our_rule)
        assert our_error is None or isinstance(our_error, KVExploreError), repr(our_error)
        assert (our_error is None) == (their_error is None), (layer, their_error, our_error)
        compared["refusals"] += their_error is not None
        if their_view is not None:
            assert tensor_facts(our_view) == tensor_facts(their_view), layer
            assert tensor_facts(our_view)["storage"] == storage_of(caches[layer]), layer

    # The whole functions: refused by both or neither; where neither refuses,
    # every layer is the same object, or the same view of the same storage.
    their_edit, their_refusal = outcome(lmcache.apply, cfg, caches, hints)
    our_edit, our_refusal = outcome(apply_kv_cache_group_edits, cfg, caches)
    assert our_refusal is None or isinstance(our_refusal, KVExploreError), repr(our_refusal)
    assert (their_refusal is None) == (our_refusal is None), (their_refusal, our_refusal)
    compared["lmcache_refused"] = their_refusal is not None
    if their_refusal is not None:
        compared["refusals"] += 1
        failing = [layer for layer, (theirs, _) in layers.items() if theirs[2] is not None]
        if their_verdict is None:  # a rule refused: the first layer whose rule raised
            assert failing, their_refusal
            layer, rule = failing[0], layers[failing[0]][0][0]
            assert f"layer {layer!r}" in str(our_refusal), (layer, our_refusal)
            assert f"rule {rule!r}" in str(our_refusal), (rule, our_refusal)
        return compared
    our_rules = {row["layer"]: row["rule"] for row in our_edit.report.to_dict("records")}
    assert our_rules == {layer: theirs[0] for layer, (theirs, _) in layers.items()}
    assert set(our_edit) == set(their_edit) == set(caches)
    for layer, before in caches.items():
        theirs_now, ours_now = their_edit[layer], our_edit[layer]
        if our_rules[layer] is None:
            assert theirs_now is before and ours_now is before, layer
            continue
        assert isinstance(theirs_now, torch.Tensor) and isinstance(ours_now, torch.Tensor)
        assert tensor_facts(ours_now) == tensor_facts(theirs_now), layer
        assert tensor_facts(ours_now)["storage"] == storage_of(before), layer
        compared["views"] += 1
    return compared


# -------------------------------------------------------------------- tests


def test_flashinfer_exclusions_hold():
    """The models left out of the FLASHINFER cases are the ones vLLM refuses there."""
    for name in sorted(FLASHINFER_REFUSED):
        for gpu in GPUS:
            with pytest.raises(KVExploreError, match="FLASHINFER"):
                planned(name, gpu, 1, "FLASHINFER")


def test_the_cases_reach_every_rule_and_refusal(lmcache):
    """The parametrisation is not vacuous: LMCache's validation refuses some
    case, and each of its rules but the MLA one fires on some (no catalog plan
    pages an MLA cache below its logical block; test_kernel_paged_mla does)."""
    fired, refused = set(), 0
    for name, gpu, tp, backend, layout in (case.values for case in CASES):
        if (gpu, tp) != ("A100", 1):
            continue
        p = planned(name, gpu, tp, backend, layout)
        if outcome(lmcache.validate, p.kv_cache_config)[1] is not None:
            refused += 1
            continue
        hints = lmcache.layout_hints(p.vllm_config)
        for registration in REGISTRATIONS:
            caches = allocate(p, device="meta", registration=registration)
            fired |= {theirs[0] for theirs, _ in per_layer(lmcache, p, caches, hints).values()}
    assert refused
    unreached = {"subpaged-mla-attention-view"}
    assert {r.name for r in lmcache.rules} - unreached <= fired - {None}, fired


@pytest.mark.parametrize("registration", REGISTRATIONS)
@pytest.mark.parametrize(("name", "gpu", "tp", "backend", "layout"), CASES)
def test_kvexplore_agrees_with_lmcache(lmcache, name, gpu, tp, backend, layout, registration):
    p = planned(name, gpu, tp, backend, layout)
    caches = allocate(p, device="cpu", registration=registration)
    compared = assert_agree(lmcache, p, caches)
    assert compared["views"] or compared["refusals"] or not p.kv_cache_config.has_mamba_layers


# ------------------------------------------- registrations beyond the catalog


def first_layer(p, kind: KVCacheSpecKind) -> str:
    return next(name for name, spec in layer_specs(p.kv_cache_config) if spec_kind(spec) == kind)


def kernel_paged_mla(p, caches):
    """The MLA layer re-paged at 64 states per kernel page (``[B * r, 1, 64, C]``)."""
    name = first_layer(p, KVCacheSpecKind.MLA_ATTENTION)
    t = caches[name]
    ratio = t.shape[2] // 64
    return {**caches, name: t.view(t.shape[0] * ratio, t.shape[1], 64, t.shape[3])}


def heads_before_tokens(p, caches):
    """The legacy attention layer with each kernel page laid out heads-first."""
    name = first_layer(p, KVCacheSpecKind.FULL_ATTENTION)
    pages, two, rows, heads, size = caches[name].shape
    fresh = torch.zeros(pages, two, heads, rows, size, dtype=caches[name].dtype)
    return {**caches, name: fresh.transpose(2, 3)}


def heads_before_blocks(p, caches):
    """The unified attention layer with the heads dim outermost in memory."""
    name = first_layer(p, KVCacheSpecKind.FULL_ATTENTION)
    t = caches[name]
    fresh = torch.zeros(t.shape[1], t.shape[0], *t.shape[2:], dtype=t.dtype)
    return {**caches, name: fresh.transpose(0, 1)}


def states_as_tuple(p, caches):
    """The legacy Mamba states as a tuple instead of vLLM's list."""
    name = first_layer(p, KVCacheSpecKind.MAMBA)
    return {**caches, name: tuple(caches[name])}


def states_one_page_in(p, caches):
    """The legacy Mamba states of a buffer one page longer, from its second page."""
    name = first_layer(p, KVCacheSpecKind.MAMBA)
    page = dict(layer_specs(p.kv_cache_config))[name].page_size_bytes
    raw = torch.zeros((NUM_BLOCKS + 1) * page, dtype=torch.int8)
    moved = []
    for state in caches[name]:
        start = page + state.storage_offset() * state.element_size()
        typed = raw.view(state.dtype)
        offset = start // state.element_size()
        moved.append(typed.as_strided(state.shape, state.stride(), offset))
    return {**caches, name: moved}


#: (derivation, model, backend, registration, what LMCache's apply does with it)
DERIVED = [
    (kernel_paged_mla, "moonshotai/Kimi-Linear-48B-A3B-Instruct", None, "unified", "edits"),
    (heads_before_tokens, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "legacy", "refuses"),
    (heads_before_blocks, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "unified", "refuses"),
    (states_as_tuple, "Qwen/Qwen3.5-0.8B", None, "legacy", "leaves"),
    (states_one_page_in, "Qwen/Qwen3.5-0.8B", None, "legacy", "refuses"),
]


@pytest.mark.parametrize(
    ("derive", "name", "backend", "registration", "lmcache_does"),
    DERIVED,
    ids=[derive.__name__ for derive, *_ in DERIVED],
)
def test_derived_registrations(lmcache, derive, name, backend, registration, lmcache_does):
    """A registration derived from a catalog plan's: kvexplore refuses, leaves
    and re-views its layers exactly as LMCache does (``lmcache_does`` keeps
    each derivation reaching the path it names)."""
    p = planned(name, "A100", 1, backend)
    caches = allocate(p, device="cpu", registration=registration)
    derived = derive(p, caches)
    (changed,) = [layer for layer in caches if derived[layer] is not caches[layer]]
    compared = assert_agree(lmcache, p, derived)
    hints = lmcache.layout_hints(p.vllm_config)
    theirs, _ = per_layer(lmcache, p, derived, hints)[changed]  # (rule, view, error)
    if compared["lmcache_refused"]:
        does = "refuses"
    else:
        does = "leaves" if theirs[1] is None else "edits"
    assert does == lmcache_does, (changed, theirs)
