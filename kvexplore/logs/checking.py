"""A start-up log checked against kvexplore, line by line.

:func:`check_log` plans the deployment a log describes
(:mod:`kvexplore.logs.deployment`) with the release that printed it where
its environment exists here (else the installed vLLM), answers
:func:`kvexplore.capacity` for it twice (from kvexplore's own memory
estimates, and from the KV cache memory the log states), and sets each
figure the log states beside kvexplore's: equal or not, and for each the
term and the rule behind it (weights, total, activation peak, non-torch, CUDA
graphs, block alignment, padding, group count, backend, layout, admission).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from kvexplore.capacity_planning import (
    CALIBRATED_TERMS,
    CapacityReport,
    capacity,
    profile_estimates,
)
from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import GiB, requested_memory
from kvexplore.logs.deployment import (
    Deployment,
    activation_peak,
    as_log,
    planned,
    printer,
    resolve,
    subtracts_cudagraphs,
    unstated_memory,
)
from kvexplore.logs.figures import BY_NAME, CHECKED, answers
from kvexplore.logs.reading import LogFigure, VllmLog
from kvexplore.planning.planner import plan
from kvexplore.planning.release import release_name

#: Each compared figure: (term, rule) for the comparison table, from the
#: figure records.
RULES = {f.name: (f.term, f.rule) for f in CHECKED}
COLUMNS = [
    "figure",
    "line",
    "log",
    "kvexplore",
    "equal",
    "kvexplore at the log's KV memory",
    "term",
    "rule",
]


@dataclass(frozen=True, kw_only=True)
class LogCheck(Displayable):
    """A log's figures beside kvexplore's (:func:`check_log`).

    ``rows`` has one row per figure the log states that kvexplore answers
    (:data:`COLUMNS`: the log's value as printed, kvexplore's, ``equal``, the
    value kvexplore finds from the log's own KV cache memory where that
    applies, the ``term`` and its ``rule``).  ``release`` is the release that
    printed the log (None when it does not say), ``planned`` the one whose
    code planned it and ``installed`` the one installed here;
    ``release_note`` says which release planned and why.  ``report`` is
    kvexplore's capacity from its own estimates, ``at_log_memory`` the one
    from the log's KV cache memory (None when the log states none); both are
    None when another release's environment planned, whose vLLM objects stay
    in that process.  ``memory_bars`` is the figure's data (bytes per memory
    term, the log's beside kvexplore's), ``title`` names the deployment
    planned, ``notes`` says how the deployment was read and what was not
    planned."""

    log: VllmLog = field(repr=False)
    deployment: Deployment = field(repr=False)
    report: CapacityReport | None = field(repr=False)
    at_log_memory: CapacityReport | None = field(repr=False)
    rows: pd.DataFrame = field(repr=False, compare=False)
    release: str | None
    planned: str
    installed: str
    release_note: str
    title: str
    notes: tuple[str, ...]
    contradictions: pd.DataFrame = field(repr=False, compare=False)
    memory_bars: pd.DataFrame = field(repr=False, compare=False)

    @property
    def plan(self):
        """The plan kvexplore made of the log's deployment; None when another
        release's environment planned it."""
        report = self.report if self.report is not None else self.at_log_memory
        return None if report is None else report.plan

    @property
    def differences(self) -> pd.DataFrame:
        """The rows where the log and kvexplore differ."""
        return self.rows[self.rows.equal == False].reset_index(drop=True)  # noqa: E712

    def explain(self) -> str:
        lines = [self.release_note, *self.notes]
        for row in self.rows.itertuples(index=False):
            verdict = {True: "equal", False: "differs", None: "not compared"}[row.equal]
            lines.append(
                f"{row.figure} (line {row.line}): log {row.log}, kvexplore {row.kvexplore}"
                f" -> {verdict}; {row.term}: {row.rule}"
            )
        for row in self.contradictions.itertuples(index=False):
            lines.append(f"contradiction in the log: {row.figure}: {row.values}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "planned": self.planned,
            "installed": self.installed,
            "release_note": self.release_note,
            "title": self.title,
            "notes": list(self.notes),
            "rows": [
                {k: _plain(v) for k, v in r.items()}
                for r in self.rows.to_dict("records")
            ],
            "contradictions": self.contradictions.to_dict("records"),
            "memory_bars": [
                {k: _plain(v) for k, v in r.items()}
                for r in self.memory_bars.to_dict("records")
            ],
        }


def _plain(value: Any) -> Any:
    """``value`` as JSON data: tuples as lists, numpy scalars as Python's,
    a missing number (NaN) as None."""
    if isinstance(value, tuple):
        return list(value)
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and value != value:
        return None
    return value


def memory_bars(log: VllmLog, report: CapacityReport | None, p) -> pd.DataFrame:
    """Bytes per memory term, the log's (stated, or the residual it implies
    for the terms it does not state, from the card's total as the log or
    kvexplore gives it) beside kvexplore's (``report``'s; each term's high
    end from :func:`~kvexplore.capacity_planning.profile_estimates` of plan
    ``p`` when kvexplore's own answer refuses the deployment)."""
    names = CALIBRATED_TERMS[1:]
    if report is not None:
        ours = {n: getattr(report, n) for n in names}
        ours["kv_cache_memory_bytes"] = report.kv_cache_memory
    else:
        ours = {n: high for n, (_, high, _) in profile_estimates(p).items()}
        ours["kv_cache_memory_bytes"] = None
    stated = {n: _value(log, n) for n in (*names, "kv_cache_memory_bytes",
                                          "requested_memory_bytes", "total_memory_bytes")}
    util = _value(log, "gpu_memory_utilization") or p.gpu_memory_utilization
    total = stated["total_memory_bytes"] or p.gpu.total_memory_range[0]
    requested = stated["requested_memory_bytes"] or requested_memory(total, util)
    rows = [{"term": n, "log": stated[n], "kvexplore": ours[n]} for n in names]
    residual = None
    if stated["kv_cache_memory_bytes"] is not None:
        known = [stated[n] for n in names if stated[n] is not None]
        residual = unstated_memory(requested, stated["kv_cache_memory_bytes"], known)
    rows.append({"term": "not stated (residual)", "log": residual, "kvexplore": None})
    rows.append({"term": "kv_cache_memory_bytes", "log": stated["kv_cache_memory_bytes"],
                 "kvexplore": ours["kv_cache_memory_bytes"]})
    rows.append({"term": "requested", "log": requested, "kvexplore": requested})
    return pd.DataFrame(rows, columns=["term", "log", "kvexplore"])


def _value(log: VllmLog, name: str) -> Any:
    """The log's value of ``name``, None when absent or contradicted."""
    try:
        return log.get(name)
    except KVExploreError:
        return None


def _show(name: str, value: Any) -> str:
    if value is None:
        return ""
    if BY_NAME[name].unit == "bytes":
        return f"{value / GiB:.2f} GiB"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def _equal(name: str, figure: LogFigure, ours: Any, r: CapacityReport) -> bool | None:
    """Whether the log's ``figure`` equals kvexplore's answer ``ours``: within
    kvexplore's range where the record gives one, within the printed precision
    for bytes and decimals, a name regardless of case, else exactly; None when
    kvexplore has no answer."""
    if ours is None:
        return None
    value, record = figure.value, BY_NAME[name]
    if record.answer_range is not None:
        low, high = record.answer_range(r)
        return low - figure.resolution <= value <= high + figure.resolution
    if isinstance(value, float) or record.unit == "bytes":
        return abs(float(value) - float(ours)) <= max(figure.resolution, 1e-9)
    if isinstance(value, str) or isinstance(ours, str):
        return str(value).upper() == str(ours).upper()
    return value == ours


def _first(log: VllmLog, name: str) -> LogFigure | None:
    """The log's first statement of ``name`` (the activation peak as
    :func:`~kvexplore.logs.deployment.activation_peak` finds it)."""
    return activation_peak(log) if name == "activation_peak_bytes" else log.first(name)


def _term_of_memory_difference(log: VllmLog, ours: dict, r: CapacityReport) -> str:
    """Which terms make the KV memory differ: those the log states that
    differ (with the difference), and the residual the log implies for the
    terms it does not state beside kvexplore's estimate of them."""
    parts, unstated, stated = [], [], []
    for name in CALIBRATED_TERMS[1:]:
        figure = _first(log, name)
        if figure is None:
            unstated.append(name)
            continue
        stated.append(figure.value)
        if not _equal(name, figure, ours[name], r):
            parts.append(
                f"{BY_NAME[name].term} ({(figure.value - ours[name]) / GiB:+.2f} GiB in the log)"
            )
    kv = _value(log, "kv_cache_memory_bytes")
    requested = _value(log, "requested_memory_bytes")
    total = _value(log, "total_memory_bytes")
    util = _value(log, "gpu_memory_utilization") or r.gpu_memory_utilization
    if unstated and kv is not None:
        asked = requested if requested is not None else requested_memory(
            total or r.total_memory_bytes, util)
        residual = unstated_memory(asked, kv, stated)
        estimate = sum(ours[name] for name in unstated)
        parts.append(
            f"{', '.join(BY_NAME[n].term for n in unstated)}, which the log does not state: "
            f"it implies {residual / GiB:.2f} GiB for them"
            + ("" if total or requested else " (with kvexplore's total for the card)")
            + f", kvexplore estimates {estimate / GiB:.2f} GiB"
        )
    return "memory: " + "; ".join(parts)


def _equal_at_log(name: str, figure: LogFigure, at: Any, log: VllmLog) -> bool:
    """Whether ``figure`` equals kvexplore's value ``at`` the log's KV cache
    memory, within what the memory's printed precision moves it (the log's
    ``X.XX GiB`` is +-0.005 GiB; blocks, tokens and concurrency scale with it,
    and a whole count floors one either way)."""
    kv = log.first("kv_cache_memory_bytes")
    share = kv.resolution / kv.value if kv is not None and kv.value else 0.0
    slack = abs(float(at)) * share + figure.resolution
    if BY_NAME[name].floored:
        slack += 1
    return abs(float(figure.value) - float(at)) <= slack


def _row(name, figure, ours, at, equal, term, rule) -> dict[str, Any]:
    return {
        "figure": name,
        "line": figure.line,
        "log": figure.text,
        "kvexplore": _show(name, ours.get(name))
        if ours.get(name) is not None
        else "not answered",
        "equal": equal,
        "kvexplore at the log's KV memory": _show(name, at),
        "term": term,
        "rule": rule,
    }


def _group_aware_tokens(log: VllmLog) -> bool:
    """Whether the log's ``GPU KV cache size`` is ``int(max_concurrency x
    max_model_len)`` (vLLM's group-aware ``get_kv_cache_capacity``) within the
    concurrency's printed precision; True when it cannot tell."""
    tokens, conc = log.first("kv_cache_size_tokens"), log.first("max_concurrency")
    length = _value(log, "max_model_len")
    if tokens is None or conc is None or length is None:
        return True
    slack = conc.resolution * length + 1
    return abs(tokens.value - conc.value * length) <= slack


def check_log(log: Any, model: Any = None, gpu: Any = None, *, vllm: str | None = None,
              **overrides) -> LogCheck:
    """Check a start-up log (a :class:`VllmLog`, its text or its path) against
    kvexplore's plan of the deployment it describes.

    ``model`` (a catalog id, ``config.json`` or its directory; default: the
    model the log names, if kvexplore can find it), ``gpu`` (default: the card
    the log names) and ``overrides`` (``plan()`` keywords, over the log's)
    choose what is planned; a missing model or GPU is a
    :class:`KVExploreError` naming what to give.

    ``vllm`` is the release whose code plans (spelled as
    :func:`~kvexplore.planning.release.canonical_release` spells it; its
    environment is created if missing).  By default: the release that printed
    the log when it is in the window and its environment exists here and
    passes :func:`~kvexplore.versions.check_environment`, else the installed
    one; :attr:`LogCheck.release_note` says which planned and why.  Another
    release's environment runs the whole check (``python -m
    kvexplore.logs.checking``) and answers its rows and memory bars."""
    log = as_log(log)
    installed = release_name().removeprefix("vLLM ")
    planned, why = _planning_release(log, vllm, installed)
    if planned != installed:
        return _check_in(planned, log, model, gpu, overrides, installed, why)
    return _check_here(log, model, gpu, overrides, installed, why)


def _planning_release(log: VllmLog, vllm: str | None, installed: str) -> tuple[str, str]:
    """``(release that plans, why)`` (:func:`check_log`'s ``vllm``)."""
    from kvexplore.planning.release import canonical_release

    if vllm is not None:
        return canonical_release(vllm), "as asked"
    if log.release is None:
        return installed, ""
    try:
        release = canonical_release(log.release)
    except KVExploreError:
        from kvexplore.planning.release import WINDOW_RELEASES

        return installed, (f"{log.release} is outside the window of releases kvexplore plans "
                           f"with, {WINDOW_RELEASES[0]} to {WINDOW_RELEASES[-1]}")
    if release == installed:
        return installed, ""
    from kvexplore.versions.environments import environment_path, environment_problems

    path = environment_path(release)
    if not path.exists():
        return installed, (f"there is no environment for {release} here; "
                           f"`kvexplore envs {release} --create` makes one")
    problems = environment_problems(release)
    if problems:
        return installed, (f"the environment of {release} at {path} fails its check "
                           f"({'; '.join(problems)}); `kvexplore envs {release} --repair` "
                           "rebuilds it")
    return release, ""


def _note(release: str | None, planned: str, installed: str, why: str) -> str:
    """:attr:`LogCheck.release_note`."""
    if release is None:
        return (f"The log does not say which vLLM printed it; kvexplore planned with the "
                f"installed {installed}.")
    if planned == release:
        if planned == installed:
            return f"The log was printed by vLLM {release}, the release installed here."
        return (f"The log was printed by vLLM {release}; kvexplore planned with {release}'s "
                f"own code, in its environment (installed here: {installed}).")
    with_ = f"the installed {installed}" if planned == installed else planned
    because = f" ({why})" if why else ""
    return (
        f"The log was printed by vLLM {release}; kvexplore planned with {with_}{because}, so "
        "rules that moved between the two releases (block alignment, CUDA-graph accounting, "
        "default block size and utilization) can differ for that reason alone."
    )


def _check_in(release: str, log: VllmLog, model: Any, gpu: Any, overrides: dict,
              installed: str, why: str) -> LogCheck:
    """:func:`check_log` run by vLLM ``release``'s environment
    (:func:`~kvexplore.versions.environments.answer_in`), its answer read back
    beside this process's reading of the log and its deployment."""
    import json
    import os
    import tempfile

    from kvexplore.planning.gpus import GPU
    from kvexplore.versions.environments import answer_in, model_argument

    dep = resolve(log, model, gpu, dict(overrides))
    request = {
        "log": log.raw,
        "name": log.name,
        "model": None if model is None else model_argument(model),
        "gpu": gpu.name if isinstance(gpu, GPU) else gpu,
        "overrides": overrides,
    }
    try:
        payload = json.dumps(request)
    except (TypeError, ValueError) as exc:
        raise KVExploreError(
            f"overrides={overrides!r:.200} cannot be sent to vLLM {release}'s environment "
            f"({exc}); expected plan() keywords with JSON values, or vllm={installed!r}"
        ) from exc
    if not log.raw:
        raise KVExploreError(
            f"the log given holds no text for vLLM {release}'s environment to read; expected "
            "a log from kvexplore.read_log (or its text or path)"
        )
    fd, path = tempfile.mkstemp(prefix="kvexplore-log-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(payload)
        answer = answer_in(release, "kvexplore.logs.checking", path)
    finally:
        os.unlink(path)
    return LogCheck(
        log=log,
        deployment=dep,
        report=None,
        at_log_memory=None,
        rows=pd.DataFrame(answer["rows"], columns=COLUMNS),
        release=log.release,
        planned=release,
        installed=installed,
        release_note=_note(log.release, release, installed, why),
        title=answer["title"],
        notes=tuple(answer["notes"]),
        contradictions=log.contradictions,
        memory_bars=pd.DataFrame(answer["memory_bars"], columns=["term", "log", "kvexplore"]),
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m kvexplore.logs.checking REQUEST.json``: the check of the
    request's log (:func:`_check_in` writes it) with this process's vLLM, as
    one JSON line naming that release."""
    import dataclasses
    import json
    import sys

    from kvexplore.logs.reading import read_log

    with open((argv or sys.argv[1:])[0]) as f:
        request = json.load(f)
    log = dataclasses.replace(read_log(request["log"]), name=request["name"])
    installed = release_name().removeprefix("vLLM ")
    c = _check_here(log, request["model"], request["gpu"], request["overrides"], installed, "")
    print(json.dumps({"vllm": installed, **c.to_dict()}, default=str))
    return 0


def _check_here(log: VllmLog, model: Any, gpu: Any, overrides: dict, installed: str,
                why: str) -> LogCheck:
    """:func:`check_log` with the installed vLLM."""
    dep = resolve(log, model, gpu, dict(overrides))
    notes = list(dep.notes)
    report, at_log = _reports(log, dep, notes)
    rows = pd.DataFrame(_rows(log, report, at_log), columns=COLUMNS)
    p = (report if report is not None else at_log).plan
    return LogCheck(
        log=log,
        deployment=dep,
        report=report,
        at_log_memory=at_log,
        rows=rows,
        release=log.release,
        planned=installed,
        installed=installed,
        release_note=_note(log.release, installed, installed, why),
        title=f"{p.model.name} on {p.gpu.name} TP {p.tensor_parallel_size}",
        notes=tuple(notes),
        contradictions=log.contradictions,
        memory_bars=memory_bars(log, report, p),
    )


def _reports(log: VllmLog, dep: Deployment, notes: list[str]):
    """``(report, at_log)``: kvexplore's capacity of the log's deployment from
    its own memory estimates (None when they refuse it, with a note) and at
    the KV cache memory the log states (None when it states none); a
    deployment refused both ways is refused."""
    kwargs = dict(dep.plan_kwargs)
    extra: dict[str, Any] = {}
    if dep.enforce_eager:
        extra["cudagraph_bytes"] = 0
        notes.append("enforce_eager=True: no CUDA graphs, kvexplore's CUDA-graph term is 0")
    elif subtracts_cudagraphs(log) is False:
        extra["cudagraph_bytes"] = 0
        notes.append(
            f"{printer(log)} does not subtract CUDA graphs from the KV memory (the "
            "estimate is the default from v0.21.0): kvexplore's CUDA-graph term is 0, as "
            "that release accounts it"
        )
    log_kv = _value(log, "kv_cache_memory_bytes")
    report = None
    try:
        report = planned(lambda **kw: capacity(dep.model, gpu=dep.gpu, **extra, **kw),
                         kwargs, notes)
    except KVExploreError as refusal:
        if log_kv is None:
            raise
        notes.append(
            f"kvexplore's own memory estimate refuses this deployment ({refusal}); the "
            "figures that depend on memory are answered at the log's KV cache memory only"
        )
    if log_kv is None:
        return report, None
    base = report.plan if report is not None else plan(dep.model, gpu=dep.gpu, **kwargs)
    return report, capacity(base.replace(kv_cache_memory_bytes=int(log_kv)))


def _rows(log: VllmLog, report: CapacityReport | None,
          at_log: CapacityReport | None) -> list[dict[str, Any]]:
    """One row per compared figure the log states, in the records' order."""
    theirs = answers(at_log) if at_log is not None else {}
    if report is not None:
        ours = answers(report)
    else:
        ours = {k: v for k, v in theirs.items() if not BY_NAME[k].needs_memory}
    report_or_log = report if report is not None else at_log
    contradicted = set(log.contradictions.figure)
    rows = []
    for record in CHECKED:
        name = record.name
        figure = _first(log, name)
        if figure is None:
            continue
        if name in contradicted:
            rows.append({
                "figure": name, "line": figure.line, "log": "contradicts itself",
                "kvexplore": _show(name, ours.get(name)), "equal": None,
                "kvexplore at the log's KV memory": "", "term": record.term,
                "rule": "not compared: the log states two values (see contradictions)",
            })
            continue
        at = theirs.get(name) if record.memory_dependent else None
        if ours.get(name) is None and at is not None:  # answered at the log's memory only
            equal = _equal_at_log(name, figure, at, log)
        else:
            equal = _equal(name, figure, ours.get(name), report_or_log)
        blocks = at_log if at_log is not None else report
        term = _term(log, record, figure, equal, ours, at, report_or_log, blocks)
        rows.append(_row(name, figure, ours, at, equal, term, record.rule))
    return rows


def _term(log: VllmLog, record, figure: LogFigure, equal: bool | None, ours: dict, at: Any,
          report: CapacityReport, blocks: CapacityReport | None) -> str:
    """The row's ``term``: the record's, or what makes the figure differ (the
    memory terms behind a different KV memory; memory or admission behind a
    different capacity figure; a token count its release prints as blocks x
    block size)."""
    if record.name == "kv_cache_size_tokens" and not _group_aware_tokens(log):
        return (
            "admission: this log's 'GPU KV cache size' is not max_concurrency x "
            "max_model_len; its release prints num_blocks x block_size"
            + (f" (kvexplore's at the log's memory: {blocks.num_blocks * blocks.block_size:,})"
               if blocks is not None else "")
        )
    if equal is not False:
        return record.term
    if record.term == "memory":  # the KV cache memory: which terms make it differ
        return _term_of_memory_difference(log, ours, report)
    if record.memory_dependent and at is not None:
        if ours.get(record.name) is not None and _equal_at_log(record.name, figure, at, log):
            return "memory (equal at the log's KV memory, within its printed precision)"
        return "admission (differs at the log's KV memory too: blocks per request)"
    return record.term


__all__ = ["COLUMNS", "RULES", "LogCheck", "check_log", "memory_bars"]

if __name__ == "__main__":  # pragma: no cover
    import sys

    sys.exit(main())
