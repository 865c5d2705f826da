"""The way out of a start-up refusal: the nearest settings that start.

:func:`way_out` takes a plan whose :attr:`~kvexplore.planning.planner.Plan.admission`
refuses and returns, for the check that refused first, the settings a user
would change, each confirmed by planning it (:class:`WayOut.starts` is the
whole start-up verdict of that plan, never a formula):

- ``cudagraph_mode`` (full CUDA graphs with Mamba layers and ``max_num_seqs``
  above the cache's blocks): the largest ``max_num_seqs`` that starts (a
  smaller batch also shrinks the sampler's share of the memory profile, so it
  may exceed today's block count), the smallest ``gpu_memory_utilization``
  (in hundredths, up to 1.0) that starts the asked ``max_num_seqs``, and
  ``compilation_config={"cudagraph_mode": "PIECEWISE"}`` (no full decode
  graphs, so no one-block-per-sequence rule, at decode speed's cost);
- ``kv_cache_memory`` (one request of ``max_model_len`` does not fit): the
  ``max_model_len`` vLLM's own refusal estimates, and the smallest
  ``gpu_memory_utilization`` that holds the asked length;
- ``request_memory`` (another process holds memory): the largest
  ``gpu_memory_utilization`` (in hundredths) the free memory covers.

Searches plan each candidate with :meth:`Plan.replace`; a plan's build is
reused where only memory keywords change.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict


def serve_flag(name: str, value: Any) -> str:
    """Engine argument ``name`` set to ``value`` as a ``vllm serve`` flag:
    the name with dashes; ``True`` as ``--x``, ``False`` as ``--no-x``; a
    dict as quoted JSON; anything else shell-quoted."""
    flag = "--" + name.replace("_", "-")
    if value is True:
        return flag
    if value is False:
        return "--no-" + name.replace("_", "-")
    if isinstance(value, dict):
        return f"{flag} {shlex.quote(json.dumps(value))}"
    return f"{flag} {shlex.quote(str(value))}"


@dataclass(frozen=True, kw_only=True)
class WayOut:
    """One change of ``plan()`` keywords and what it does to the start-up.

    ``change`` maps keyword to value; ``why`` says what it trades;
    ``starts`` is the whole start-up verdict of the plan with the change
    (``plan``), ``summary`` that plan's verdict in one line."""

    change: FrozenDict
    why: str
    starts: bool
    summary: str
    plan: Any = field(repr=False, compare=False)

    @property
    def flags(self) -> str:
        """The change as ``vllm serve`` flags (``--max-num-seqs 844``)."""
        return " ".join(serve_flag(name, value) for name, value in self.change.items())

    def text(self) -> str:
        verdict = "starts" if self.starts else "still refused"
        return f"{self.flags}: {verdict}; {self.why}"

    def to_dict(self) -> dict[str, Any]:
        return {"change": dict(self.change), "flags": self.flags, "why": self.why,
                "starts": self.starts, "summary": self.summary}


def _starts(p) -> bool:
    return p.admission is None or p.admission.ok


def _try(p, **change):
    """``p.replace(**change)``, or ``None`` where the change is refused as input."""
    try:
        return p.replace(**change)
    except KVExploreError:
        return None


def _way(p, why: str, *, _depth: int = 0, **change) -> WayOut | None:
    """The change planned; where it gets past the check that refused but a
    later check refuses, that check's first way out is added to it (at most
    two more steps), so a way out names every change it needs."""
    q = _try(p, **change)
    if q is None:
        return None
    first = p.admission.refused_by if p.admission is not None else None
    if not _starts(q) and _depth < 2 and first is not None \
            and q.admission.refused_by.name != first.name:
        after = way_out(q, _depth=_depth + 1)
        if after:
            step = after[0]
            return WayOut(change=FrozenDict({**change, **step.change}),
                          why=f"{why}; then {step.why}", starts=step.starts,
                          summary=step.summary, plan=step.plan)
    return WayOut(change=FrozenDict(change), why=why, starts=_starts(q),
                  summary=q.admission.summary() if q.admission is not None else "", plan=q)


def _largest(lo: int, hi: int, starts) -> int | None:
    """The largest ``n`` in ``[lo, hi]`` with ``starts(n)``, where ``starts``
    holds up to some point and fails after it; ``None`` when ``lo`` fails."""
    if lo > hi or not starts(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if starts(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _smallest_utilization(p, start: float) -> float | None:
    """The smallest ``gpu_memory_utilization`` in hundredths above ``start``,
    up to 1.0, whose plan starts; ``None`` when none does (the cache's
    memory grows with the utilization, so the verdict turns once)."""
    lo = math.floor(start * 100) + 1

    def starts(n: int) -> bool:
        q = _try(p, gpu_memory_utilization=n / 100)
        return q is not None and _starts(q)

    if lo > 100 or not starts(100):
        return None
    hi = 100
    while lo < hi:
        mid = (lo + hi) // 2
        if starts(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo / 100


def _piecewise(p) -> dict:
    """The plan's ``compilation_config`` with ``cudagraph_mode`` PIECEWISE."""
    return {**(p.inputs.get("compilation_config") or {}), "cudagraph_mode": "PIECEWISE"}


def _cudagraph(p, check, depth: int) -> list[WayOut]:
    asked = int(check.inputs["max_num_seqs"])
    blocks = int(check.inputs["num_blocks"])
    out = []

    def seqs_start(n: int) -> bool:
        q = _try(p, max_num_seqs=n)
        return q is not None and _starts(q)

    # fewer sequences never leave fewer blocks, so the search starts at today's
    n = _largest(min(max(blocks, 1), asked - 1), asked - 1, seqs_start)
    if n is None:
        n = _largest(1, max(blocks, 1) - 1, seqs_start)
    if n is not None:
        out.append(_way(p, _depth=depth, why=f"at most {n:,} sequences decode at once (asked {asked:,}); "
                           "each holds one Mamba block", max_num_seqs=n))
    if p.sized_by_profile:
        util = _smallest_utilization(p, p.gpu_memory_utilization)
        if util is not None:
            out.append(_way(p, _depth=depth, why=f"{asked:,} sequences need {asked:,} blocks; vLLM takes "
                               f"{util:.2f} of the card (was {p.gpu_memory_utilization:.2f})",
                            gpu_memory_utilization=util))
    out.append(_way(p, _depth=depth, why="captures no full CUDA graph (decode runs piecewise graphs: slower "
                       "decode, no one-block-per-sequence rule)",
                    compilation_config=_piecewise(p)))
    return [w for w in out if w is not None]


def _memory(p, depth: int) -> list[WayOut]:
    out = []
    estimate = p.admission.estimated_max_model_len
    if estimate:
        out.append(_way(p, _depth=depth, why=f"requests of at most {estimate:,} tokens (vLLM's own estimate; "
                           f"asked {p.max_model_len:,})", max_model_len=estimate))
    if p.sized_by_profile:
        util = _smallest_utilization(p, p.gpu_memory_utilization)
        if util is not None:
            out.append(_way(p, _depth=depth, why=f"vLLM takes {util:.2f} of the card (was "
                               f"{p.gpu_memory_utilization:.2f})", gpu_memory_utilization=util))
    return [w for w in out if w is not None]


def _request_memory(p, check, depth: int) -> list[WayOut]:
    total, free = int(check.inputs["total_memory"]), int(check.inputs["free_memory"])
    util = math.floor(free / total * 100) / 100 if total else 0
    if util <= 0:
        return []
    way = _way(p, _depth=depth, why=f"vLLM asks for {util:.2f} of the card, what the "
                  f"{free:,} B free at start cover", gpu_memory_utilization=util)
    return [way] if way is not None else []


def way_out(p, *, _depth: int = 0) -> tuple[WayOut, ...]:
    """The settings nearest to ``p`` that get past its first start-up
    refusal, each planned (see the module doc); ``()`` when ``p`` starts or
    no change kvexplore knows gets past the check that refused."""
    admission = p.admission
    if admission is None or admission.ok:
        return ()
    first = admission.refused_by
    if first.name == "cudagraph_mode" and "exceeds available Mamba cache blocks" in (
            first.message or ""):
        return tuple(_cudagraph(p, first, _depth))
    if first.name == "kv_cache_memory":
        return tuple(_memory(p, _depth))
    if first.name == "request_memory":
        return tuple(_request_memory(p, first, _depth))
    if first.name == "cudagraph_mode":
        way = _way(p, why="captures no full CUDA graph", _depth=_depth,
                   compilation_config=_piecewise(p))
        return (way,) if way is not None else ()
    return ()


__all__ = ["WayOut", "serve_flag", "way_out"]
