"""The CLI mirrors the Python API and fails with one clear line."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kvexplore.cli import build_parser, main
from kvexplore.planning.release import WINDOW_RELEASES


def test_plan_table(capsys):
    assert main(["plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--tp", "4"]) == 0
    out = capsys.readouterr().out
    assert "272 = 16 x cdiv(271360, 16 x 1024)" in out
    assert "mamba_page_size_padded" in out


def test_plan_json(capsys):
    assert main(["plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--backend", "FLASHINFER", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["block_size"] == 544
    assert data["kernel_block_sizes"] == [544, 544, 544, 32]
    assert len(data["groups"]) == 4


def test_bad_tp_is_one_line(capsys):
    assert main(["plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--tp", "3"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvexplore: error:") and "(3)" in err
    assert "Traceback" not in err


def test_catalog(capsys):
    assert main(["catalog", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert any(r["model"] == "Qwen/Qwen3.5-0.8B" for r in rows)


# -- failures and vLLM's logs, through the real command ----------------------------

REPO = pathlib.Path(__file__).resolve().parents[1]


def run_cli(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kvexplore", *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("kvexplore: error:")]


def test_json_parses_and_vllm_logs_stay_off_stdout():
    quiet = run_cli("plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--json")
    # --no-cache: the quiet run stored the answer, and an answer from the store runs no vLLM
    loud = run_cli("plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--json", "--verbose", "--no-cache")
    assert quiet.returncode == loud.returncode == 0, (quiet.stderr, loud.stderr)
    assert json.loads(quiet.stdout) == json.loads(loud.stdout)
    assert json.loads(loud.stdout)["block_size"] == 544
    assert " INFO " not in quiet.stderr
    assert " INFO " in loud.stderr  # --verbose lets vLLM's INFO records through, on stderr
    assert "Traceback" not in quiet.stderr + loud.stderr


def test_unwritable_csv_is_one_line_naming_the_path():
    r = run_cli("sweep", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--csv", "/no/such/dir/out.csv")
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    [line] = error_lines(r.stderr)
    assert "/no/such/dir/out.csv" in line
    assert r.stdout == ""


def test_unwritable_csv_is_refused_before_the_sweep_runs(monkeypatch, capsys, tmp_path):
    import kvexplore.cli as cli

    def no_sweep(*a, **k):
        raise AssertionError("the sweep ran before the output file was checked")

    monkeypatch.setattr(cli, "sweep", no_sweep)
    for bad, why in ((tmp_path / "missing" / "x.csv", "does not exist"), (tmp_path, "it is a folder")):
        assert main(["sweep", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--csv", str(bad)]) == 2
        [line] = error_lines(capsys.readouterr().err)
        assert str(bad) in line and why in line
    assert list(tmp_path.iterdir()) == []  # nothing half-written


def test_usage_error_is_one_line(capsys):
    with pytest.raises(SystemExit) as info:
        main(["plan", "Qwen/Qwen3.5-0.8B", "--tp", "two"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert error_lines(err) == err.splitlines()
    assert "--tp" in err and "'two'" in err


def test_every_subcommand_takes_verbose():
    parser = build_parser()
    for command in ("catalog", "gpus", "plan", "offload", "sweep", "capacity"):
        argv = [command] if command in ("catalog", "gpus") else [command, "m"]
        assert parser.parse_args([*argv, "--verbose"]).verbose is True
        assert parser.parse_args(argv).verbose is False


def _dests(command: str) -> set[str]:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    return {a.dest for a in sub.choices[command]._actions}


@pytest.mark.parametrize("command", ["plan", "offload", "sweep", "capacity"])
def test_every_plan_keyword_has_a_flag(command):
    import inspect

    import kvexplore

    wanted = set(inspect.signature(kvexplore.plan).parameters)
    if command == "sweep":
        wanted.discard("speculative_config")  # a JSON object per run, not an axis
    if command == "capacity":
        wanted |= set(inspect.signature(kvexplore.capacity).parameters) - {"plan_kwargs"}
    if command in ("offload", "sweep"):
        wanted |= set(kvexplore.OffloadOptions.names())
    assert wanted - _dests(command) == set()


def test_memory_profile_flags_reach_the_plan(capsys):
    import kvexplore

    args = ["plan", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--max-num-batched-tokens", "2048",
            "--max-num-seqs", "64", "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    small = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", max_num_batched_tokens=2048, max_num_seqs=64)
    default = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    assert data["kv_cache_memory_bytes"] == small.kv_cache_memory_bytes
    assert small.kv_cache_memory_bytes != default.kv_cache_memory_bytes


def test_capacity_weight_bytes_and_extra(capsys):
    args = ["capacity", "Qwen/Qwen3.5-0.8B", "--gpu", "A100", "--weight-bytes", str(4 << 30),
            "--cpu-bytes-to-use", str(8 << 30), "--extra", '{"block_size": 1088}', "--json"]
    assert main(args) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["weight_bytes"] == 4 << 30
    # the offloaded block of 1,088 tokens is two 544-token GPU blocks
    assert (data["host"]["blocks_per_chunk"], data["host"]["span_tokens"]) == (2, 1088)


# -- a text plan from the answer store ---------------------------------------------

PLAN_TEXT_ARGS = ("plan", "Qwen/Qwen3.5-0.8B", "--gpu", "H100", "--num-blocks", "16")

#: ``python -m kvexplore ARGS`` that reports, at exit, whether vLLM or torch was imported.
_MAIN_REPORTING_IMPORTS = (
    "import atexit, runpy, sys; "
    "atexit.register(lambda: print('imported', 'vllm' in sys.modules, 'torch' in sys.modules, "
    "file=sys.stderr)); sys.argv[0] = 'kvexplore'; runpy.run_module('kvexplore', run_name='__main__')"
)


def _answered_here(capsys, args) -> str:
    """What ``kvexplore ARGS`` prints when this process answers it (with vLLM,
    imported here); the answer goes to the test's empty answer store, one
    entry more."""
    from kvexplore.store import AnswerStore

    before = len(AnswerStore.open().entries())
    assert main(list(args)) == 0
    assert len(AnswerStore.open().entries()) == before + 1  # computed, then stored
    return capsys.readouterr().out


def test_a_repeated_text_plan_prints_the_same_text_without_vllm(capsys):
    first = _answered_here(capsys, PLAN_TEXT_ARGS)
    assert "KV cache groups:" in first and "derivation:" in first
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the test's answer store
    second = subprocess.run([sys.executable, "-c", _MAIN_REPORTING_IMPORTS, *PLAN_TEXT_ARGS],
                            cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stderr
    assert second.stdout == first  # character for character
    assert second.stderr.splitlines()[-1] == "imported False False", second.stderr


def test_envs_imports_neither_vllm_nor_torch(tmp_path):
    """``kvexplore envs`` checks and lists environments by running their own
    Pythons: the command itself imports neither vLLM nor torch (the release
    tests' first step runs it once per release)."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "KVEXPLORE_CACHE_DIR": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", _MAIN_REPORTING_IMPORTS, "envs", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert [r["release"] for r in rows] == list(WINDOW_RELEASES)
    assert not any(r["exists"] for r in rows)  # an empty cache folder: none made
    assert done.stderr.splitlines()[-1] == "imported False False", done.stderr


def test_text_plan_reads_the_store_and_no_cache_skips_it(capsys):
    import kvexplore
    from kvexplore.planning.stored import PLAN_KIND, question
    from kvexplore.store import AnswerStore

    assert main(list(PLAN_TEXT_ARGS)) == 0
    fresh = capsys.readouterr().out
    assert fresh == kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16).text() + "\n"
    store = AnswerStore.open()
    key = question(PLAN_KIND, "Qwen/Qwen3.5-0.8B", gpu="H100", num_blocks=16)
    answer = store.get(key)
    assert answer["text"] == fresh[:-1]
    store.put(key, {**answer, "text": "the stored text"})
    assert main(list(PLAN_TEXT_ARGS)) == 0
    assert capsys.readouterr().out == "the stored text\n"  # read back, not planned
    assert main([*PLAN_TEXT_ARGS, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == answer["facts"]  # one payload, both forms
    assert main([*PLAN_TEXT_ARGS, "--no-cache"]) == 0
    assert capsys.readouterr().out == fresh  # the store is neither read ...
    assert store.get(key)["text"] == "the stored text"  # ... nor written


# -- offload and capacity from the answer store ------------------------------------

#: A small deployment per command, and the same with one of its own options changed.
STORED_COMMANDS = {
    "offload": (("offload", "Qwen/Qwen3.5-0.8B", "--gpu", "H100", "--num-blocks", "16",
                 "--extra", '{"block_size": 1152}'),
                ("--extra", '{"block_size": 2304}')),
    "capacity": (("capacity", "Qwen/Qwen3.5-0.8B", "--gpu", "H100", "--max-model-len", "8192",
                  "--kv-cache-memory-bytes", str(1 << 30), "--prompt-tokens", "100,1000"),
                 ("--gpu-memory-utilization", "0.8")),
}


def _run_reporting_imports(args, env) -> tuple[str, str]:
    """stdout, and whether vLLM and torch were imported (``"imported BOOL BOOL"``)."""
    r = subprocess.run([sys.executable, "-c", _MAIN_REPORTING_IMPORTS, *args],
                       cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr.splitlines()[-1]


@pytest.mark.parametrize("command", sorted(STORED_COMMANDS))
def test_a_repeated_command_prints_the_same_answer_without_vllm(capsys, command):
    args, changed = STORED_COMMANDS[command]
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # the test's answer store
    first = _answered_here(capsys, args)
    second, imported = _run_reporting_imports(args, env)
    assert second == first  # character for character
    assert imported == "imported False False"
    # one payload holds both forms: --json is answered from the same entry
    facts, imported = _run_reporting_imports((*args, "--json"), env)
    assert imported == "imported False False"
    assert json.loads(facts)["prefix_hits" if command == "capacity" else "reasons"]
    # another value of the command's own option is another answer (computed and stored)
    other = _answered_here(capsys, (*args, *changed))
    if command == "offload":
        assert other != first


@pytest.mark.parametrize("command", sorted(STORED_COMMANDS))
def test_a_command_reads_the_store_and_no_cache_skips_it(capsys, command):
    from kvexplore.cli import CAPACITY_KIND, OFFLOAD_KIND, command_question
    from kvexplore.store import AnswerStore

    args, changed = STORED_COMMANDS[command]
    key = command_question(build_parser().parse_args(list(args)))
    assert key.kind == {"offload": OFFLOAD_KIND, "capacity": CAPACITY_KIND}[command]
    assert main(list(args)) == 0
    fresh = capsys.readouterr().out
    store = AnswerStore.open()
    answer = store.get(key)
    assert answer["text"] + "\n" == fresh
    assert key != command_question(build_parser().parse_args([*args, *changed]))
    store.put(key, {**answer, "text": "the stored text"})
    assert main(list(args)) == 0
    assert capsys.readouterr().out == "the stored text\n"  # read back, not computed
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == answer["facts"]
    assert main([*args, "--no-cache"]) == 0
    assert capsys.readouterr().out == fresh  # the store is neither read ...
    assert store.get(key)["text"] == "the stored text"  # ... nor written
    assert main([*args, "--json", "--no-cache"]) == 0
    assert json.loads(capsys.readouterr().out) == answer["facts"]
    assert len(store.entries()) == 1
