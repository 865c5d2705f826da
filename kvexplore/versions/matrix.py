"""Does this LMCache accept this deployment on this vLLM, and what does it do to each group?

:func:`lmcache_outcomes` answers with the installed vLLM release: the plan's
registration (``unified``, what vLLM 0.26 and later hand a connector, or
``legacy``) for :data:`~kvexplore.versions.compare.FACT_BLOCKS` blocks, and
for each LMCache release, each KV cache group's outcome: the rule that
re-views its layers and the shapes before and after, ``as registered``
(no rule matches), ``refused`` (validation, the layout hint or the rule's own
check, with LMCache's reason) or ``blocked`` (the group is fine, but LMCache
refuses the deployment at another group's validation or hint).
:func:`compatibility` gets those rows from every vLLM release named, each in
its own environment, as :func:`~kvexplore.versions.compare.compare_versions`
does.

    python -m kvexplore.versions.matrix '{"model": "Qwen/Qwen3.5-0.8B", "gpu": "H100"}'

prints the installed release's rows as one JSON line.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvexplore.display import Displayable, register_forms
from kvexplore.editing.lmcache import lmcache_release, lmcache_releases
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, jsonable
from kvexplore.planning.release import canonical_release, installed_release
from kvexplore.rendering.releases import matrix_figure, matrix_html
from kvexplore.version import release_list
from kvexplore.versions.compare import FACT_BLOCKS

#: Outcomes of one group, best first.
OUTCOMES = ("edited", "as registered", "blocked", "refused")
COLUMNS = [
    "vllm", "lmcache", "group", "kind", "layers", "outcome", "rule",
    "shape_before", "shape_after", "reason",
]  # fmt: skip


def _shape(value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return list(value.shape)
    if isinstance(value, (list, tuple)):
        return [list(t.shape) for t in value if isinstance(t, torch.Tensor)]
    return None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())[:400]


def _release_rows(small, kv, release) -> list[dict[str, Any]]:
    """One row per group of ``small`` for LMCache ``release``."""
    from kvexplore.editing.rules import edit_each_layer
    from kvexplore.editing.validation import check_kv_cache_groups

    cfg = small.kv_cache_config
    verdicts = check_kv_cache_groups(cfg, lmcache=release)
    rejected = {
        int(v.group): v.reason for v in verdicts.itertuples() if v.verdict == "rejected"
    }
    layers: dict[str, tuple] = {}
    stage_refusal = None
    if not rejected:
        try:
            layers = edit_each_layer(cfg, kv, lmcache=release)
        except KVExploreError as exc:
            stage_refusal = _one_line(exc)
    rows = []
    for g in small.groups:
        names = [n for n in g.layer_names if n in kv]
        row = {
            "lmcache": release.version,
            "group": g.index,
            "kind": g.kind,
            "layers": len(names),
            "rule": None,
            "shape_before": _shape(kv[names[0]]) if names else None,
            "shape_after": None,
            "reason": None,
        }
        if g.index in rejected:
            row.update(outcome="refused", reason=f"validation: {rejected[g.index]}")
        elif rejected or stage_refusal:
            row.update(
                outcome="blocked", reason=stage_refusal or "another group is refused"
            )
        else:
            outcomes = [layers.get(n, (None, kv[n], None)) for n in names]
            refused = next((o for o in outcomes if o[2] is not None), None)
            fired = [o[0] for o in outcomes if o[0] is not None]
            if refused is not None:
                row.update(outcome="refused", rule=refused[0], reason=refused[2])
            elif fired:
                row.update(
                    outcome="edited",
                    rule=", ".join(dict.fromkeys(fired)),
                    shape_after=_shape(outcomes[0][1]),
                )
            else:
                row.update(outcome="as registered", shape_after=row["shape_before"])
        rows.append(row)
    return rows


def _stores(p, releases, chunk_size: int) -> dict[str, Any]:
    """Per LMCache release, what its multi-process connector and server say
    of the deployment at ``chunk_size`` (:func:`kvexplore.lmcache_layouts`):
    accepted, the check that refused, the chunk used, the smallest accepted
    chunk and the bytes one chunk stores; ``None`` for a release whose
    connector builds no hybrid groups."""
    from kvexplore.connectors.lmcache_layout import lmcache_layouts

    hybrid = [r for r in releases if r.hybrid_groups]
    layouts = lmcache_layouts(p, lmcache=hybrid, chunk_size=chunk_size) if hybrid else {}
    out: dict[str, Any] = {}
    for r in releases:
        layout = layouts.get(r.version)
        out[r.version] = None if layout is None else {
            "accepted": layout.accepted,
            "refused_by": layout.refusal.name if layout.refusal else None,
            "refusal": layout.refusal.message if layout.refusal else None,
            "chunk_size": layout.chunk_size,
            "smallest_chunk": layout.smallest_chunk(),
            "chunk_bytes": layout.chunk_bytes,
        }
    return out


def lmcache_outcomes(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    lmcache: Sequence[str] | None = None,
    registration: str = "unified",
    chunk_size: int | None = None,
    **plan_kwargs,
) -> dict[str, Any]:
    """The installed vLLM's answer: ``{"vllm": release, "rows": [...],
    "deployments": {lmcache: None or LMCache's refusal}}`` for the releases
    of ``lmcache`` (default: every known one), JSON-ready; with
    ``chunk_size``, also ``"stores"``: per release what its server says of the
    deployment at that chunk (:func:`_stores`)."""
    from kvexplore.planning.planner import plan
    from kvexplore.registration import allocate, check_registration_name

    check_registration_name(registration)
    releases = [lmcache_release(r) for r in (lmcache or lmcache_releases())]
    p = plan(model, **plan_kwargs)
    small = p.with_num_blocks(FACT_BLOCKS)
    kv = allocate(small, device="meta", registration=registration)
    from kvexplore.editing.rules import apply_kv_cache_group_edits

    rows, deployments = [], {}
    for release in releases:
        rows += _release_rows(small, kv, release)
        try:
            apply_kv_cache_group_edits(small.kv_cache_config, kv, lmcache=release)
            deployments[release.version] = None
        except KVExploreError as exc:
            deployments[release.version] = _one_line(exc)
    answer = {"vllm": p.vllm_version, "rows": jsonable(rows), "deployments": deployments}
    if chunk_size is not None:
        answer["stores"] = jsonable(_stores(p, releases, chunk_size))
    return answer


@dataclass(frozen=True)
class Compatibility(Displayable):
    """One deployment under every (vLLM release, LMCache release): per KV
    cache group, what LMCache does (``rows``, a DataFrame of :data:`COLUMNS`),
    and per pair whether LMCache accepts the deployment at all
    (``deployments``: ``{(vllm, lmcache): None or the refusal}``); with a
    ``chunk_size``, per pair what LMCache's multi-process connector and server
    say of the deployment at that chunk (``stores``: ``{(vllm, lmcache): None
    or {accepted, refused_by, refusal, chunk_size, smallest_chunk,
    chunk_bytes}}``).
    ``text()``, ``_repr_html_()`` and ``figure()`` are its display forms
    (:data:`FORMS`)."""

    model: str
    inputs: FrozenDict
    registration: str
    rows_data: tuple
    deployments: FrozenDict
    stores: FrozenDict = field(default_factory=FrozenDict)
    chunk_size: int | None = None

    @property
    def rows(self) -> pd.DataFrame:
        """One row per (vLLM, LMCache, group) (a new DataFrame)."""
        return pd.DataFrame(list(self.rows_data), columns=COLUMNS)

    @property
    def vllm_releases(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r["vllm"] for r in self.rows_data))

    @property
    def lmcache_releases(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r["lmcache"] for r in self.rows_data))

    def grid(self) -> pd.DataFrame:
        """One row per (vLLM, LMCache) pair, one column per group: the
        outcome (and rule) in a word; ``accepted`` says whether LMCache's
        ``apply_kv_cache_group_edits`` returns at all."""
        out = []
        for (vllm, lmcache), refusal in self.deployments.items():
            row = {"vllm": vllm, "lmcache": lmcache, "accepted": refusal is None}
            if self.chunk_size is not None:
                row.update(_store_columns(self.stores.get((vllm, lmcache)), self.chunk_size))
            for r in self.rows_data:
                if (r["vllm"], r["lmcache"]) == (vllm, lmcache):
                    word = r["outcome"] + (f": {r['rule']}" if r["rule"] else "")
                    row[f"group {r['group']} ({r['kind']})"] = word
            out.append(row)
        return pd.DataFrame(out)

    def differences(self) -> list[str]:
        """Where two adjacent releases (of LMCache, for one vLLM; of vLLM, for
        one LMCache) differ for a group, one line each."""
        rows = {(r["vllm"], r["lmcache"], r["group"]): r for r in self.rows_data}
        lines = []
        for vllm in self.vllm_releases:
            for a, b in zip(
                self.lmcache_releases, self.lmcache_releases[1:], strict=False
            ):
                lines += _diff(
                    rows, (vllm, a), (vllm, b), f"vLLM {vllm}: LMCache {a} -> {b}"
                )
        for lmcache in self.lmcache_releases:
            for a, b in zip(self.vllm_releases, self.vllm_releases[1:], strict=False):
                lines += _diff(
                    rows,
                    (a, lmcache),
                    (b, lmcache),
                    f"LMCache {lmcache}: vLLM {a} -> {b}",
                )
        return lines

    def _head(self) -> str:
        inputs = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        return (
            f"{self.model}{f' ({inputs})' if inputs else ''}, {self.registration} "
            f"registration: vLLM {', '.join(self.vllm_releases)} x LMCache "
            f"{', '.join(self.lmcache_releases)}"
        )

    def __repr__(self) -> str:
        return (
            f"Compatibility({self.model!r}, vllm={list(self.vllm_releases)}, "
            f"lmcache={list(self.lmcache_releases)})"
        )


def _store_columns(store: Mapping[str, Any] | None, chunk_size: int) -> dict[str, Any]:
    """The grid's columns for what LMCache's server says at ``chunk_size``."""
    if store is None:
        return {f"stores at chunk {chunk_size}": "no hybrid groups", "smallest_chunk": None}
    word = (f"yes, chunk {store['chunk_size']}, {store['chunk_bytes']:,} B"
            if store["accepted"] else f"refused: {store['refused_by']}")
    return {f"stores at chunk {chunk_size}": word, "smallest_chunk": store["smallest_chunk"]}


def compatibility_text(c: Compatibility) -> str:
    """``Compatibility.text()``: the grid, then every difference between
    adjacent releases."""
    lines = [c._head(), c.grid().to_string(index=False)]
    diffs = c.differences()
    lines.append(f"{len(diffs)} differences between adjacent releases")
    lines += [f"  {d}" for d in diffs]
    return "\n".join(lines)


def compatibility_figure(c: Compatibility):
    """``Compatibility.figure()``: the grid drawn, one row per (vLLM,
    LMCache), one column per group, each cell coloured by outcome and
    labelled with the rule."""
    return matrix_figure(c._head(), list(c.rows_data), list(c.deployments))


def compatibility_html(c: Compatibility) -> str:
    """``Compatibility._repr_html_()``: the grid as a coloured table (and,
    with a chunk size, what LMCache's server says per pair)."""
    out = matrix_html(c._head(), list(c.rows_data), dict(c.deployments))
    if c.chunk_size is None:
        return out
    from kvexplore.rendering.html import table_html

    columns = ["vllm", "lmcache", f"stores at chunk {c.chunk_size}", "smallest_chunk"]
    return out + table_html(c.grid(), columns)


#: ``Compatibility`` -> its ``(text, html, figure)`` forms, registered here,
#: where the type is defined (:func:`kvexplore.display.register_forms`).
FORMS = {Compatibility: (compatibility_text, compatibility_html, compatibility_figure)}
register_forms(FORMS)


def _diff(rows, left, right, title) -> list[str]:
    out = []
    groups = sorted({g for (v, m, g) in rows if (v, m) in (left, right)})
    for g in groups:
        a, b = rows.get((*left, g)), rows.get((*right, g))
        if a is None or b is None:
            continue
        fa = (a["outcome"], a["rule"], a["shape_after"])
        fb = (b["outcome"], b["rule"], b["shape_after"])
        if fa != fb:
            out.append(f"{title}, group {g} ({a['kind']}): {_word(a)} -> {_word(b)}")
    return out


def _word(row: Mapping[str, Any]) -> str:
    """``edited (rule) [shape after]``, ``as registered [shape]``, ``refused (rule)``."""
    shape = f" {row['shape_after']}" if row["shape_after"] is not None else ""
    return row["outcome"] + (f" ({row['rule']})" if row["rule"] else "") + shape


def outcomes_in(release: str, model: Any, request: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`lmcache_outcomes` as vLLM ``release`` answers, in its own
    environment (this process for the installed release); an environment
    that fails its check or answers as another release is refused
    (:func:`~kvexplore.versions.environments.answer_in`)."""
    if release == installed_release().version:
        return lmcache_outcomes(model, **request)
    from kvexplore.versions.environments import answer_in, model_argument

    payload = json.dumps({"model": model_argument(model), **request})
    return answer_in(release, "kvexplore.versions.matrix", payload)


def compatibility(
    model: Any = "Qwen/Qwen3.5-0.8B",
    *,
    vllm: Sequence[str] | None = None,
    lmcache: Sequence[str] | None = None,
    registration: str = "unified",
    chunk_size: int | None = None,
    **plan_kwargs,
) -> Compatibility:
    """One deployment (``plan()``'s keywords) under every vLLM release of
    ``vllm`` (default: the installed one; others each in its own environment)
    and every LMCache release of ``lmcache`` (default: every one kvexplore
    knows): per group, the rule that fires and the shapes before and after,
    ``as registered``, or LMCache's refusal.  With ``chunk_size``, per pair
    also what LMCache's multi-process connector and server say of the
    deployment at that chunk (:func:`kvexplore.lmcache_layout`, in each vLLM
    release's own environment).

    Refused with a :class:`KVExploreError`: a release of either kind that is
    not known (or not in vLLM's window), a release named twice, an
    environment that cannot be made, a release that cannot answer."""
    from kvexplore.versions.environments import environment_path

    vllm_list = _releases("vllm", vllm, [installed_release().version])
    lmcache_list = _releases("lmcache", lmcache, list(lmcache_releases()))
    lmcache_list = [lmcache_release(r).version for r in lmcache_list]
    if len(set(lmcache_list)) != len(lmcache_list):
        raise KVExploreError(
            f"lmcache={lmcache!r} names a release twice; expected each once"
        )
    for r in vllm_list:
        if r != installed_release().version:
            environment_path(r)  # refuses a release outside the window
    if chunk_size is not None:
        from kvexplore.connectors.lmcache_layout import check_chunk_size

        check_chunk_size(chunk_size)
    request = {"lmcache": lmcache_list, "registration": registration, **plan_kwargs}
    if chunk_size is not None:
        request["chunk_size"] = chunk_size
    # Each other release answers in a process of its own: they run side by
    # side while this process answers for the installed release.
    with ThreadPoolExecutor(max(1, len(vllm_list))) as pool:
        answers = list(pool.map(lambda r: outcomes_in(r, model, request), vllm_list))
    rows, deployments, stores = [], {}, {}
    for answer in answers:
        rows += [{"vllm": answer["vllm"], **row} for row in answer["rows"]]
        for m in lmcache_list:
            deployments[(answer["vllm"], m)] = answer["deployments"][m]
            if chunk_size is not None:
                stores[(answer["vllm"], m)] = answer["stores"][m]
    name = (
        model
        if isinstance(model, str)
        else getattr(model, "name", type(model).__name__)
    )
    return Compatibility(
        str(name),
        FrozenDict(plan_kwargs),
        registration,
        tuple(rows),
        FrozenDict(deployments),
        FrozenDict(stores),
        chunk_size,
    )


def _releases(what: str, value: object, default: list[str]) -> list[str]:
    """``value`` as a list of releases (:func:`kvexplore.version.release_list`;
    vLLM's spelled by ``canonical_release``), ``default`` when None."""
    if value is None:
        return default
    spell = canonical_release if what == "vllm" else str.strip
    return list(release_list(value, what=what, spell=spell,
                             expected="expected a list of release strings"))


def main(argv: list[str] | None = None) -> int:
    request = json.loads((argv or sys.argv[1:])[0])
    model = request.pop("model")
    print(json.dumps(lmcache_outcomes(model, **request), default=str))
    return 0


__all__ = ["COLUMNS", "OUTCOMES", "Compatibility", "compatibility", "lmcache_outcomes"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
