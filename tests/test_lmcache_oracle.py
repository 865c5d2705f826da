"""Differential oracle: every LMCache release's own KV-cache-group edits against kvexplore's.

For each LMCache release kvexplore knows (0.4.7 to 0.5.6, and the 0.5.7rc2
pre-release), that release's own ``validate_kv_cache_groups``, its layout
hints (``lmcache.integration.vllm.utils.vllm_layout_hints``), its rules one
layer at a time and its ``apply_kv_cache_group_edits`` run on exactly what its
vLLM connector hands them: the plan's ``KVCacheConfig`` and the caches
:func:`kvexplore.allocate` registers.  kvexplore's functions of the same names,
asked for that release (``lmcache=``), run on the same inputs, and the two must
agree:

* verdict by verdict: validation refuses the same groups, the hint is the
  same (or both refuse the layout), each layer's first matching rule is the
  same and refuses exactly when LMCache's does;
* view by view: every layer's value is the same object where neither edits it,
  and where one does, both hold views of the same storage with the same
  shape, strides, storage offset and dtype;
* the whole apply: refused by both or neither, kvexplore's refusal naming the
  layer and rule LMCache's raised at.

Cases: every bundled model on A100 and H100, TP 1 and 2, both registrations,
on the default attention backend and on FLASHINFER (kernel pages smaller than
the logical block), a few hybrids under each other KV-cache layout vLLM
resolves, and registrations derived from these that reach every rule and
refusal of every release: (K, V) plane pairs as vLLM-Ascend registers them
(interleaved kernel pages in one pool, as 0.30 does; each plane dense, as up
to 0.29), Mamba states carved as separate slices, states one page into their
buffer.

LMCache is never a dependency of kvexplore (its own requirements conflict
with vLLM's): ``tests/lmcache_oracle.py`` installs each wheel ``--no-deps``
into kvexplore's cache folder once and runs it in a process of its own.
Without the package index the tests fail, saying so.
"""

from __future__ import annotations

import functools
import re

import pytest
import torch
from lmcache_oracle import OracleUnavailable, case_of, kvexplore_outcome, run_oracles
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpecKind,
    MambaSpec,
)

from kvexplore import allocate, plan
from kvexplore.editing.lmcache import LMCACHE_RELEASES, lmcache_releases
from kvexplore.editing.registered import spec_kind
from kvexplore.errors import KVExploreError
from kvexplore.planning.models import catalog_names

RELEASES = lmcache_releases()
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
    return (name, gpu, tp, backend, layout)


CATALOG = [
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


# ------------------------------------------------------------------- inputs


@functools.cache
def planned(
    name: str, gpu: str, tp: int, backend: str | None, layout: str | None = None
):
    return plan(
        name,
        gpu=gpu,
        tensor_parallel_size=tp,
        num_blocks=NUM_BLOCKS,
        attention_backend=backend,
        kv_cache_layout=layout,
    )


def layer_specs(cfg):
    """``(layer, spec)`` group by group, per-layer specs unwrapped."""
    for group in cfg.kv_cache_groups:
        per_layer = getattr(group.kv_cache_spec, "kv_cache_specs", None)
        for name in group.layer_names:
            yield name, per_layer[name] if per_layer else group.kv_cache_spec


# ------------------------------------------- registrations beyond the catalog


def first_layer(p, kind: KVCacheSpecKind) -> str:
    return next(
        name for name, spec in layer_specs(p.kv_cache_config) if spec_kind(spec) == kind
    )


def kernel_paged_mla(p, caches):
    """The MLA layer re-paged at 64 states per kernel page (``[B * r, 1, 64, C]``)."""
    name = first_layer(p, KVCacheSpecKind.MLA_ATTENTION)
    t = caches[name]
    ratio = t.shape[2] // 64
    return {**caches, name: t.view(t.shape[0] * ratio, t.shape[1], 64, t.shape[3])}


def kernel_paged_mla_legacy(p, caches):
    """The legacy (rank-3) MLA layer re-paged at 64 rows per kernel page
    (``[B * r, 64, C]``)."""
    name = first_layer(p, KVCacheSpecKind.MLA_ATTENTION)
    t = caches[name]
    ratio = t.shape[1] // 64
    return {**caches, name: t.view(t.shape[0] * ratio, 64, t.shape[2])}


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


def kv_planes_interleaved(p, caches):
    """The legacy attention layer as vLLM-Ascend 0.30 registers it: a (K, V)
    pair of ``[pages, kernel_block, heads, head_size]`` planes whose kernel
    pages alternate in one pool (``K0 V0 K1 V1 ...``)."""
    name = first_layer(p, KVCacheSpecKind.FULL_ATTENTION)
    t = caches[name]
    return {**caches, name: (t[:, 0], t[:, 1])}


def kv_planes_contiguous(p, caches):
    """The same layer as vLLM-Ascend up to 0.29 registers it: every K page,
    then every V page, each plane dense."""
    name = first_layer(p, KVCacheSpecKind.FULL_ATTENTION)
    pages, _, rows, heads, size = caches[name].shape
    fresh = torch.zeros(2, pages, rows, heads, size, dtype=caches[name].dtype)
    return {**caches, name: (fresh[0], fresh[1])}


def kv_planes_as_list(p, caches):
    """The interleaved pair as a list (LMCache reads lists and tuples alike)."""
    name = first_layer(p, KVCacheSpecKind.FULL_ATTENTION)
    t = caches[name]
    return {**caches, name: [t[:, 0], t[:, 1]]}


def states_as_slices(p, caches):
    """The legacy Mamba states carved as separate dense slices of one pool
    (each steps its own bytes per block, not the padded page)."""
    name = first_layer(p, KVCacheSpecKind.MAMBA)
    states = caches[name]
    sizes = [s[0].numel() * s.element_size() for s in states]
    pool = torch.zeros(NUM_BLOCKS * sum(sizes), dtype=torch.uint8)
    out, start = [], 0
    for state, size in zip(states, sizes, strict=True):
        piece = pool[start : start + NUM_BLOCKS * size]
        out.append(piece.view(state.dtype).view(state.shape))
        start += NUM_BLOCKS * size
    return {**caches, name: out}


#: (derivation, model, backend, registration, {release: what its apply does})
#: -- "edits", "leaves" (the changed layer as registered) or "refuses".
FIRST = ("0.4.7", "0.5.0", "0.5.1", "0.5.2")
FOUR = ("0.5.3", "0.5.4", "0.5.5", "0.5.6")
PRE = ("0.5.7rc2",)


def _does(**by_family) -> dict:
    out = {}
    for family, does in by_family.items():
        for release in {"two": FIRST, "four": FOUR, "pre": PRE}[family]:
            out[release] = does
    return out


DERIVED = [
    # unified: up to 0.5.4 the Mamba rows are refused first; 0.5.5 leaves a
    # rank-4 MLA cache alone; 0.5.6 on re-views it
    (kernel_paged_mla, "moonshotai/Kimi-Linear-48B-A3B-Instruct", None, "unified",
     {**_does(two="refuses", four="refuses", pre="edits"),
      "0.5.5": "leaves", "0.5.6": "edits"}),
    (kernel_paged_mla_legacy, "moonshotai/Kimi-Linear-48B-A3B-Instruct", None, "legacy",
     _does(two="leaves", four="edits", pre="edits")),
    (heads_before_tokens, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "legacy",
     _does(two="refuses", four="refuses", pre="refuses")),
    # 0.5.5 re-views rank-5 attention only: the heads-first rank-4 tensor is
    # left as registered; 0.5.6 on refuses it (not contiguous in memory order)
    (heads_before_blocks, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "unified",
     {**_does(two="refuses", four="refuses", pre="refuses"), "0.5.5": "leaves"}),
    (states_as_tuple, "Qwen/Qwen3.5-0.8B", None, "legacy",
     _does(two="refuses", four="leaves", pre="leaves")),
    (states_one_page_in, "Qwen/Qwen3.5-0.8B", None, "legacy",
     _does(two="refuses", four="refuses", pre="edits")),
    (states_as_slices, "Qwen/Qwen3.5-0.8B", None, "legacy",
     _does(two="refuses", four="refuses", pre="leaves")),
    (kv_planes_interleaved, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "legacy",
     _does(two="leaves", four="leaves", pre="edits")),
    (kv_planes_contiguous, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "legacy",
     _does(two="leaves", four="leaves", pre="edits")),
    (kv_planes_as_list, "Qwen/Qwen3.5-0.8B", "FLASHINFER", "legacy",
     _does(two="leaves", four="leaves", pre="edits")),
]  # fmt: skip


def sliced_config(mode: str = "align", layout: str = "LBNHC"):
    """A hand-made hybrid whose Mamba state bytes divide by its block size, so
    ``mamba-slice-planes`` re-views separately carved slices (states of
    3 x 128 bf16 = 768 B and 4 x 8 x 8 fp32 = 1024 B per block, block 64);
    ``mode`` its Mamba cache mode, ``layout`` the layout vLLM resolved."""
    mamba = MambaSpec(
        block_size=64,
        shapes=((3, 128), (4, 8, 8)),
        dtypes=(torch.bfloat16, torch.float32),
        mamba_cache_mode=mode,
    )
    attn = FullAttentionSpec(
        block_size=64, num_kv_heads=1, head_size=8, dtype=torch.bfloat16
    )
    cfg = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["m"], mamba), KVCacheGroupSpec(["a"], attn)],
        kv_cache_layout=layout,
    )
    conv = torch.zeros(NUM_BLOCKS * (768 + 1024), dtype=torch.uint8)
    states = [
        conv[: NUM_BLOCKS * 768].view(torch.bfloat16).view(NUM_BLOCKS, 3, 128),
        conv[NUM_BLOCKS * 768 :].view(torch.float32).view(NUM_BLOCKS, 4, 8, 8),
    ]
    attention = torch.zeros(NUM_BLOCKS, 2, 64, 1, 8, dtype=torch.bfloat16)
    return cfg, {"m": states, "a": attention}


def _build_cases() -> dict[str, dict]:
    cases = {}
    for name, gpu, tp, backend, layout in CATALOG:
        p = planned(name, gpu, tp, backend, layout)
        for registration in REGISTRATIONS:
            label = "-".join(
                filter(
                    None,
                    (name, gpu, f"tp{tp}", backend or "default", layout, registration),
                )
            )
            caches = allocate(p, device="cpu", registration=registration)
            cases[label] = case_of(p.kv_cache_config, p.cache_config, caches)
            del caches
    for derive, name, backend, registration, _ in DERIVED:
        p = planned(name, "A100", 1, backend)
        caches = allocate(p, device="cpu", registration=registration)
        derived = derive(p, caches)
        (changed,) = [layer for layer in caches if derived[layer] is not caches[layer]]
        cases[derive.__name__] = case_of(p.kv_cache_config, p.cache_config, derived)
        cases[derive.__name__]["changed"] = changed
    for label, mode, layout in (
        ("sliced_config", "align", "LBNHC"),
        # LMCache 0.4.7-0.5.4 keep snapshots for 'align' only
        ("sliced_config_mode_all", "all", "LBNHC"),
        # a heads-outermost layout LMCache 0.5.5 on cannot hint
        ("sliced_config_heads_outermost", "align", "LHBNC"),
    ):
        cfg, caches = sliced_config(mode, layout)
        cache_config = planned(QWEN, "A100", 1, None).cache_config
        cache_config.kv_cache_layout = layout
        cases[label] = case_of(cfg, cache_config, caches)
    # The same Mamba layer registered unified ([B, 1, 1, 1792] int8): its row
    # divides by the block, so 0.5.3 / 0.5.4's plain view succeeds when hinted.
    cfg, caches = sliced_config()
    row = torch.zeros(NUM_BLOCKS, 1, 1, 768 + 1024, dtype=torch.int8)
    for hint in (None, "NHD", "HND"):
        case = case_of(
            cfg, planned(QWEN, "A100", 1, None).cache_config, {**caches, "m": row}
        )
        if hint:
            case["hint"] = hint
        cases[f"unified_config-hint-{hint}"] = case
    # No prefix caching: vLLM keeps no Mamba snapshots (mode 'none'), which
    # every release's validation refuses.
    p = plan(QWEN, gpu="A100", num_blocks=NUM_BLOCKS, enable_prefix_caching=False)
    for registration in REGISTRATIONS:
        caches = allocate(p, device="cpu", registration=registration)
        cases[f"{QWEN}-no-prefix-caching-{registration}"] = case_of(
            p.kv_cache_config, p.cache_config, caches
        )
    # The hint LMCache 0.5.3 / 0.5.4 take from vLLM's get_kv_cache_layout(),
    # which vLLM 0.31-0.34 no longer have: given as NHD and HND, as an older
    # vLLM would report it.
    for name in HINTED_MODELS:
        p = planned(name, "A100", 1, None)
        caches = allocate(p, device="cpu", registration="unified")
        for hint in ("NHD", "HND"):
            case = case_of(p.kv_cache_config, p.cache_config, caches)
            case["hint"] = hint
            cases[f"{name}-unified-hint-{hint}"] = case
    return cases


HINTED_MODELS = (
    "Qwen/Qwen3.5-0.8B",
    "ibm-granite/granite-4.0-h-350m",
    "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
    "tiiuae/Falcon-H1-0.5B-Instruct",
    "state-spaces/mamba-130m-hf",
)


QWEN = "Qwen/Qwen3.5-0.8B"


@pytest.fixture(scope="session")
def oracle():
    """``(cases, {release: {case: LMCache's outcome}})`` for every release."""
    cases = _build_cases()
    labels = list(cases)
    try:
        outcomes = run_oracles(RELEASES, [cases[label] for label in labels])
    except OracleUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    return cases, {
        r: dict(zip(labels, outs, strict=True)) for r, outs in outcomes.items()
    }


def assert_same(release: str, theirs: dict, ours: dict, label: str) -> None:
    where = f"LMCache {release}, {label}"
    assert ours["rules"] == theirs["rules"], where
    assert (ours["validate"] is None) == (theirs["validate"] is None), (
        where, theirs["validate"], ours["validate"])  # fmt: skip
    if theirs["validate"] is not None:
        groups = sorted(
            int(g) for g in re.findall(r"group (\d+):", theirs["validate"][1])
        )
        assert groups == ours["rejected_groups"], where
        assert ours["validate"][0] == "KVExploreError", where
    assert ("hints" in theirs) == ("hints" in ours), where
    if "hints" in theirs:
        refused = isinstance(theirs["hints"], tuple)
        assert refused == isinstance(ours["hints"], tuple), (
            where,
            theirs["hints"],
            ours["hints"],
        )
        if not refused:
            assert ours["hints"] == theirs["hints"], where
    assert set(ours["layers"]) == set(theirs["layers"]), where
    for layer, (their_rule, their_view, their_error) in theirs["layers"].items():
        our_rule, our_view, our_error = ours["layers"][layer]
        assert our_rule == their_rule, (where, layer, their_rule, our_rule)
        assert (our_error is None) == (their_error is None), (
            where,
            layer,
            their_error,
            our_error,
        )
        assert our_view == their_view, (where, layer)
    assert ours["apply"][0] == theirs["apply"][0], (
        where,
        theirs["apply"],
        ours["apply"],
    )
    if theirs["apply"][0] == "ok":
        assert ours["apply"][1] == theirs["apply"][1], where
        assert ours["named"] == release, where
        if theirs["layers"]:
            assert ours["report_rules"] == {
                k: v[0] for k, v in theirs["layers"].items()
            }
        return
    assert ours["apply"][1][0] == "KVExploreError", (where, ours["apply"])
    failing = [
        layer for layer, (_, _, err) in theirs["layers"].items() if err is not None
    ]
    if (
        theirs["validate"] is None
        and not isinstance(theirs.get("hints"), tuple)
        and failing
    ):
        layer, rule = failing[0], theirs["layers"][failing[0]][0]
        assert f"layer {layer!r}" in ours["apply"][1][1], (where, ours["apply"])
        assert f"rule {rule!r}" in ours["apply"][1][1], (where, ours["apply"])


# -------------------------------------------------------------------- tests


def test_flashinfer_exclusions_hold():
    """The models left out of the FLASHINFER cases are the ones vLLM refuses there."""
    for name in sorted(FLASHINFER_REFUSED):
        for gpu in GPUS:
            with pytest.raises(KVExploreError, match="FLASHINFER"):
                planned(name, gpu, 1, "FLASHINFER")


def test_kvexplore_agrees_with_every_lmcache_release(oracle):
    """Every case, every release: kvexplore's answer is the release's own."""
    cases, outcomes = oracle
    compared = {r: 0 for r in RELEASES}
    for release in RELEASES:
        for label, case in cases.items():
            assert_same(
                release,
                outcomes[release][label],
                kvexplore_outcome(release, case),
                label,
            )
            compared[release] += 1
    assert all(n == len(cases) for n in compared.values()), compared


def _reached(outcomes: dict) -> tuple[set, set]:
    fired, refusals = set(), set()
    for outcome in outcomes.values():
        if outcome["validate"] is not None:
            refusals.add("validation")
        if isinstance(outcome.get("hints"), tuple):
            refusals.add("layout hint")
        for rule, _, error in outcome["layers"].values():
            if rule is not None and error is None:
                fired.add(rule)
            if error is not None:
                refusals.add(f"{rule}: {error[0]}")
    return fired, refusals


@pytest.mark.parametrize("release", RELEASES)
def test_the_cases_reach_every_rule_and_refusal(oracle, release):
    """The cases are not vacuous: every rule of every release re-views some
    layer, and some case is refused by validation and by a rule's apply."""
    _, outcomes = oracle
    fired, refusals = _reached(outcomes[release])
    assert set(LMCACHE_RELEASES[release].rules) <= fired, (release, fired)
    assert "validation" in refusals, (release, refusals)
    assert any(":" in r for r in refusals), (release, refusals)


@pytest.mark.parametrize(
    ("derive", "name", "backend", "registration", "lmcache_does"),
    DERIVED,
    ids=[derive.__name__ for derive, *_ in DERIVED],
)
def test_derived_registrations(
    oracle, derive, name, backend, registration, lmcache_does
):
    """A registration derived from a catalog plan's: each release refuses,
    leaves or re-views its changed layer as ``lmcache_does`` says (which keeps
    each derivation reaching the path it names), and kvexplore agrees."""
    cases, outcomes = oracle
    changed = cases[derive.__name__]["changed"]
    for release in RELEASES:
        theirs = outcomes[release][derive.__name__]
        if theirs["apply"][0] == "refused":
            does = "refuses"
        else:
            does = "leaves" if theirs["apply"][1][changed] == "same" else "edits"
        assert does == lmcache_does[release], (release, changed, theirs["apply"])
        assert_same(
            release,
            theirs,
            kvexplore_outcome(release, cases[derive.__name__]),
            derive.__name__,
        )


#: Deployments every vLLM release of the window registers for the per-release
#: run (the full catalog runs on the default release).
RELEASE_CASES = (
    ("Qwen/Qwen3.5-0.8B", "A100", None),
    ("Qwen/Qwen3.5-0.8B", "H100", "FLASHINFER"),
    ("nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "H100", None),
)
#: LMCache releases of the per-vLLM-release run: one of each rule set whose
#: answer can depend on the vLLM release (the first rules; the hint from
#: vLLM's get_kv_cache_layout; rank-4 attention and per-layer specs; the
#: pre-release).  Every release runs on the default vLLM release above.
RELEASE_RUN_LMCACHE = ("0.5.2", "0.5.4", "0.5.6", "0.5.7rc2")


@pytest.mark.release
def test_every_lmcache_release_on_this_vllm_release():
    """What this vLLM release registers (both registrations), under the
    LMCache releases of :data:`RELEASE_RUN_LMCACHE`, their own code beside
    kvexplore's answer for them."""
    cases = {}
    for name, gpu, backend in RELEASE_CASES:
        p = planned(name, gpu, 1, backend)
        for registration in REGISTRATIONS:
            caches = allocate(p, device="cpu", registration=registration)
            cases[f"{name}-{gpu}-{registration}"] = case_of(
                p.kv_cache_config, p.cache_config, caches
            )
    labels = list(cases)
    try:
        outcomes = run_oracles(RELEASE_RUN_LMCACHE, [cases[label] for label in labels])
    except OracleUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)
    for release in RELEASE_RUN_LMCACHE:
        for label, theirs in zip(labels, outcomes[release], strict=True):
            assert_same(
                release, theirs, kvexplore_outcome(release, cases[label]), label
            )
