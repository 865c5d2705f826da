"""The Explorer widget: a thin ipywidgets layer over :class:`ExplorerState`.

``Explorer(model="Qwen/Qwen3.5-0.8B")`` is a ``VBox``: a row of controls
(model, tensor parallel size, DCP, block size, kv-cache dtype, model dtype,
attention backend, Mamba cache mode, prefix caching (vLLM turns the Mamba
cache mode to ``align`` while it is on), registration era, layer, block) and a tab
per panel (status, plan summary with its derivation, memory, page map
before/after edits, edit report with validation verdicts, offloading config,
live tensors).  All logic lives in :class:`kvexplore.explorer.state.ExplorerState`;
this module only forwards ``.value`` changes to ``state.set`` and copies the
changed panels' HTML back, so a control change re-renders only what changed.

Nothing here can raise into the notebook: a bad value (a TP that does not
divide the heads, a config path that does not exist, a layer out of range)
shows up as a message in the status tab and in the affected panels, and the
controls stay usable.

Figures are opt-in (the "figure" checkbox): the page map is drawn with
matplotlib into an ``Image`` only while the box is ticked, since an Agg draw
costs more than all the HTML panels together.  Figures are plain
``matplotlib.figure.Figure`` objects (not pyplot), so nothing accumulates.

In a notebook::

    from kvexplore.explorer.widgets import Explorer
    ex = Explorer("Qwen/Qwen3.5-0.8B")
    ex                                    # tag this cell nbval-ignore-output
    ex.controls["attention_backend"].value = "FLASHINFER"
    print(ex.state.panels["page_map"].text)   # checked by nbval
"""

from __future__ import annotations

import io
from typing import Any

import ipywidgets as widgets

from kvexplore.explorer.state import CONTROL_DEFAULTS, PANELS, ExplorerState, choices
from kvexplore.planning.models import DEFAULT_MODEL

_TITLES = {
    "status": "status",
    "summary": "plan",
    "memory": "memory",
    "page_map": "page map",
    "edits": "edits & validation",
    "offload": "offloading",
    "live": "live tensors",
}


class Explorer(widgets.VBox):
    """Interactive KV-cache explorer (see module doc).

    Attributes: ``state`` (the :class:`ExplorerState`), ``controls`` (control
    name -> widget; set ``.value`` to drive it), ``panels`` (panel name ->
    ``HTML`` widget), ``live_button``, ``figure_toggle``, ``figure`` (an
    ``Image`` holding the PNG page map when the toggle is on).
    """

    def __init__(self, model: Any = DEFAULT_MODEL, **controls: Any) -> None:
        self.state = ExplorerState(model, **controls)
        opts = choices()
        c = self.state.controls
        lay = widgets.Layout(width="230px")
        style = {"description_width": "110px"}

        def dropdown(name, label):
            options = list(opts[name])
            if c[name] not in options:
                options.append(c[name])
            return widgets.Dropdown(options=options, value=c[name], description=label, layout=lay, style=style)

        self.controls: dict[str, widgets.Widget] = {
            "model": widgets.Combobox(
                options=opts["model"], value=str(c["model"]), description="model",
                ensure_option=False, continuous_update=False,
                placeholder="catalog id or path to config.json",
                layout=widgets.Layout(width="470px"), style=style,
            ),
            "tensor_parallel_size": widgets.IntText(value=int(c["tensor_parallel_size"]), description="TP", layout=lay, style=style),
            "decode_context_parallel_size": widgets.IntText(value=int(c["decode_context_parallel_size"]), description="DCP", layout=lay, style=style),
            "block_size": widgets.Combobox(
                options=opts["block_size"], value=str(c["block_size"]), description="block size",
                ensure_option=False, continuous_update=False, layout=lay, style=style,
            ),
            "kv_cache_dtype": dropdown("kv_cache_dtype", "kv-cache dtype"),
            "dtype": dropdown("dtype", "model dtype"),
            "attention_backend": dropdown("attention_backend", "backend"),
            "mamba_cache_mode": dropdown("mamba_cache_mode", "Mamba cache"),
            "gpu": dropdown("gpu", "GPU"),
            "enable_prefix_caching": dropdown("enable_prefix_caching", "prefix caching"),
            "registration": dropdown("registration", "registration"),
            "layer": widgets.IntText(value=int(c["layer"]), description="layer", layout=lay, style=style),
            "block": widgets.IntText(value=int(c["block"]), description="block", layout=lay, style=style),
        }
        for name, w in self.controls.items():
            w.observe(self._on_change, names="value")
            w.kvexplore_control = name  # which ExplorerState control it drives
            w.add_class(_css_class("control", name))  # stable hook for browser tests
        self.layer_label = widgets.HTML()
        self.figure_toggle = widgets.Checkbox(value=False, description="figure", indent=False,
                                              layout=widgets.Layout(width="90px"))
        self.figure_toggle.observe(lambda _change: self._draw_figure(), names="value")
        self.figure = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        self.live_button = widgets.Button(description="Run live round-trip", icon="play",
                                          layout=widgets.Layout(width="200px"))
        self.live_button.on_click(self._on_live)
        self.panels: dict[str, widgets.HTML] = {name: widgets.HTML() for name in PANELS}
        for name, panel in self.panels.items():
            panel.add_class(_css_class("panel", name))
        tabs = []
        for name in PANELS:
            box: list[widgets.Widget] = [self.panels[name]]
            if name == "page_map":
                box = [widgets.HBox([self.figure_toggle, self.layer_label]), self.figure, self.panels[name]]
            if name == "live":
                box = [self.live_button, self.panels[name]]
            tabs.append(widgets.VBox(box))
        self.tabs = widgets.Tab(children=tabs, titles=[_TITLES[n] for n in PANELS])
        ctl = self.controls
        rows = [
            widgets.HBox([ctl["model"], ctl["gpu"], ctl["registration"]]),
            widgets.HBox([ctl["tensor_parallel_size"], ctl["decode_context_parallel_size"], ctl["block_size"]]),
            widgets.HBox([ctl["attention_backend"], ctl["kv_cache_dtype"], ctl["dtype"]]),
            widgets.HBox([ctl["mamba_cache_mode"], ctl["enable_prefix_caching"], ctl["layer"], ctl["block"]]),
        ]
        super().__init__(children=[*rows, self.panels["status"], self.tabs])
        self.add_class("kvx-explorer")
        self._render(PANELS)

    # -- event handlers --------------------------------------------------------
    def _on_change(self, change) -> None:
        name = getattr(change["owner"], "kvexplore_control", None)
        if name is None:
            return
        try:
            changed = self.state.set(**{name: change["new"]})
        except Exception as exc:  # never a traceback in the notebook
            self.panels["status"].value = _error_html(exc)
            return
        self._render(changed)

    def _on_live(self, _button=None) -> None:
        self.live_button.disabled = True
        self.panels["live"].value = _info_html("running: allocating, editing, round-tripping ...")
        try:
            self.state.run_live()
        except Exception as exc:  # run_live already turns errors into a panel
            self.panels["live"].value = _error_html(exc)
        else:
            self.panels["live"].value = self.state.panels["live"].html
        finally:
            self.live_button.disabled = False

    # -- rendering ---------------------------------------------------------------
    def _render(self, changed) -> None:
        for name in changed:
            panel = self.state.panels.get(name)
            if panel is not None and self.panels[name].value != panel.html:
                self.panels[name].value = panel.html
        if "page_map" in changed or "status" in changed:
            self._update_layer_label()
        if "page_map" in changed:
            self._draw_figure()

    def _update_layer_label(self) -> None:
        from html import escape

        p = self.state.plan
        if p is None:
            self.layer_label.value = ""
            return
        try:
            pos = self.state._layer()
            info = p.layers[pos]
            text = f"layer {pos}: {info.name} ({info.kind}); layers 0..{len(p.layers) - 1}"
        except ValueError:
            text = f"layers 0..{len(p.layers) - 1}"
        self.layer_label.value = f"<code>{escape(text)}</code>"

    def _draw_figure(self) -> None:
        if not self.figure_toggle.value:
            self.figure.layout.display = "none"
            return
        try:
            fig = self.state.page_map_figure()
        except ValueError:
            # the status panel already shows the message; just hide the figure
            fig = None
        if fig is None:
            self.figure.layout.display = "none"
            return
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        self.figure.value = buf.getvalue()
        self.figure.layout.display = ""

    # -- text form ---------------------------------------------------------------
    def text(self) -> str:
        """Every panel's text form, for notebooks checked by nbval."""
        return "\n\n".join(f"== {name} ==\n{self.state.panels[name].text}" for name in PANELS)


def _css_class(kind: str, name: str) -> str:
    """``("panel", "page_map")`` -> ``"kvx-panel-page-map"``: DOM hooks that
    browser tests (and user CSS) can rely on, unlike ipywidgets' own classes."""
    return f"kvx-{kind}-{name.replace('_', '-')}"


def _error_html(exc: BaseException) -> str:
    from kvexplore.explorer.state import _describe_error
    from kvexplore.rendering.html import message_html

    return message_html(_describe_error(exc))


def _info_html(text: str) -> str:
    from kvexplore.rendering.html import message_html

    return message_html(text, "info")


__all__ = ["CONTROL_DEFAULTS", "Explorer"]
