"""Fleet sweeps: a real Dask cluster, rows written as they come and resumed,
the answer store, and the refusals of bad executors, files and stores."""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import subprocess
import sys
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pandas as pd
import pytest
from distributed import Client, LocalCluster

import kvexplore
from kvexplore import KVExploreError
from kvexplore.capacity_planning import capacity_sweep
from kvexplore.fleet import RowFile, batches, run_tasks
from kvexplore.offloading.sweep import KEY_COLUMN, sweep
from kvexplore.planning.stored import PLAN_KIND, plan_facts, question
from kvexplore.store import AnswerStore, Question

sweep_module = importlib.import_module("kvexplore.offloading.sweep")

QWEN = "Qwen/Qwen3.5-0.8B"
REPO = Path(__file__).resolve().parents[1]

#: Two GPUs x two block sizes x two DCPs: eight rows, one plan each, four of
#: them refused by vLLM (TP 1 is not divisible by DCP 2).
AXES = dict(gpu=["A100", "H100"], num_blocks=64, block_size=[None, 1024],
            decode_context_parallel_size=[1, 2])


@pytest.fixture(scope="module")
def cluster():
    """A LocalCluster of two worker processes, one thread each, closed after the module."""
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as c:
        yield c


@pytest.fixture(scope="module")
def client(cluster):
    with Client(cluster) as c:
        yield c


@pytest.fixture(scope="module")
def sequential():
    return sweep(QWEN, store=False, **AXES)


def _counting(monkeypatch, stop_after: int | None = None) -> list:
    calls = []
    real = sweep_module.make_plan

    def counting(model, **kw):
        if stop_after is not None and len(calls) >= stop_after:
            raise KeyboardInterrupt  # the user stops the sweep
        calls.append(kw)
        return real(model, **kw)

    monkeypatch.setattr(sweep_module, "make_plan", counting)
    return calls


# ---------------------------------------------------------------------------
# Dask
# ---------------------------------------------------------------------------


def test_dask_sweep_gives_the_sequential_rows(client, sequential):
    """On a two-process LocalCluster, through the Client and through its
    executor, the rows equal the sequential sweep's, refused rows and their
    reasons included."""
    assert sequential.error.notna().sum() == 4 and sequential.error.isna().sum() == 4
    on_client = sweep(QWEN, executor=client, store=False, **AXES)
    on_executor = sweep(QWEN, executor=client.get_executor(), store=False, **AXES)
    pd.testing.assert_frame_equal(on_client, sequential)
    pd.testing.assert_frame_equal(on_executor, sequential)
    assert len(client.scheduler_info()["workers"]) == 2


def test_dask_capacity_sweep_gives_the_sequential_rows(client):
    models = [QWEN, "no-such-org/no-such-model-here"]
    kwargs = dict(gpu="A100", max_model_len=8192, gpu_memory_utilization=0.85)
    seq = capacity_sweep(models, store=False, **kwargs)
    par = capacity_sweep(models, executor=client, store=False, **kwargs)
    pd.testing.assert_frame_equal(par, seq)
    assert pd.isna(seq.error[0]) and "no-such-org/no-such-model-here" in seq.error[1]
    assert seq.num_blocks[0] == kvexplore.capacity(QWEN, **kwargs).num_blocks


def _die_once(marker: str, x: int) -> int:
    """Kills its worker process the first time any task runs, then doubles."""
    if not os.path.exists(marker):
        Path(marker).touch()
        os._exit(1)
    return 2 * x


def test_a_dask_worker_that_dies_loses_no_row(client, tmp_path):
    """The worker that runs the first batch dies; the scheduler runs that batch
    again on a worker that lives, and every result comes back once, in order."""
    marker = str(tmp_path / "died")
    got = {}
    out = run_tasks(_die_once, [(marker, i) for i in range(8)], client,
                     on_result=lambda i, v: got.setdefault(i, v))
    assert Path(marker).exists()
    assert out == [2 * i for i in range(8)]
    assert got == dict(enumerate(out))


def test_a_closed_client_or_executor_is_refused(cluster, tmp_path):
    c = Client(cluster)
    c.close()
    out = tmp_path / "rows.csv"
    with pytest.raises(KVExploreError, match="closed.*expected a running dask.distributed.Client"):
        sweep(QWEN, executor=c, output=out, gpu="A100")
    with pytest.raises(KVExploreError, match="closed.*expected a running dask.distributed.Client"):
        capacity_sweep([QWEN], executor=c, gpu="A100")
    assert list(tmp_path.iterdir()) == []  # refused before any work
    pool = ProcessPoolExecutor(max_workers=1)
    pool.shutdown()
    with pytest.raises(KVExploreError, match="refuses tasks.*expected a running executor"):
        sweep(QWEN, executor=pool, store=False, gpu="A100")
    with pytest.raises(KVExploreError, match="executor=4 has no submit"):
        sweep(QWEN, executor=4, store=False, gpu="A100")


def _exit_on_odd(x: int) -> int:
    if x % 2:
        os._exit(1)
    return x


def test_a_broken_pool_is_one_error_after_the_rows_that_arrived():
    got = {}
    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(KVExploreError, match="BrokenProcessPool.*rows that arrived are kept"):
            run_tasks(_exit_on_odd, [(0,), (1,)], pool, on_result=got.__setitem__)
    assert got in ({}, {0: 0})  # the batch with task 0 may run before the pool breaks


def test_a_list_of_models_is_the_first_axis():
    granite = "ibm-granite/granite-4.0-h-350m"
    both = sweep([QWEN, granite], store=False, gpu="A100", num_blocks=64, block_size=[None, 1024])
    alone = [sweep(m, store=False, gpu="A100", num_blocks=64, block_size=[None, 1024])
             for m in (QWEN, granite)]
    pd.testing.assert_frame_equal(both, pd.concat(alone, ignore_index=True))
    assert both.model.tolist() == [QWEN, QWEN, granite, granite]


def test_batches_keep_a_models_tasks_together():
    tasks = [("b", 1), ("a", 1), ("b", 2), ("a", 2), ("a", 3), ("b", 3)]
    got = batches(tasks, 2, key=lambda t: t[0])
    assert [[tasks[i][0] for i in b] for b in got] == [["a", "a", "a"], ["b", "b", "b"]]
    assert sorted(i for b in got for i in b) == list(range(6))


# ---------------------------------------------------------------------------
# Rows as they come, and resuming
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_an_interrupted_sweep_resumes_from_its_file(monkeypatch, tmp_path, sequential, suffix):
    out = tmp_path / f"rows{suffix}"
    _counting(monkeypatch, stop_after=2)
    with pytest.raises(KeyboardInterrupt):
        sweep(QWEN, output=out, store=False, **AXES)
    monkeypatch.undo()
    part = RowFile(out, [*sequential.columns, KEY_COLUMN], [KEY_COLUMN]).existing
    assert len(part) == 2  # the rows of the two plans made before the stop
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temporary file left
    calls = _counting(monkeypatch)
    resumed = sweep(QWEN, output=out, store=False, **AXES)
    assert len(calls) == 6  # only the six plans whose rows are not in the file
    pd.testing.assert_frame_equal(resumed, sequential)
    again = RowFile(out, [*sequential.columns, KEY_COLUMN], [KEY_COLUMN]).existing
    pd.testing.assert_frame_equal(pd.DataFrame(list(again.values()), columns=sequential.columns),
                                  sequential)


def test_rows_of_another_vllm_release_are_planned_again_and_kept(monkeypatch, tmp_path):
    import kvexplore.fleet as fleet
    from kvexplore.fleet import RELEASE_COLUMN
    from kvexplore.planning.release import Release, installed_release

    out = tmp_path / "rows.parquet"
    axes = dict(gpu="A100", num_blocks=64, block_size=[None, 1024])
    here = installed_release().version
    monkeypatch.setattr(fleet, "installed_release", lambda: Release("0.32.0"))
    old = sweep(QWEN, output=out, store=False, **axes)  # a file another release wrote
    monkeypatch.undo()
    calls = _counting(monkeypatch)
    df = sweep(QWEN, output=out, store=False, **axes)
    assert len(calls) == 2  # both plans again: the other release's rows are not resumed
    pd.testing.assert_frame_equal(df, old)
    assert RELEASE_COLUMN not in df.columns
    rows = RowFile(out, [*df.columns, KEY_COLUMN], [KEY_COLUMN]).rows
    assert [r[RELEASE_COLUMN] for r in rows] == [here, here, "0.32.0", "0.32.0"]
    calls.clear()
    sweep(QWEN, output=out, store=False, **axes)
    assert calls == []  # this release's rows are resumed
    assert len(RowFile(out, [*df.columns, KEY_COLUMN], [KEY_COLUMN]).rows) == 4


def test_the_file_holds_the_rows_a_dask_sweep_returns(client, tmp_path, sequential):
    out = tmp_path / "rows.parquet"
    df = sweep(QWEN, executor=client, output=out, store=False, **AXES)
    pd.testing.assert_frame_equal(df, sequential)
    calls = []
    monkey = pytest.MonkeyPatch()
    try:
        calls = _counting(monkey)
        again = sweep(QWEN, output=out, store=False, **AXES)
    finally:
        monkey.undo()
    assert calls == []  # every row was in the file
    pd.testing.assert_frame_equal(again, sequential)
    assert pd.read_parquet(out).shape == (len(sequential), len(sequential.columns) + 2)  # + key, vllm


def test_an_unusable_output_is_refused_before_any_work(monkeypatch, tmp_path):
    calls = _counting(monkeypatch)
    garbage = tmp_path / "old.parquet"
    garbage.write_bytes(b"not parquet")
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    for bad, why in ((tmp_path / "missing" / "x.parquet", "does not exist"),
                     (tmp_path / "x.txt", "expected one of"),
                     (tmp_path, "it is a folder"),
                     (garbage, "cannot be read as parquet"),
                     (other, "holds columns \\['a', 'b'\\]")):
        with pytest.raises(KVExploreError, match=why) as info:
            sweep(QWEN, output=bad, store=False, gpu="A100")
        assert str(bad) in str(info.value)
    assert calls == []
    assert garbage.read_bytes() == b"not parquet" and other.read_text() == "a,b\n1,2\n"


# ---------------------------------------------------------------------------
# The answer store
# ---------------------------------------------------------------------------


def test_a_stored_sweep_needs_no_plan(monkeypatch, tmp_path, sequential):
    first = sweep(QWEN, store=tmp_path, **AXES)
    pd.testing.assert_frame_equal(first, sequential)
    calls = _counting(monkeypatch)
    again = sweep(QWEN, store=tmp_path, **AXES)
    assert calls == []
    pd.testing.assert_frame_equal(again, sequential)
    # a fresh process answers from the store without importing vLLM
    code = (f"import sys, kvexplore; df = kvexplore.sweep({QWEN!r}, store={str(tmp_path)!r}, **{AXES!r}); "
            "print(df.to_json(orient='split')); print('vllm' in sys.modules, 'torch' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    table, imported = r.stdout.splitlines()
    assert imported == "False False", r.stderr
    assert table == sequential.to_json(orient="split")


def test_a_stored_capacity_row_needs_no_build(monkeypatch, tmp_path):
    import kvexplore.capacity_planning as cp

    kwargs = dict(gpu="A100", max_model_len=8192, gpu_memory_utilization=0.85)
    fresh = capacity_sweep([QWEN], store=tmp_path, **kwargs)
    monkeypatch.setattr(cp, "capacity_row", lambda *a: pytest.fail("built again"))
    pd.testing.assert_frame_equal(capacity_sweep([QWEN], store=tmp_path, **kwargs), fresh)


def test_stored_plan_facts_equal_a_fresh_plan(tmp_path):
    fresh = json.loads(json.dumps(kvexplore.plan(QWEN, gpu="A100", num_blocks=64).to_dict(),
                                  default=str))
    assert plan_facts(QWEN, store=tmp_path, gpu="A100", num_blocks=64) == fresh
    entry, = AnswerStore.open(tmp_path).entries()
    assert plan_facts(QWEN, store=tmp_path, gpu="A100", num_blocks=64) == fresh
    # a corrupt entry warns, is rebuilt and stored again
    entry[2].write_text('{"key": ')
    with pytest.warns(UserWarning, match="corrupt"):
        assert plan_facts(QWEN, store=tmp_path, gpu="A100", num_blocks=64) == fresh
    assert json.loads(entry[2].read_text())["value"]["facts"] == fresh


def test_a_store_key_names_release_code_model_gpu_and_request():
    a = question(PLAN_KIND, QWEN, gpu="A100", num_blocks=64)
    assert a.releases["vllm"] == kvexplore.plan(QWEN, gpu="A100", num_blocks=64).vllm_version
    assert a.releases["kvexplore"].startswith(kvexplore.__version__ + "+")
    assert a.model["digest"] == kvexplore.load_model_config(QWEN).digest
    assert a != question(PLAN_KIND, QWEN, gpu="H100", num_blocks=64)
    assert a != question(PLAN_KIND, QWEN, gpu="A100", num_blocks=65)
    assert a == question(PLAN_KIND, QWEN, gpu="A100", num_blocks=64, tensor_parallel_size=1)


def test_an_unwritable_or_broken_store_is_refused(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad, why in ((a_file, "is not a folder"), ("/sys", "cannot be written"),
                     ("/sys/kvexplore-answers", "cannot be written")):
        with pytest.raises(KVExploreError, match=why) as info:
            sweep(QWEN, store=bad, gpu="A100")
        assert str(bad) in str(info.value)
    with pytest.raises(KVExploreError, match="store=3 is invalid"):
        plan_facts(QWEN, store=3)


def _demo(i: int) -> Question:
    return Question("demo", options={"i": i})


def test_the_store_drops_the_least_recently_used(tmp_path):
    s = AnswerStore.open(tmp_path, max_bytes=10**9)
    for i in range(4):
        s.put(_demo(i), {"answer": "x" * 1000})
    for i, (_, _, path) in enumerate(sorted(s.entries(), key=lambda e: json.loads(e[2].read_text())["question"]["options"]["i"])):
        os.utime(path, (1000 + i, 1000 + i))  # entry 0 is the oldest
    assert s.get(_demo(0)) is not None  # a hit makes it the newest
    small = AnswerStore(tmp_path, max_bytes=2 * s.entries()[0][1])
    assert small.prune() == 2
    assert [small.get(_demo(i)) is not None for i in range(4)] == [True, False, False, True]


# ---------------------------------------------------------------------------
# The command line
# ---------------------------------------------------------------------------


def test_cli_plan_json_from_the_store_is_the_fresh_json_without_vllm(tmp_path, monkeypatch,
                                                                     capsys):
    from kvexplore.cli import main

    args = ("plan", QWEN, "--gpu", "A100", "--num-blocks", "64", "--json")
    env = {"KVEXPLORE_STORE_DIR": str(tmp_path / "answers")}
    monkeypatch.setenv("KVEXPLORE_STORE_DIR", env["KVEXPLORE_STORE_DIR"])
    assert main([*args, "--no-cache"]) == 0  # answered here, with vLLM
    fresh = capsys.readouterr().out
    assert not (tmp_path / "answers").exists()  # --no-cache writes nothing
    assert main(list(args)) == 0
    assert capsys.readouterr().out == fresh
    assert (tmp_path / "answers").exists()  # ... and this one was stored
    probe = ("import sys; from kvexplore.cli import main; rc = main(sys.argv[1:]); "
             "print(rc, 'vllm' in sys.modules, 'torch' in sys.modules, file=sys.stderr)")
    hit = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert hit.stdout == fresh  # byte for byte, from a process without vLLM
    assert hit.stderr.split()[-3:] == ["0", "False", "False"]


def test_cli_sweep_out_writes_the_rows_of_the_python_sweep(tmp_path, capsys):
    from kvexplore.cli import main

    out = tmp_path / "rows.csv"
    args = ["sweep", QWEN, "--gpu", "A100,H100", "--num-blocks", "64",
            "--block-size", "none,1024", "--dcp", "1,2", "--out", str(out), "--no-cache"]
    assert main(args) == 0
    assert capsys.readouterr().out.strip() == f"wrote 8 rows to {out}"
    # the command line's axes, in its flags' order
    expected = sweep(QWEN, store=False, gpu=["A100", "H100"], decode_context_parallel_size=[1, 2],
                     block_size=[None, 1024], num_blocks=[64])
    rows = RowFile(out, [*expected.columns, KEY_COLUMN], [KEY_COLUMN]).existing.values()
    pd.testing.assert_frame_equal(pd.DataFrame(list(rows), columns=expected.columns), expected)
    assert main([*args[:-3], "--out", str(tmp_path / "no" / "x.parquet")]) == 2
    assert "does not exist" in capsys.readouterr().err and not (tmp_path / "no").exists()


def test_progress_bar_is_quiet_when_disabled(capsys):
    assert run_tasks(pow, [(2, 3), (3, 2)]) == [8, 9]
    assert capsys.readouterr().err == ""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert run_tasks(pow, []) == []
