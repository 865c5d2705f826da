"""vLLM's start-up admission check, kept as a verdict instead of an error.

:func:`kv_cache_config_with_admission` runs the engine core's
``get_kv_cache_configs`` (``vllm/v1/core/kv_cache_planning.py``; before that
module existed, ``vllm/v1/core/kv_cache_utils.py``) and keeps the verdict of
its ``_check_enough_kv_cache_memory`` as an :class:`Admission`, so a plan that
vLLM would refuse still shows its layout, with vLLM's own message.
:func:`blocks_and_admission` is the same division and the same check for any
other memory, on a config whose pool bytes per block are known: the one place
kvexplore asks vLLM how many blocks a memory holds and whether it admits a
request.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kvexplore.display import Displayable
from kvexplore.layout import FrozenDict
from kvexplore.planning import release
from kvexplore.planning.emulation import emulate, patch_attributes


@dataclass(frozen=True, kw_only=True)
class Admission(Displayable):
    """vLLM's start-up verdict on the way to serving: every check the release
    runs between ``create_engine_config()`` and its first request that
    kvexplore reproduces (:attr:`checks`, in vLLM's order,
    :mod:`kvexplore.planning.startup`), the KV cache memory check among them
    (``kv_cache_planning.py: _check_enough_kv_cache_memory``, called by
    ``get_kv_cache_configs``: can the cache serve one request of
    ``max_model_len`` tokens?).

    ``ok`` is False when any check refuses; ``message`` is vLLM's own error
    text of the first refusal; ``refused_by`` that check.  ``memory_ok`` is
    the memory check's own verdict, ``needed_bytes`` / ``available_bytes``
    its inputs, and ``estimated_max_model_len`` the estimate its message
    quotes (``_estimate_max_model_len_from_groups``, a binary search run on
    first access). ``auto_fit_from`` is the model's length when
    ``max_model_len=-1`` made vLLM shrink it to fit.  ``release`` names the
    vLLM release whose check gave the verdict, in one line by :meth:`summary`.
    ``text()``, ``_repr_html_()`` and ``figure()`` are its display forms
    (:mod:`kvexplore.display`).
    """

    ok: bool
    max_model_len: int
    needed_bytes: int
    available_bytes: int
    auto_fit_from: int | None = None
    release: str = ""
    _extra: tuple = field(default=(), repr=False, compare=False)
    _estimate: Any = field(default=None, repr=False, compare=False)
    _check: Any = field(default=None, repr=False, compare=False)
    _before: tuple = field(default=(), repr=False, compare=False)
    _after: tuple = field(default=(), repr=False, compare=False)

    @property
    def memory_ok(self) -> bool:
        """The KV cache memory check's own verdict."""
        return self.needed_bytes <= self.available_bytes and self.available_bytes > 0

    def with_checks(self, before: tuple = (), after: tuple = ()) -> Admission:
        """This verdict with the checks vLLM runs ``before`` the memory check
        (the worker's ``init_device``) and ``after`` it (``initialize_kv_cache``
        and on), each a :class:`~kvexplore.planning.startup.StartupCheck`;
        ``ok`` becomes every check's verdict."""
        return dataclasses.replace(
            self, ok=self.memory_ok and all(c.ok for c in (*before, *after)),
            _before=tuple(before), _after=tuple(after))

    @cached_property
    def checks(self) -> tuple:
        """Every check that ran, in vLLM's order, each a
        :class:`~kvexplore.planning.startup.StartupCheck`: the worker's
        ``request_memory``, the KV cache memory check, the model runner's
        CUDA-graph resolution and the connector's."""
        from kvexplore.planning.startup import StartupCheck

        memory = StartupCheck(
            name="kv_cache_memory", stage="engine core get_kv_cache_configs",
            function=("v1/core/kv_cache_planning.py: _check_enough_kv_cache_memory"
                      if release.kv_cache_planning().__name__.endswith("kv_cache_planning")
                      else "v1/core/kv_cache_utils.py: _check_enough_kv_cache_memory"),
            ok=self.memory_ok, message=None if self.memory_ok else self._memory_message,
            inputs=FrozenDict(max_model_len=self.max_model_len, needed_bytes=self.needed_bytes,
                              available_bytes=self.available_bytes),
        )
        return (*self._before, memory, *self._after)

    @property
    def refused_by(self):
        """The first check that refuses (a ``StartupCheck``), or ``None``."""
        return next((c for c in self.checks if not c.ok), None) if not self.ok else None

    @cached_property
    def estimated_max_model_len(self) -> int | None:
        if self.memory_ok or self._estimate is None or self.available_bytes <= 0:
            return None
        est = self._estimate(self.available_bytes)
        return est if est > 0 else None

    @cached_property
    def message(self) -> str | None:
        """vLLM's own message of the first refusal; ``None`` when admitted."""
        first = self.refused_by
        return None if first is None else first.message

    @cached_property
    def _memory_message(self) -> str | None:
        if self.memory_ok:
            return None
        estimate = self.estimated_max_model_len or 0
        try:
            self._check(
                self.available_bytes, lambda: self.needed_bytes, self.max_model_len,
                lambda _available: estimate, *self._extra,
            )
        except ValueError as exc:
            return " ".join(str(exc).split())
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok, "max_model_len": self.max_model_len,
            "needed_bytes": self.needed_bytes, "available_bytes": self.available_bytes,
            "estimated_max_model_len": self.estimated_max_model_len,
            "auto_fit_from": self.auto_fit_from, "message": self.message,
            "release": self.release,
            "refused_by": None if self.refused_by is None else self.refused_by.name,
            "checks": [c.to_dict() for c in self.checks],
        }

    @property
    def check_table(self):
        """One row per check that ran (a pandas DataFrame): name, stage, vLLM
        function, passed, vLLM's message, outcome."""
        import pandas as pd

        return pd.DataFrame([{"check": c.name, "stage": c.stage, "function": c.function,
                              "passed": c.ok, "message": c.message or "",
                              "outcome": c.outcome} for c in self.checks])

    def summary(self) -> str:
        """One line: ``admitted: ...`` with the bytes one request needs and
        the cache holds (and the auto-fit length it replaced), or ``refused
        by RELEASE at start-up:`` and vLLM's own message, with the check's
        name where it is not the memory check (:attr:`check_table` lists
        every check)."""
        if self.ok:
            out = (
                f"admitted: one request of max_model_len={self.max_model_len:,} needs "
                f"{self.needed_bytes:,} B of the {self.available_bytes:,} B the cache holds"
            )
            if self.auto_fit_from is not None:
                out += f" (auto-fit reduced max_model_len from {self.auto_fit_from:,})"
            return out
        first = self.refused_by
        if first is not None and first.name != "kv_cache_memory":
            return f"refused by {self.release} at start-up ({first.name}): {self.message}"
        return f"refused by {self.release} at start-up: {self.message}"


def kv_cache_config_with_admission(vc, stages: tuple, memory: list, rank: int = 0):
    """``get_kv_cache_configs`` as the engine core calls it on every pipeline
    stage's worker (``stages``: one build each, one without pipeline
    parallelism, with the global groups; ``memory``: each worker's KV cache
    bytes), keeping the verdict of its admission check (:class:`Admission`)
    instead of raising it.  A memory of ``None`` lets the config's
    ``num_gpu_blocks_override`` decide the block count.

    Returns ``(KVCacheConfig of stage rank, Admission | None)``: the verdict
    of the first worker vLLM would refuse, else stage ``rank``'s.  Every
    worker's config has the fewest blocks of any (vLLM sizes them alike)."""
    kcp = release.kv_cache_planning()
    seen: list[Admission] = []
    original = kcp._check_enough_kv_cache_memory
    before = vc.model_config.max_model_len

    def check(available, get_needed, max_model_len, estimate, *extra):
        needed = get_needed()
        seen.append(
            Admission(
                ok=needed <= available and available > 0, max_model_len=max_model_len,
                needed_bytes=needed, available_bytes=available,
                release=release.release_name(), _extra=extra,
                _estimate=estimate, _check=original,
            )
        )

    workers = [dict(b.layer_specs) for b in stages]
    memory = [m or 1 for m in memory]  # 1: num_gpu_blocks_override decides
    with emulate(stages[rank].gpu, meta_tensors=False), patch_attributes(
        [(kcp, "_check_enough_kv_cache_memory", check)]
    ):
        cfg = release.kv_cache_configs(vc, workers, memory, stages[rank].groups)[rank]
    cfg.kv_cache_layout = vc.cache_config.kv_cache_layout
    refused = [a for a in seen if not a.ok]
    admission = refused[0] if refused else (seen[min(rank, len(seen) - 1)] if seen else None)
    if admission is not None and vc.model_config.max_model_len != before:
        admission = dataclasses.replace(admission, auto_fit_from=before)
    return cfg, admission


def largest_max_model_len(vc, groups: list, pool_bytes: int, check_bytes: int) -> int:
    """The longest request ``check_bytes`` of KV cache memory admits
    (``_estimate_max_model_len_from_groups``, the search vLLM's refusal
    quotes), up to ``vc``'s ``max_model_len``; 0 without memory.  ``groups``
    and ``pool_bytes`` as for :func:`blocks_and_admission`; ``check_bytes``
    is the memory less the null block (:attr:`Admission.available_bytes`)."""
    if check_bytes <= 0:
        return 0
    return int(release.max_model_len_estimator(vc, groups, pool_bytes)(check_bytes))


def blocks_and_admission(vc, groups: list, pool_bytes: int,
                         available_bytes: int) -> tuple[int, Admission]:
    """``(num_blocks, Admission)`` for ``available_bytes`` of KV cache memory, as
    ``get_kv_cache_configs`` computes them:
    ``available_bytes // pool_bytes`` blocks, and
    ``_check_enough_kv_cache_memory`` on the memory less the null block's
    ``pool_bytes``, with ``_max_memory_usage_bytes_from_groups`` and
    ``_estimate_max_model_len_from_groups`` over ``groups`` (a
    ``KVCacheGroupSpec`` list) for ``vc``'s ``max_model_len``, each where the
    release keeps it (:func:`kvexplore.planning.release.max_memory_usage_bytes_from_groups`,
    :func:`~kvexplore.planning.release.max_model_len_estimator`).  ``pool_bytes``
    is the pool's bytes per block id (:func:`~kvexplore.planning.release.pool_bytes_per_block`)."""
    kcp = release.kv_cache_planning()
    needed = release.max_memory_usage_bytes_from_groups(vc, groups, pool_bytes)
    check_memory = available_bytes - pool_bytes
    return available_bytes // pool_bytes, Admission(
        ok=needed <= check_memory and check_memory > 0,
        max_model_len=int(vc.model_config.max_model_len), needed_bytes=int(needed),
        available_bytes=int(check_memory), release=release.release_name(),
        _extra=release.admission_hint(vc),
        _estimate=release.max_model_len_estimator(vc, groups, pool_bytes),
        _check=kcp._check_enough_kv_cache_memory,
    )


__all__ = ["Admission", "blocks_and_admission", "kv_cache_config_with_admission",
           "largest_max_model_len"]
