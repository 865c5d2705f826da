"""The inputs of a plan: :class:`PlanRequest`, the one spelling of ``plan()``'s keywords.

Each field of :class:`PlanRequest` is one ``plan()`` keyword, named and
defaulted as vLLM's engine argument is (``None``: vLLM decides, as an unset
flag does).  Its metadata carries everything else said about it: the check
that normalises it (:func:`as_int`, :func:`as_fraction`, :func:`as_choice`,
...), the help and flags of the command line (:mod:`kvexplore.cli`), whether
it is an ``EngineArgs`` keyword and whether the model build depends on it.
``plan()``'s signature, its defaults, its input checks, the plan cache key and
the command line's options are all read from these fields.

A request is frozen, hashable and picklable: the key of the plan cache.  It
accepts what vLLM's own engine arguments accept, spelled the ways Python users
have them (ints and numpy ints, ``torch.bfloat16`` or ``"bfloat16"``), and
refuses the rest with a :class:`KVExploreError` naming the argument, the value
and what was expected.  vLLM itself checks the combinations later (a TP that
does not divide the heads, a backend that does not suit the model) and its
reasons are quoted then.

>>> PlanRequest(tensor_parallel_size=2).tensor_parallel_size
2
>>> PlanRequest(block_size=16.0)
Traceback (most recent call last):
...
kvexplore.errors.KVExploreError: block_size=16.0 is invalid; expected an integer >= 1 or None
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import inspect
import json
import numbers
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvexplore.errors import KVExploreError

MAMBA_CACHE_MODES = ("none", "align", "all")
KV_CACHE_LAYOUTS = ("LBNHC", "LBHNC", "LHBNC", "BLHNC", "BLNHC", "BHLNC", "NHD", "HND")
MODEL_DTYPES = ("auto", "bfloat16", "float16", "float32", "half", "float")
MAMBA_SSM_DTYPES = ("auto", "float32", "float16", "bfloat16")


def as_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None,
           allow_none: bool = False) -> int | None:
    """``value`` as an ``int`` (``numpy`` integers accepted; bools, floats and
    strings refused), checked against ``[minimum, maximum]``."""
    if value is None and allow_none:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
        if number >= minimum and (maximum is None or number <= maximum):
            return number
    bound = f"an integer >= {minimum}" + (f" and <= {maximum:,}" if maximum else "")
    raise KVExploreError(
        f"{name}={value!r} is invalid; expected {bound}" + (" or None" if allow_none else "")
    )


def as_fraction(name: str, value: Any) -> float:
    """``value`` as a float in ``(0, 1]`` (vLLM's ``CacheConfig`` bounds on
    ``gpu_memory_utilization``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise KVExploreError(f"{name}={value!r} is invalid; expected a number in (0, 1]")
    return float(value)


def as_choice(name: str, value: Any, choices: tuple[str, ...], *, allow_none: bool = False):
    """``value`` if it is one of ``choices`` (a ``torch.dtype`` counts by its
    name: ``torch.bfloat16`` is ``"bfloat16"``)."""
    if value is None and allow_none:
        return None
    text = _dtype_text(value)
    if isinstance(text, str) and text in choices:
        return text
    raise KVExploreError(
        f"{name}={value!r} is invalid; expected one of {list(choices)}"
        + (" or None" if allow_none else "")
    )


def as_bool(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (``1``, ``"yes"`` refused)."""
    if value is True or value is False:
        return value
    raise KVExploreError(f"{name}={value!r} is invalid; expected True or False")


def _dtype_text(value: Any) -> Any:
    if value is None or isinstance(value, str):
        return value
    import torch

    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


def _bool_or_none(name: str, value: Any) -> bool | None:
    if value is None or value is True or value is False:
        return value
    raise KVExploreError(f"{name}={value!r} is invalid; expected True, False or None (vLLM decides)")


def _int_or_none(name: str, value: Any) -> int | None:
    return as_int(name, value, allow_none=True)


def _index(name: str, value: Any) -> int:
    return as_int(name, value, minimum=0)


def _fraction_or_none(name: str, value: Any) -> float | None:
    return None if value is None else as_fraction(name, value)


def _max_model_len(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        if int(value) == -1 or int(value) >= 1:
            return int(value)
    raise KVExploreError(
        f"{name}={value!r} is invalid; expected an integer >= 1, -1 (auto-fit to "
        "the KV cache memory, as vLLM does) or None (the model's own length)"
    )


def _backend(name: str, value: Any) -> str | None:
    if value is None:
        return None
    from kvexplore.planning.backends import validate_backend_name

    return validate_backend_name(value)


def _kv_cache_dtypes() -> tuple[str, ...]:
    from kvexplore.planning.release import kv_cache_dtypes

    return kv_cache_dtypes()


def _quantization_methods() -> tuple[str, ...]:
    from kvexplore.planning.release import quantization_methods

    return quantization_methods()


def _choice_of(choices: tuple[str, ...] | Callable[[], tuple[str, ...]], *,
               allow_none: bool = False) -> Callable[[str, Any], Any]:
    """A check accepting one of ``choices`` (a tuple, or a function giving the
    installed release's)."""
    def check(name: str, value: Any):
        options = choices() if callable(choices) else choices
        return as_choice(name, value, options, allow_none=allow_none)

    return check


def _json_object(example: str) -> Callable[[str, Any], str | None]:
    """A check accepting ``None`` or a dict of JSON values, kept as canonical
    JSON text (hashable, picklable, equal for equal dicts)."""
    def check(name: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise KVExploreError(f"{name}={value!r} is invalid; expected a dict such as {example}")
        try:
            return json.dumps(dict(value), sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise KVExploreError(
                f"{name}={value!r} is invalid; expected JSON values only ({exc})"
            ) from None

    return check


def _draft_model(spec: Mapping | None):
    """The :class:`~kvexplore.planning.models.ModelSource` of a speculative
    config's draft ``model`` (a catalog id, ``config.json``, directory or hub
    id, as ``plan()``'s ``model``), or None: the request is keyed by the draft
    config's content, and vLLM reads it from the materialised directory."""
    if not spec or spec.get("model") is None:
        return None
    from kvexplore.planning.models import load_model_config

    try:
        return load_model_config(spec["model"])
    except KVExploreError as exc:
        raise KVExploreError(f"speculative_config['model']={spec['model']!r}: {exc}") from None


def keyword(default: Any, check: Callable[[str, Any], Any], help: str, *,
            flags: tuple[str, ...] = (), cli: str = "str",
            choices: tuple[str, ...] | Callable[[], tuple[str, ...]] | None = None,
            engine: bool = True, build: bool = True, sweep: bool = True):
    """A :class:`PlanRequest` field: one ``plan()`` keyword.

    ``check(name, value)`` returns the normalised value or raises a
    :class:`KVExploreError` naming both; ``help``, ``flags`` (the command
    line's option strings; default ``--name-with-dashes``), ``cli`` (how a
    flag's text is read: ``"int"``, ``"float"``, ``"str"``, ``"bool"`` (a
    ``--x/--no-x`` pair), ``"json"``, ``"int_or_none"``) and ``choices`` make
    the command line's option; ``engine``: passed to vLLM's ``EngineArgs``
    under the same name when not ``None``; ``build``: the model build depends
    on it (a plan that changes only other keywords reuses the build);
    ``sweep``: the command line's sweep takes it (a comma-separated list of
    values, but a ``"bool"`` or ``"json"`` flag's one value, held fixed).
    """
    return field(default=default, metadata={
        "keyword": True, "check": check, "help": help, "flags": flags, "cli": cli,
        "choices": choices, "engine": engine, "build": build, "sweep": sweep,
    })


@dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """``plan()``'s keywords, checked and normalised: the key of the plan cache.

    Construct it with keywords (every field has vLLM's default); each value is
    checked by its field's check and stored normalised (``torch.bfloat16`` as
    ``"bfloat16"``, ``speculative_config`` and ``hf_overrides`` as canonical
    JSON text).  ``draft_model`` is not a keyword: the
    :class:`~kvexplore.planning.models.ModelSource` a ``speculative_config``'s
    ``model`` names, so the request is keyed by the draft config's content.
    Refusals: a :class:`KVExploreError` naming the keyword, the value and what
    was expected; both ``num_blocks`` and ``kv_cache_memory_bytes``; a keyword
    set away from its default that the installed release's ``EngineArgs`` does
    not have (:func:`kvexplore.planning.release.require_engine_arguments`).
    """

    tensor_parallel_size: int = keyword(
        1, as_int, "ranks each layer is sharded over (vLLM's --tensor-parallel-size)",
        flags=("--tp", "--tensor-parallel-size"), cli="int")
    decode_context_parallel_size: int = keyword(
        1, as_int, "ranks the decode KV cache is split over within TP",
        flags=("--dcp", "--decode-context-parallel-size"), cli="int")
    block_size: int | None = keyword(
        None, _int_or_none, "tokens per KV cache block (default: vLLM aligns it to the backend)",
        cli="int_or_none")
    dtype: str = keyword("auto", _choice_of(MODEL_DTYPES), "the model's weights and activations",
                         choices=MODEL_DTYPES)
    kv_cache_dtype: str = keyword("auto", _choice_of(_kv_cache_dtypes),
                                  "the attention KV cache's data type", choices=_kv_cache_dtypes)
    enable_prefix_caching: bool | None = keyword(
        None, _bool_or_none, "automatic prefix caching (default: vLLM's for the model)", cli="bool")
    mamba_cache_mode: str | None = keyword(
        None, _choice_of(MAMBA_CACHE_MODES, allow_none=True),
        "which Mamba states the cache keeps (default: vLLM's, from prefix caching)",
        choices=MAMBA_CACHE_MODES)
    mamba_ssm_cache_dtype: str = keyword("auto", _choice_of(MAMBA_SSM_DTYPES),
                                         "the Mamba SSM state's data type", choices=MAMBA_SSM_DTYPES)
    max_model_len: int | None = keyword(
        None, _max_model_len, "longest request in tokens (-1: auto-fit to the KV cache)",
        cli="int", engine=False, build=False)
    attention_backend: str | None = keyword(
        None, _backend, "vLLM's AttentionBackendEnum name (default: vLLM's choice for the GPU)",
        flags=("--backend", "--attention-backend"))
    speculative_config: str | None = keyword(
        None, _json_object("{'method': 'mtp', 'num_speculative_tokens': 2}"),
        'as vLLM takes it, e.g. \'{"method": "mtp", "num_speculative_tokens": 2}\'',
        flags=("--speculative-config", "-sc"), cli="json", sweep=False)
    num_blocks: int | None = keyword(
        None, _int_or_none, "blocks of the cache (vLLM's --num-gpu-blocks-override)",
        flags=("--num-blocks",), cli="int", engine=False, build=False)
    kv_cache_memory_bytes: int | None = keyword(
        None, _int_or_none, "bytes of the cache (instead of the memory profile)",
        cli="int", engine=False, build=False)
    gpu_memory_utilization: float | None = keyword(
        None, _fraction_or_none,
        "share of the card vLLM takes (default: the release's) when neither --num-blocks "
        "nor --kv-cache-memory-bytes is given", cli="float", engine=False, build=False)
    enable_extensible_kv_cache: bool | None = keyword(
        None, _bool_or_none,
        "vLLM >= 0.34: size the cache after warmup (default: on where supported)",
        cli="bool", engine=False, build=False)
    kv_cache_layout: str | None = keyword(
        None, _choice_of(KV_CACHE_LAYOUTS, allow_none=True),
        "the layout VLLM_KV_CACHE_LAYOUT requests (default: the engine core's)",
        choices=KV_CACHE_LAYOUTS, engine=False)
    max_num_batched_tokens: int | None = keyword(
        None, _int_or_none, "tokens of the dummy run vLLM's memory profile measures", cli="int")
    max_num_seqs: int | None = keyword(
        None, _int_or_none, "sequences of a batch (vLLM's --max-num-seqs)", cli="int")
    mamba_block_size: int | None = keyword(
        None, _int_or_none,
        "tokens per Mamba block, with prefix caching (vLLM's --mamba-block-size; in 'align' "
        "mode vLLM sets it to the block size)", cli="int")
    prefix_match_unit: int | None = keyword(
        None, _int_or_none,
        "finest token boundary a prefix-cache hit lands on; every group's block size must be "
        "a multiple (vLLM's --prefix-match-unit)", cli="int")
    mamba_cache_dtype: str = keyword(
        "auto", _choice_of(MAMBA_SSM_DTYPES),
        "the Mamba conv (and, with mamba_ssm_cache_dtype 'auto', SSM) state's data type "
        "(vLLM's --mamba-cache-dtype)", choices=MAMBA_SSM_DTYPES)
    pipeline_parallel_size: int = keyword(
        1, as_int, "pipeline stages; each stage's worker registers only its layers "
        "(vLLM's --pipeline-parallel-size)", flags=("--pp", "--pipeline-parallel-size"), cli="int")
    pipeline_parallel_rank: int = keyword(
        0, _index, "the pipeline stage whose worker the plan shows (0 to "
        "pipeline_parallel_size - 1)", cli="int", engine=False, build=False)
    data_parallel_size: int = keyword(
        1, as_int, "engine replicas; MoE layers are sharded over DP x TP ranks "
        "(vLLM's --data-parallel-size)", flags=("--dp", "--data-parallel-size"), cli="int")
    enable_expert_parallel: bool = keyword(
        False, as_bool, "split the experts of MoE layers over the DP x TP ranks instead of "
        "sharding each (vLLM's --enable-expert-parallel)", cli="bool")
    quantization: str | None = keyword(
        None, _choice_of(_quantization_methods, allow_none=True),
        "weight quantization method (default: the checkpoint's quantization_config)",
        choices=_quantization_methods)
    hf_overrides: str | None = keyword(
        None, _json_object("{'num_hidden_layers': 8}"),
        'changes to the model\'s config.json, e.g. \'{"num_hidden_layers": 8}\' (a sweep '
        'holds it fixed)', cli="json")
    enforce_eager: bool = keyword(
        False, as_bool, "run the model eagerly: no CUDA graphs (vLLM's --enforce-eager)",
        cli="bool")
    compilation_config: str | None = keyword(
        None, _json_object("{'cudagraph_mode': 'PIECEWISE'}"),
        'vLLM\'s CompilationConfig fields, e.g. \'{"cudagraph_mode": "PIECEWISE"}\' '
        '(vLLM\'s --compilation-config / -cc; a sweep holds it fixed)',
        flags=("--compilation-config", "-cc"), cli="json")
    kv_transfer_config: str | None = keyword(
        None, _json_object("{'kv_connector': 'OffloadingConnector', 'kv_role': 'kv_both'}"),
        'the KV connector, as vLLM takes it, e.g. \'{"kv_connector": "OffloadingConnector", '
        '"kv_role": "kv_both"}\' (vLLM\'s --kv-transfer-config; a sweep holds it fixed)',
        cli="json")
    gpu_memory_in_use: int = keyword(
        0, _index, "bytes of the card another process holds when vLLM starts (vLLM measures "
        "the free memory; its request_memory check refuses less than gpu_memory_utilization "
        "of the card)", cli="int", engine=False, build=False)
    draft_model: Any = field(default=None, init=False, repr=False, metadata={"keyword": False})

    def __post_init__(self) -> None:
        for f in keyword_fields():
            object.__setattr__(self, f.name, f.metadata["check"](f.name, getattr(self, f.name)))
        spec = json.loads(self.speculative_config) if self.speculative_config else None
        object.__setattr__(self, "draft_model", _draft_model(spec))
        if self.num_blocks is not None and self.kv_cache_memory_bytes is not None:
            raise KVExploreError(
                f"give num_blocks ({self.num_blocks}) or kv_cache_memory_bytes "
                f"({self.kv_cache_memory_bytes}), not both"
            )
        if not 0 <= self.pipeline_parallel_rank < self.pipeline_parallel_size:
            raise KVExploreError(
                f"pipeline_parallel_rank={self.pipeline_parallel_rank} is not a stage of "
                f"pipeline_parallel_size={self.pipeline_parallel_size}; expected 0 to "
                f"{self.pipeline_parallel_size - 1}"
            )
        check_engine_configs(self.compilation_config, self.kv_transfer_config)
        from kvexplore.planning.release import require_engine_arguments

        require_engine_arguments({f.name: getattr(self, f.name) for f in keyword_fields()
                                  if f.metadata["engine"]
                                  and getattr(self, f.name) != f.default})

    def keywords(self) -> dict[str, Any]:
        """The ``plan()`` keywords this request holds (a new dict; JSON fields
        as dicts): ``plan(model, gpu=..., **request.keywords())`` plans it again."""
        return {f.name: _decoded(f, getattr(self, f.name)) for f in keyword_fields()}

    def replace(self, **changes: Any) -> PlanRequest:
        """A new, checked request with some keywords changed."""
        return PlanRequest(**{**self.keywords(), **changes})

    def given(self) -> dict[str, Any]:
        """The keywords set away from their defaults (JSON fields as dicts)."""
        return {f.name: _decoded(f, getattr(self, f.name)) for f in keyword_fields()
                if getattr(self, f.name) != f.default}

    def build_request(self) -> PlanRequest:
        """This request with every keyword the model build does not depend on
        at its default: the key of the build cache."""
        out = copy.copy(self)
        for f in keyword_fields():
            if not f.metadata["build"]:
                object.__setattr__(out, f.name, f.default)
        return out

    def engine_kwargs(self) -> dict[str, Any]:
        """``EngineArgs`` keywords for this request (what a ``vllm serve``
        command line with the same flags sets; unset flags are left to vLLM):
        every engine keyword not ``None``, JSON fields as dicts, and the
        speculative config's draft ``model`` as its materialised directory."""
        kw = {f.name: _decoded(f, getattr(self, f.name)) for f in keyword_fields()
              if f.metadata["engine"] and getattr(self, f.name) is not None}
        if self.draft_model is not None:
            kw["speculative_config"]["model"] = str(self.draft_model.config_dir)
        return kw


def check_engine_configs(compilation_config: str | None, kv_transfer_config: str | None) -> None:
    """Refuse a ``compilation_config`` or ``kv_transfer_config`` (canonical
    JSON text) that vLLM's own config classes refuse: ``CompilationConfig``
    (an unknown field, a ``cudagraph_mode`` that is not a ``CUDAGraphMode``
    name) and ``KVTransferConfig`` with ``KVConnectorFactory.get_connector_class``
    (a connector vLLM does not know), each a :class:`KVExploreError` naming
    the value and quoting vLLM."""
    if compilation_config is not None:
        from vllm.config.compilation import CompilationConfig, CUDAGraphMode

        given = json.loads(compilation_config)
        names = {f.name for f in dataclasses.fields(CompilationConfig)}
        unknown = [k for k in given if k not in names]
        if unknown:
            close = difflib.get_close_matches(unknown[0], sorted(names), n=3, cutoff=0.6)
            raise KVExploreError(
                f"compilation_config={given!r} has an unknown field {unknown[0]!r}"
                + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else "")
                + "; expected fields of vLLM's CompilationConfig such as 'cudagraph_mode', "
                "'cudagraph_capture_sizes', 'max_cudagraph_capture_size'"
            )
        mode = given.get("cudagraph_mode")
        modes = [m.name for m in CUDAGraphMode]
        if mode is not None and (not isinstance(mode, str) or mode.upper() not in modes):
            raise KVExploreError(
                f"compilation_config['cudagraph_mode']={mode!r} is invalid; expected one of "
                f"{modes} (vLLM's CUDAGraphMode)"
            )
        try:
            CompilationConfig(**given)
        except Exception as exc:
            raise KVExploreError(
                f"compilation_config={given!r} is refused by vLLM's CompilationConfig: "
                f"{' '.join(str(exc).split())[:300]}"
            ) from None
    if kv_transfer_config is not None:
        from vllm.config.kv_transfer import KVTransferConfig

        from kvexplore.planning.release import connector_class

        given = json.loads(kv_transfer_config)
        try:
            ktc = KVTransferConfig(**given)
            if ktc.kv_connector is None:
                raise ValueError("kv_connector is not set")
            connector_class(ktc)
        except Exception as exc:
            raise KVExploreError(
                f"kv_transfer_config={given!r} is refused by vLLM: "
                f"{' '.join(str(exc).split())[:300]}; expected a connector vLLM's "
                "KVConnectorFactory knows (e.g. 'OffloadingConnector', 'LMCacheMPConnector', "
                "'NixlConnector') and its kv_role"
            ) from None


def check_quantization(src, request: PlanRequest) -> None:
    """Refuse ``quantization`` for a model whose checkpoint holds no
    quantization config (``config.json``'s ``quantization_config``, also as
    ``hf_overrides`` set it, or a ``hf_quant_config.json`` beside it): vLLM
    then quantizes the loaded weights online, in the quantization method's
    ``process_weights_after_loading``, which the meta-device build does not
    run, so the weights per rank (and the memory left to the cache) would be
    the unquantized ones.  ``src`` is the model's
    :class:`~kvexplore.planning.models.ModelSource`."""
    if request.quantization is None:
        return
    from kvexplore.planning.models import QUANT_CONFIG_FILE

    config = src.config
    overrides = json.loads(request.hf_overrides) if request.hf_overrides else {}
    sections = [config, overrides, config.get("text_config") or {},
                overrides.get("text_config") or {}]
    if any(isinstance(c, Mapping) and c.get("quantization_config") for c in sections):
        return
    if (src.config_dir / QUANT_CONFIG_FILE).exists():
        return
    raise KVExploreError(
        f"quantization={request.quantization!r} is not plannable for {src.name}: its config has "
        "no quantization_config, so vLLM would quantize its weights online after loading "
        "(the method's process_weights_after_loading), which kvexplore's meta-device build does "
        "not run; expected a quantized checkpoint's method (or hf_overrides with its "
        "quantization_config), or quantization=None"
    )


def _decoded(f: dataclasses.Field, value: Any) -> Any:
    return json.loads(value) if f.metadata["cli"] == "json" and value is not None else value


#: Keywords whose checks ask the installed vLLM (its ``CacheDType`` values,
#: ``AttentionBackendEnum`` names, quantization methods).
VLLM_CHECKED = ("kv_cache_dtype", "attention_backend", "quantization")


def store_key(**kwargs: Any) -> tuple[tuple[str, Any], ...]:
    """``(name, value)`` for every :class:`PlanRequest` field, in order, checked
    and normalised as :class:`PlanRequest` does except for what needs vLLM:
    the :data:`VLLM_CHECKED` values are kept as given text and no engine
    argument's presence is asked.  The key the answer store looks a request
    up by without importing vLLM; only requests ``plan()`` accepted are
    stored under it.  Refused: an unknown keyword, a value a check refuses,
    a vLLM-checked value that is not text or ``None``."""
    check_keywords("plan()", kwargs, PLAN_DEFAULTS)
    out = []
    for f in _KEYWORD_FIELDS:
        value = kwargs.get(f.name, f.default)
        if f.name in VLLM_CHECKED:
            value = _dtype_text(value)
            if value is not None and not isinstance(value, str):
                raise KVExploreError(f"{f.name}={value!r} is invalid; expected a name")
        else:
            value = f.metadata["check"](f.name, value)
        out.append((f.name, value))
    spec = dict(out)["speculative_config"]
    out.append(("draft_model", _draft_model(json.loads(spec) if spec else None)))
    return tuple(out)


def check_keywords(function: str, given: Any, known: Any) -> None:
    """Refuse a keyword of ``function`` not among ``known`` (names), naming it,
    its value, the nearest spellings (``difflib``) and the full list."""
    known = list(known)
    unknown = [k for k in given if k not in known]
    if not unknown:
        return
    close = difflib.get_close_matches(unknown[0], known, n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(map(repr, close))}? " if close else ""
    raise KVExploreError(
        f"{function} got an unknown keyword {unknown[0]}={given[unknown[0]]!r}; {hint}"
        f"expected one of {known}"
    )


def plan_request(**keywords: Any) -> PlanRequest:
    """The :class:`PlanRequest` of ``plan()``'s keywords (``model`` and ``gpu``
    aside): each checked once by its field's check.  A keyword that is not a
    field is refused naming the nearest spellings."""
    check_keywords("plan()", keywords, ["gpu", *PLAN_KEYWORDS])
    return PlanRequest(**keywords)


def plan_signature(first: Sequence[inspect.Parameter]) -> inspect.Signature:
    """``plan()``'s signature: ``first`` (``model``, ``gpu``), then every
    :class:`PlanRequest` keyword, keyword-only, with its default and the
    type it is given as."""
    hints = typing.get_type_hints(PlanRequest)
    # a JSON keyword is given as a dict and kept as canonical JSON text
    given = {f.name: dict | None for f in _KEYWORD_FIELDS if f.metadata["cli"] == "json"}
    return inspect.Signature([
        *first,
        *(inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                            annotation=given.get(f.name, hints.get(f.name)))
          for f in _KEYWORD_FIELDS),
    ])


def keyword_fields() -> tuple[dataclasses.Field, ...]:
    """:class:`PlanRequest`'s fields that are ``plan()`` keywords, in order."""
    return _KEYWORD_FIELDS


_KEYWORD_FIELDS = tuple(f for f in dataclasses.fields(PlanRequest) if f.metadata.get("keyword"))

#: ``plan()``'s keywords besides ``model`` and ``gpu``, in signature order.
PLAN_KEYWORDS: tuple[str, ...] = tuple(f.name for f in _KEYWORD_FIELDS)

#: ``plan()`` keywords with vLLM's engine-argument defaults (``None``: vLLM decides).
PLAN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in _KEYWORD_FIELDS}

#: ``plan()`` keywords the model build does not depend on (a plan that changes
#: only these reuses the build): the memory and admission keywords, and the
#: pipeline stage shown (every stage is built).
POST_BUILD_KEYWORDS: tuple[str, ...] = tuple(f.name for f in _KEYWORD_FIELDS
                                         if not f.metadata["build"])


__all__ = [
    "KV_CACHE_LAYOUTS",
    "MAMBA_CACHE_MODES",
    "MAMBA_SSM_DTYPES",
    "POST_BUILD_KEYWORDS",
    "MODEL_DTYPES",
    "PLAN_DEFAULTS",
    "PLAN_KEYWORDS",
    "check_keywords",
    "plan_request",
    "plan_signature",
    "PlanRequest",
    "as_bool",
    "as_choice",
    "as_fraction",
    "as_int",
    "VLLM_CHECKED",
    "check_engine_configs",
    "check_quantization",
    "keyword",
    "keyword_fields",
    "store_key",
]
