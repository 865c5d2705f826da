"""A plan's facts from the answer store: a deployment planned before costs no build.

:func:`plan_facts` is ``plan(model, **kwargs).to_dict()`` as JSON values,
and :func:`plan_answer` those facts with ``Plan.text()`` (what ``kvexplore
plan`` prints), kept together in the answer store (:mod:`kvexplore.store`,
one :func:`payload` ``{"kind": ..., "facts": ..., "text": ...}``) for the plan's :func:`question`:
the vLLM release, kvexplore's :func:`~kvexplore.store.code_version`, the model
config's name and content digest, the GPU and the normalised request
(:func:`~kvexplore.planning.inputs.store_key`: checked as ``PlanRequest``
without the checks that import vLLM).  A hit reads one file and imports neither vLLM nor torch; a miss
plans (vLLM's own code) and stores the facts.  The facts read back are the
facts a fresh plan gives, value for value and in the same order, and the
text is the text it prints, character for character.

An answer computed from a plan and options of its own (``kvexplore offload``,
``kvexplore capacity``), or a sweep's row, is kept the same way, for the
:func:`question` of its kind, its plan's keywords and those options.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.planning.gpus import DEFAULT_GPU, resolve_gpu
from kvexplore.planning.inputs import store_key
from kvexplore.planning.models import DEFAULT_MODEL, ModelSource, load_model_config
from kvexplore.planning.release import installed_release
from kvexplore.store import Question, answer, canonical, code_version

#: The store's kind for a plan's facts.
PLAN_KIND = "plan"


def _key_value(value: Any) -> Any:
    if isinstance(value, ModelSource):
        return {"name": value.name, "digest": value.digest}
    return value


def question(kind: str, model: Any = DEFAULT_MODEL, options: Mapping[str, Any] | None = None,
             **kwargs: Any) -> Question:
    """The :class:`~kvexplore.store.Question` of an answer of ``kind``
    computed from ``plan(model, **kwargs)`` and ``options`` (everything else
    the answer depends on: a command's own flags, a sweep row's own
    keywords): the model's name and config digest, the GPU's fields, the
    request (:func:`~kvexplore.planning.inputs.store_key`: checked as
    ``PlanRequest`` without the checks that import vLLM), ``options`` as
    canonical JSON values, the installed vLLM release and kvexplore's
    :func:`~kvexplore.store.code_version`; imports no vLLM.  A value
    ``plan()`` refuses raises its :class:`KVExploreError`."""
    src = load_model_config(model)
    gpu = resolve_gpu(kwargs.pop("gpu", DEFAULT_GPU))
    request = store_key(**kwargs)
    return Question(
        kind,
        model={"name": src.name, "digest": src.digest},
        gpu=dataclasses.asdict(gpu),
        request=[[k, _key_value(v)] for k, v in request],
        options=json.loads(canonical(dict(options or {}))),
        releases={"vllm": installed_release().version, "kvexplore": code_version()},
    )


def json_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """``facts`` as JSON values (what ``json.dumps(..., default=str)`` writes,
    read back: tuples as lists, other objects as text), order kept."""
    return json.loads(json.dumps(facts, default=str))


def payload(kind: str, facts: dict, text: str | None) -> dict[str, Any]:
    """A stored answer: ``{"kind": the question's kind, "facts": JSON
    values, "text": the text form or None}``; the kind says whose facts
    they are, so no command serves another's."""
    return {"kind": kind, "facts": facts, "text": text}


def is_payload(value: Any, kind: str | None = None) -> bool:
    """Whether ``value`` is a stored :func:`payload` (a plan's, ``kvexplore
    offload``'s or ``capacity``'s) and nothing else; with ``kind``, one
    answering a question of that kind (a plan's question whose entry holds
    an offloading answer is not a plan's payload)."""
    return (isinstance(value, dict) and set(value) == {"kind", "facts", "text"}
            and isinstance(value["kind"], str) and (kind is None or value["kind"] == kind)
            and isinstance(value["facts"], dict) and isinstance(value["text"], (str, type(None))))


def plan_answer(model: Any = DEFAULT_MODEL, *, store: Any = True, text: bool = False,
                **kwargs: Any) -> dict[str, Any]:
    """``{"kind": "plan", "facts": plan(model, **kwargs).to_dict() as JSON values
    (:func:`json_facts`), "text": plan(...).text()}``, from the answer store
    when it holds them (no vLLM import), else planned and stored, both for
    :func:`question` ``(PLAN_KIND, model, **kwargs)``
    (:func:`kvexplore.store.answer`).  A plan computed here is stored with
    its text; ``text=True`` asks for the text, so a stored payload without
    it (``"text": None``) is planned again.  ``store``: ``True`` the user's
    store, ``False`` none, or a folder (:func:`kvexplore.store.answer_store`;
    an unwritable folder is a :class:`KVExploreError` before any work).
    Refusals are ``plan()``'s."""
    try:
        q = question(PLAN_KIND, model, **dict(kwargs))
    except KVExploreError:
        q = None  # plan() gives the refusal, checked with vLLM

    def compute() -> dict[str, Any]:
        from kvexplore.planning.planner import plan

        p = plan(model, **kwargs)
        return payload(PLAN_KIND, json_facts(p.to_dict()), p.text())

    return answer(q, compute, store, valid=lambda value: is_payload(value, PLAN_KIND),
                  enough=lambda hit: not text or hit["text"] is not None)


def plan_facts(model: Any = DEFAULT_MODEL, *, store: Any = True, **kwargs: Any) -> dict[str, Any]:
    """``plan(model, **kwargs).to_dict()`` as JSON values (:func:`json_facts`),
    from the answer store when it holds them (no vLLM import), else planned
    and stored (:func:`plan_answer`'s ``facts``).  ``store``: ``True`` the
    user's store, ``False`` none, or a folder
    (:func:`kvexplore.store.answer_store`; an unwritable folder is a
    :class:`KVExploreError` before any work).  Refusals are ``plan()``'s."""
    return plan_answer(model, store=store, **kwargs)["facts"]


__all__ = [
    "PLAN_KIND",
    "is_payload",
    "payload",
    "json_facts",
    "plan_answer",
    "plan_facts",
    "question",
]
