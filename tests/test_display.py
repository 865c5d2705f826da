"""One display protocol: every result type's text, HTML and figure are the
``kvexplore.display`` singledispatch forms, found on first use whether or not
the rendering stage was imported.

The texts are compared with strings written out by hand from the inputs
(each result built from values chosen here), not with the functions under test.
"""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from kvexplore.display import Displayable, figure_form, html_form, text_form
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict
from kvexplore.planning.admission import Admission
from kvexplore.planning.drafter import Drafter
from kvexplore.versions.compare import VersionComparison
from kvexplore.versions.matrix import Compatibility

REPO = pathlib.Path(__file__).resolve().parents[1]
QWEN = "Qwen/Qwen3.5-0.8B"

#: A fresh process that imports one planning-stage module only, plans, and
#: reports whether the rendering stage was imported before and after the
#: display calls (``plan_answer`` first: the stored text needs no caller's import).
_FRESH = """
import json, sys
from kvexplore.planning.planner import plan
p = plan("Qwen/Qwen3.5-0.8B", gpu="H100")
before = "kvexplore.rendering" in sys.modules
from kvexplore.planning.stored import plan_answer
stored = plan_answer("Qwen/Qwen3.5-0.8B", store=False, gpu="H100")["text"]
print(json.dumps({"before": before, "stored": stored, "text": p.text(),
                  "html": p._repr_html_(), "admission": p.admission.text(), "repr": repr(p),
                  "after": "kvexplore.rendering" in sys.modules}))
"""


def test_a_plan_displays_in_a_process_that_imported_only_the_planning_stage():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run(
        [sys.executable, "-c", _FRESH],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["before"] is False and out["after"] is True
    assert out["text"].splitlines()[0] == out["repr"]
    # Qwen3.5-0.8B's Mamba page: 1,085,440 B of state in pages of 64 x 2,048 B
    # (FlashAttention's 16-token kernel alignment, 64 tokens per Mamba chunk)
    assert "576 = lcm(16, 64) x cdiv(1085440, 64 x 2048)" in out["text"]
    assert out["html"].count('class="kvx-bar"') == 4  # one page bar per KV cache group
    # the config's max_position_embeddings is 262,144
    assert out["admission"].startswith(
        "admitted: one request of max_model_len=262,144 needs "
    )
    assert out["stored"] == out["text"]


RESULT_TYPES = [Admission, Drafter, VersionComparison, Compatibility]


def _explorer_and_rendering_types():
    from kvexplore.explorer.state import Comparison
    from kvexplore.rendering.editing import EditGroup

    return [Comparison, EditGroup]


@pytest.mark.parametrize(
    "cls", RESULT_TYPES + _explorer_and_rendering_types(), ids=lambda c: c.__name__
)
def test_every_result_type_displays_through_the_registered_forms(cls):
    import kvexplore.rendering  # noqa: F401  the forms of the types before it

    assert issubclass(cls, Displayable)
    # no type keeps a method of its own beside the protocol's
    assert (cls.text, cls._repr_html_) == (Displayable.text, Displayable._repr_html_)
    assert cls.figure is Displayable.figure
    for form in (text_form, html_form):
        assert form.dispatch(cls) is not form.registry[object], (cls, form)


def test_admission_text_by_hand():
    a = Admission(ok=True, max_model_len=1000, needed_bytes=2000, available_bytes=5000)
    assert a.text() == (
        "admitted: one request of max_model_len=1,000 needs 2,000 B of the "
        "5,000 B the cache holds"
    )
    fit = Admission(
        ok=True,
        max_model_len=1000,
        needed_bytes=2000,
        available_bytes=5000,
        auto_fit_from=4096,
    )
    assert fit.text() == a.text() + " (auto-fit reduced max_model_len from 4,096)"
    assert 'class="kvx-message kvx-info"' in a._repr_html_()
    assert "5,000 B the cache holds" in a._repr_html_()
    labels = [t.get_text() for t in a.figure().axes[0].get_yticklabels()]
    assert labels == ["one request of 1,000 tokens", "the cache holds"]


def test_a_refused_admission_is_vllms_message():
    from kvexplore.planning.planner import plan

    a = plan(QWEN, gpu="A100", kv_cache_memory_bytes=10**8).admission
    assert not a.ok
    assert a.text().startswith("refused by vLLM ")
    # vLLM's own message, with the config's max_position_embeddings
    assert (
        " at start-up: To serve at least one request with the model's max seq len (262144)"
        in a.text()
    )
    assert 'class="kvx-message kvx-error"' in a._repr_html_()


def test_drafter_text_by_hand():
    mtp = Drafter(
        "mtp", 3, "MTPSpeculator", "Qwen3_5MTP", ("mtp.layers.0.self_attn.attn",), 0, 1
    )
    assert mtp.text() == (
        "mtp x 3 draft tokens: vLLM's MTPSpeculator builds Qwen3_5MTP, "
        "1 draft attention layer(s) (mtp.layers.0.self_attn.attn)"
    )
    four = Drafter(
        "eagle", 2, "EagleSpeculator", "EagleLlama", ("d.0", "d.1", "d.2", "d.3"), 0, 1
    )
    assert four.text() == (
        "eagle x 2 draft tokens: vLLM's EagleSpeculator builds EagleLlama, "
        "4 draft attention layer(s) (d.0, d.1, d.2 ...)"
    )
    ngram = Drafter("ngram", 3, None, None, (), 0, 1)
    assert (
        ngram.text()
        == "ngram x 3 draft tokens: no draft model, so no KV cache layers are added"
    )
    assert "<code>d.3</code>" in four._repr_html_()
    with pytest.raises(KVExploreError, match="Drafter has no figure form"):
        ngram.figure()


def _page(page_bytes: int, pad: int) -> dict:
    return {
        "group": "g0 mamba",
        "layer": "l0",
        "page_bytes": page_bytes,
        "real_bytes": 90,
        "kernel_pages": 1,
        "segments": [
            ["conv", 0, 40, "bfloat16"],
            ["ssm", 40, 50, "float32"],
            ["pad", 90, pad, ""],
        ],
    }


def test_version_comparison_text_by_hand():
    facts = {
        "0.33.0": {
            "vllm": "0.33.0",
            "plan": {"block_size": 544, "dtype": "bfloat16"},
            "pages": [_page(100, 10)],
        },
        "0.34.0": {
            "vllm": "0.34.0",
            "plan": {"block_size": 576, "dtype": "bfloat16"},
            "pages": [_page(120, 30)],
        },
    }
    c = VersionComparison(QWEN, FrozenDict({"gpu": "A100"}), FrozenDict(facts))
    assert c.text() == "\n".join(
        [
            "Qwen/Qwen3.5-0.8B (gpu=A100) across vLLM 0.33.0, 0.34.0: 3 facts differ",
            "               fact                          0.33.0                          0.34.0",
            "    plan.block_size                             544                             576",
            "pages[0].page_bytes                             100                             120",
            "  pages[0].segments conv 40 B | ssm 50 B | pad 10 B conv 40 B | ssm 50 B | pad 30 B",
        ]
    )
    html = c._repr_html_()
    assert html.startswith(
        '<div class="kvx-releases"><p>Qwen/Qwen3.5-0.8B (gpu=A100) across vLLM '
        "0.33.0, 0.34.0: 3 facts differ</p>"
    )
    assert "vLLM 0.34.0 \u00b7 g0 mamba (120 B)" in html and "<td>576</td>" in html
    same = VersionComparison(
        QWEN,
        FrozenDict(),
        FrozenDict({"0.33.0": facts["0.33.0"], "0.34.0": facts["0.33.0"]}),
    )
    assert (
        same.text() == "Qwen/Qwen3.5-0.8B across vLLM 0.33.0, 0.34.0: no fact differs"
    )


def test_compatibility_text_by_hand():
    def row(vllm, lmcache, outcome, rule, after):
        return dict(
            vllm=vllm,
            lmcache=lmcache,
            group=0,
            kind="mamba",
            layers=6,
            outcome=outcome,
            rule=rule,
            shape_before=[10, 2],
            shape_after=after,
            reason="no" if outcome == "refused" else None,
        )

    rows = (
        row("0.33.0", "0.5.2", "edited", "MambaPageViewEdit", [10, 1, 2]),
        row("0.33.0", "0.5.6", "refused", None, None),
        row("0.34.0", "0.5.2", "as registered", None, [10, 2]),
        row("0.34.0", "0.5.6", "refused", None, None),
    )
    deployments = {
        ("0.33.0", "0.5.2"): None,
        ("0.33.0", "0.5.6"): "no",
        ("0.34.0", "0.5.2"): None,
        ("0.34.0", "0.5.6"): "no",
    }
    c = Compatibility(
        QWEN, FrozenDict({"gpu": "H100"}), "unified", rows, FrozenDict(deployments)
    )
    assert c.text() == "\n".join(
        [
            "Qwen/Qwen3.5-0.8B (gpu=H100), unified registration: vLLM 0.33.0, 0.34.0 x LMCache "
            "0.5.2, 0.5.6",
            "  vllm lmcache  accepted           group 0 (mamba)",
            "0.33.0   0.5.2      True edited: MambaPageViewEdit",
            "0.33.0   0.5.6     False                   refused",
            "0.34.0   0.5.2      True             as registered",
            "0.34.0   0.5.6     False                   refused",
            "3 differences between adjacent releases",
            "  vLLM 0.33.0: LMCache 0.5.2 -> 0.5.6, group 0 (mamba): edited (MambaPageViewEdit) "
            "[10, 1, 2] -> refused",
            "  vLLM 0.34.0: LMCache 0.5.2 -> 0.5.6, group 0 (mamba): as registered [10, 2] -> refused",
            "  LMCache 0.5.2: vLLM 0.33.0 -> 0.34.0, group 0 (mamba): edited (MambaPageViewEdit) "
            "[10, 1, 2] -> as registered [10, 2]",
        ]
    )
    assert c._repr_html_().startswith(
        "<div><b>Qwen/Qwen3.5-0.8B (gpu=H100), unified registration: vLLM 0.33.0, 0.34.0 x "
        "LMCache 0.5.2, 0.5.6</b><table>"
    )
    assert len(c.figure().axes) == 1


def test_a_type_without_forms_is_refused_by_name():
    for form, name in (
        (text_form, "text"),
        (html_form, "html"),
        (figure_form, "figure"),
    ):
        with pytest.raises(
            KVExploreError,
            match=f"^float has no {name} form; expected a kvexplore result",
        ):
            form(2.5)
