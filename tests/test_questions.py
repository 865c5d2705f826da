"""One question, one key, one answer: the answer store never serves an answer
to another question, and a resumed sweep file never serves a row whose own
cells ask another question."""

from __future__ import annotations

import csv
import json
import os
import shutil

import pandas as pd
import pytest

import kvexplore
from kvexplore.capacity_planning import capacity_sweep
from kvexplore.offloading.sweep import KEY_COLUMN, sweep
from kvexplore.planning.stored import PLAN_KIND, plan_answer, plan_facts, question
from kvexplore.store import TEMPORARY_SECONDS, AnswerStore, Question, answer

QWEN = "Qwen/Qwen3.5-0.8B"
GRANITE = "ibm-granite/granite-4.0-h-350m"
PLAN = dict(gpu="A100", num_blocks=64)
SWEEP = dict(gpu="A100", num_blocks=64)
GiB = 1 << 30


def _path(store: AnswerStore, q: Question):
    """Where the store keeps ``q``'s entry: ``<kind>/<2 hex>/<key>.json``."""
    key = q.key()
    return store.root / q.kind / key[:2] / f"{key}.json"


@pytest.fixture(scope="module")
def fresh_facts():
    return json.loads(json.dumps(kvexplore.plan(QWEN, **PLAN).to_dict(), default=str))


# -- every field of a question is part of its key -------------------------------------


def _changed_questions(base: Question) -> dict[str, Question]:
    """``base`` with one field changed, for every field, through the builder
    where a deployment changes (so the change is one a user can make)."""
    config = kvexplore.load_model_config(QWEN).config
    edited = {
        **config,
        "text_config": {**config["text_config"], "max_position_embeddings": 4096},
    }
    return {
        "kind": question("offload", QWEN, {"o": 1}, **PLAN),
        "model": question(PLAN_KIND, GRANITE, {"o": 1}, **PLAN),
        "model content": question(PLAN_KIND, edited, {"o": 1}, **PLAN),
        "gpu": question(PLAN_KIND, QWEN, {"o": 1}, **{**PLAN, "gpu": "H100"}),
        "request": question(PLAN_KIND, QWEN, {"o": 1}, **{**PLAN, "num_blocks": 65}),
        "options": question(PLAN_KIND, QWEN, {"o": 2}, **PLAN),
        "vllm release": base.replace(releases={**base.releases, "vllm": "0.32.0"}),
        "kvexplore code": base.replace(
            releases={**base.releases, "kvexplore": "0.0.0+x"}
        ),
    }


def test_each_field_of_a_question_is_another_answer(tmp_path):
    store = AnswerStore.open(tmp_path)
    base = question(PLAN_KIND, QWEN, {"o": 1}, **PLAN)
    assert base == question(
        PLAN_KIND, QWEN, {"o": 1}, **PLAN, tensor_parallel_size=1
    )  # a default
    store.put(base, {"answer": 1})
    changed = _changed_questions(base)
    assert {name for name, q in changed.items() if q == base} == set()
    assert len({q.key() for q in changed.values()}) == len(changed)
    for name, q in changed.items():
        assert store.get(q) is None, name
    assert store.get(base) == {"answer": 1}  # the misses removed nothing


def test_an_entry_answering_another_question_under_the_key_is_a_miss(
    tmp_path, fresh_facts
):
    """A store file copied under another question's key (the offload command's
    payload where the plan's belongs) is never served: one warning, removed,
    the plan's facts computed and stored."""
    store = AnswerStore.open(tmp_path)
    plan_q = question(PLAN_KIND, QWEN, **PLAN)
    offload_q = question(
        "offload", QWEN, {"offload": {"cpu_bytes_to_use": GiB}}, **PLAN
    )
    store.put(offload_q, {"facts": {"reasons": ["offloaded"]}, "text": "offload facts"})
    _path(store, plan_q).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(_path(store, offload_q), _path(store, plan_q))
    with pytest.warns(UserWarning, match="answers another question") as seen:
        assert plan_facts(QWEN, store=tmp_path, **PLAN) == fresh_facts
    assert len(seen) == 1
    assert json.loads(_path(store, plan_q).read_text())["question"] == plan_q.to_json()
    # an entry from before entries named their question is a miss too
    _path(store, plan_q).write_text(
        json.dumps({"key": {}, "value": {"facts": {}, "text": "x"}})
    )
    with pytest.warns(UserWarning, match="corrupt"):
        assert plan_facts(QWEN, store=tmp_path, **PLAN) == fresh_facts


def test_a_plan_question_holding_another_commands_payload_is_planned_again(
    tmp_path, fresh_facts
):
    """An entry that records the plan's question but holds the offload
    command's payload (same shape: kind, facts, text) is not the plan's: the
    plan's facts are computed and stored over it."""
    from kvexplore.planning.stored import payload

    store = AnswerStore.open(tmp_path)
    plan_q = question(PLAN_KIND, QWEN, **PLAN)
    store.put(plan_q, payload("offload", {"reasons": ["offloaded"]}, "offload facts"))
    assert plan_facts(QWEN, store=tmp_path, **PLAN) == fresh_facts
    assert store.get(plan_q)["kind"] == PLAN_KIND


@pytest.mark.parametrize(
    "hostile",
    [
        "deep nesting",
        "directory",
        "not json",
        "truncated",
        "another payload",
        "not utf-8",
    ],
)
def test_a_hostile_entry_is_a_miss_removed_with_one_warning(tmp_path, hostile):
    store = AnswerStore.open(tmp_path)
    q = Question("plan", model={"name": "m", "digest": "0"}, options={"o": 1})
    path = _path(store, q)
    path.parent.mkdir(parents=True)
    if hostile == "deep nesting":
        path.write_text("[" * 200_000)  # json's RecursionError
    elif hostile == "directory":
        (path / "inside").mkdir(parents=True)
    elif hostile == "not json":
        path.write_text("no answer")
    elif hostile == "truncated":
        path.write_text('{"question": ')
    elif hostile == "another payload":  # the right question, a value of another kind
        path.write_text(json.dumps({"question": q.to_json(), "value": [1, 2]}))
    else:
        path.write_bytes(b"\xff\xfe\x00")
    calls = []

    def compute():
        calls.append(1)
        return {"facts": {"a": 1}, "text": "t"}

    with pytest.warns(UserWarning, match="removed, building the answer again") as seen:
        got = answer(
            q, compute, tmp_path, valid=lambda v: isinstance(v, dict) and "facts" in v
        )
    assert len(seen) == 1
    assert got == {"facts": {"a": 1}, "text": "t"} and calls == [1]
    assert path.is_file()  # the computed answer replaced it
    assert answer(q, compute, tmp_path) == got and calls == [
        1
    ]  # and is served next time


def test_no_cache_reads_and_writes_nothing(tmp_path, fresh_facts):
    q = question(PLAN_KIND, QWEN, **PLAN)
    store = AnswerStore.open(tmp_path)
    store.put(q, {"facts": {"stale": True}, "text": None})
    assert plan_answer(QWEN, store=False, **PLAN)["facts"] == fresh_facts  # not read
    assert store.get(q) == {"facts": {"stale": True}, "text": None}  # not written
    assert (
        answer(None, lambda: 3, tmp_path) == 3
    )  # an input without a question: computed
    assert len(store.entries()) == 1


def test_prune_removes_the_temporary_files_a_killed_writer_left(tmp_path):
    store = AnswerStore.open(tmp_path, max_bytes=10**9)
    q = Question("demo", options={"i": 1})
    store.put(q, {"a": 1})
    folder = _path(store, q).parent
    left = [folder / ".0123456789abcdef.x1.tmp", tmp_path / ".probe.x2"]
    running = folder / ".0123456789abcdef.x3.tmp"
    old = os.stat(_path(store, q)).st_mtime - TEMPORARY_SECONDS - 10
    for path in [*left, running]:
        path.write_text('{"question": ')
    for path in left:
        os.utime(path, (old, old))
    assert store.prune() == 2
    assert not any(p.exists() for p in left)
    assert running.exists()  # a writer still at work keeps its file
    assert store.get(q) == {"a": 1}


# -- resumed sweep files check each row against its key ------------------------------


def _edit_cells(path, column: str, old, new) -> None:
    """Change ``column`` from ``old`` to ``new`` in the file's rows, by hand
    (its other cells, the key cell included, as they were)."""
    if path.suffix == ".csv":
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        i = rows[0].index(column)
        for r in rows[1:]:
            r[i] = r[i].replace(old, new)
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(rows)
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    i = table.column_names.index(column)
    values = [v.replace(old, new) for v in table.column(i).to_pylist()]
    table = table.set_column(i, column, pa.array(values)).replace_schema_metadata(
        table.schema.metadata
    )
    pq.write_table(table, path)


def _counting(monkeypatch) -> list:
    import importlib

    module = importlib.import_module("kvexplore.offloading.sweep")
    calls, real = [], module.make_plan

    def counting(model, **kwargs):
        calls.append(kwargs)
        return real(model, **kwargs)

    monkeypatch.setattr(module, "make_plan", counting)
    return calls


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_row_whose_key_cells_were_edited_is_computed_again(
    monkeypatch, tmp_path, suffix
):
    out = tmp_path / f"rows{suffix}"
    small, large = {"block_size": 1088}, {"block_size": 1632}
    fresh = sweep(QWEN, store=False, **SWEEP, extra_config=[small, large])
    assert fresh.blocks_per_chunk.tolist() == [
        2,
        3,
    ]  # 1088 and 1632 tokens of 544-token blocks
    sweep(QWEN, output=out, store=False, **SWEEP, extra_config=small)
    _edit_cells(out, "extra_config", "1088", "1632")  # the row of 1088 now says 1632
    calls = _counting(monkeypatch)
    asked_large = sweep(QWEN, output=out, store=False, **SWEEP, extra_config=large)
    assert len(calls) == 1  # not served from the edited row
    pd.testing.assert_frame_equal(asked_large, fresh.iloc[[1]].reset_index(drop=True))
    calls.clear()
    asked_small = sweep(QWEN, output=out, store=False, **SWEEP, extra_config=small)
    assert len(calls) == 1  # its key is 1088 but its cells say 1632: not served either
    pd.testing.assert_frame_equal(asked_small, fresh.iloc[[0]].reset_index(drop=True))
    calls.clear()
    sweep(QWEN, output=out, store=False, **SWEEP, extra_config=small)
    assert calls == []  # the row computed again is resumed


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_capacity_row_whose_cells_were_edited_is_computed_again(
    monkeypatch, tmp_path, suffix
):
    import kvexplore.capacity_planning as cp

    out = tmp_path / f"capacity{suffix}"
    kwargs = dict(gpu="A100", max_model_len=8192, kv_cache_memory_bytes=GiB)
    fresh = capacity_sweep([QWEN], output=out, store=False, **kwargs)
    _edit_cells(out, "gpu", "A100", "H100")
    calls = []
    real = cp.capacity_row
    monkeypatch.setattr(cp, "capacity_row", lambda *a: calls.append(a) or real(*a))
    again = capacity_sweep([QWEN], output=out, store=False, **kwargs)
    assert len(calls) == 1
    pd.testing.assert_frame_equal(again, fresh)
    calls.clear()
    capacity_sweep([QWEN], output=out, store=False, **kwargs)
    assert calls == []
    rows = pd.read_csv(out) if suffix == ".csv" else pd.read_parquet(out)
    assert rows.gpu.tolist() == ["A100"]  # the edited row was replaced


def test_a_stored_row_of_another_question_is_not_served(monkeypatch, tmp_path):
    """Each sweep row is stored for its own question; a row entry copied
    under another row's key is a miss."""
    small, large = {"block_size": 1088}, {"block_size": 1632}
    first = sweep(QWEN, store=tmp_path, **SWEEP, extra_config=[small, large])
    store = AnswerStore.open(tmp_path)
    paths = sorted(p for _, _, p in store.entries())
    assert len(paths) == 2
    by_block = {
        json.loads(p.read_text())["question"]["options"]["extra_config"][
            "block_size"
        ]: p
        for p in paths
    }
    shutil.copy(by_block[1088], by_block[1632])
    with pytest.warns(UserWarning, match="answers another question"):
        again = sweep(QWEN, store=tmp_path, **SWEEP, extra_config=[small, large])
    pd.testing.assert_frame_equal(again, first)
    assert KEY_COLUMN not in again.columns
