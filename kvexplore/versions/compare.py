"""One deployment across vLLM releases: each release's own answer, side by side.

:func:`deployment_facts` answers with the installed release: the plan
(``Plan.to_dict()``), each group's page and its segments, what a connector registers (shape, stride, dtype and
storage of each group's first layer, for 16 blocks of the same layout),
which LMCache edit fires on how many layers of each group, the
``OffloadingConfig`` and the capacity, all as JSON-ready data.
:func:`compare_versions` gets those facts from every release named, each in
its own environment (:func:`kvexplore.versions.environment`; the installed
release in this process), so two releases never share a process, and lists
every fact whose value differs.

    python -m kvexplore.versions.compare '{"model": "Qwen/Qwen3.5-0.8B", "gpu": "A100"}'

prints the installed release's facts as one JSON line (what
:func:`compare_versions` runs in each environment).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvexplore.display import Displayable, register_forms
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, jsonable
from kvexplore.pages import page_facts
from kvexplore.planning.release import (
    COMPARED_RELEASES,
    WINDOW_RELEASES,
    canonical_release,
    installed_release,
)
from kvexplore.rendering.releases import (
    page_summary,
    release_pages_figure,
    releases_html,
)
from kvexplore.version import release_list

#: Blocks of the same layout the registration and edit facts are taken for.
FACT_BLOCKS = 16
#: Characters of one value :meth:`VersionComparison.text` shows (the table has all).
TEXT_WIDTH = 60


def _error(exc: Exception) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:400]


def _registration_facts(p) -> dict[str, Any]:
    """Per group, the first layer's registered tensor(s), and the LMCache edit
    that fires on each group's layers, for :data:`FACT_BLOCKS` blocks."""
    from kvexplore.editing.rules import apply_kv_cache_group_edits
    from kvexplore.registration import allocate

    small = p.with_num_blocks(FACT_BLOCKS)
    kv = allocate(p, device="meta", num_blocks=FACT_BLOCKS)
    groups = {}
    for g in small.groups:
        value = kv[g.layer_names[0]]
        tensors = value if isinstance(value, list) else [value]
        groups[str(g.index)] = [{
            "shape": list(t.shape), "stride": list(t.stride()),
            "dtype": str(t.dtype).removeprefix("torch."),
            "storage_offset": int(t.storage_offset()),
            "storage_bytes": int(t.untyped_storage().nbytes()),
        } for t in tensors]
    try:
        edited = apply_kv_cache_group_edits(small.kv_cache_config, kv)
        edits = {f"{row['group']}:{row['rule']}": {
            "layers": int(row["layers"]), "shape_before": jsonable(row["shape_before"]),
            "shape_after": jsonable(row["shape_after"])}
            for row in edited.by_group().to_dict("records")}
    except KVExploreError as exc:
        edits = {"refused": _error(exc)}
    return {"registered": groups, "edits": edits}


def _offload_facts(p) -> dict[str, Any]:
    from dataclasses import asdict

    from kvexplore.offloading.config import offload_config

    try:
        c = offload_config(p).config
    except (KVExploreError, ValueError) as exc:
        return {"refused": _error(exc)}
    out = jsonable(asdict(c))
    for g in out.get("groups", []):
        g["layer_names"] = len(g["layer_names"])
    return out


def _capacity_facts(p) -> dict[str, Any]:
    from kvexplore.capacity_planning import capacity

    try:
        r = capacity(p)
    except KVExploreError as exc:
        return {"refused": _error(exc)}
    return {"num_blocks": r.num_blocks, "kv_cache_size_tokens": r.kv_cache_size_tokens,
            "max_concurrency": round(r.max_concurrency, 4),
            "kv_cache_memory_range": list(r.kv_cache_memory_range),
            "gpu_memory_utilization": r.gpu_memory_utilization}


def deployment_facts(model: Any = "Qwen/Qwen3.5-0.8B", **plan_kwargs) -> dict[str, Any]:
    """What the installed vLLM release answers for one deployment, as JSON-ready
    data: ``vllm``, ``plan`` (:meth:`~kvexplore.Plan.to_dict`, with
    ``extensible_kv_cache`` and ``gpu_memory_utilization``), ``layers``
    (name -> kind), ``pages`` (per group, the first layer's page and its
    segments: :func:`~kvexplore.pages.page_facts`; ``[]`` where the page model
    cannot describe a page),
    ``registration`` (per group: the first layer's registered tensors, and the
    LMCache edits), ``offloading`` and ``capacity`` (each a ``{"refused":
    message}`` where the release refuses)."""
    from kvexplore.planning.planner import plan

    p = plan(model, **plan_kwargs)
    plan_facts = p.to_dict()
    plan_facts.pop("derivation", None)
    plan_facts.update(extensible_kv_cache=p.extensible_kv_cache,
                      gpu_memory_utilization=p.gpu_memory_utilization)
    try:
        registration = _registration_facts(p)
    except KVExploreError as exc:
        registration = {"refused": _error(exc)}
    try:
        pages = page_facts(p)
    except KVExploreError:
        pages = []  # no page map: the comparison draws no page for this release
    return {
        "vllm": p.vllm_version,
        "plan": plan_facts,
        "explain": dict(p.derivation()),
        "layers": {info.name: info.kind for info in p.layers},
        "pages": pages,
        "registration": registration,
        "offloading": _offload_facts(p),
        "capacity": _capacity_facts(p),
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(_flatten(v, f"{prefix}[{i}]"))
        return out
    return {prefix: json.dumps(value) if isinstance(value, list) else value}


def _tabled(facts: Mapping[str, Any]) -> dict[str, Any]:
    """The facts a table compares: all but the release and the derivation
    texts; each page as its group, bytes and a one-line summary of its
    segments."""
    out = {k: v for k, v in facts.items() if k not in ("vllm", "explain", "pages")}
    out["pages"] = [{"group": page["group"], "page_bytes": page["page_bytes"],
                     "real_bytes": page["real_bytes"], "kernel_pages": page["kernel_pages"],
                     "segments": page_summary(page["segments"])}
                    for page in facts.get("pages", ())]
    return out


@dataclass(frozen=True)
class VersionComparison(Displayable):
    """One deployment's facts per release (:func:`deployment_facts`), and the
    facts whose values differ.  ``facts`` maps release -> facts (JSON data).
    ``text()``, ``_repr_html_()`` and ``figure()`` are its display forms
    (:data:`FORMS`)."""

    model: str
    inputs: FrozenDict
    facts: FrozenDict

    @property
    def releases(self) -> tuple[str, ...]:
        return tuple(self.facts)

    def table(self, *, only_differences: bool = True, section: str | None = None) -> pd.DataFrame:
        """One row per fact (``plan.block_size``, ``registration.edits...``), one
        column per release; a fact missing in a release is ``None``.  With
        ``only_differences`` (default) only the facts whose values differ;
        ``section`` keeps the facts under one heading (``"plan"``, ...)."""
        flat = {r: _flatten(_tabled(f)) for r, f in self.facts.items()}
        keys = list(dict.fromkeys(k for f in flat.values() for k in f))
        rows = []
        for key in keys:
            if section is not None and key.split(".")[0].split("[")[0] != section:
                continue
            values = [flat[r].get(key) for r in self.releases]
            if only_differences and all(v == values[0] for v in values):
                continue
            rows.append({"fact": key, **dict(zip(self.releases, values, strict=True))})
        return pd.DataFrame(rows, columns=["fact", *self.releases])

    @property
    def differences(self) -> pd.DataFrame:
        """:meth:`table` of the facts that differ (a new DataFrame)."""
        return self.table()

    @property
    def pages(self) -> dict[str, list]:
        """Release -> its pages (:func:`~kvexplore.pages.page_facts`)."""
        return {r: list(f.get("pages", ())) for r, f in self.facts.items()}

    def _head(self) -> str:
        inputs = ", ".join(f"{k}={v}" for k, v in self.inputs.items())
        return f"{self.model}{f' ({inputs})' if inputs else ''} across vLLM {', '.join(self.releases)}"

    def __repr__(self) -> str:
        return f"VersionComparison({self.model!r}, releases={list(self.releases)})"


def comparison_text(c: VersionComparison) -> str:
    """``VersionComparison.text()``: the facts that differ, one per line, a
    column per release (values longer than :data:`TEXT_WIDTH` characters cut
    short)."""
    diff = c.differences
    if diff.empty:
        return c._head() + ": no fact differs"
    shown = diff.map(lambda v: v if not isinstance(v, str) or len(v) <= TEXT_WIDTH
                     else v[:TEXT_WIDTH - 3] + "...")
    return c._head() + f": {len(diff)} facts differ\n" + shown.to_string(index=False)


def comparison_figure(c: VersionComparison):
    """``VersionComparison.figure()``: each release's page of each group, one
    row each, on one byte axis."""
    return release_pages_figure(c._head(), c.pages)


def comparison_html(c: VersionComparison) -> str:
    """``VersionComparison._repr_html_()``: the pages drawn, then the table of
    the facts that differ."""
    return releases_html(f"{c._head()}: {len(c.differences)} facts differ", c.pages,
                         c.differences.to_html(index=False))


#: ``VersionComparison`` -> its ``(text, html, figure)`` forms, registered
#: here, where the type is defined (:func:`kvexplore.display.register_forms`).
FORMS = {VersionComparison: (comparison_text, comparison_html, comparison_figure)}
register_forms(FORMS)


def facts_in(release: str, model: Any, plan_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`deployment_facts` as vLLM ``release`` answers, in its own
    environment (this process for the installed release); ``release`` as
    :func:`~kvexplore.planning.release.canonical_release` spells it.  The
    facts' ``vllm`` is the release that ran; an environment that fails its
    check or answers as another release is refused
    (:func:`~kvexplore.versions.environments.answer_in`)."""
    release = canonical_release(release)
    if release == installed_release().version:
        return deployment_facts(model, **plan_kwargs)
    from kvexplore.versions.environments import answer_in, model_argument

    request = json.dumps({"model": model_argument(model), **plan_kwargs})
    return answer_in(release, "kvexplore.versions.compare", request)


def compare_versions(model: Any = "Qwen/Qwen3.5-0.8B", *,
                     vllm: Sequence[str] = COMPARED_RELEASES,
                     **plan_kwargs) -> VersionComparison:
    """The same deployment (``plan()``'s keywords) in each vLLM release of
    ``vllm`` (by default :data:`~kvexplore.planning.release.COMPARED_RELEASES`,
    the window's newest two), each answered by that release's own code in its
    own environment (created with uv on first use), with every fact that
    differs.

    Each release is spelled as
    :func:`~kvexplore.planning.release.canonical_release` spells it
    (``"0.34"`` is ``"0.34.0"``) before any environment is looked for.
    Refused with a :class:`KVExploreError`: ``vllm`` not a list of release
    strings (or one comma-separated string), a release outside the window, a
    release named twice (after that spelling) or fewer than two, an
    environment that cannot be created (uv's message) or fails its check
    (:func:`~kvexplore.versions.check_environment`), a release that cannot
    answer (its last lines) or answers as another release."""
    releases = release_list(
        vllm, what="vllm", spell=canonical_release, minimum=2,
        expected=f"expected two or more different releases of {list(WINDOW_RELEASES)}, as a "
                 f"list of strings such as {list(COMPARED_RELEASES)} or one comma-separated "
                 "string",
    )
    # Each other release answers in its own worker process: they run side by
    # side while this process answers for the installed release.
    with ThreadPoolExecutor(len(releases)) as pool:
        answers = list(pool.map(lambda r: facts_in(r, model, plan_kwargs), releases))
    facts = dict(zip(releases, answers, strict=True))
    name = model if isinstance(model, str) else getattr(model, "name", type(model).__name__)
    return VersionComparison(str(name), FrozenDict(plan_kwargs), FrozenDict(facts))


def main(argv: list[str] | None = None) -> int:
    request = json.loads((argv or sys.argv[1:])[0])
    model = request.pop("model")
    print(json.dumps(deployment_facts(model, **request), default=str))
    return 0


__all__ = ["FACT_BLOCKS", "VersionComparison", "compare_versions", "deployment_facts",
           "facts_in"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
