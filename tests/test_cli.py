"""The CLI mirrors the Python API and fails with one clear line."""

import json

from kvexplore.cli import main


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
