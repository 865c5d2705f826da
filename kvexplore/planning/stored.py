"""A plan's facts from the answer store: a deployment planned before costs no build.

:func:`plan_facts` is ``plan(model, **kwargs).to_dict()`` as JSON values,
and :func:`plan_answer` those facts with ``Plan.text()`` (what ``kvexplore
plan`` prints), kept together in the answer store (:mod:`kvexplore.store`,
one payload ``{"facts": ..., "text": ...}``) under :func:`plan_key`: the
vLLM release, kvexplore's :func:`~kvexplore.store.code_version`, the model
config's name and content digest, the GPU and the normalised request
(:func:`~kvexplore.planning.inputs.store_key`: checked as ``PlanRequest``
without the checks that import vLLM).  A hit reads one file and imports neither vLLM nor torch; a miss
plans (vLLM's own code) and stores the facts.  The facts read back are the
facts a fresh plan gives, value for value and in the same order, and the
text is the text it prints, character for character.

An answer computed from a plan and options of its own (``kvexplore offload``,
``kvexplore capacity``) is kept the same way, one payload of facts and text,
under :func:`answer_key`: :func:`plan_key` and those options.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from kvexplore.display import text_form
from kvexplore.errors import KVExploreError
from kvexplore.planning.gpus import DEFAULT_GPU, resolve_gpu
from kvexplore.planning.inputs import store_key
from kvexplore.planning.models import DEFAULT_MODEL, ModelSource, load_model_config
from kvexplore.planning.release import installed_release
from kvexplore.store import AnswerStore, answer_store, canonical, code_version

#: The store's kind for a plan's facts.
PLAN_KIND = "plan"


def _key_value(value: Any) -> Any:
    if isinstance(value, ModelSource):
        return {"name": value.name, "digest": value.digest}
    return value


def plan_key(model: Any = DEFAULT_MODEL, **kwargs: Any) -> dict[str, Any]:
    """The store key of ``plan(model, **kwargs)``: a JSON object of the vLLM
    release, :func:`~kvexplore.store.code_version`, the model's name and
    digest, the GPU's fields and the request; imports no vLLM.  A value
    ``plan()`` refuses raises its :class:`KVExploreError`."""
    src = load_model_config(model)
    gpu = resolve_gpu(kwargs.pop("gpu", DEFAULT_GPU))
    request = store_key(**kwargs)
    return {
        "vllm": installed_release().version,
        "kvexplore": code_version(),
        "model": {"name": src.name, "digest": src.digest},
        "gpu": dataclasses.asdict(gpu),
        "request": [[k, _key_value(v)] for k, v in request],
    }


def answer_key(model: Any, options: Mapping[str, Any], **plan_kwargs: Any) -> dict[str, Any]:
    """The store key of an answer computed from ``plan(model, **plan_kwargs)``
    and ``options`` (everything else the answer depends on: a command's own
    flags): :func:`plan_key`'s fields and ``"options"``, ``options`` as
    canonical JSON values (:func:`~kvexplore.store.canonical`: tuples as
    lists, other objects as text); imports no vLLM.  A value ``plan()``
    refuses raises its :class:`KVExploreError`."""
    return {**plan_key(model, **plan_kwargs), "options": json.loads(canonical(dict(options)))}


def json_facts(facts: dict[str, Any]) -> dict[str, Any]:
    """``facts`` as JSON values (what ``json.dumps(..., default=str)`` writes,
    read back: tuples as lists, other objects as text), order kept."""
    return json.loads(json.dumps(facts, default=str))


def _stored_answer(value: Any) -> dict[str, Any] | None:
    """A plan's stored payload, or None when ``value`` is not one."""
    if (isinstance(value, dict) and isinstance(value.get("facts"), dict)
            and isinstance(value.get("text", ""), (str, type(None)))):
        return {"facts": value["facts"], "text": value.get("text")}
    return None


def stored_plan(store: AnswerStore, key: Any) -> dict[str, Any] | None:
    """The payload :func:`plan_answer` stored under ``key`` in ``store``
    (``{"facts": ..., "text": ... or None}``), or None; imports no vLLM."""
    return _stored_answer(store.get(PLAN_KIND, key))


def stored_answer(store: AnswerStore, kind: str, key: Any) -> dict[str, Any] | None:
    """The payload ``{"facts": ..., "text": ...}`` stored under ``(kind,
    key)`` in ``store`` (``text`` a string), or None when there is none or it
    is not such a payload; imports no vLLM."""
    hit = _stored_answer(store.get(kind, key))
    return hit if hit is not None and isinstance(hit["text"], str) else None


def plan_answer(model: Any = DEFAULT_MODEL, *, store: Any = True, text: bool = False,
                **kwargs: Any) -> dict[str, Any]:
    """``{"facts": plan(model, **kwargs).to_dict() as JSON values
    (:func:`json_facts`), "text": plan(...).text()}``, from the answer store
    when it holds them (no vLLM import), else planned and stored, both under
    :func:`plan_key`.  ``text`` is None when it was not asked for and the
    rendering stage (:mod:`kvexplore.rendering`, which registers
    ``Plan.text``) was not imported; ``text=True`` asks for it (a stored
    payload without it is planned again; without the rendering stage,
    ``Plan.text``'s :class:`KVExploreError`).  ``store``: ``True`` the user's
    store, ``False`` none, or a folder (:func:`kvexplore.store.answer_store`;
    an unwritable folder is a :class:`KVExploreError` before any work).
    Refusals are ``plan()``'s."""
    s = answer_store(store)
    key = None
    if s is not None:
        try:
            key = plan_key(model, **kwargs)
        except KVExploreError:
            key = None  # plan() gives the refusal, checked with vLLM
        if key is not None:
            hit = stored_plan(s, key)
            if hit is not None and (not text or hit["text"] is not None):
                return hit
    from kvexplore.planning.planner import plan

    p = plan(model, **kwargs)
    rendered = text or type(p) in text_form.registry
    answer = {"facts": json_facts(p.to_dict()), "text": p.text() if rendered else None}
    if key is not None:
        s.put(PLAN_KIND, key, answer)
    return answer


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
    "answer_key",
    "json_facts",
    "plan_answer",
    "plan_facts",
    "plan_key",
    "stored_answer",
    "stored_plan",
]
