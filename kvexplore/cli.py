"""``kvexplore`` command line: the Python API, one subcommand per function.

    kvexplore catalog [--gpu G]
    kvexplore gpus
    kvexplore plan MODEL [--gpu G --tp N --dcp N --block-size N --kv-cache-dtype D --backend B --json]
    kvexplore offload MODEL [--tp N --dcp N --extra JSON --pipeline-parallel-size N ... --json]
    kvexplore sweep MODEL[,MODEL...] --tp 1,2,4,8 [--dcp 1,2 --block-size none,64 --nnodes-within-dp 1,2 --out rows.parquet]
    kvexplore envs [RELEASE ...] [--create | --repair] [--python]
    kvexplore versions MODEL --vllm 0.33.0,0.34.0 [--gpu G ... --all --json]
    kvexplore edits MODEL [--lmcache 0.5.2 --registration legacy --gpu G ... --json]
    kvexplore matrix MODEL [--vllm 0.33.0,0.34.0 --lmcache 0.5.2,0.5.6 --registration legacy ... --json]
    kvexplore capacity MODEL [--gpu G --gpu-memory-utilization 0.92 --max-model-len N --weight-bytes N --cpu-bytes-to-use N --extra JSON --calibration LOG --json]
    kvexplore check-log server.log [--model PATH --gpu G --vllm R --tp N ... --json]

``--gpu`` names the GPU (default H100); the other flags are vLLM's engine
arguments and the fields of ``OffloadOptions``.  ``--verbose`` shows vLLM's
INFO logs and torch's and Python's warnings; logs always go to stderr, so
stdout holds only the answer.  Without ``--verbose`` stderr is empty on
success, and every failure prints one line to stderr and exits with status 2.
``plan``, ``offload``, ``capacity`` and ``sweep`` answer a deployment
planned before from the answer store (:mod:`kvexplore.store`) without
building it (``plan``, ``offload`` and ``capacity``, text or ``--json``,
without importing vLLM or torch); ``--no-cache`` skips the store.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import gc
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvexplore.advising import ADVICE_KIND
from kvexplore.errors import KVExploreError
from kvexplore.fleet import check_output
from kvexplore.layout import jsonable
from kvexplore.offloading.options import OffloadOptions
from kvexplore.offloading.sweep import sweep
from kvexplore.planning.gpus import gpus
from kvexplore.planning.inputs import PLAN_KEYWORDS, keyword_fields
from kvexplore.planning.release import COMPARED_RELEASES
from kvexplore.planning.stored import (
    PLAN_KIND,
    is_payload,
    json_facts,
    payload,
    plan_answer,
    question,
)
from kvexplore.store import Question, answer, answer_store

if TYPE_CHECKING:
    import pandas as pd

#: Each ``OffloadOptions`` field's type, as written in its annotation.
_OPTION_TYPES = {f.name: f.type for f in dataclasses.fields(OffloadOptions)}


def _cli_int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _cli_float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _cli_int_or_none(text: str) -> int | None:
    if text.lower() == "none":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer or 'none'") from None


#: How a ``PlanRequest`` field's flag text becomes its value, by its ``cli`` metadata.
_PARSERS = {"int": _cli_int, "float": _cli_float, "int_or_none": _cli_int_or_none, "str": str}


def _add_plan_args(p: argparse.ArgumentParser, *, lists: bool = False,
                   model: bool = True) -> None:
    """``MODEL`` (with ``model``), ``--gpu`` and one option per ``PlanRequest``
    field, made from the field's metadata (flags, help, choices and how its
    text is read); for a sweep (``lists``), the fields it can vary take
    comma-separated lists."""
    if model:
        p.add_argument("model", help="catalog id (see `kvexplore catalog`), config.json or its directory")
    p.add_argument("--gpu", default=None, help="GPU name or compute capability (see `kvexplore gpus`)")
    for f in keyword_fields():
        meta = f.metadata
        flags = meta["flags"] or ("--" + f.name.replace("_", "-"),)
        kind = meta["cli"]
        if lists and not meta["sweep"]:
            continue
        more: dict = {}
        if kind == "bool":
            more["action"] = argparse.BooleanOptionalAction
        elif kind == "json":
            more["type"] = _json_object
        elif lists:
            more["type"] = str
        else:
            more["type"] = _PARSERS[kind]
            choices = meta["choices"]
            # the installed release's names (a function) are checked by
            # PlanRequest: asking vLLM for them here would import it on every call
            if choices is not None and not callable(choices):
                more["choices"] = choices
                more["metavar"] = f.name.upper()
        help_text = meta["help"] + (" (comma-separated)" if lists and kind not in ("bool", "json") else "")
        if "choices" in more:
            help_text += " {%(choices)s}"
        elif callable(meta["choices"]):
            help_text += " (a name the installed vLLM release knows)"
        p.add_argument(*flags, dest=f.name, default=None, help=help_text, **more)


_PLAN_KEYS = ("gpu", *PLAN_KEYWORDS)


def _json_object(value: str) -> dict:
    try:
        out = json.loads(value)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not JSON: {exc.msg}") from None
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"{value!r} must be a JSON object")
    return out


def _add_offload_args(p: argparse.ArgumentParser, *, lists: bool = False) -> None:
    """One flag per ``OffloadOptions`` field (``extra_config`` is ``--extra``);
    a field that is also a ``plan()`` keyword (``data_parallel_size``) has the
    plan's flag, whose value goes to both."""
    for f in dataclasses.fields(OffloadOptions):
        if f.name in PLAN_KEYWORDS:
            continue
        if f.name == "extra_config":
            what = "a JSON object, or a JSON array of them (one row each)" if lists else "a JSON object"
            p.add_argument("--extra", dest=f.name, default=None, help=f"{f.metadata['help']}: {what}")
        else:
            more = {"action": "store_true"} if f.type == "bool" and not lists else {}
            help_text = f.metadata["help"] + (" (comma-separated)" if lists else "")
            p.add_argument("--" + f.name.replace("_", "-"), dest=f.name, default=None, help=help_text, **more)


def _extra(value: str, *, lists: bool = False) -> list | dict:
    """``--extra``: a JSON object (or, for a sweep, a JSON array of objects / null)."""
    example = '\'{"block_size": 1088}\''
    try:
        out = json.loads(value)
    except json.JSONDecodeError as exc:
        raise KVExploreError(f"--extra {value!r} is not JSON ({exc.msg}); expected a JSON object such as {example}") from None
    if lists and isinstance(out, list) and all(v is None or isinstance(v, dict) for v in out) and out:
        return out
    if not isinstance(out, dict):
        kind = {list: "array", str: "string", bool: "boolean", int: "number", float: "number"}.get(type(out), "null")
        raise KVExploreError(
            f"--extra {value!r} is a JSON {kind}, not an object; expected a JSON object "
            f"such as {example}" + (" or a non-empty array of them" if lists else "")
        )
    return [out] if lists else out


def _option_value(name: str, raw: str):
    """A flag's text as the option's type (``int``, ``bool`` or ``str``; 'none' -> None)."""
    kind = _OPTION_TYPES[name]
    if kind == "int":
        try:
            return int(raw)
        except ValueError:
            pass
    elif kind == "bool":
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
    else:
        return None if raw.lower() == "none" and "None" in kind else raw
    flag = "--" + name.replace("_", "-")
    raise KVExploreError(f"{flag} {raw!r} is invalid; expected {'an integer' if kind == 'int' else 'true or false'}")


def _block_size(value: str):
    if value.lower() == "none":
        return None
    try:
        return int(value)
    except ValueError:
        raise KVExploreError(f"--block-size {value!r} is invalid; expected an integer or 'none'") from None


def _list_item(kind: str):
    """How one comma-separated item of a sweep's flag becomes a value."""
    return {"int": int, "float": float, "int_or_none": _block_size, "str": str}[kind]


#: How a flag's text (or, for a sweep, each comma-separated item) becomes a value; others stay text.
_CONVERT = {
    **{f.name: _list_item(f.metadata["cli"]) for f in keyword_fields()
       if f.metadata["cli"] in ("int", "float", "int_or_none")},
    **{name: functools.partial(_option_value, name) for name in _OPTION_TYPES if name != "extra_config"},
}


def _kwargs(ns: argparse.Namespace, keys, *, lists: bool = False) -> dict:
    """The flags given among ``keys``, as keyword values (lists of them for a sweep)."""
    out = {}
    for key in keys:
        raw = getattr(ns, key, None)
        if raw is None:
            continue
        if key == "extra_config":
            out[key] = _extra(raw, lists=lists)
        elif not isinstance(raw, str):  # argparse made it an int, a dict or a flag's bool
            out[key] = [raw] if lists else raw
        else:
            conv = _CONVERT.get(key, str)
            out[key] = _split(raw, conv) if lists else conv(raw)
    return out


def plan_kwargs(ns: argparse.Namespace) -> dict:
    """The ``plan()`` keywords (``gpu`` included) a parsed command line's flags
    give, as ``plan()`` takes them; flags not given are left out."""
    return _kwargs(ns, _PLAN_KEYS)


def _split(value: str, conv) -> list:
    out = []
    for part in value.split(","):
        part = part.strip()
        try:
            out.append(conv(part))
        except ValueError:
            raise KVExploreError(f"list item {part!r} in {value!r} is invalid") from None
    return out


def _table_text(df: pd.DataFrame) -> str:
    import pandas as pd

    with pd.option_context("display.max_rows", None, "display.max_columns", None, "display.width", 200):
        return df.to_string(index=False)


def _print_table(df: pd.DataFrame) -> None:
    print(_table_text(df))


def _print_json(data) -> None:
    print(json.dumps(data, indent=2, default=str))


def _print_frame(df: pd.DataFrame, as_json: bool) -> None:
    if as_json:
        print(df.to_json(orient="records", indent=2))
    else:
        _print_table(df)


def cmd_catalog(ns) -> None:
    from kvexplore.planning.planner import catalog

    _print_frame(catalog(**({"gpu": ns.gpu} if ns.gpu else {})), ns.json)


def cmd_gpus(ns) -> None:
    _print_frame(gpus(), ns.json)


def cmd_envs(ns) -> None:
    """The window's releases and their environments, each checked
    (``problems``: what :func:`kvexplore.versions.check_environment` finds,
    empty when usable); ``--create`` makes the missing ones named (with uv)
    and rebuilds those that fail the check, ``--repair`` only rebuilds those;
    ``--python`` prints only their Pythons."""
    import pandas as pd

    from kvexplore.planning.release import (
        WINDOW_RELEASES,
        canonical_release,
        installed_release,
    )
    from kvexplore.version import release_list
    from kvexplore.versions import environment, environment_path, environment_problems

    versions = list(release_list(ns.releases, what="releases", spell=canonical_release,
                                 expected="expected releases of the window", minimum=0)
                    or WINDOW_RELEASES)
    rows = []
    for v in versions:
        path = environment_path(v)
        python = path / "bin" / "python"
        if ns.create or (ns.repair and path.exists()):
            environment(v, create=ns.create, repair=True)
        problems = environment_problems(v) if path.exists() else ()
        rows.append({"release": v, "installed_here": v == installed_release().version,
                     "environment": str(path), "exists": python.exists(), "python": str(python),
                     "problems": "; ".join(problems)})
    if ns.python:
        print("\n".join(r["python"] for r in rows))
        return
    _print_frame(pd.DataFrame(rows), ns.json)


def cmd_versions(ns) -> None:
    """:func:`kvexplore.compare_versions`: the facts that differ (``--all``:
    every fact), one column per release."""
    from kvexplore.versions import compare_versions

    c = compare_versions(ns.model, vllm=ns.vllm.split(","), **_kwargs(ns, _PLAN_KEYS))
    if ns.json:
        _print_json({"model": c.model, "releases": list(c.releases), "facts": dict(c.facts)})
        return
    if ns.all:
        _print_frame(c.table(only_differences=False), False)
    else:
        print(c.text())


def _workload(ns):
    from kvexplore.advising import Workload

    return Workload(
        max_model_len=ns.max_model_len, prompt_tokens=ns.prompt_tokens,
        output_tokens=ns.output_tokens, concurrency=ns.concurrency,
        shared_prefix=ns.shared_prefix, reuse_prefix=ns.reuse_prefix,
        speculative_config=ns.speculative_config, cpu_bytes_to_use=ns.cpu_bytes_to_use)


def _advise_question(ns) -> Question:
    """The stored answer's question of an ``advise`` command line answered
    by the installed release (another ``--vllm`` has none here)."""
    from kvexplore.advising import advice_question
    from kvexplore.planning.release import canonical_release, installed_release

    if ns.vllm is not None and canonical_release(ns.vllm) != installed_release().version:
        raise KVExploreError(f"--vllm {ns.vllm} is answered in its own environment")
    return advice_question(ns.model, gpu=ns.gpu, gpus=ns.gpus, workload=_workload(ns),
                           space=ns.space, objective=ns.objective)


def cmd_advise(ns) -> None:
    """:func:`kvexplore.advise`: the recommendation, its ``vllm serve``
    command and every searched setting (``--json``: :meth:`Advice.to_dict`;
    with several ``--vllm`` releases, one per release)."""
    from kvexplore.advising import advise

    vllm = ns.vllm.split(",") if ns.vllm and "," in ns.vllm else ns.vllm
    got = advise(ns.model, gpu=ns.gpu, gpus=ns.gpus, workload=_workload(ns), vllm=vllm,
                 space=ns.space, objective=ns.objective, store=not ns.no_cache)
    if ns.json:
        _print_json(got.to_dict())
    else:
        print(got.text())


def cmd_edits(ns) -> None:
    """:func:`kvexplore.apply_kv_cache_group_edits` of one LMCache release on
    what the plan registers (16 blocks of its layout, on the meta device):
    one row per group and rule, or LMCache's refusal."""
    from kvexplore.editing import apply_kv_cache_group_edits, lmcache_release
    from kvexplore.planning.planner import plan
    from kvexplore.registration import allocate
    from kvexplore.versions.compare import FACT_BLOCKS

    release = lmcache_release(ns.lmcache)
    p = plan(ns.model, **_kwargs(ns, _PLAN_KEYS)).with_num_blocks(FACT_BLOCKS)
    kv = allocate(p, device="meta", registration=ns.registration)
    edited = apply_kv_cache_group_edits(p, kv, lmcache=release)
    if ns.json:
        _print_json({"vllm": p.vllm_version, "lmcache": edited.lmcache,
                     "registration": ns.registration,
                     "groups": jsonable(edited.by_group().to_dict("records"))})
        return
    print(edited.text())


def cmd_lmcache(ns) -> None:
    """:func:`kvexplore.lmcache_layout`: what one LMCache release's
    multi-process connector and server store for MODEL's deployment at
    ``--chunk-size``: the checks, the groups, the bytes per chunk, the tokens
    of ``--prompt-tokens`` stored and hit, the smallest accepted chunk."""
    from kvexplore.connectors.lmcache_layout import lmcache_layout

    layout = lmcache_layout(ns.model, lmcache=ns.lmcache, chunk_size=ns.chunk_size,
                            separate_object_groups=ns.separate_object_groups,
                            engine_type=ns.engine_type, **_kwargs(ns, _PLAN_KEYS))
    prompts = {p: {"stored": layout.stored(p), "hit": layout.hit(p)} for p in ns.prompt_tokens}
    if ns.json:
        _print_json({
            "vllm": layout.plan.vllm_version, "lmcache": layout.release.version,
            "accepted": layout.accepted, "chunk_size": layout.chunk_size,
            "asked_chunk_size": layout.asked_chunk_size,
            "smallest_chunk": layout.smallest_chunk(),
            "scheduler_block": layout.scheduler_block,
            "group_tokens_per_block": list(layout.group_tokens_per_block),
            "chunk_bytes": layout.chunk_bytes, "server_flags": layout.server_flags(),
            "checks": [c._asdict() for c in layout.checks],
            "engine_groups": jsonable(layout.engine_groups.to_dict("records")),
            "kernel_groups": jsonable(layout.kernel_groups.to_dict("records")),
            "object_groups": jsonable(layout.object_groups.to_dict("records")),
            "prompts": prompts,
        })
        return
    print(layout.text())
    for p, row in prompts.items():
        print(f"a {p:,}-token prompt: {row['stored']:,} tokens stored, {row['hit']:,} hit")


def _bool_flag(value: str) -> bool:
    if value.lower() in ("true", "1", "yes", "on"):
        return True
    if value.lower() in ("false", "0", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"{value!r}; expected true or false")


def _counts(value: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r}; expected comma-separated token counts") from None
    return out


def cmd_matrix(ns) -> None:
    """:func:`kvexplore.compatibility`: per (vLLM, LMCache) pair and group,
    what LMCache does; then where adjacent releases differ."""
    from kvexplore.versions.matrix import compatibility

    c = compatibility(ns.model, vllm=ns.vllm, lmcache=ns.lmcache,
                      registration=ns.registration, chunk_size=ns.chunk_size,
                      **_kwargs(ns, _PLAN_KEYS))
    if ns.json:
        _print_json({"model": c.model, "registration": c.registration,
                     "rows": jsonable(c.rows.to_dict("records")),
                     "deployments": [{"vllm": v, "lmcache": m, "refusal": r}
                                     for (v, m), r in c.deployments.items()],
                     "stores": [{"vllm": v, "lmcache": m, "chunk_size": c.chunk_size,
                                 **(r or {"accepted": None})}
                                for (v, m), r in c.stores.items()]})
        return
    print(c.text())


#: The answer store's kind of ``kvexplore offload``'s answer (its facts and text).
OFFLOAD_KIND = "offload"

#: The answer store's kind of ``kvexplore capacity``'s answer (its facts and text).
CAPACITY_KIND = "capacity"


def _capacity_kwargs(ns, *, calibrated: bool = True) -> dict:
    """``capacity()``'s keywords the flags give (the plan's and its own);
    ``--calibration LOG`` is :func:`kvexplore.calibrate` of that log (with
    ``calibrated``)."""
    kwargs = _kwargs(ns, (*_PLAN_KEYS, *_CAPACITY_BYTES))
    if ns.offload_extra_config is not None:
        kwargs["offload_extra_config"] = _extra(ns.offload_extra_config)
    if calibrated and ns.calibration is not None:
        from kvexplore.logs.calibrating import calibrate

        gpu = kwargs.get("gpu")
        try:
            kwargs["calibration"] = calibrate(ns.calibration, gpu=gpu)
        except KVExploreError:  # the log's model is not one kvexplore finds: MODEL's
            kwargs["calibration"] = calibrate(ns.calibration, model=ns.model, gpu=gpu)
    return kwargs


def _log_digest(path: str) -> str:
    """The SHA-256 of a log file's bytes (the store key of a calibration)."""
    import hashlib

    try:
        return hashlib.sha256(open(path, "rb").read()).hexdigest()
    except OSError as exc:
        raise KVExploreError(f"--calibration {path!r} cannot be read ({exc}); expected a "
                             "vLLM start-up log file") from None


def _prompt_lengths(ns) -> list[int]:
    return _split(ns.prompt_tokens, int) if ns.prompt_tokens else []


def _plan_question(ns) -> Question:
    return question(PLAN_KIND, ns.model, **_kwargs(ns, _PLAN_KEYS))


def _offload_question(ns) -> Question:
    """``offload``'s question: the plan's and every ``OffloadOptions`` field,
    defaults filled in."""
    options = OffloadOptions.from_kwargs(**_kwargs(ns, OffloadOptions.names())).as_dict()
    return question(OFFLOAD_KIND, ns.model, {"offload": options}, **_kwargs(ns, _PLAN_KEYS))


def _capacity_question(ns) -> Question:
    """``capacity``'s question: the plan's, the capacity keywords given (a
    calibration log by its bytes' digest) and the ``--prompt-tokens`` lengths."""
    kwargs = _capacity_kwargs(ns, calibrated=False)
    planned = {k: v for k, v in kwargs.items() if k in _PLAN_KEYS}
    own = {k: v for k, v in kwargs.items() if k not in planned}
    if ns.calibration is not None:
        own["calibration_log"] = _log_digest(ns.calibration)
    return question(CAPACITY_KIND, ns.model, {"capacity": own, "prompt_tokens": _prompt_lengths(ns)},
                    **planned)


#: The commands whose answers the store keeps: their question.
_QUESTIONS = {"plan": _plan_question, "offload": _offload_question,
              "capacity": _capacity_question, "advise": _advise_question}
#: The answer store's kind of each command's answer.
_KINDS = {"plan": PLAN_KIND, "offload": OFFLOAD_KIND, "capacity": CAPACITY_KIND,
          "advise": ADVICE_KIND}


def command_question(ns: argparse.Namespace) -> Question:
    """The :class:`~kvexplore.store.Question` of a parsed ``plan``,
    ``offload`` or ``capacity`` command line: what its answer is stored and
    read back for (a value the command refuses is a :class:`KVExploreError`)."""
    if getattr(ns, "command", None) not in _QUESTIONS:
        raise KVExploreError(
            f"command={getattr(ns, 'command', None)!r} has no stored answer here; "
            f"expected one of {sorted(_QUESTIONS)}"
        )
    return _QUESTIONS[ns.command](ns)


def _question(ns) -> Question | None:
    """``ns``'s question; None with ``--no-cache`` or when it cannot be made
    (a value the command refuses: the full path gives the refusal).  An
    unwritable store is a :class:`KVExploreError` before any work."""
    if ns.no_cache:
        return None
    answer_store(True)
    try:
        return command_question(ns)
    except KVExploreError:
        return None


def _print_answer(answer: dict, as_json: bool) -> None:
    """A stored or computed payload as the command prints it: the facts as
    JSON, or the text."""
    if as_json:
        _print_json(answer["facts"])
    else:
        print(answer["text"])


def answer_from_store(ns) -> bool:
    """``plan``, ``offload`` or ``capacity`` (``--json`` or text) answered
    from the answer store before vLLM is imported: True when the store held
    the payload the command stored for its question (with its text, unless
    ``--json``), now printed the same way."""
    q = _question(ns)
    if q is None:
        return False
    hit = answer_store(True).get(q, lambda value: is_payload(value, q.kind))
    if hit is None or (not ns.json and hit["text"] is None):
        return False
    _print_answer(hit, ns.json)
    return True


def cmd_plan(ns) -> None:
    kwargs = _kwargs(ns, _PLAN_KEYS)
    # what a hit in the store prints (answer_from_store): the same JSON values or text
    _print_answer(plan_answer(ns.model, store=not ns.no_cache, text=not ns.json, **kwargs), ns.json)


def _answered(ns, compute) -> None:
    """Print ``compute()``'s payload (``{"facts": JSON values, "text": the
    text form}``), stored for the command's question unless ``--no-cache``
    (:func:`kvexplore.store.answer`): both forms are kept, so either flag is
    answered from the store next time."""

    q, kind = _question(ns), _KINDS[ns.command]

    def stored() -> dict:
        got = compute()
        return payload(kind, json_facts(got["facts"]), got["text"])

    _print_answer(answer(q, stored, True, valid=lambda value: is_payload(value, kind)), ns.json)


def cmd_offload(ns) -> None:
    from kvexplore.offloading.config import offload_config
    from kvexplore.planning.planner import plan

    options = _kwargs(ns, OffloadOptions.names())  # before planning: a bad flag fails fast

    def compute() -> dict:
        result = offload_config(plan(ns.model, **_kwargs(ns, _PLAN_KEYS)), **options)
        return {"facts": result.to_dict(),
                "text": _table_text(result.table()) + "\n\n" + result.explain()}

    _answered(ns, compute)


def cmd_sweep(ns) -> None:
    axes = _kwargs(ns, _PLAN_KEYS, lists=True)
    axes.update(_kwargs(ns, OffloadOptions.names(), lists=True))
    if ns.csv and ns.out:
        raise KVExploreError(f"--csv {ns.csv!r} and --out {ns.out!r} both given; expected one output file")
    out, flag = (ns.csv, "--csv") if ns.csv else (ns.out, "--out")
    if out:
        check_output(out, flag)  # before the sweep's work
    models = [m.strip() for m in ns.model.split(",")] if "," in ns.model else ns.model
    df = sweep(models, output=out, store=not ns.no_cache, **axes)
    if out:
        print(f"wrote {len(df)} rows to {out}")
    elif ns.json:
        print(df.to_json(orient="records", indent=2, default_handler=str))
    else:
        _print_table(df)


#: ``capacity`` byte counts the command line takes, with their help.
_CAPACITY_BYTES = {
    "total_memory_bytes": "the card's torch.cuda.mem_get_info() total (default: the GPU table's reading)",
    "weight_bytes": "the loaded weights per rank (default: the model's parameters and buffers)",
    "activation_peak_bytes": None,
    "non_torch_bytes": None,
    "cudagraph_bytes": None,
    "cpu_bytes_to_use": "host bytes of the native CPU offloading tier",
}


def cmd_capacity(ns) -> None:
    from kvexplore.capacity_planning import capacity

    kwargs = _capacity_kwargs(ns)

    def compute() -> dict:
        r = capacity(ns.model, **kwargs)
        lengths = _prompt_lengths(ns)
        for n in lengths:
            # validated here so that a bad length fails before any output
            r.prefix_hit_tokens(n)
        facts = r.to_dict()
        text = r.text()
        if lengths:
            facts["prefix_hits"] = {str(n): r.prefix_hit_tokens(n) for n in lengths}
            text += "\n\n" + _table_text(r.prefix_table(lengths))
        return {"facts": facts, "text": text}

    _answered(ns, compute)


def cmd_check_log(ns) -> None:
    """A vLLM start-up log checked line by line against kvexplore's plan of it."""
    from kvexplore.logs.checking import check_log

    result = check_log(ns.log, model=ns.model, gpu=ns.gpu, vllm=ns.vllm,
                       **_kwargs(ns, PLAN_KEYWORDS))
    if ns.json:
        _print_json(result.to_dict())
    else:
        print(result.text())


def _finish(p: argparse.ArgumentParser, func) -> None:
    """The flags every subcommand ends with, and the function it runs."""
    p.add_argument("--json", action="store_true")
    p.add_argument("--verbose", action="store_true", help="show vLLM's INFO logs (on stderr)")
    p.add_argument("--no-cache", dest="no_cache", action="store_true",
                   help="neither read nor write the answer store (kvexplore.store)")
    p.set_defaults(func=func)


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with a usage error one line like every other failure."""

    def error(self, message: str):
        self.exit(2, f"kvexplore: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvexplore", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("catalog", help="list the bundled model configs")
    c.add_argument("--gpu", default=None)
    _finish(c, cmd_catalog)
    _finish(sub.add_parser("gpus", help="the GPUs kvexplore answers for"), cmd_gpus)
    p = sub.add_parser("plan", help="the KV cache vLLM builds for MODEL")
    _add_plan_args(p)
    _finish(p, cmd_plan)
    p.set_defaults(answer_from_store=answer_from_store)
    o = sub.add_parser("offload", help="the OffloadingConfig vLLM hands an offloading backend")
    _add_plan_args(o)
    _add_offload_args(o)
    _finish(o, cmd_offload)
    o.set_defaults(answer_from_store=answer_from_store)
    s = sub.add_parser("sweep", help="plans and offloading configs over comma-separated axes")
    _add_plan_args(s, lists=True)
    _add_offload_args(s, lists=True)
    s.add_argument("--csv", help="write the rows to this CSV file as they come; a re-run resumes")
    s.add_argument("--out", help="write the rows to this .parquet or .csv file as they come; "
                                 "a re-run with the same file skips the rows already there")
    _finish(s, cmd_sweep)
    k = sub.add_parser("capacity", help="KV cache memory, tokens, concurrency and prefix-cache hits on a GPU")
    _add_plan_args(k)
    for key, help_text in _CAPACITY_BYTES.items():
        k.add_argument("--" + key.replace("_", "-"), dest=key, type=int, default=None, help=help_text)
    k.add_argument("--extra", dest="offload_extra_config", default=None,
                   help="kv_connector_extra_config of the CPU tier: a JSON object")
    k.add_argument("--prompt-tokens", dest="prompt_tokens", default=None,
                   help="comma-separated prompt lengths: tokens a repeat reuses")
    k.add_argument("--calibration", default=None, help="a vLLM start-up log of this GPU: "
                   "its measured memory terms (kvexplore.calibrate)")
    _finish(k, cmd_capacity)
    k.set_defaults(answer_from_store=answer_from_store)
    v = sub.add_parser("versions", help="one deployment across vLLM releases, side by side")
    _add_plan_args(v)
    v.add_argument("--vllm", default=",".join(COMPARED_RELEASES),
                   help="comma-separated releases of the window")
    v.add_argument("--all", action="store_true", help="every fact, not only those that differ")
    _finish(v, cmd_versions)
    a = sub.add_parser("advise", help="the engine arguments that start, hold a workload and "
                       "reuse its shared prefix, searched on vLLM's own code")
    a.add_argument("model", help="catalog id (see `kvexplore catalog`), config.json or its directory")
    a.add_argument("--gpu", default="H100", help="GPU name (see `kvexplore gpus`)")
    a.add_argument("--gpus", type=int, default=1, help="GPUs of that type to use at most")
    for flag in ("max-model-len", "prompt-tokens", "output-tokens", "cpu-bytes-to-use"):
        a.add_argument("--" + flag, dest=flag.replace("-", "_"), type=int, default=None)
    a.add_argument("--concurrency", type=int, default=1, help="requests to serve at once")
    a.add_argument("--shared-prefix", dest="shared_prefix", type=int, default=0,
                   help="tokens every request starts with")
    a.add_argument("--reuse-prefix", dest="reuse_prefix", action="store_true",
                   help="a setting that reuses none of the shared prefix does not hold the workload")
    a.add_argument("--speculative-config", "-sc", dest="speculative_config", type=_json_object,
                   default=None)
    a.add_argument("--space", type=_json_object, default=None,
                   help='axes to search, e.g. \'{"kv_cache_dtype": ["auto", "fp8"]}\'')
    a.add_argument("--objective", default="concurrency",
                   choices=("concurrency", "prefix_reuse", "gpus"))
    a.add_argument("--vllm", default=None, help="a release, or comma-separated releases")
    _finish(a, cmd_advise)
    a.set_defaults(answer_from_store=answer_from_store)
    d = sub.add_parser("edits", help="one LMCache release's KV-cache-group edits on MODEL's registration")
    _add_plan_args(d)
    d.add_argument("--lmcache", default=None,
                   help="LMCache release (default: the installed one, else the newest stable)")
    d.add_argument("--registration", default="unified", choices=("unified", "legacy"))
    _finish(d, cmd_edits)
    lm = sub.add_parser("lmcache", help="what one LMCache release's multi-process connector and "
                        "server store for MODEL: groups, bytes per chunk, stored and hit tokens")
    _add_plan_args(lm)
    lm.add_argument("--lmcache", default=None,
                    help="LMCache release (default: the installed one, else the newest stable)")
    lm.add_argument("--chunk-size", dest="chunk_size", type=int, default=256,
                    help="the LMCache server's --chunk-size (tokens)")
    lm.add_argument("--separate-object-groups", dest="separate_object_groups",
                    type=_bool_flag, default=None,
                    help="true / false: the server's --separate-object-groups "
                         "(default: the release's)")
    lm.add_argument("--engine-type", dest="engine_type", default="default",
                    choices=("default", "blend"))
    lm.add_argument("--prompt-tokens", dest="prompt_tokens", type=_counts, default=[],
                    help="comma-separated prompt lengths: the tokens stored and hit for each")
    _finish(lm, cmd_lmcache)
    m = sub.add_parser("matrix", help="what each LMCache release does on each vLLM release")
    _add_plan_args(m)
    m.add_argument("--vllm", default=None, help="comma-separated vLLM releases (default: the installed one)")
    m.add_argument("--lmcache", default=None,
                   help="comma-separated LMCache releases (default: every one kvexplore knows)")
    m.add_argument("--registration", default="unified", choices=("unified", "legacy"))
    m.add_argument("--chunk-size", dest="chunk_size", type=int, default=None,
                   help="also what LMCache's multi-process server says at this --chunk-size")
    _finish(m, cmd_matrix)
    g = sub.add_parser("check-log", help="a vLLM start-up log checked line by line against "
                       "kvexplore's plan of the deployment it describes")
    g.add_argument("log", help="the log file")
    g.add_argument("--model", default=None, help="catalog id, config.json or its directory "
                   "(default: the model the log names)")
    _add_plan_args(g, model=False)  # --gpu (default: the card the log names) and plan flags
                                    # over the log's
    g.add_argument("--vllm", default=None,
                   help="the release that plans (default: the log's, when its environment "
                   "exists here, else the installed one)")
    _finish(g, cmd_check_log)
    e = sub.add_parser("envs", help="one environment per vLLM release of the window (uv)")
    e.add_argument("releases", nargs="*", help="releases (default: the whole window)")
    e.add_argument("--create", action="store_true",
                   help="create the missing environments and rebuild those that fail the check")
    e.add_argument("--repair", action="store_true",
                   help="rebuild the environments that fail the check (in a new folder, swapped in)")
    e.add_argument("--python", action="store_true", help="print only each environment's Python")
    _finish(e, cmd_envs)
    e.set_defaults(runs_vllm=False)  # it runs the environments' Pythons, never vLLM here
    return parser


@contextlib.contextmanager
def _vllm_logs_routed(verbose: bool) -> Iterator[None]:
    """vLLM's log records at INFO with ``--verbose``, else ERROR, and on
    stderr in every mode: vLLM's own handler writes to stdout, which holds
    only the answer (so ``--json`` output always parses).  Levels and streams
    are put back afterwards, so an in-process ``main()`` leaves no handler
    pointing at a stream that has since closed."""
    from vllm.config.logging import LoggingConfig
    from vllm.logger import configure_logging

    from kvexplore.planning.emulation import vllm_log_level

    level = logging.INFO if verbose else logging.ERROR
    logger = logging.getLogger("vllm")
    if verbose and not logger.handlers:
        configure_logging(LoggingConfig(log_level="INFO"))  # vLLM's own handler, as its engine installs it
    before = (vllm_log_level(), logger.level)
    streams = [(h, h.stream) for h in logger.handlers
               if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler)]
    vllm_log_level(level)
    logger.setLevel(level)
    for h, _ in streams:
        h.setStream(sys.stderr)
    try:
        yield
    finally:
        for h, stream in streams:
            h.setStream(stream)
        vllm_log_level(before[0])
        logger.setLevel(before[1])


#: Documented settings torch and vLLM read when imported, set (where the user
#: has not set them) for a command run without ``--verbose``: ``TORCH_LOGS``
#: ``-all`` puts every torch logger at ERROR (torch._logging), so the
#: deprecation and "No CUDA runtime is found" warnings it logs on import stay
#: off stderr; ``TORCH_CPP_LOG_LEVEL`` does the same for c10's C++ log;
#: ``VLLM_LOGGING_LEVEL`` is vLLM's default level (vllm/envs.py).
QUIET_SETTINGS = {"TORCH_LOGS": "-all", "TORCH_CPP_LOG_LEVEL": "ERROR",
                  "VLLM_LOGGING_LEVEL": "ERROR"}


@contextlib.contextmanager
def _quiet(verbose: bool) -> Iterator[None]:
    """Without ``verbose``: :data:`QUIET_SETTINGS` in ``os.environ`` (for a
    torch or vLLM not yet imported), torch's logger at ERROR (for one already
    imported) and Python's warnings ignored, all put back afterwards; with
    ``verbose`` nothing changes, so they reach stderr."""
    if verbose:
        yield
        return
    added = {k: v for k, v in QUIET_SETTINGS.items() if k not in os.environ}
    torch_logger = logging.getLogger("torch")
    level = torch_logger.level
    os.environ.update(added)
    torch_logger.setLevel(max(level, logging.ERROR))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        torch_logger.setLevel(level)
        for k in added:
            os.environ.pop(k, None)


def main(argv: list[str] | None = None) -> int:
    ns = build_parser().parse_args(argv)
    try:
        with _quiet(ns.verbose):
            answer = getattr(ns, "answer_from_store", None)
            if answer is not None and answer(ns):
                return 0
            # a command that never imports vLLM has no vLLM log to route
            routed = _vllm_logs_routed if getattr(ns, "runs_vllm", True) else contextlib.nullcontext
            with routed(ns.verbose):
                ns.func(ns)
    except Exception as exc:  # noqa: BLE001 - every failure is one line, never a traceback
        why = str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"
        print("kvexplore: error: " + " ".join(why.splitlines()), file=sys.stderr)
        return 2
    return 0


def console() -> None:
    """The ``kvexplore`` command and ``python -m kvexplore``: :func:`main`,
    then the process's exit with its status.  The heap is frozen first: the
    interpreter's closing garbage collections would scan every object vLLM's
    imports and the answer left, only to free what the exit frees anyway
    (``atexit`` handlers still run)."""
    status = main()
    gc.freeze()
    sys.exit(status)


if __name__ == "__main__":  # pragma: no cover
    console()
