"""The installed vLLM release: which one it is, whether kvexplore answers for
it, and where that release keeps the functions kvexplore runs.

kvexplore plans with the vLLM installed beside it, every answer coming from
that release's own code.  Releases move functions between modules and change
their signatures; this module is the one place that finds each function by
what the installed vLLM has (a module, a function, a parameter, a field),
never by comparing version strings.  Only :func:`installed_release` reads the
version, to refuse a release outside :data:`WINDOW` before anything runs.

>>> WINDOW
('0.31.0', '0.35')
>>> installed_release().version in WINDOW_RELEASES
True
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from kvexplore.errors import KVExploreError
from kvexplore.version import parse_release

#: The releases kvexplore answers for: at least the first, below the second.
WINDOW = ("0.31.0", "0.35")

#: The releases of the window that kvexplore's per-release tests run.
WINDOW_RELEASES = ("0.31.0", "0.32.0", "0.33.0", "0.34.0")

#: The releases a comparison across releases names when none are given
#: (``compare_versions``, ``kvexplore versions``): the window's newest two.
COMPARED_RELEASES = WINDOW_RELEASES[-2:]

#: The window as a pip requirement (``pyproject.toml`` and ``environment.yml``
#: declare the same).
REQUIREMENT = f"vllm>={WINDOW[0]},<{WINDOW[1]}"

#: Requirements a release pins that the package index does not serve, with the
#: release installed instead.  vLLM 0.34.0 pins ``flashinfer-python==0.7.3``,
#: which is not published; kvexplore never runs a FlashInfer kernel (it imports
#: the package only where vLLM does at configuration time), so the 0.34.0
#: environment takes 0.7.2.post1, the release vLLM 0.33.0 pins.
INSTALL_OVERRIDES: dict[str, tuple[str, ...]] = {
    "0.34.0": ("flashinfer-python==0.7.2.post1",),
}


def window_text() -> str:
    return f"vLLM {WINDOW[0]} up to (not including) {WINDOW[1]}"


def in_window(version: str) -> bool:
    """Whether ``version`` (a PEP 440 string) lies in :data:`WINDOW`."""
    try:
        v = Version(version)
    except ValueError:
        return False
    return Version(WINDOW[0]) <= v < Version(WINDOW[1])


def canonical_release(version: Any) -> str:
    """The one spelling of a vLLM release of the window: PEP 440's normal
    form with at least three release numbers, so ``"0.34"``, ``"v0.34.0"``
    and ``" 0.34.0"`` are all ``"0.34.0"`` (the name of its environment
    folder and the ``vllm==`` it installs).  Refused with a
    :class:`KVExploreError` naming the value and the window: anything but a
    version string, or a release outside the window."""
    expected = f"expected a release of {window_text()} such as {WINDOW_RELEASES[-1]!r}"
    if not isinstance(version, str):
        raise KVExploreError(f"vLLM release {version!r} is invalid; {expected}")
    v = parse_release(version)
    if v is None:
        raise KVExploreError(f"vLLM release {version!r} is not a version; {expected}")
    numbers = (*v.release, 0, 0)[: max(3, len(v.release))]
    text = ".".join(str(n) for n in numbers) + str(v)[len(v.base_version):]
    if v.epoch:
        text = f"{v.epoch}!{text}"
    if not in_window(text):
        raise KVExploreError(f"vLLM release {version!r} is outside kvexplore's window; {expected}")
    return text


@dataclass(frozen=True)
class Release:
    """The installed vLLM: ``version`` as its package metadata gives it."""

    version: str

    @property
    def name(self) -> str:
        """``"vLLM 0.34.0"``: how answers name the release they came from."""
        return f"vLLM {self.version}"

    def __str__(self) -> str:
        return self.name


@functools.cache
def installed_release() -> Release:
    """The installed vLLM release, refused with a :class:`KVExploreError`
    naming it and the window when it lies outside :data:`WINDOW` or is
    missing."""
    try:
        version = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        raise KVExploreError(
            f"vLLM is not installed; kvexplore answers for {window_text()} "
            f"(pip install '{REQUIREMENT}')"
        ) from None
    if not in_window(version):
        raise KVExploreError(
            f"the installed vLLM is {version}; kvexplore answers for {window_text()} "
            f"(pip install '{REQUIREMENT}'), never with another release's rules"
        )
    return Release(version)


def release_name() -> str:
    """:attr:`Release.name` of the installed release (``"vLLM 0.33.0"``)."""
    return installed_release().name


def _mismatch(what: str) -> KVExploreError:
    return KVExploreError(
        f"the installed vLLM {installed_release().version} has no {what}: its internals "
        f"do not match any release of the window ({window_text()}); reinstall vLLM "
        f"('{REQUIREMENT}')"
    )


def _first(candidates: tuple[tuple[str, str], ...], what: str):
    """The first ``(module, name)`` of ``candidates`` the installed vLLM has."""
    for module, name in candidates:
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        if hasattr(mod, name):
            return mod, getattr(mod, name)
    raise _mismatch(what)


# ---------------------------------------------------------------------------
# The engine core's KV cache planning
# ---------------------------------------------------------------------------


@functools.cache
def kv_cache_planning():
    """The module that holds ``get_kv_cache_configs`` and the admission check
    ``_check_enough_kv_cache_memory``: ``vllm/v1/core/kv_cache_planning.py``
    where it exists, else ``vllm/v1/core/kv_cache_utils.py``."""
    module, _ = _first(
        (("vllm.v1.core.kv_cache_planning", "get_kv_cache_configs"),
         ("vllm.v1.core.kv_cache_utils", "get_kv_cache_configs")),
        "get_kv_cache_configs",
    )
    if not hasattr(module, "_check_enough_kv_cache_memory"):
        raise _mismatch("_check_enough_kv_cache_memory beside get_kv_cache_configs")
    return module


def global_kv_cache_groups(vc, workers: list[dict]) -> list | None:
    """The engine core's groups over ``workers`` (one spec dict per worker:
    ``get_global_kv_cache_groups``) where the release groups layers before
    ``get_kv_cache_configs``; ``None`` where ``get_kv_cache_configs`` groups
    them itself."""
    fn = getattr(kv_cache_planning(), "get_global_kv_cache_groups", None)
    return None if fn is None else fn(vc, workers)


def kv_cache_configs(vc, workers: list[dict], memory: list[int], groups: list | None) -> list:
    """``get_kv_cache_configs`` over ``workers`` (one spec dict and one memory
    per worker), called as the release's engine core calls it (with the
    global groups where it takes them): one ``KVCacheConfig`` per worker."""
    fn = kv_cache_planning().get_kv_cache_configs
    if groups is None:
        return fn(vc, workers, memory)
    return fn(vc, workers, memory, list(groups))


def finish_groups(vc, groups: list | None) -> None:
    """What the release's engine core runs on the global groups before memory
    is profiled (``adjust_dcp_kv_cache_interleave_size``) and what the config
    checks after (``validate_block_size``), where the release has them."""
    adjust = getattr(vc, "adjust_dcp_kv_cache_interleave_size", None)
    if adjust is not None and groups is not None:
        adjust(groups)
    validate = getattr(vc, "validate_block_size", None)
    if validate is not None:
        validate()


# ---------------------------------------------------------------------------
# The worker
# ---------------------------------------------------------------------------


def uses_v2_model_runner(vc) -> bool:
    """Whether the worker runs Model Runner V2: ``VllmConfig.use_v2_model_runner``
    where the release still has the V1 runner (:func:`has_v1_model_runner`),
    else always."""
    return not has_v1_model_runner() or bool(vc.use_v2_model_runner)


def runner_kv_cache_spec(vc) -> dict:
    """The model runner's ``get_kv_cache_spec``: Model Runner V2's
    (``vllm/v1/worker/gpu/attn_utils.py``) unless the release has the V1
    runner and the config chooses it (:func:`uses_v2_model_runner`)."""
    if uses_v2_model_runner(vc):
        _, fn = _first((("vllm.v1.worker.gpu.attn_utils", "get_kv_cache_spec"),),
                       "Model Runner V2 get_kv_cache_spec")
        return fn(vc)
    from types import SimpleNamespace

    _, runner_cls = _first((("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),),
                           "GPUModelRunner")
    runner = SimpleNamespace(vllm_config=vc, shared_kv_cache_layers={})
    return runner_cls.get_kv_cache_spec(runner)


def builds_no_draft_model(spec) -> bool:
    """Whether a ``SpeculativeConfig`` drafts by n-gram lookup, with no draft
    model (``SpeculativeConfig.use_ngram()``; a release without it names the
    method ``"ngram"``)."""
    use_ngram = getattr(spec, "use_ngram", None)
    return bool(use_ngram()) if use_ngram is not None else spec.method == "ngram"


def init_speculator(vc, device):
    """Model Runner V2's ``init_speculator`` (``vllm/v1/worker/gpu/spec_decode/
    __init__.py``), with no request state where the release asks for one."""
    _, fn = _first((("vllm.v1.worker.gpu.spec_decode", "init_speculator"),),
                   "Model Runner V2 init_speculator")
    if "req_states" in inspect.signature(fn).parameters:
        return fn(vc, device, None)
    return fn(vc, device)


def triton_flags() -> list[tuple[Any, str]]:
    """``(module, "HAS_TRITON")`` for every module whose flag decides the model
    runner or a layer's kernel at config time (``vllm/config/vllm.py`` where
    it imports the flag)."""
    out = []
    for name in ("vllm.config.vllm",):
        mod = importlib.import_module(name)
        if "HAS_TRITON" in vars(mod):
            out.append((mod, "HAS_TRITON"))
    return out


def prefill_checkpoint_alignment(vc) -> int | None:
    """``get_mamba_prefill_checkpoint_alignment`` (``vllm/model_executor/
    layers/mamba/abstract.py``): the token alignment the built Mamba layers
    ask of the block size; ``None`` where the release has no such function
    (its layers ask for none)."""
    from vllm.model_executor.layers.mamba import abstract

    fn = getattr(abstract, "get_mamba_prefill_checkpoint_alignment", None)
    return None if fn is None else fn(vc)


def kv_cache_dtypes() -> tuple[str, ...]:
    """The ``--kv-cache-dtype`` choices of the release (``CacheDType``)."""
    from typing import get_args

    from vllm.config.cache import CacheDType

    return tuple(get_args(CacheDType))


@functools.cache
def engine_argument_names() -> frozenset[str]:
    """The fields of the release's ``EngineArgs`` (``vllm/engine/arg_utils.py``)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return frozenset(f.name for f in dataclasses.fields(EngineArgs))


def require_engine_arguments(given: dict[str, Any]) -> None:
    """Refuse ``given`` engine keywords the release's ``EngineArgs`` has no
    field for, naming the release, the keyword and its value."""
    missing = [name for name in given if name not in engine_argument_names()]
    if missing:
        shown = ", ".join(f"{name}={given[name]!r}" for name in missing)
        raise KVExploreError(
            f"{release_name()} has no engine argument {', '.join(missing)} (its EngineArgs "
            f"has no such field), so it cannot plan {shown}; leave "
            f"{'it' if len(missing) == 1 else 'them'} unset with this release"
        )


def quantization_methods() -> tuple[str, ...]:
    """The ``--quantization`` choices of the release (``QUANTIZATION_METHODS``
    of ``vllm/model_executor/layers/quantization/__init__.py``)."""
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return tuple(QUANTIZATION_METHODS)


def _known_pool(pool_bytes: int):
    """A stand-in for vLLM's config builder that answers the pool's bytes per
    block id (``KVCacheConfigBuilder._get_pool_bytes_per_block``), the one
    thing the builder-taking pool arithmetic asks it: the known value spares
    a probe block on every step of the estimate's search."""
    from types import SimpleNamespace

    return SimpleNamespace(_get_pool_bytes_per_block=lambda _vc, _groups: pool_bytes)


def _takes_builder(fn) -> bool:
    """Whether a pool-arithmetic function takes the config builder first."""
    return next(iter(inspect.signature(fn).parameters)) == "builder"


def pool_bytes_per_block(vc, groups: list) -> int:
    """Bytes one block id costs in the worker's KV cache pool: the divisor
    ``get_kv_cache_configs`` turns a worker's memory into ``num_blocks`` with,
    over ``groups`` (``KVCacheGroupSpec`` list).  Where the release keeps it:

    * 0.33.0 on: ``vllm/v1/core/kv_cache_planning.py:
      _pool_bytes_per_block_from_builder`` with the builder of
      ``vllm/v1/core/kv_cache_config_builder.py: get_kv_cache_config_builder``
      (one probe block placed);
    * 0.32.0: ``vllm/v1/core/kv_cache_utils.py: _pool_bytes_per_block(vllm_config,
      kv_cache_groups)`` (aligned for the resolved KV cache layout);
    * 0.31.0: ``vllm/v1/core/kv_cache_utils.py: _pool_bytes_per_block(kv_cache_groups)``.

    Run it where the platform answers as the GPU."""
    module = kv_cache_planning()
    fn = getattr(module, "_pool_bytes_per_block_from_builder", None)
    if fn is not None:
        _, get_builder = _first(
            (("vllm.v1.core.kv_cache_config_builder", "get_kv_cache_config_builder"),),
            "get_kv_cache_config_builder beside _pool_bytes_per_block_from_builder")
        return int(fn(get_builder(vc), vc, list(groups)))
    fn = getattr(module, "_pool_bytes_per_block", None)
    if fn is None:
        raise _mismatch("_pool_bytes_per_block beside get_kv_cache_configs")
    if "vllm_config" in inspect.signature(fn).parameters:
        return int(fn(vc, list(groups)))
    return int(fn(list(groups)))


def max_memory_usage_bytes_from_groups(vc, groups: list, pool_bytes: int) -> int:
    """Bytes one request of ``vc``'s ``max_model_len`` takes from the pool over
    ``groups`` (``pool_bytes`` per block id, :func:`pool_bytes_per_block`):
    ``_max_memory_usage_bytes_from_groups``, the need ``get_kv_cache_configs``
    admits a request by.  Where the release keeps it:

    * 0.33.0 on: ``vllm/v1/core/kv_cache_planning.py``, taking the config
      builder first (given one that answers ``pool_bytes``);
    * 0.31.0 and 0.32.0: ``vllm/v1/core/kv_cache_utils.py``, taking
      ``(vllm_config, kv_cache_groups)`` (it computes the pool bytes itself)."""
    fn = getattr(kv_cache_planning(), "_max_memory_usage_bytes_from_groups", None)
    if fn is None:
        raise _mismatch("_max_memory_usage_bytes_from_groups beside get_kv_cache_configs")
    if _takes_builder(fn):
        return int(fn(_known_pool(pool_bytes), vc, list(groups)))
    return int(fn(vc, list(groups)))


def max_model_len_estimator(vc, groups: list, pool_bytes: int):
    """``estimate(available_bytes) -> int``: the longest ``max_model_len`` that
    memory admits over ``groups`` (a binary search up to ``vc``'s
    ``max_model_len``; 0 when one token does not fit), the estimate
    ``get_kv_cache_configs`` hands its admission check:
    ``_estimate_max_model_len_from_groups``.  Where the release keeps it:

    * 0.33.0 on: ``vllm/v1/core/kv_cache_planning.py``, taking the config
      builder first (given one that answers ``pool_bytes``);
    * 0.31.0 and 0.32.0: ``vllm/v1/core/kv_cache_utils.py``, taking
      ``(vllm_config, kv_cache_groups, available_memory)``."""
    fn = getattr(kv_cache_planning(), "_estimate_max_model_len_from_groups", None)
    if fn is None:
        raise _mismatch("_estimate_max_model_len_from_groups beside get_kv_cache_configs")
    if _takes_builder(fn):
        return functools.partial(fn, _known_pool(pool_bytes), vc, list(groups))
    return functools.partial(fn, vc, list(groups))


def cache_hit_alignment_tokens(cfg, vc, scheduler_block_size: int, hash_block_size: int) -> int:
    """The token granularity prefix-cache hits land on for the scheduler's
    ``KVCacheConfig`` ``cfg`` (block sizes from ``resolve_kv_cache_block_sizes``).
    Where the release keeps it:

    * 0.32.0 on: ``vllm/v1/core/kv_cache_utils.py:
      resolve_cache_hit_alignment_tokens``;
    * 0.31.0: the coordinator's ``_cache_hit_alignment_tokens``
      (``vllm/v1/core/kv_cache_coordinator.py``), read from the coordinator
      ``get_kv_cache_coordinator`` builds for ``cfg`` as the release's
      ``KVCacheManager`` asks for it (a pool of a few blocks: the alignment
      does not depend on the pool's size)."""
    from vllm.v1.core import kv_cache_utils

    fn = getattr(kv_cache_utils, "resolve_cache_hit_alignment_tokens", None)
    if fn is not None:
        return int(fn(cfg, vc, scheduler_block_size, hash_block_size))
    import dataclasses

    _, get_coordinator = _first(
        (("vllm.v1.core.kv_cache_coordinator", "get_kv_cache_coordinator"),),
        "get_kv_cache_coordinator")
    cc, pc = vc.cache_config, vc.parallel_config
    coordinator = get_coordinator(
        kv_cache_config=dataclasses.replace(cfg, num_blocks=len(cfg.kv_cache_groups) + 2),
        max_model_len=vc.model_config.max_model_len,
        max_in_flight_tokens=getattr(vc, "max_in_flight_tokens", None),
        use_eagle=False,
        enable_caching=bool(cc.enable_prefix_caching),
        enable_kv_cache_events=False,
        dcp_world_size=pc.decode_context_parallel_size,
        pcp_world_size=getattr(pc, "prefill_context_parallel_size", 1),
        scheduler_block_size=scheduler_block_size,
        hash_block_size=hash_block_size,
    )
    alignment = getattr(coordinator, "_cache_hit_alignment_tokens", None)
    return int(scheduler_block_size if alignment is None else alignment)


def total_num_hidden_layers(model_config) -> int:
    """The model's decoder layers as the release counts them, the number
    ``get_pp_indices`` splits over pipeline stages
    (``ModelConfig.get_total_num_hidden_layers``, else the text config's
    ``num_hidden_layers``)."""
    count = getattr(model_config, "get_total_num_hidden_layers", None)
    if count is not None:
        return int(count())
    return int(getattr(model_config.hf_text_config, "num_hidden_layers", 0))


def has_v1_model_runner() -> bool:
    """Whether the release still has Model Runner V1 (``VllmConfig.use_v2_model_runner``
    chooses between the two where it does)."""
    from vllm.config.vllm import VllmConfig

    return hasattr(VllmConfig, "use_v2_model_runner")


def offloading_has_windows() -> bool:
    """Whether the release's ``build_offloading_config`` bounds each group by a
    window in chunks (``get_sliding_window_size_in_chunks`` beside it in
    ``vllm/distributed/kv_transfer/kv_connector/v1/offloading/config.py``)."""
    module = importlib.import_module(
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading.config")
    return hasattr(module, "get_sliding_window_size_in_chunks")


@functools.cache
def rejects_single_group_prefix_match_unit() -> bool:
    """Whether the release's ``resolve_kv_cache_block_sizes``
    (``vllm/v1/core/kv_cache_utils.py``) refuses a ``prefix_match_unit`` other
    than the block size when the cache has one group and a connector hashes
    blocks: asked of that function on a one-group probe config."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=64, dtype=torch.bfloat16)
    cfg = SimpleNamespace(kv_cache_groups=[KVCacheGroupSpec(["probe"], spec)])
    vc = SimpleNamespace(
        cache_config=SimpleNamespace(block_size=16, prefix_match_unit=32,
                                     enable_prefix_caching=True),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        kv_transfer_config=object(),
    )
    try:
        resolve_kv_cache_block_sizes(cfg, vc)
    except ValueError:
        return True
    return False


def construct(cls, **fields):
    """``cls(**fields)`` with only the fields the release's dataclass has (a
    field a release does not have is not part of its answer)."""
    import dataclasses

    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in fields.items() if k in names})


# ---------------------------------------------------------------------------
# Sizing: the extensible KV cache and the default utilization
# ---------------------------------------------------------------------------


def extensible_kv_cache(vc, requested: bool | None = None) -> bool:
    """Settle, on ``vc`` (a plan's own copy, with its ``kv_cache_memory_bytes``
    and ``num_gpu_blocks_override``), whether the release sizes the cache
    after warmup with its extensible KV cache, as a fresh engine would:
    ``VllmConfig._resolve_extensible_kv_cache`` run again with
    ``--enable-extensible-kv-cache`` as ``requested`` (``None``: on where
    supported; it refuses the cache when either memory input is set, and a
    request for it there with vLLM's ``ValueError``).  False where the release
    has no such cache; a request for it there is refused.  Run it where the
    platform answers as the GPU."""
    cc = vc.cache_config
    if not hasattr(vc, "_resolve_extensible_kv_cache") or not hasattr(
            cc, "enable_extensible_kv_cache"):
        if requested:
            raise KVExploreError(
                f"enable_extensible_kv_cache=True: the installed vLLM "
                f"{installed_release().version} has no extensible KV cache; expected "
                "None or False (vLLM 0.34.0 brings it)"
            )
        return False
    cc.enable_extensible_kv_cache = requested
    cc._extensible_kv_cache_resolved = False
    vc._resolve_extensible_kv_cache()
    return bool(cc.enable_extensible_kv_cache)


def resolved_gpu_memory_utilization(cc, requested: float | None, extensible: bool) -> float:
    """The share of the card the worker requests: ``requested`` when given,
    else the release's default (``CacheConfig.resolved_gpu_memory_utilization``
    where it exists: 1.0 with the extensible cache, else
    ``DEFAULT_GPU_MEMORY_UTILIZATION``; before that, the field's default)."""
    import copy

    if requested is not None:
        return float(requested)
    if hasattr(type(cc), "resolved_gpu_memory_utilization"):
        probe = copy.copy(cc)
        probe.gpu_memory_utilization = None
        probe.enable_extensible_kv_cache = extensible
        return float(probe.resolved_gpu_memory_utilization)
    return float(type(cc)().gpu_memory_utilization)


def after_warmup_sizing():
    """``measure_kv_cache_bytes`` (``vllm/v1/worker/extensible_kv_cache.py``):
    the bytes the extensible cache takes from memory measured after warmup;
    None where the release has no extensible cache (:func:`extensible_cache_module`)."""
    ext = extensible_cache_module()
    if ext is None:
        return None
    fn = getattr(ext, "measure_kv_cache_bytes", None)
    if fn is None:
        raise _mismatch("measure_kv_cache_bytes beside its extensible KV cache")
    return fn


def extensible_cache_module():
    """``vllm.v1.worker.extensible_kv_cache`` where the release has the
    extensible KV cache, else None."""
    try:
        return importlib.import_module("vllm.v1.worker.extensible_kv_cache")
    except ImportError:
        return None


def admission_hint(vc) -> tuple[str, ...]:
    """The arguments the release's ``_check_enough_kv_cache_memory`` takes after
    its four: ``(hint,)`` where it ends its message with
    ``_more_kv_cache_memory_hint(vc)``, else ``()``."""
    module = kv_cache_planning()
    if len(inspect.signature(module._check_enough_kv_cache_memory).parameters) <= 4:
        return ()
    hint = getattr(module, "_more_kv_cache_memory_hint", None)
    if hint is None:
        raise _mismatch("_more_kv_cache_memory_hint for its admission check's hint")
    return (hint(vc),)


# ---------------------------------------------------------------------------
# The start-up checks after the KV cache config exists
# ---------------------------------------------------------------------------


def resolve_cudagraph_mode(cc, *, min_cg_support, min_cg_attn_backend: str | None,
                           uniform_decode_query_len: int, use_v2_model_runner: bool,
                           tensor_parallel_size: int, kv_cache_config, max_num_reqs: int,
                           piecewise_capture_available: bool):
    """The release's ``CompilationConfig.resolve_cudagraph_mode_and_sizes``
    (``vllm/config/compilation.py``) called on ``cc`` as the model runner's
    ``initialize_kv_cache`` calls it (``is_profiling=False``), with only the
    keywords the release's signature has (0.31 takes
    ``tensor_parallel_size``, 0.34 no ``use_v2_model_runner``;
    ``piecewise_capture_available`` is passed by Model Runner V2 only).
    ``cc`` is rewritten as vLLM rewrites it: pass a copy."""
    fn = getattr(type(cc), "resolve_cudagraph_mode_and_sizes", None)
    if fn is None:
        raise _mismatch("CompilationConfig.resolve_cudagraph_mode_and_sizes")
    given = {
        "uniform_decode_query_len": uniform_decode_query_len,
        "use_v2_model_runner": use_v2_model_runner,
        "tensor_parallel_size": tensor_parallel_size,
        "kv_cache_config": kv_cache_config,
        "max_num_reqs": max_num_reqs,
        "is_profiling": False,
    }
    if use_v2_model_runner:
        given["piecewise_capture_available"] = piecewise_capture_available
    takes = inspect.signature(fn).parameters
    return fn(cc, min_cg_support, min_cg_attn_backend,
              **{k: v for k, v in given.items() if k in takes})


def piecewise_capture_available(vc, model) -> bool:
    """Model Runner V2's ``piecewise_capture_available``
    (``vllm/v1/worker/gpu/model_runner.py: initialize_kv_cache``): breakable
    CUDA graphs switched on (0.34: ``is_breakable_cudagraph_enabled`` of the
    compilation config; before: ``VLLM_USE_BREAKABLE_CUDAGRAPH``) or a
    submodule of ``model`` compiled by ``@support_torch_compile``
    (``has_compiled_submodule``)."""
    runner = importlib.import_module("vllm.v1.worker.gpu.model_runner")
    breakable = getattr(runner, "is_breakable_cudagraph_enabled", None)
    if breakable is not None:
        on = bool(breakable(vc.compilation_config))
    else:
        import vllm.envs as envs

        on = bool(getattr(envs, "VLLM_USE_BREAKABLE_CUDAGRAPH", False))
    _, compiled = _first((("vllm.v1.worker.gpu.cudagraph_utils", "has_compiled_submodule"),),
                         "has_compiled_submodule")
    return on or (model is not None and bool(compiled(model)))


def uniform_decode_query_len(vc) -> int:
    """Tokens one decode step verifies per request: ``1 +
    num_speculative_tokens`` (V1: ``GPUModelRunner.uniform_decode_query_len``;
    V2: ``num_speculative_steps`` plus the one token sampled per step)."""
    spec = vc.speculative_config
    return 1 + int(getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 1


def request_memory_check():
    """``request_memory`` (``vllm/v1/worker/utils.py``): the worker's
    ``init_device`` check that the card's free memory covers
    ``gpu_memory_utilization`` of it."""
    _, fn = _first((("vllm.v1.worker.utils", "request_memory"),), "request_memory")
    return fn


def connector_supports_hma(kv_transfer_config) -> bool:
    """``KVConnectorFactory.supports_hma_config``
    (``vllm/distributed/kv_transfer/kv_connector/factory.py``): whether the
    connector (every child of a ``MultiConnector``) declares support for the
    hybrid KV cache manager."""
    _, factory = _first((("vllm.distributed.kv_transfer.kv_connector.factory",
                          "KVConnectorFactory"),), "KVConnectorFactory")
    return bool(factory.supports_hma_config(kv_transfer_config))


def attention_cp_check():
    """``check_attention_cp_compatibility`` (``vllm/v1/worker/cp_utils.py``):
    the model runner's check that every attention layer's backend supports
    the configured prefill / decode context parallelism."""
    _, fn = _first((("vllm.v1.worker.cp_utils", "check_attention_cp_compatibility"),),
                   "check_attention_cp_compatibility")
    return fn


def connector_class(kv_transfer_config) -> type:
    """``KVConnectorFactory.get_connector_class``: the class a
    ``kv_transfer_config`` names (the registry, or its module path)."""
    _, factory = _first((("vllm.distributed.kv_transfer.kv_connector.factory",
                          "KVConnectorFactory"),), "KVConnectorFactory")
    return factory.get_connector_class(kv_transfer_config)


def model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]):
    """vLLM's ``ModelRunnerOutput`` (``vllm/v1/outputs.py``) for requests
    ``req_ids`` with these sampled tokens, as the release's fields take it:
    ``req_id_to_index`` up to 0.33, gone in 0.34."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    kw: dict[str, Any] = {"req_ids": req_ids, "sampled_token_ids": sampled_token_ids}
    if "req_id_to_index" in {f.name for f in dataclasses.fields(ModelRunnerOutput)}:
        kw["req_id_to_index"] = {r: i for i, r in enumerate(req_ids)}
    return ModelRunnerOutput(**kw)


def legacy_kv_cache_layout() -> str | None:
    """What ``vllm.v1.attention.backends.utils.get_kv_cache_layout()`` returns
    on the installed vLLM, or ``None`` where the release has no such function
    (LMCache 0.5.3 and 0.5.4 take their layout hint from it, and build no
    hint where it is missing)."""
    from vllm.v1.attention.backends import utils

    getter = getattr(utils, "get_kv_cache_layout", None)
    return None if getter is None else getter()


__all__ = [
    "COMPARED_RELEASES",
    "INSTALL_OVERRIDES",
    "REQUIREMENT",
    "WINDOW",
    "WINDOW_RELEASES",
    "admission_hint",
    "after_warmup_sizing",
    "attention_cp_check",
    "builds_no_draft_model",
    "cache_hit_alignment_tokens",
    "canonical_release",
    "connector_class",
    "connector_supports_hma",
    "construct",
    "engine_argument_names",
    "extensible_cache_module",
    "extensible_kv_cache",
    "finish_groups",
    "global_kv_cache_groups",
    "has_v1_model_runner",
    "in_window",
    "init_speculator",
    "installed_release",
    "kv_cache_configs",
    "kv_cache_dtypes",
    "kv_cache_planning",
    "legacy_kv_cache_layout",
    "max_memory_usage_bytes_from_groups",
    "max_model_len_estimator",
    "model_runner_output",
    "offloading_has_windows",
    "piecewise_capture_available",
    "pool_bytes_per_block",
    "prefill_checkpoint_alignment",
    "quantization_methods",
    "rejects_single_group_prefix_match_unit",
    "release_name",
    "request_memory_check",
    "require_engine_arguments",
    "resolve_cudagraph_mode",
    "resolved_gpu_memory_utilization",
    "runner_kv_cache_spec",
    "total_num_hidden_layers",
    "triton_flags",
    "uniform_decode_query_len",
    "uses_v2_model_runner",
    "window_text",
    "Release",
]
