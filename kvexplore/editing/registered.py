"""The registration the edits work on: its check against the config, and its result.

:func:`check_registration` refuses a registration that does not describe the
config before anything is edited; :class:`EditResult` is the edited mapping of
:func:`kvexplore.apply_kv_cache_group_edits` with one report row per layer.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import FrozenInstanceError
from typing import TypeAlias

import pandas as pd
import torch
from vllm.v1.kv_cache_interface import (
    KVCacheConfig,
    KVCacheSpec,
    KVCacheSpecKind,
    get_kv_cache_spec_kind,
)

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, dtype_name, real_page_bytes

__all__ = [
    "REPORT_COLUMNS",
    "EditResult",
    "RegisteredKVCache",
    "check_registration",
    "describe",
    "layer_spec",
    "layout_facts",
    "spec_kind",
    "tensors_of",
]

#: One registered cache value: a tensor, one tensor per Mamba state
#: (``[conv_state, ssm_state]``) in the legacy registration, or an attention
#: layer's (K, V) pair of ``[pages, kernel_block, heads, head_size]`` planes
#: (vLLM-Ascend's split caches).
RegisteredKVCache: TypeAlias = (
    torch.Tensor | list[torch.Tensor] | tuple[torch.Tensor, torch.Tensor]
)

#: A unified Mamba layer is the raw int8 buffer viewed without a dtype
#: (``create_kv_cache_views``: a Mamba spec has ``dtypes``, not ``dtype``).
_UNIFIED_MAMBA_DTYPES = (torch.int8, torch.uint8)


def describe(value: object) -> str:
    """A registered value in an error: shape, strides and dtype, or its type."""
    if isinstance(value, torch.Tensor):
        return (
            f"Tensor(shape={tuple(value.shape)}, stride={tuple(value.stride())}, "
            f"dtype={dtype_name(value.dtype)})"
        )
    if isinstance(value, (list, tuple)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__


def spec_kind(spec: KVCacheSpec) -> KVCacheSpecKind:
    """vLLM's kind of ``spec``; ``UNKNOWN`` for an object that is no spec (never raises)."""
    try:
        return get_kv_cache_spec_kind(spec)
    except Exception:  # a non-spec object: a rule's matches() must not raise
        return KVCacheSpecKind.UNKNOWN


def layer_spec(group_spec: KVCacheSpec, layer_name: str) -> KVCacheSpec:
    """The spec of one layer: unwraps ``UniformTypeKVCacheSpecs``."""
    per_layer = getattr(group_spec, "kv_cache_specs", None)
    if isinstance(per_layer, dict) and layer_name in per_layer:
        return per_layer[layer_name]
    return group_spec


def tensors_of(value: object) -> list[torch.Tensor]:
    """A registered value's tensors: ``[t]`` for a tensor, the states of a
    list of tensors, ``[]`` for anything else."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)) and all(
        isinstance(t, torch.Tensor) for t in value
    ):
        return list(value)
    return []


#: Ranks of the attention tensors vLLM registers, ``(unified, legacy)``:
#: ``[kernel blocks, 2, kernel block, heads x head]`` and the backend's 5-D
#: ``get_kv_cache_shape`` for standard attention; ``[kernel blocks, 1, kernel
#: block, latent]`` and ``[kernel blocks, kernel block, latent]`` for MLA.
_ATTENTION_RANKS = {False: (4, 5), True: (4, 3)}


def _is_kv_pair(value: object) -> bool:
    """A (K, V) pair of 4-D planes, as vLLM-Ascend registers split caches."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(t, torch.Tensor) and t.ndim == 4 for t in value)
    )


def _layer_problems(
    name: str, spec: KVCacheSpec, value: object, tensors: list[torch.Tensor]
) -> list[str]:
    """What is wrong with one layer's tensors for its spec: an attention page
    is in ``spec.dtype``; a Mamba layer is ``len(MambaSpec.shapes)`` states
    in ``spec.dtypes`` or one 4-D ``[blocks, 1, 1, row]`` int8 tensor."""
    problems: list[str] = []
    kind = spec_kind(spec)
    if kind != KVCacheSpecKind.MAMBA:
        ranks = _ATTENTION_RANKS[kind == KVCacheSpecKind.MLA_ATTENTION]
        split = _is_kv_pair(value) and kind != KVCacheSpecKind.MLA_ATTENTION
        if not split and not isinstance(value, torch.Tensor):
            problems.append(
                f"attention layer {name!r} is registered as {describe(value)}; expected "
                "one tensor, as vLLM registers every attention layer (or a (K, V) "
                "pair of 4-D planes, as vLLM-Ascend does)"
            )
        elif not split and value.ndim not in ranks:
            problems.append(
                f"layer {name!r} is a {value.ndim}-D tensor {tuple(value.shape)}; expected "
                f"{' or '.join(f'{r}-D' for r in ranks)} (unified or legacy registration "
                f"of its {type(spec).__name__})"
            )
        wanted = getattr(spec, "dtype", None)
        wrong = [t.dtype for t in tensors if t.dtype != wanted]
        if isinstance(wanted, torch.dtype) and wrong:
            problems.append(
                f"layer {name!r} is registered as {dtype_name(wrong[0])}; "
                f"expected {dtype_name(wanted)}, the dtype of its "
                f"{type(spec).__name__}"
            )
        return problems
    if len(tensors) == 1 and tensors[0].ndim == 4:
        if tensors[0].dtype not in _UNIFIED_MAMBA_DTYPES:
            problems.append(
                f"Mamba layer {name!r} is a {dtype_name(tensors[0].dtype)} tensor; "
                "expected int8 bytes, as create_kv_cache_views registers a unified "
                "Mamba row"
            )
    else:
        wanted_dtypes = tuple(getattr(spec, "dtypes", ()) or ())
        for index, (state, dtype) in enumerate(
            zip(tensors, wanted_dtypes, strict=False)
        ):
            if state.dtype != dtype:
                problems.append(
                    f"Mamba layer {name!r} state {index} is {dtype_name(state.dtype)}; "
                    f"expected {dtype_name(dtype)} (MambaSpec.dtypes[{index}])"
                )
    expected = len(getattr(spec, "shapes", ())) or 2
    if isinstance(value, (list, tuple)) and len(value) != expected:
        problems.append(
            f"Mamba layer {name!r} is a list of {len(value)} tensors; "
            f"expected {expected} ([conv_state, ssm_state] per "
            "MambaSpec.shapes) in the legacy registration"
        )
    elif isinstance(value, torch.Tensor) and value.ndim != 4:
        problems.append(
            f"Mamba layer {name!r} is one {value.ndim}-D tensor "
            f"{tuple(value.shape)}; expected a legacy list of {expected} "
            "state tensors or a unified 4-D [blocks, 1, 1, row] view"
        )
    return problems


def _size_problems(
    name: str, spec: KVCacheSpec, tensors: list[torch.Tensor], num_blocks: int | None
) -> list[str]:
    """A layer whose tensors do not hold ``num_blocks`` real pages of its spec.

    Every registration vLLM hands a connector (one buffer or per-layer
    storage, unified or legacy, any backend) views exactly ``num_blocks x
    real page bytes`` per layer (``real_page_size_bytes`` where vLLM pads a
    page); a tensor of another size is not that layer's cache."""
    if not num_blocks:
        return []
    got = sum(t.numel() * t.element_size() for t in tensors)
    page = real_page_bytes(spec)
    if got == num_blocks * page:
        return []
    shapes = ", ".join(str(tuple(t.shape)) for t in tensors)
    return [
        f"layer {name!r} is registered as {shapes}: {got:,} B; expected {num_blocks:,} "
        f"blocks x {page:,} B (the real page of its {type(spec).__name__}) = "
        f"{num_blocks * page:,} B, as the config's num_blocks says"
    ]


def registration_problems(plan, kv_caches: Mapping[str, object]) -> list[str]:
    """The layers of ``kv_caches`` whose tensors are not laid out as ``plan``
    registers them: every tensor's shape, strides and dtype must be those of
    one of the registrations vLLM hands a connector for this plan
    (:func:`kvexplore.registration.allocate` on the meta device, each of
    :data:`~kvexplore.registration.REGISTRATIONS`)."""
    from kvexplore.registration import REGISTRATIONS, allocate

    expected: dict[str, list[tuple]] = {}
    for registration in REGISTRATIONS:
        for name, value in allocate(
            plan, device="meta", registration=registration
        ).items():
            expected.setdefault(name, []).append(_signature(value))
    problems = []
    for name, value in kv_caches.items():
        if name not in expected or not tensors_of(value):
            continue  # named by check_registration
        got = _signature(value)
        if got not in expected[name]:
            problems.append(
                f"layer {name!r} is registered as {_described(got)}; expected "
                + " or ".join(_described(e) for e in dict.fromkeys(expected[name]))
                + f", as vLLM registers it for this plan ({plan.attention_backend}, "
                f"{plan.kv_cache_layout_name})"
            )
    return problems


def _signature(value: object) -> tuple:
    return tuple(
        (tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors_of(value)
    )


def _described(signature: tuple) -> str:
    return " + ".join(
        f"{list(shape)} strides {list(stride)} {dtype_name(dtype)}"
        for shape, stride, dtype in signature
    )


def _listed(names: list[str], most: int) -> str:
    return f"{names[:most]}{' ...' if len(names) > most else ''}"


def check_registration(
    kv_cache_config: KVCacheConfig | None, kv_caches: object
) -> dict[str, tuple[int | None, KVCacheSpec | None]]:
    """Check a registration against its config; return layer -> (group, spec).

    Every registered layer is in the result (``(None, None)`` without a
    config).  All problems (missing or extra layers, values that are not
    tensors or tensor lists, tensors not in their spec's dtype, malformed
    Mamba entries, a layer whose tensors do not hold the config's
    ``num_blocks`` real pages of its spec, mixed devices) are collected into one ``KVExploreError``,
    each naming its layer, before anything is edited.
    """
    if not isinstance(kv_caches, Mapping):
        raise KVExploreError(
            f"kv_caches is a {type(kv_caches).__name__}; expected a mapping of "
            "layer name -> tensor or [conv_state, ssm_state]"
        )
    problems: list[str] = []
    where: dict[str, tuple[int | None, KVCacheSpec | None]] = {}
    num_blocks = getattr(kv_cache_config, "num_blocks", None)
    if kv_cache_config is not None:
        for index, group in enumerate(kv_cache_config.kv_cache_groups):
            for name in group.layer_names:
                where[name] = (index, layer_spec(group.kv_cache_spec, name))
        missing = [name for name in where if name not in kv_caches]
        extra = [name for name in kv_caches if name not in where]
        if missing:
            problems.append(
                f"kv_caches lacks {len(missing)} layer(s) the config names: "
                f"{_listed(missing, 8)}"
            )
        if extra:
            problems.append(
                f"kv_caches holds {len(extra)} layer(s) no config group names: "
                f"{_listed(extra, 8)}"
            )
    devices: dict[str, list[str]] = {}
    for name, value in kv_caches.items():
        _, spec = where.setdefault(name, (None, None))
        tensors = tensors_of(value)
        if not tensors:
            problems.append(
                f"layer {name!r} is registered as {describe(value)}; expected a "
                "tensor or a non-empty list of tensors"
            )
            continue
        for device in dict.fromkeys(str(t.device) for t in tensors):
            devices.setdefault(device, []).append(name)
        if spec is not None:
            problems.extend(_layer_problems(name, spec, value, tensors))
            problems.extend(_size_problems(name, spec, tensors, num_blocks))
    if len(devices) > 1:
        listed = ", ".join(
            f"{device}: {_listed(names, 3)}"
            for device, names in sorted(devices.items())
        )
        problems.append(
            f"registered tensors live on {len(devices)} devices ({listed}); "
            "expected one device"
        )
    if problems:
        raise KVExploreError(
            "cannot edit this registration: " + "; ".join(problems) + "."
        )
    return where


_FACTS = ("shape", "stride", "storage_offset", "dtype")


def layout_facts(value: object, num_blocks: int | None, suffix: str) -> dict:
    """Report columns of one value: ``shape`` / ``stride`` / ``storage_offset`` /
    ``dtype`` (tuples of them for a state list) and ``block_bytes`` (all its
    elements' bytes over ``num_blocks``), each with ``_{suffix}``."""
    tensors = tensors_of(value)
    if not tensors:
        facts: dict[str, object] = dict.fromkeys(_FACTS)
    else:
        facts = {
            "shape": [tuple(t.shape) for t in tensors],
            "stride": [tuple(t.stride()) for t in tensors],
            "storage_offset": [t.storage_offset() for t in tensors],
            "dtype": [dtype_name(t.dtype) for t in tensors],
        }
        single = isinstance(value, torch.Tensor)
        facts = {k: v[0] if single else tuple(v) for k, v in facts.items()}
        if num_blocks:
            total = sum(t.numel() * t.element_size() for t in tensors)
            facts["block_bytes"] = total // num_blocks
    facts.setdefault("block_bytes", None)
    return {f"{key}_{suffix}": fact for key, fact in facts.items()}


#: The columns of :attr:`EditResult.report`.
REPORT_COLUMNS = [
    "group", "layer", "kind", "rule", "declined",
    *(f"{fact}_before" for fact in _FACTS),
    *(f"{fact}_after" for fact in _FACTS),
    "block_bytes_before", "block_bytes_after",
]  # fmt: skip
_BY_GROUP_COLUMNS = [
    "group", "kind", "rule", "layers", "shape_before", "shape_after",
    "block_bytes_before", "block_bytes_after",
]  # fmt: skip


def _rebuild_edit_result(edited, report, note, lmcache):
    return EditResult(edited, report, note, lmcache=lmcache)


class EditResult(Displayable, FrozenDict):
    """The edited ``{layer_name: value}`` dict, plus what happened per layer.

    It *is* the new dict (edited layers re-viewed, the others the very same
    objects), frozen (``TypeError`` / ``FrozenInstanceError`` on any write);
    ``dict(result)`` is a mutable copy.

    ``report`` (a new DataFrame each access): one row per layer with group,
    layer, spec kind, the rule that matched (or ``None``), why every earlier
    rule declined, and shape / stride / storage offset / dtype / bytes per
    block before and after.  ``counts``: rule name -> layers re-viewed.
    """

    __slots__ = ("_rows", "_note", "_lmcache")

    def __init__(
        self,
        edited: Mapping[str, RegisteredKVCache],
        report: pd.DataFrame,
        note: str = "",
        *,
        lmcache: str | None = None,
    ) -> None:
        dict.__init__(self, edited)
        object.__setattr__(self, "_rows", tuple(report.to_dict("records")))
        object.__setattr__(self, "_note", str(note))
        object.__setattr__(self, "_lmcache", lmcache)

    def __setattr__(self, name: str, value: object) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r} of EditResult")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r} of EditResult")

    def __reduce__(self):
        return (
            _rebuild_edit_result,
            (dict(self), self.report, self._note, self._lmcache),
        )

    def __copy__(self) -> EditResult:
        return self

    def __deepcopy__(self, memo: dict) -> EditResult:
        return self

    @property
    def report(self) -> pd.DataFrame:
        """One row per layer (a new DataFrame each time: edit it freely)."""
        return pd.DataFrame(list(self._rows), columns=REPORT_COLUMNS, dtype=object)

    @property
    def counts(self) -> dict[str, int]:
        """Rule name -> layers it re-viewed (a copy)."""
        return dict(
            Counter(row["rule"] for row in self._rows if isinstance(row["rule"], str))
        )

    @property
    def note(self) -> str:
        """Why no rule was consulted, or ``""``."""
        return self._note

    @property
    def lmcache(self) -> str | None:
        """The LMCache release whose edits these are (``"0.5.6"``), or ``None``
        for a result built without one."""
        return self._lmcache

    def by_group(self) -> pd.DataFrame:
        """One row per group and rule that fired (``None``: no rule): ``layers``
        it re-viewed, shapes and bytes per block of the first such layer."""
        seen: dict[tuple[object, object], dict[str, object]] = {}
        for row in self._rows:
            key = (row["group"], row["rule"])
            if key in seen:
                seen[key]["layers"] += 1
            else:
                seen[key] = {c: row.get(c) for c in _BY_GROUP_COLUMNS} | {"layers": 1}
        return pd.DataFrame(
            list(seen.values()), columns=_BY_GROUP_COLUMNS, dtype=object
        )

    def summary(self) -> str:
        """One line: the LMCache release, layers, and how many each rule re-viewed."""
        rules = ", ".join(f"{name} x{n}" for name, n in sorted(self.counts.items()))
        extra = f"; {self._note}" if self._note else ""
        who = f"LMCache {self._lmcache}, " if self._lmcache else ""
        return (
            f"EditResult({who}{len(self)} layers: {rules or 'no layer edited'}{extra})"
        )

    def __repr__(self) -> str:
        return self.text()
