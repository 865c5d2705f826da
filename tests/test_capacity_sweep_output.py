"""capacity_sweep(output=...): rows written as they come, resumed by their key,
and the output refused before any work when it cannot be written."""

from __future__ import annotations

import pandas as pd
import pytest

import kvexplore.capacity_planning as cp
from kvexplore import KVExploreError
from kvexplore.capacity_planning import (
    CAPACITY_COLUMNS,
    FILE_KEY_COLUMN,
    capacity_file_key,
    capacity_question,
    capacity_sweep,
)
from kvexplore.fleet import RELEASE_COLUMN, RowFile
from kvexplore.planning.release import Release, installed_release

QWEN = "Qwen/Qwen3.5-0.8B"
GRANITE = "ibm-granite/granite-4.0-h-350m"
UNKNOWN = "no-such-org/no-such-model-here"
GiB = 1 << 30

#: Three rows: two small deployments and a model no catalog or hub holds (its
#: row is a refusal whose key cannot be computed).
MODELS = [QWEN, UNKNOWN, GRANITE]
KWARGS = dict(gpu="A100", max_model_len=8192, kv_cache_memory_bytes=GiB)
FILE_COLUMNS = [*CAPACITY_COLUMNS, FILE_KEY_COLUMN]


@pytest.fixture(scope="module")
def uninterrupted():
    return capacity_sweep(MODELS, store=False, **KWARGS)


def _counting(monkeypatch, stop_after: int | None = None) -> list:
    """Patch ``capacity_row`` to record the models it is asked for; after
    ``stop_after`` rows it raises ``KeyboardInterrupt`` (the user stops the sweep)."""
    calls = []
    real = cp.capacity_row

    def counting(model, kwargs):
        if stop_after is not None and len(calls) >= stop_after:
            raise KeyboardInterrupt
        calls.append(model)
        return real(model, kwargs)

    monkeypatch.setattr(cp, "capacity_row", counting)
    return calls


def _file_rows(path) -> list[dict]:
    return RowFile(path, FILE_COLUMNS, [FILE_KEY_COLUMN]).rows


def test_the_file_key_names_model_plan_and_capacity_keywords():
    key = capacity_file_key(capacity_question(QWEN, KWARGS))
    assert key == capacity_file_key(capacity_question(QWEN, dict(KWARGS)))
    assert key == capacity_file_key(capacity_question(QWEN, {**KWARGS, "tensor_parallel_size": 1}))  # a default
    for other in (capacity_question(GRANITE, KWARGS),
                  capacity_question(QWEN, {**KWARGS, "gpu": "H100"}),
                  capacity_question(QWEN, {**KWARGS, "kv_cache_memory_bytes": 2 * GiB}),
                  capacity_question(QWEN, {**KWARGS, "cpu_bytes_to_use": GiB})):
        assert capacity_file_key(other) not in (None, key)
    # a key that cannot be computed is None: the row is computed again
    assert capacity_question(UNKNOWN, KWARGS) is None and capacity_file_key(None) is None
    assert capacity_question(QWEN, {**KWARGS, "tensor_parallel_size": "two"}) is None


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_an_interrupted_capacity_sweep_resumes_from_its_file(monkeypatch, tmp_path, suffix,
                                                             uninterrupted):
    out = tmp_path / f"capacity{suffix}"
    _counting(monkeypatch, stop_after=1)
    with pytest.raises(KeyboardInterrupt):
        capacity_sweep(MODELS, output=out, store=False, **KWARGS)
    monkeypatch.undo()
    [first] = _file_rows(out)  # the row computed before the stop
    assert first["model"] == QWEN and first[FILE_KEY_COLUMN] == capacity_file_key(capacity_question(QWEN, KWARGS))
    assert first[RELEASE_COLUMN] == installed_release().version
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left

    calls = _counting(monkeypatch)
    resumed = capacity_sweep(MODELS, output=out, store=False, **KWARGS)
    assert calls == [UNKNOWN, GRANITE]  # Qwen's row came from the file
    pd.testing.assert_frame_equal(resumed, uninterrupted)
    assert pd.isna(resumed.error[0]) and UNKNOWN in resumed.error[1]

    # the file holds each row once, in order, with its key (None: no key)
    rows = _file_rows(out)
    pd.testing.assert_frame_equal(pd.DataFrame(rows, columns=FILE_COLUMNS)[list(CAPACITY_COLUMNS)],
                                  uninterrupted)
    assert [r[FILE_KEY_COLUMN] for r in rows] == [capacity_file_key(capacity_question(m, KWARGS)) for m in MODELS]

    # a third run computes only the row with no key, and writes it once
    calls.clear()
    again = capacity_sweep(MODELS, output=out, store=False, **KWARGS)
    assert calls == [UNKNOWN]
    pd.testing.assert_frame_equal(again, uninterrupted)
    assert len(_file_rows(out)) == 3


def test_other_keywords_are_other_rows_of_the_same_file(monkeypatch, tmp_path, uninterrupted):
    out = tmp_path / "capacity.parquet"
    capacity_sweep([QWEN], output=out, store=False, **KWARGS)
    calls = _counting(monkeypatch)
    bigger = capacity_sweep([QWEN], output=out, store=False, **{**KWARGS, "kv_cache_memory_bytes": 2 * GiB})
    assert calls == [QWEN]  # another deployment: not the row in the file
    assert bigger.num_blocks[0] > uninterrupted.num_blocks[0]
    assert [r["num_blocks"] for r in _file_rows(out)] == [bigger.num_blocks[0], uninterrupted.num_blocks[0]]


def test_rows_of_another_vllm_release_are_computed_again_and_kept(monkeypatch, tmp_path):
    import kvexplore.fleet as fleet

    out = tmp_path / "capacity.csv"
    here = installed_release().version
    monkeypatch.setattr(fleet, "installed_release", lambda: Release("0.32.0"))
    capacity_sweep([QWEN], output=out, store=False, **KWARGS)  # a file another release wrote
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    df = capacity_sweep([QWEN], output=out, store=False, **KWARGS)
    assert calls == [QWEN]  # not resumed from the other release's row
    assert len(df) == 1
    rows = _file_rows(out)
    assert [r[RELEASE_COLUMN] for r in rows] == [here, "0.32.0"]  # both kept, this release first
    assert rows[0][FILE_KEY_COLUMN] == rows[1][FILE_KEY_COLUMN]
    calls.clear()
    capacity_sweep([QWEN], output=out, store=False, **KWARGS)
    assert calls == []  # this release's row is resumed
    assert len(_file_rows(out)) == 2


def test_rows_from_the_store_are_written_to_the_file(monkeypatch, tmp_path, uninterrupted):
    answers = tmp_path / "answers"
    capacity_sweep(MODELS, store=answers, **KWARGS)
    calls = _counting(monkeypatch)
    out = tmp_path / "capacity.csv"
    df = capacity_sweep(MODELS, output=out, store=answers, **KWARGS)
    assert calls == [UNKNOWN]  # the stored rows need no build
    pd.testing.assert_frame_equal(df, uninterrupted)
    assert [r["model"] for r in _file_rows(out)] == [QWEN, UNKNOWN, GRANITE]


def test_an_unwritable_output_is_refused_before_any_work(monkeypatch, tmp_path):
    monkeypatch.setattr(cp, "capacity_row", lambda *a: pytest.fail("a row was computed"))
    monkeypatch.setattr(cp, "capacity", lambda *a, **k: pytest.fail("a deployment was built"))
    monkeypatch.setattr(cp, "capacity_question", lambda *a: pytest.fail("a key was computed"))
    sweep_file = tmp_path / "sweep.csv"
    sweep_file.write_text("model,gpu\nx,A100\n")
    for bad, why in ((tmp_path / "missing" / "x.parquet", "does not exist"),
                     (tmp_path / "x.txt", "expected one of"),
                     (tmp_path, "it is a folder"),
                     ("/sys/kvexplore-capacity.csv", "folder is not writable"),
                     (sweep_file, "holds columns \\['model', 'gpu'\\]")):
        with pytest.raises(KVExploreError, match=why) as info:
            capacity_sweep(MODELS, output=bad, store=tmp_path / "answers", **KWARGS)
        assert str(bad) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv"]  # no store, no file
    assert sweep_file.read_text() == "model,gpu\nx,A100\n"
