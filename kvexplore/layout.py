"""Pure byte-layout arithmetic shared by every stage: small functions, no I/O.

>>> cdiv(1085440, 16 * 2048)
34
>>> state_names(2), state_names(3)
(['conv', 'ssm'], ['conv0', 'conv1', 'ssm'])
>>> runs([0, 1, 2, 5, 7, 8])
[(0, 2), (5, 5), (7, 8)]
>>> compress_ints([0, 1, 2, 5])
'0-2, 5'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kvexplore.errors import KVExploreError

#: One gibibyte, in bytes.
GiB = 1 << 30


class FrozenDict(dict):
    """kvexplore's one read-only mapping: a ``dict`` (so ``==``, JSON,
    ``dataclasses.asdict`` and vLLM code that expects a dict all work) whose
    mutators raise ``TypeError``.  ``dict(d)`` is a mutable copy; ``copy`` and
    ``deepcopy`` give plain dicts.

    >>> d = FrozenDict(a=1)
    >>> d["b"] = 2
    Traceback (most recent call last):
    ...
    TypeError: FrozenDict is read-only; copy it with dict(...) to change it
    """

    __slots__ = ()

    def _refuse(self, *args, **kwargs):
        raise TypeError(
            f"{type(self).__name__} is read-only; copy it with dict(...) to change it"
        )

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def __reduce__(self):  # pickle, copy and deepcopy give plain dicts
        return (dict, (dict(self),))


def element_size(dtype) -> int:
    """Bytes per element of a ``torch.dtype`` (``torch.bfloat16`` -> 2)."""
    return dtype.itemsize


def requested_memory(total_memory: int, gpu_memory_utilization: float) -> int:
    """The bytes a worker may use: ``ceil(total x gpu_memory_utilization)``,
    as vLLM's ``v1/worker/utils.py: request_memory`` computes it.

    >>> requested_memory(85_029_158_912, 0.9)
    76526243021
    """
    return math.ceil(total_memory * gpu_memory_utilization)


def cdiv(a: int, b: int) -> int:
    """Ceiling division, as vLLM's ``vllm.utils.math_utils.cdiv``."""
    return -(-a // b)


def element_extent(shape: Sequence[int], stride: Sequence[int]) -> int:
    """Elements from a strided view's first to its last addressed element,
    inclusive (``sum((n - 1) * |s|) + 1``; 0 for an empty view)."""
    if any(n == 0 for n in shape):
        return 0
    return sum((n - 1) * abs(s) for n, s in zip(shape, stride, strict=True)) + 1


def dtype_name(dtype) -> str:
    """``torch.bfloat16`` -> ``'bfloat16'``."""
    return str(dtype).removeprefix("torch.")


def runs(values: Iterable[int]) -> list[tuple[int, int]]:
    """Sorted distinct ``values`` as inclusive ``(first, last)`` runs of consecutive integers."""
    out: list[tuple[int, int]] = []
    for v in sorted(set(values)):
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def compress_ints(values: Iterable[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``'0-2, 5'``."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs(values))


def state_names(count: int) -> list[str]:
    """Names of a Mamba page's states in ``MambaSpec.shapes`` order, as vLLM's
    mixers return them from ``get_state_shape``: ``conv`` state(s), then ``ssm``
    (a short-conv layer has one conv state only)."""
    if count == 1:
        return ["conv"]
    if count == 2:
        return ["conv", "ssm"]
    return [f"conv{i}" for i in range(count - 1)] + ["ssm"]


def leaf_specs(spec) -> list:
    """The specs a (possibly composite, e.g. ``UniformTypeKVCacheSpecs``) spec holds."""
    inner = getattr(spec, "kv_cache_specs", None)
    if isinstance(inner, Mapping):
        return list(inner.values())
    return [spec]


def page_bytes(spec) -> int:
    """A spec's page: vLLM's ``KVCacheSpec.page_size_bytes`` (padded where
    vLLM pads), as an int.  Every stage reads a page's bytes here; refused
    with a :class:`KVExploreError` naming the object when it has none."""
    try:
        return int(spec.page_size_bytes)
    except Exception as exc:
        raise KVExploreError(
            f"spec {type(spec).__name__} has no usable page_size_bytes ({exc}); "
            "expected a vLLM KVCacheSpec with a page size"
        ) from None


def real_page_bytes(spec) -> int:
    """A spec's bytes before padding: ``real_page_size_bytes`` where vLLM pads
    (``MambaSpec``), else :func:`page_bytes`."""
    real = getattr(spec, "real_page_size_bytes", None)
    return int(real) if isinstance(real, int) else page_bytes(spec)


def check_int(name: str, value: Any, *, minimum: int = 1, allow_none: bool = False) -> None:
    """Raise ``KVExploreError`` naming ``name`` unless ``value`` is an int >= ``minimum``."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise KVExploreError(
            f"{name}={value!r} is invalid; expected an integer >= {minimum}"
            + (" or None" if allow_none else "")
        )


def jsonable(value: Any) -> Any:
    """``value`` as strict JSON data: numpy/torch scalars unwrapped, NaN -> None,
    infinities and unknown objects -> their ``repr``."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, Mapping)):
        try:
            value = value.item()
        except (TypeError, ValueError):
            return repr(value)
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if math.isinf(value):
            return repr(value)
        return value
    if value is None or isinstance(value, (bool, int, str)):
        return value
    return repr(value)
