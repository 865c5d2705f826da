"""Plain-text forms of results that live outside the rendering stage.

Deterministic (no addresses, no timings), so nbval and tests can compare them.
"""

from __future__ import annotations


def plan_text(plan) -> str:
    """``Plan.text()``: the one-line header, the key numbers, the groups and the
    derivation of every size (what ``kvexplore plan`` prints)."""
    summary = plan.summary
    groups = plan.group_table
    lines = [repr(plan), "", summary.to_string(index=False), "", "KV cache groups:"]
    lines.append(groups.to_string(index=False))
    lines += ["", "derivation:", plan.explain()]
    return "\n".join(lines)
