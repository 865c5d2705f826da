"""Text, HTML and figures of ``EditResult`` and ``RoundTripReport``, and the
Explorer's edits panel."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from html import escape
from typing import Any

from kvexplore.display import Displayable
from kvexplore.rendering.figures import new_figure
from kvexplore.rendering.html import message_html, table_html

_EDIT_COLUMNS = ["group", "layer", "rule", "shape_before", "shape_after"]
#: The columns of a round-trip report its text form shows.
ROUNDTRIP_COLUMNS = ["group", "layer", "regions", "blocks", "bytes", "ok", "detail"]


def _mib(nbytes: object) -> float:
    return float(nbytes or 0) / (1 << 20)


def _summary_text(summary: str, table, columns: list[str]) -> str:
    """``summary``, then ``table[columns]`` unless the table is empty."""
    if table.empty:
        return summary
    return summary + "\n" + table[columns].to_string(index=False)


def edit_result_text(result) -> str:
    """Summary line, then group / layer / rule / shape before and after."""
    return _summary_text(result.summary(), result.report, _EDIT_COLUMNS)


def edit_result_html(result) -> str:
    """Summary, the per-group table, then the per-layer table."""
    body = "" if result.report.empty else (
        f"<p>by group</p>{table_html(result.by_group())}<p>by layer</p>{table_html(result.report)}")
    return f"<div><p><b>{escape(result.summary())}</b></p>{body}</div>"


def edit_result_figure(result):
    """Per group: MiB per block of the registered and of the edited view,
    labelled with the shapes, the rule and how many layers it fired on."""
    table = result.by_group()
    rows = max(1, len(table))
    fig = new_figure(10, 0.9 + 0.6 * rows)
    ax = fig.add_subplot(1, 1, 1)
    if table.empty:
        ax.text(0.5, 0.5, result.summary(), ha="center", va="center")
        ax.set_axis_off()
        return fig
    labels = []
    for i, row in enumerate(table.to_dict("records")):
        y = rows - 1 - i
        before, after = _mib(row["block_bytes_before"]), _mib(row["block_bytes_after"])
        ax.barh(y + 0.2, before, height=0.38, color="#9ecae1")
        ax.barh(y - 0.2, after, height=0.38, color="#fdae6b")
        ax.text(before, y + 0.2, f" {row['shape_before']}", va="center", fontsize=7)
        ax.text(after, y - 0.2, f" {row['shape_after']}", va="center", fontsize=7)
        rule = row["rule"] if isinstance(row["rule"], str) else "no rule"
        labels.append((y, f"group {row['group']} ({row['kind']})\n{rule} x{row['layers']}"))
    ax.set_yticks([y for y, _ in labels], [text for _, text in labels], fontsize=7)
    ax.set_xlabel("MiB per block (registered: blue, edited: orange)")
    ax.set_title(result.summary(), fontsize=8)
    ax.margins(x=0.35)
    fig.tight_layout()
    return fig


def roundtrip_text(report) -> str:
    """Summary line, then one row per layer (group, regions, bytes, verdict)."""
    return _summary_text(report.summary(), report.table, ROUNDTRIP_COLUMNS)


def roundtrip_html(report) -> str:
    """Summary, then the whole per-layer table."""
    return f"<div><p><b>{escape(report.summary())}</b></p>{table_html(report.table)}</div>"


def _per_group(report) -> list[dict[str, object]]:
    groups: dict[object, dict[str, object]] = {}
    for v in report.layers:
        entry = groups.setdefault(
            v.group, {"group": v.group, "bytes": 0, "mismatched": 0, "uncovered": 0}
        )
        entry["bytes"] += v.bytes
        entry["mismatched"] += v.mismatched_bytes
        entry["uncovered"] += v.uncovered_bytes
    return [groups[g] for g in sorted(groups)]


def roundtrip_figure(report):
    """Per group: MiB checked, and mismatched / uncovered bytes (labelled)."""
    groups = _per_group(report)
    rows = max(1, len(groups))
    fig = new_figure(10, 0.9 + 0.45 * rows)
    checked, failures = fig.subplots(1, 2, sharey=True)
    if not groups:
        checked.text(0.5, 0.5, report.summary(), ha="center", va="center")
        checked.set_axis_off()
        failures.set_axis_off()
        return fig
    ys = list(range(rows - 1, -1, -1))
    checked.barh(ys, [_mib(g["bytes"]) for g in groups], color="#74c476")
    checked.set_yticks(ys, [f"group {g['group']}" for g in groups], fontsize=7)
    checked.set_xlabel("MiB checked")
    for name, color, offset in (
        ("mismatched", "#de2d26", 0.2),
        ("uncovered", "#fd8d3c", -0.2),
    ):
        values = [int(g[name]) for g in groups]
        failures.barh(
            [y + offset for y in ys], values, height=0.38, color=color, label=name
        )
        for y, value in zip(ys, values, strict=True):
            failures.text(value, y + offset, f" {value:,}", va="center", fontsize=7)
    failures.set_xlabel("bytes")
    failures.legend(fontsize=7, loc="lower right")
    failures.margins(x=0.3)
    fig.suptitle(report.summary(), fontsize=8)
    fig.tight_layout()
    return fig


@dataclass(frozen=True)
class EditGroup(Displayable):
    """One KV cache group's edits, from ``EditResult.report``.

    ``layers``: ``(layer, rule, declined)`` in report order; ``rules``:
    ``(rule, layers)`` in first-seen order (``None``: no rule matched);
    ``before``/``after``: the distinct ``shape dtype`` per block;
    ``declined``: ``(reason, layers)`` per distinct reason.  ``text()`` and
    ``_repr_html_()`` are its display forms (:mod:`kvexplore.display`).
    """

    group: Any
    kind: str
    layers: tuple[tuple[str, str | None, str | None], ...]
    rules: tuple[tuple[str | None, int], ...]
    before: tuple[str, ...]
    after: tuple[str, ...]
    declined: tuple[tuple[str, int], ...]

    @property
    def first_layer(self) -> str:
        return self.layers[0][0]

    def rules_text(self) -> str:
        return ", ".join(f"{rule or 'no rule (registered object kept)'} x{n}" for rule, n in self.rules)


def _opt(value) -> str | None:
    return value if isinstance(value, str) and value else None


def _view(rec, side: str) -> str:
    return f"{rec.get('shape_' + side)} {rec.get('dtype_' + side)}"


def edit_group_text(group: EditGroup) -> str:
    """``EditGroup.text()``: the group's rules, its view before and after, and
    every declined reason with the layers it declined."""
    n = len(group.layers)
    lines = [f"group {group.group} ({group.kind}, {n} layer{'s' if n != 1 else ''}): {group.rules_text()}",
             f"  view before: {' | '.join(group.before)}",
             f"  view after:  {' | '.join(group.after)}"]
    for reason, count in group.declined:
        lines.append(f"  declined on {count} of {n}: {reason}")
    return "\n".join(lines)


def edit_group_html(group: EditGroup) -> str:
    """``EditGroup._repr_html_``: :func:`edit_groups_html` of the one group."""
    return edit_groups_html([group])


def edit_groups(report) -> list[EditGroup]:
    """One :class:`EditGroup` per group of an edit report (a DataFrame or
    records with the columns of ``EditResult.report``), in first-seen order."""
    records = report.to_dict("records") if hasattr(report, "to_dict") else list(report)
    by_group: dict = {}
    for rec in records:
        by_group.setdefault(rec.get("group"), []).append(rec)
    out = []
    for g, rows in by_group.items():
        reasons = [part for rec in rows for part in (_opt(rec.get("declined")) or "").split("; ") if part]
        out.append(EditGroup(
            group=g,
            kind=" / ".join(dict.fromkeys(str(rec.get("kind")) for rec in rows)),
            layers=tuple((str(rec.get("layer")), _opt(rec.get("rule")), _opt(rec.get("declined")))
                         for rec in rows),
            rules=tuple(Counter(_opt(rec.get("rule")) for rec in rows).items()),
            before=tuple(dict.fromkeys(_view(rec, "before") for rec in rows)),
            after=tuple(dict.fromkeys(_view(rec, "after") for rec in rows)),
            declined=tuple(Counter(reasons).items()),
        ))
    return out


def edit_groups_html(groups: list[EditGroup], bars: Mapping[Any, str] | None = None) -> str:
    """A summary table of ``groups``, then per group its ``bars[group]``, the
    declined reasons and the per-layer table (closed ``<details>``)."""
    summary = table_html([{
        "group": g.group, "kind": g.kind, "layers": len(g.layers), "rule (layers)": g.rules_text(),
        "view before": " | ".join(g.before), "view after": " | ".join(g.after)} for g in groups])
    parts = [summary]
    for g in groups:
        n = len(g.layers)
        parts.append(f'<div class="kvx-edit-group"><p><b>group {escape(str(g.group))}</b> '
                     f"({escape(g.kind)}, {n} layers): {escape(g.rules_text())}; first layer "
                     f"<code>{escape(g.first_layer)}</code></p>")
        if bars and bars.get(g.group):
            parts.append(bars[g.group])
        if g.declined:
            items = "".join(f"<li>{count} of {n}: {escape(reason)}</li>" for reason, count in g.declined)
            parts.append(f"<details><summary>declined rules ({len(g.declined)} reasons)</summary>"
                         f"<ul>{items}</ul></details>")
        table = table_html([{"layer": layer, "rule": rule, "declined": why} for layer, rule, why in g.layers])
        parts.append(f"<details><summary>per-layer reasons ({n} layers)</summary>{table}</details></div>")
    return "".join(parts)


def edits_panel(verdicts, registration: str, summary: str = "", groups=(),
                bars: Mapping[Any, str] | None = None, error: str = "") -> tuple[str, str]:
    """The Explorer's edits panel as ``(text, html)``: the
    ``check_kv_cache_groups`` verdicts, then the :func:`edit_groups` (in the
    HTML with :func:`edit_groups_html`'s ``bars``) or ``error`` (why the edits
    were refused)."""
    text = "validation:\n" + verdicts.to_string(index=False)
    head = ("<details open><summary><b>validation</b></summary>" + table_html(verdicts)
            + "</details>")
    if error:
        return f"{text}\n{error}", head + message_html(error)
    text += f"\nedits ({registration}): {summary}\n" + "\n".join(g.text() for g in groups)
    return text, (head + f"<p><b>edits ({escape(registration)})</b>: {escape(summary)}</p>"
                  + edit_groups_html(list(groups), bars))


__all__ = [
    "ROUNDTRIP_COLUMNS",
    "edits_panel",
    "EditGroup",
    "edit_groups",
    "edit_groups_html",
    "edit_result_figure",
    "edit_result_html",
    "edit_result_text",
    "roundtrip_figure",
    "roundtrip_html",
    "roundtrip_text",
]
