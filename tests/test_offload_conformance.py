"""kvexplore's offload_config against the installed vLLM's own build_offloading_config.

For >= 500 reproducible random configurations across the bundled catalog (plus
hand-built KV cache configs for what the planner never produces: chunked-local
groups, groups without KV transfer, an empty cache, UniformTypeKVCacheSpecs,
extra retained sliding-window tokens, prefix_match_unit), each plan drawn
under OPTIONS_PER_PLAN offload-option sets drawn independently, both are
called with the same inputs: vLLM's function on the stand-in VllmConfig
with a real ParallelConfig / KVTransferConfig / KVEventsConfig.  The results
must be equal field by field; where vLLM raises or asserts, kvexplore must
raise a ValueError for the same rule, carrying the same numbers.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import re
import traceback
from collections import Counter

import pytest
from offload_reference import (
    VllmConfigStandIn,
    vllm_offload_inputs,
    vllm_parallel_config,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)

import kvexplore
from kvexplore.errors import KVExploreError
from kvexplore.offloading.config import (
    OffloadConfigError,
    offload_config,
)
from kvexplore.offloading.derive import STRICTER_CODES

pytestmark = pytest.mark.release

SEED = 20260433
N_COMPARED = 700  # offload comparisons (valid plans); plan-level DCP cases come on top
OPTIONS_PER_PLAN = 3  # offload-option sets drawn for each plan drawn

MODELS = kvexplore.catalog_names()
# weight the model families that matter most: MLA, sliding window, hybrid Mamba, dense GQA
WEIGHTED = MODELS + [
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-V3",
    "deepseek-ai/DeepSeek-V3",
    "Qwen/Qwen3.5-0.8B",
    "Qwen/Qwen3.5-0.8B",
    "openai/gpt-oss-20b",
    "google/gemma-3-1b-it",
    "meta-llama/Llama-3.1-8B-Instruct",
]


# ---------------------------------------------------------------------------
# classification of vLLM's exceptions
# ---------------------------------------------------------------------------


def vllm_code(exc: BaseException) -> str:
    """The kvexplore error code meaning the same as vLLM's exception."""
    msg = str(exc)
    if isinstance(exc, KVExploreError):  # vllm_parallel_config: ParallelConfig rejected
        return "parallel_config"
    if isinstance(exc, ZeroDivisionError):
        return "zero_chunk"
    if "no eligible cache groups" in msg:
        return "no_eligible_groups"
    if "not divisible by tokens_per_hash" in msg:
        return "tokens_per_hash"
    if "Specify only one of" in msg:
        return "both_chunk_keys"
    if "'blocks_per_chunk' must be greater than 0" in msg:
        return "blocks_per_chunk_not_positive"
    if "must be a multiple of the GPU KV cache block size" in msg:
        return "block_size_not_multiple"
    if "all groups must have the same block size" in msg:
        return "mixed_tokens_per_block"
    if "prefix_match_unit" in msg:
        return "prefix_match_unit"
    if isinstance(exc, (TypeError, ValueError)) and "int()" in msg:
        return "not_an_integer"
    if isinstance(exc, (ValueError, OverflowError)) and "cannot convert float" in msg:
        return "not_an_integer"  # int() of NaN or of an infinity
    if isinstance(exc, AssertionError):
        line = traceback.extract_tb(exc.__traceback__)[-1].line or ""
        if "FullAttentionSpec" in line:
            return "unsupported_spec"
        if "> 0" in line:
            return "invalid_window"
    return f"unclassified {type(exc).__name__}: {msg}"


def numbers(text: str) -> set[str]:
    return set(re.findall(r"-?\d+", text))


# ---------------------------------------------------------------------------
# synthetic plans: KV cache configs the planner never produces
# ---------------------------------------------------------------------------


def _with(p, kv_cache_config=None, cache_changes=None):
    """A plan the planner never makes: its vLLM objects and the frozen facts
    read from them replaced together."""
    from kvexplore.planning.planner import GroupInfo, TensorInfo

    vc = p.vllm_config
    cc = vc.cache_config
    if cache_changes:
        cc = copy.copy(cc)
        for k, v in cache_changes.items():
            setattr(cc, k, v)
    new_vc = VllmConfigStandIn(
        model_config=vc.model_config,
        cache_config=cc,
        parallel_config=vc.parallel_config,
    )
    kc = kv_cache_config or p.kv_cache_config
    groups = tuple(
        GroupInfo(i, tuple(g.layer_names), g.kv_cache_spec, p.kernel_block_sizes[0], None,
                  enable_kv_transfer=g.enable_kv_transfer)
        for i, g in enumerate(kc.kv_cache_groups)
    )
    tensors = tuple(TensorInfo(t.size, tuple(t.layers), t.layer_stride, t.block_stride, t.offset)
                    for t in kc.kv_cache_tensors)
    return dataclasses.replace(
        p, _vllm_config=new_vc, _kv_cache_config=kc, groups=groups, tensors=tensors,
        num_blocks=kc.num_blocks, prefix_match_unit=cc.prefix_match_unit,
    )


def synthetic_plans() -> dict[str, object]:
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        SlidingWindowSpec,
        UniformTypeKVCacheSpecs,
    )

    out = {}
    llama = kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", tensor_parallel_size=4, gpu="A100")
    kc = llama.kv_cache_config
    g = kc.kv_cache_groups[0]
    s = g.kv_cache_spec
    half = len(g.layer_names) // 2
    chunked = ChunkedLocalAttentionSpec(
        block_size=s.block_size,
        num_kv_heads=s.num_kv_heads,
        head_size=s.head_size,
        dtype=s.dtype,
        attention_chunk_size=8192,
    )

    def cfg(groups, num_blocks=kc.num_blocks, tensors=kc.kv_cache_tensors, **kw):
        return KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=list(tensors),
            kv_cache_groups=groups,
            kv_tp_replicas=kc.kv_tp_replicas,
            **kw,
        )

    out["chunked-local+full"] = _with(
        llama,
        cfg(
            [
                KVCacheGroupSpec(list(g.layer_names[:half]), s),
                KVCacheGroupSpec(list(g.layer_names[half:]), chunked),
            ]
        ),
    )
    out["no-transfer"] = _with(
        llama, cfg([KVCacheGroupSpec(list(g.layer_names), s, enable_kv_transfer=False)])
    )
    out["empty-cache"] = _with(llama, cfg([g], num_blocks=0, tensors=[]))
    out["uniform-no-tensors"] = _with(
        llama,
        cfg(
            [
                KVCacheGroupSpec(
                    list(g.layer_names[:4]),
                    UniformTypeKVCacheSpecs(
                        block_size=s.block_size,
                        kv_cache_specs={n: s for n in g.layer_names[:4]},
                    ),
                ),
                KVCacheGroupSpec(list(g.layer_names[4:]), s),
            ],
            tensors=[],
        ),
    )
    out["prefix-match-unit-single"] = _with(
        llama, cache_changes={"prefix_match_unit": 8}
    )

    oss = kvexplore.plan("openai/gpt-oss-20b", tensor_parallel_size=2, gpu="A100")
    okc = oss.kv_cache_config
    groups = [
        KVCacheGroupSpec(
            list(gr.layer_names),
            dataclasses.replace(gr.kv_cache_spec, extra_retained_tokens=40)
            if isinstance(gr.kv_cache_spec, SlidingWindowSpec)
            else gr.kv_cache_spec,
        )
        for gr in okc.kv_cache_groups
    ]
    out["sliding-extra-retained"] = _with(
        oss,
        KVCacheConfig(
            num_blocks=okc.num_blocks,
            kv_cache_tensors=list(okc.kv_cache_tensors),
            kv_cache_groups=groups,
            kv_tp_replicas=okc.kv_tp_replicas,
        ),
    )
    out["prefix-match-unit-multi-bad"] = _with(
        oss, cache_changes={"prefix_match_unit": 3}
    )
    out["prefix-match-unit-multi-ok"] = _with(
        oss, cache_changes={"prefix_match_unit": 8}
    )
    return out


# ---------------------------------------------------------------------------
# random cases
# ---------------------------------------------------------------------------


def _tokens_per_block(p) -> int:
    groups = p.kv_cache_config.kv_cache_groups
    dcp = p.vllm_config.parallel_config.decode_context_parallel_size
    if not groups:
        return 16
    spec = groups[-1].kv_cache_spec
    return spec.block_size * (dcp if spec.dcp_sharded else 1)


def random_extra(rng: random.Random, t: int):
    kind = rng.choice(
        [
            "none",
            "empty",
            "good-tokens",
            "good-tokens",
            "bad-tokens",
            "blocks",
            "blocks",
            "bad-blocks",
            "both",
            "zero-tokens",
            "negative-tokens",
            "string-blocks",
            "junk",
            "float-blocks",
            "string-tokens",
        ]
    )
    extra: dict | None
    if kind == "none":
        return None
    extra = {}
    if kind == "good-tokens":
        extra["block_size"] = t * rng.randint(1, 4)
    elif kind == "bad-tokens":
        extra["block_size"] = t * rng.randint(1, 3) + rng.randint(1, max(1, t - 1))
    elif kind == "blocks":
        extra["blocks_per_chunk"] = rng.randint(1, 8)
    elif kind == "bad-blocks":
        extra["blocks_per_chunk"] = rng.choice([0, -1, -3])
    elif kind == "both":
        extra.update(block_size=t, blocks_per_chunk=2)
    elif kind == "zero-tokens":
        extra["block_size"] = 0
    elif kind == "negative-tokens":
        extra["block_size"] = -t
    elif kind == "string-blocks":
        extra["blocks_per_chunk"] = str(rng.randint(1, 4))
    elif kind == "junk":
        extra[rng.choice(["block_size", "blocks_per_chunk"])] = rng.choice(
            ["abc", [2], "1.5"]
        )
    elif kind == "float-blocks":
        extra["blocks_per_chunk"] = 2.5
    elif kind == "string-tokens":
        extra["block_size"] = str(t * 2)
    r = rng.random()
    if r < 0.35:
        extra["canonical_layout"] = True
    elif r < 0.45:
        extra["canonical_layout"] = rng.choice([False, "yes", 0, 1])
    if rng.random() < 0.1:
        extra["spec_name"] = "CPUOffloadingSpec"
    return extra


def random_offload_kwargs(rng: random.Random, p) -> dict:
    """Options drawn at random; the parallel sizes TP, PP, DP and DCP are the plan's."""
    pc = p.vllm_config.parallel_config
    tp, pp, dp = pc.tensor_parallel_size, pc.pipeline_parallel_size, pc.data_parallel_size
    pcp = rng.choice([1, 1, 1, 1, 2])
    backend = rng.choice(["mp"] * 5 + ["uni", "ray", "external_launcher", None])
    nnodes = rng.choice([1, 1, 1, 2])
    world = pp * tp * pcp * (dp if backend == "external_launcher" else 1)
    return dict(
        extra_config=random_extra(rng, _tokens_per_block(p)),
        prefill_context_parallel_size=pcp,
        data_parallel_rank=rng.randrange(dp),
        distributed_executor_backend=backend,
        nnodes_within_dp=nnodes,
        use_v2_model_runner=rng.random() < 0.2,
        enable_kv_cache_events=rng.random() < 0.3,
        rank=rng.randrange(world),
        engine_id=f"engine-{rng.randrange(4)}",
    )


def random_plan_kwargs(rng: random.Random) -> dict:
    kw = dict(
        tensor_parallel_size=rng.choice([1, 1, 2, 4, 8, 16]),
        decode_context_parallel_size=rng.choice([1, 1, 1, 2, 4]),
        kv_cache_dtype=rng.choice(["auto", "auto", "fp8"]),
    )
    pp = rng.choice([1, 1, 1, 1, 1, 1, 2, 4])
    if pp > 1:
        kw["pipeline_parallel_size"] = pp
        kw["pipeline_parallel_rank"] = rng.randrange(pp)
    if rng.random() < 0.2:
        kw["data_parallel_size"] = 2
    if rng.random() < 0.15:
        kw["block_size"] = rng.choice([16, 32, 64])
    if rng.random() < 0.1:
        kw["enable_prefix_caching"] = False
    elif rng.random() < 0.1:
        kw["mamba_cache_mode"] = "none"
    return kw


def _fractional(value) -> bool:
    return isinstance(value, float) and not value.is_integer()


def stricter_reason(code: str, extra: dict, theirs, their_err) -> bool:
    """Whether kvexplore's refusal ``code`` (one of STRICTER_CODES) is for
    what it says, where vLLM returned ``theirs`` or raised ``their_err``."""
    if code == "not_a_whole_number":
        return any(_fractional(extra.get(k)) for k in ("block_size", "blocks_per_chunk"))
    if code == "block_size_not_positive":
        if their_err is not None:
            return vllm_code(their_err) == "zero_chunk"
        return theirs.cache.blocks_per_chunk <= 0
    if code == "canonical_layout_not_bool":
        raw = extra.get("canonical_layout")
        return not isinstance(raw, bool) and raw not in (0, 1)
    return False


def compare(p, kw) -> tuple[str, str | None]:
    """('equal' | 'both-raise:<code>' | 'stricter:<code>', failure or None).

    'stricter': vLLM returns (or fails later, dividing by zero) on an extra
    config no backend could use, which kvexplore refuses by one of
    STRICTER_CODES; the code must be for a value of that kind."""
    before = copy.deepcopy(kw["extra_config"])
    try:
        mine, mine_err = offload_config(p, **kw), None
    except KVExploreError as exc:
        mine, mine_err = None, exc
    except Exception as exc:  # noqa: BLE001 - anything else is a kvexplore bug
        return "escaped", f"kvexplore let {type(exc).__name__} escape: {exc}"
    if kw["extra_config"] != before:
        return "mutated", f"extra_config mutated: {before} -> {kw['extra_config']}"
    try:
        vc, kc = vllm_offload_inputs(p, **copy.deepcopy(kw))
        theirs, their_err = build_offloading_config(vc, kc), None
    except Exception as exc:  # noqa: BLE001 - vLLM raises many types
        theirs, their_err = None, exc
    code = getattr(mine_err, "code", None)
    if code in STRICTER_CODES and (their_err is None or vllm_code(their_err) == "zero_chunk"):
        if stricter_reason(code, kw["extra_config"] or {}, theirs, their_err):
            return f"stricter:{code}", None
        return "mismatch", f"kvexplore refused ({mine_err}) a value vLLM's {theirs or their_err} shows is not of that kind"
    if their_err is None:
        if mine_err is not None:
            return "mismatch", f"vLLM returned, kvexplore raised {mine_err}"
        a, b = dataclasses.asdict(mine.config), dataclasses.asdict(theirs)
        if a != b or mine.config != theirs:
            diff = {k: (a[k], b[k]) for k in a if a[k] != b.get(k)}
            return "mismatch", f"fields differ (kvexplore, vLLM): {diff}"
        return "equal", None
    code = vllm_code(their_err)
    if mine_err is None:
        return "mismatch", f"vLLM raised {code} ({their_err}); kvexplore returned"
    if code == "parallel_config":
        ok = not isinstance(mine_err, OffloadConfigError)
        return (
            f"both-raise:{code}",
            None if ok else f"expected an input error, got {mine_err!r}",
        )
    if not isinstance(mine_err, OffloadConfigError) or mine_err.code != code:
        return "mismatch", f"vLLM: {code} ({their_err}); kvexplore: {mine_err!r}"
    if code != "not_an_integer":
        missing = numbers(str(their_err)) - numbers(str(mine_err))
        if missing:
            return (
                "mismatch",
                f"numbers {missing} of vLLM's message missing from {mine_err}",
            )
    return f"both-raise:{code}", None


def plan_level_dcp_case(model: str, tp: int, dcp: int) -> tuple[str, str | None]:
    """Invalid TP/DCP: plan(gpu="A100") must raise where vLLM's own checks raise."""
    from vllm.config import ModelConfig, ParallelConfig

    path = str(kvexplore.load_model_config(model).config_dir)
    try:
        ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp)
        ModelConfig(model=path, tokenizer=path, skip_tokenizer_init=True).verify_with_parallel_config(
            ParallelConfig(tensor_parallel_size=tp, decode_context_parallel_size=dcp)
        )
        vllm_ok = True
    except Exception:  # noqa: BLE001
        vllm_ok = False
    try:
        kvexplore.plan(model, tensor_parallel_size=tp, decode_context_parallel_size=dcp, gpu="A100")
        mine_ok = True
    except KVExploreError as exc:
        mine_ok = False
        # vLLM's model classes refuse some sizes these config-level checks
        # accept (a vision tower's heads over TP, DCP with sliding window,
        # DCP over zero KV heads per rank): the planner builds them
        if vllm_ok and any(
            why in str(exc)
            for why in ("is not divisible by", "DCP not support sliding window", "ZeroDivisionError")
        ):
            return "dcp-model-refuses", None
    if vllm_ok != mine_ok:
        return (
            "mismatch",
            f"{model} TP {tp} DCP {dcp}: vLLM ok={vllm_ok}, kvexplore ok={mine_ok}",
        )
    return ("dcp-valid" if vllm_ok else "dcp-invalid"), None


@pytest.fixture(scope="module")
def outcomes():
    rng = random.Random(SEED)
    # each drawn plan's GPU blocks, from a stream of their own: the offloading
    # config reads the blocks, not how vLLM sized them (no memory profile runs)
    blocks = random.Random(SEED + 1)
    synth = synthetic_plans()
    records = []  # (label, case description, outcome, failure, plan, kwargs)
    compared = 0
    attempts = 0
    while compared < N_COMPARED:
        attempts += 1
        assert attempts < 20 * N_COMPARED, "could not draw enough valid plans"
        if rng.random() < 0.1:
            label = rng.choice(sorted(synth))
            p = synth[label]
        else:
            label = rng.choice(WEIGHTED)
            pkw = random_plan_kwargs(rng)
            try:
                p = kvexplore.plan(label, **pkw, gpu="A100",
                                   num_blocks=blocks.choice([1, 2, 17, 1000, 65_537, 400_000]))
            except KVExploreError:
                continue
            except ZeroDivisionError:
                # planner gap: vLLM's verify_with_parallel_config divides by the
                # 0 KV heads of an attention-free model when DCP > 1
                continue
        for _ in range(min(OPTIONS_PER_PLAN, N_COMPARED - compared)):
            kw = random_offload_kwargs(rng, p)
            outcome, failure = compare(p, kw)
            records.append((label, outcome, failure, p, kw))
            compared += 1
    # DCP at plan level: valid and invalid combinations (GQA needs TP > KV heads)
    for model, tp, dcp in [
        ("Qwen/Qwen3.5-0.8B", 2, 2),
        ("Qwen/Qwen3.5-0.8B", 4, 2),
        ("Qwen/Qwen3.5-0.8B", 4, 4),
        ("Qwen/Qwen3.5-0.8B", 8, 4),
        ("meta-llama/Llama-3.1-8B-Instruct", 8, 2),
        ("meta-llama/Llama-3.1-8B-Instruct", 16, 2),
        ("google/gemma-3-1b-it", 2, 2),
        ("google/gemma-3-1b-it", 1, 2),
        ("deepseek-ai/DeepSeek-V3", 4, 2),
        ("deepseek-ai/DeepSeek-V3", 2, 4),
        ("openai/gpt-oss-20b", 16, 2),
        ("openai/gpt-oss-20b", 8, 2),
    ]:
        outcome, failure = plan_level_dcp_case(model, tp, dcp)
        records.append((model, outcome, failure, None, {"tp": tp, "dcp": dcp}))
    return records


def test_at_least_500_offload_comparisons(outcomes):
    compared = [r for r in outcomes if r[3] is not None]
    assert len(compared) >= 500


def test_kvexplore_equals_vllm(outcomes):
    failures = [
        f"{label} {p!r} {kw}: {failure}"
        for label, _, failure, p, kw in outcomes
        if failure is not None
    ]
    assert not failures, (
        f"{len(failures)} of {len(outcomes)} cases differ:\n" + "\n".join(failures[:20])
    )


def test_coverage_of_the_issue_cases(outcomes):
    """The random draw must hit every configuration class listed here."""
    seen = Counter()
    for _label, outcome, _, p, kw in outcomes:
        seen[outcome.split(":")[0]] += 1
        if outcome.startswith(("both-raise:", "stricter:")):
            seen[outcome] += 1
        if p is None:
            seen[outcome] += 1
            continue
        pc = p.vllm_config.parallel_config
        tp, dcp = pc.tensor_parallel_size, pc.decode_context_parallel_size
        specs = {
            type(g.kv_cache_spec).__name__ for g in p.kv_cache_config.kv_cache_groups
        }
        extra = kw["extra_config"] or {}
        if outcome != "equal":
            continue
        if p.model_config.use_mla and tp > 1:
            seen["mla-tp>1"] += 1
            if p.kv_cache_config.kv_tp_replicas == tp:
                seen["mla-replicated-kv"] += 1
        seen["canonical-on" if extra.get("canonical_layout") else "canonical-off"] += 1
        seen["dcp>1"] += dcp > 1
        seen["pp>1"] += pc.pipeline_parallel_size > 1
        seen["pcp>1"] += kw["prefill_context_parallel_size"] > 1
        seen["dp>1"] += pc.data_parallel_size > 1
        seen["multi-node"] += kw["nnodes_within_dp"] > 1
        seen["extra-block_size"] += "block_size" in extra
        seen["extra-blocks_per_chunk"] += "blocks_per_chunk" in extra
        seen["sliding"] += "SlidingWindowSpec" in specs
        seen["chunked-local"] += "ChunkedLocalAttentionSpec" in specs
        seen["mamba"] += "MambaSpec" in specs
        seen["v2"] += kw["use_v2_model_runner"]
    # replicated_layout True and both is_parallelism_agnostic values really occur
    results = [
        offload_config(p, **kw)
        for _, outcome, _, p, kw in outcomes
        if outcome == "equal"
    ]
    seen["replicated-true"] = sum(r.config.replicated_layout for r in results)
    seen["agnostic-true"] = sum(
        r.config.parallel.is_parallelism_agnostic for r in results
    )
    seen["agnostic-false"] = sum(
        not r.config.parallel.is_parallelism_agnostic for r in results
    )
    seen["canonical-replicated"] = sum(
        r.config.replicated_layout and r.config.canonical_layout for r in results
    )
    need = [
        "equal",
        "mla-tp>1",
        "mla-replicated-kv",
        "canonical-on",
        "canonical-off",
        "dcp>1",
        "pp>1",
        "pcp>1",
        "dp>1",
        "multi-node",
        "extra-block_size",
        "extra-blocks_per_chunk",
        "sliding",
        "chunked-local",
        "mamba",
        "v2",
        "replicated-true",
        "agnostic-true",
        "agnostic-false",
        "canonical-replicated",
        "dcp-valid",
        "dcp-invalid",
        "both-raise:both_chunk_keys",
        "both-raise:blocks_per_chunk_not_positive",
        "both-raise:block_size_not_multiple",
        "both-raise:mixed_tokens_per_block",
        "both-raise:not_an_integer",
        "both-raise:no_eligible_groups",
        "both-raise:tokens_per_hash",
        "both-raise:unsupported_spec",
        "both-raise:prefix_match_unit",
        *(f"stricter:{code}" for code in STRICTER_CODES),
        "both-raise:parallel_config",
    ]
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        config as offloading,
    )

    if not hasattr(offloading, "get_sliding_window_size_in_chunks"):
        # a release that bounds no group by a window in chunks refuses neither
        need = [k for k in need if k != "both-raise:unsupported_spec"]
    missing = [k for k in need if seen[k] == 0]
    assert not missing, f"never drawn: {missing}; seen: {dict(seen)}"


def test_vllm_parallel_config_matches_the_rules():
    """The ParallelConfig the comparisons use really has the requested shape."""
    p = kvexplore.plan("meta-llama/Llama-3.1-8B-Instruct", tensor_parallel_size=2, gpu="A100",
                       pipeline_parallel_size=2, data_parallel_size=2)
    pc = vllm_parallel_config(
        p,
        data_parallel_rank=1,
        nnodes_within_dp=2,
    )
    assert (pc.world_size, pc.nnodes_within_dp, pc.data_parallel_index) == (4, 2, 1)
    assert (pc.pipeline_parallel_size, pc.data_parallel_size) == (2, 2)
    assert pc.data_parallel_rank_local is None
    ext = vllm_parallel_config(
        p.replace(pipeline_parallel_size=1),
        data_parallel_rank=1,
        distributed_executor_backend="external_launcher",
    )
    assert (ext.world_size, ext.data_parallel_index) == (4, 1)


def one_rank_kwargs(extra_config: dict) -> dict:
    """:func:`compare`'s keywords for ``extra_config`` on one rank of one
    engine (no PCP, DP rank 0, the mp executor, Model Runner V1, no KV events)."""
    return dict(
        extra_config=extra_config,
        prefill_context_parallel_size=1,
        data_parallel_rank=0,
        distributed_executor_backend="mp",
        nnodes_within_dp=1,
        use_v2_model_runner=False,
        enable_kv_cache_events=False,
        rank=0,
        engine_id="engine-0",
    )


def test_a_later_refusal_of_vllm_comes_before_a_stricter_one():
    """whisper-small's cross-attention group is no spec vLLM's offloading
    supports: vLLM's int() truncates ``blocks_per_chunk=2.5`` to 2 (and
    ``-2.5`` to -2, which it refuses), takes ``block_size=0`` as 0 blocks per
    chunk, then asserts on the spec (where the release keeps a window per
    group).  Each pair of answers must be one the comparison accepts, naming
    the rule vLLM applies first."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading import (
        config as offloading,
    )

    windows = hasattr(offloading, "get_sliding_window_size_in_chunks")
    p = kvexplore.plan("openai/whisper-small", gpu="A100")
    assert {type(g.kv_cache_spec).__name__ for g in p.kv_cache_config.kv_cache_groups} == {
        "FullAttentionSpec",
        "CrossAttentionSpec",
    }
    expected = {
        2.5: "both-raise:unsupported_spec" if windows else "stricter:not_a_whole_number",
        -2.5: "both-raise:blocks_per_chunk_not_positive",
        0: "both-raise:unsupported_spec" if windows else "stricter:block_size_not_positive",
    }
    for value, want in expected.items():
        key = "block_size" if value == 0 else "blocks_per_chunk"
        outcome, failure = compare(p, one_rank_kwargs({key: value}))
        assert (outcome, failure) == (want, None), (value, outcome, failure)


def test_nan_and_infinity_are_refused_as_vllm_refuses_them():
    """``int()`` raises on NaN (ValueError) and on the infinities
    (OverflowError): vLLM's ``build_offloading_config`` fails on either as a
    chunk size, and kvexplore refuses it by name as not an integer (never a
    bare ValueError or OverflowError)."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    for key in ("block_size", "blocks_per_chunk"):
        for value in (math.nan, math.inf, -math.inf):
            outcome, failure = compare(p, one_rank_kwargs({key: value}))
            assert (outcome, failure) == ("both-raise:not_an_integer", None), (key, value)
