"""Figures a reader can trust: one legend, no overlapping labels, units, titles.

Every check draws the figure on an Agg canvas and reads back what matplotlib
placed (text extents in pixels, rectangle colours, tick labels), so it fails
when a figure misleads, whatever code produced it.
"""

import itertools
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvexplore
from kvexplore.rendering import figures
from kvexplore.rendering.segments import COLORS, LEGEND_TEXT, fmt_size, kind_of

CASES = [
    ("Qwen/Qwen3.5-0.8B", "A100", 0),
    ("Qwen/Qwen3.5-0.8B", "H100", 3),
    ("nvidia/Nemotron-H-56B-Base-8K", "A100", 0),
    ("tiiuae/Falcon-H1-0.5B-Instruct", "H100", 0),
    ("LiquidAI/LFM2-2.6B", "A100", 0),
    ("deepseek-ai/DeepSeek-V3", "H100", 0),
    ("openai/gpt-oss-20b", "H100", 0),
]


def _texts(fig):
    """Every visible, non-empty text of the figure with its pixel extent."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    out = []
    items = list(fig.texts)
    for ax in fig.axes:
        items += list(ax.texts) + list(ax.get_xticklabels()) + list(ax.get_yticklabels())
        items += [t for t in ax.findobj(lambda a: a.__class__.__name__ == "Text") if t in (ax.title,)]
    for t in items:
        if t.get_visible() and t.get_text().strip():
            out.append((t.get_text(), t.get_window_extent(renderer)))
    return out


def _legend_entries(fig):
    return [t.get_text() for t in fig.texts if t.get_gid() == "legend"]


def _row_names(ax):
    """Row names, top to bottom."""
    named = [t for t in ax.texts if t.get_gid() == "row-name"]
    return [t.get_text() for t in sorted(named, key=lambda t: -t.get_position()[1])]


def _x_tick_labels(ax):
    """``(position, label)`` of the byte axis' ticks, left to right."""
    return sorted((t.get_position()[0], t.get_text()) for t in ax.texts if t.get_gid() == "x-tick")


def _overlaps(texts):
    bad = []
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        w = min(ba.x1, bb.x1) - max(ba.x0, bb.x0)
        h = min(ba.y1, bb.y1) - max(ba.y0, bb.y0)
        if w > 0.5 and h > 0.5:
            bad.append((a, b))
    return bad


def _figures(model, gpu, layer):
    p = kvexplore.plan(model, gpu=gpu, num_blocks=16)
    return p, [
        kvexplore.page_map(p, layer),
        kvexplore.page_map(p, layer, edited=True),
        kvexplore.buffer_map(p),
        p.figure(),
    ]


@pytest.mark.parametrize("model,gpu,layer", CASES)
def test_no_label_overlaps_and_one_legend(model, gpu, layer):
    p, figs = _figures(model, gpu, layer)
    for fig in figs:
        texts = _texts(fig)
        assert texts, "a figure without any label"
        assert _overlaps(texts) == [], f"overlapping labels in {fig.axes[0].get_title(loc='left')!r}"
        # every rectangle has its kind's colour, and the legend lists exactly the kinds drawn
        from matplotlib.colors import to_hex

        drawn = set()
        for coll in fig.axes[0].collections:
            labels = getattr(coll, "segment_labels", None)
            if labels is None:
                continue
            for label, face in zip(labels, coll.get_facecolors(), strict=True):
                kind = kind_of(label)
                drawn.add(kind)
                assert to_hex(face) == COLORS[kind].lower(), (label, to_hex(face))
        legend_texts = _legend_entries(fig)
        assert sorted(legend_texts) == sorted(LEGEND_TEXT[k] for k in drawn)


@pytest.mark.parametrize("model,gpu,layer", CASES[:3])
def test_titles_name_model_gpu_tp_backend(model, gpu, layer):
    p, figs = _figures(model, gpu, layer)
    for fig in figs:
        title = fig.axes[0].get_title(loc="left")
        assert model in title and f"on {gpu}" in title and "tp=1" in title
        assert p.attention_backend in title


def test_byte_ticks_are_units_and_exact():
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    fig = kvexplore.page_map(p, 0)
    ax = fig.axes[0]
    marks = _x_tick_labels(ax)
    ticks = [int(x) for x, _ in marks]
    labels = [text for _, text in marks]
    # one tick mark under each label, at the same offset
    (lines,) = [c for c in ax.collections if c.get_gid() == "x-tick-marks"]
    assert [int(seg[0][0]) for seg in lines.get_segments()] == ticks
    # the page is 1,114,112 B: conv 36,864 B then SSM; the padding start
    # (1,085,440 B) is too close to the end to carry its own tick label
    assert ticks[0] == 0 and ticks[-1] == 1114112 and 36864 in ticks
    assert labels[0] == "0" and labels[-1] == "1.06 MiB" and "36 KiB" in labels
    for t, text in zip(ticks, labels, strict=True):
        m = re.fullmatch(r"([\d.,]+) (B|KiB|MiB|GiB)", text)
        if t == 0:
            continue
        assert m, text
        scale = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}[m.group(2)]
        assert abs(float(m.group(1).replace(",", "")) * scale - t) / t < 0.005
    # the thin padding gets a callout naming its size instead
    assert "pad 28 KiB" in [t.get_text() for t in ax.texts] or "pad" in [t.get_text() for t in ax.texts]


def test_fmt_size_hand_values():
    assert fmt_size(512) == "512 B"
    assert fmt_size(1024) == "1 KiB"
    assert fmt_size(28672) == "28 KiB"
    assert fmt_size(1114112) == "1.06 MiB"
    assert fmt_size(427819008) == "408 MiB"
    assert fmt_size(80 * (1 << 30)) == "80 GiB"


def test_savefig_png_and_svg(tmp_path):
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100")
    fig = kvexplore.page_map(p, 3, edited=True)
    fig.savefig(tmp_path / "page.png")
    fig.savefig(tmp_path / "page.svg")
    assert (tmp_path / "page.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = (tmp_path / "page.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg


def test_plan_display_trio():
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100")
    text = p.text()
    assert text.splitlines()[0] == repr(p)
    assert "576 = lcm(16, 64) x cdiv(1085440, 64 x 2048)" in text
    html = p._repr_html_()
    assert html.count('class="kvx-bar"') == len(p.groups)  # one page bar per group
    fig = p.figure()
    rows = _row_names(fig.axes[0])
    assert rows == [f"g{g} mamba x6 (gdn_attn)" for g in range(3)] + ["g3 full_attention x6"]


def test_forms_are_chosen_by_type_and_an_unknown_type_is_a_clear_error():
    from kvexplore.display import figure_form, html_form, text_form
    from kvexplore.rendering.layouts import PageLayout, page_layout_text

    assert text_form.dispatch(PageLayout) is page_layout_text
    assert text_form.dispatch(kvexplore.Plan) is not text_form.dispatch(object)
    for form, name in ((text_form, "text"), (html_form, "html"), (figure_form, "figure")):
        with pytest.raises(kvexplore.KVExploreError, match=f"int has no {name} form"):
            form(3)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0.01, 0.2)), min_size=1, max_size=6))
def test_spread_never_overlaps_and_stays_inside(items):
    items = sorted(items)
    want = [x for x, _ in items]
    widths = [w for _, w in items]
    if sum(widths) > 1:
        return
    at = figures.spread(want, widths, 0.0, 1.0)
    for i, (x, w) in enumerate(zip(at, widths, strict=True)):
        assert x - w / 2 >= -1e-6 and x + w / 2 <= 1 + 1e-6
        if i:
            assert at[i - 1] + widths[i - 1] / 2 <= x - w / 2 + 1e-6


def test_html_bars_never_exceed_their_width():
    """Edited coordinates may overlap; the CSS widths of a bar still sum to <= 100 %."""
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="H100")
    html = kvexplore.page_layout(p, 3, edited=True)._repr_html_()
    bars = re.findall(r'<div class="kvx-bar"[^>]*>(.*?)</div></div>', html)
    assert len(bars) == 3  # registered, kernel page 0, edited
    for bar in re.findall(r'class="kvx-bar".*?(?=class="kvx-bar"|$)', html, re.S):
        widths = [float(w) for w in re.findall(r"flex:0 0 ([\d.]+)%", bar)]
        assert widths and sum(widths) <= 100.001, sum(widths)
