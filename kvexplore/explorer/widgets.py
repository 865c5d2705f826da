"""ipywidgets over :class:`~kvexplore.explorer.state.ExplorerState`
(:class:`Explorer`) and :func:`~kvexplore.explorer.state.compare`
(:class:`Compare`).  In a notebook::

    from kvexplore.explorer.widgets import Explorer
    ex = Explorer("Qwen/Qwen3.5-0.8B")
    ex                                    # tag this cell nbval-ignore-output
    ex.controls["attention_backend"].value = "FLASHINFER"
    print(ex.state.panels["page_map"].text)   # checked by nbval
"""

from __future__ import annotations

from html import escape
from typing import Any

import ipywidgets as widgets

from kvexplore.explorer.state import (
    CONTROL_DEFAULTS,
    PANELS,
    VIEW_CONTROLS,
    ExplorerState,
    choices,
    compare,
    describe_error,
    figure_png,
)
from kvexplore.planning.models import DEFAULT_MODEL
from kvexplore.planning.release import WINDOW_RELEASES, installed_release
from kvexplore.rendering.html import (
    comparison_summary_html,
    comparison_table_html,
    message_html,
)
from kvexplore.versions import existing_environments

_TITLES = {
    "status": "status",
    "summary": "plan",
    "memory": "memory",
    "page_map": "page map",
    "edits": "edits & validation",
    "offload": "offloading",
    "live": "live tensors",
}

#: The Explorer's controls and their labels, in the order they are built.
_LABELS = {
    "model": "model",
    "tensor_parallel_size": "TP",
    "decode_context_parallel_size": "DCP",
    "pipeline_parallel_size": "PP",
    "pipeline_parallel_rank": "PP stage",
    "block_size": "block size",
    "kv_cache_dtype": "kv-cache dtype",
    "dtype": "model dtype",
    "attention_backend": "backend",
    "mamba_cache_mode": "Mamba cache",
    "gpu": "GPU",
    "enable_prefix_caching": "prefix caching",
    "max_num_seqs": "max seqs",
    "gpu_memory_utilization": "GPU mem util",
    "max_model_len": "max model len",
    "cudagraph_mode": "CUDA graphs",
    "speculative_method": "speculative",
    "num_speculative_tokens": "draft tokens",
    "draft_model": "draft model",
    "registration": "registration",
    "lmcache": "LMCache",
    "layer": "layer",
    "block": "block",
}


def _control(name: str, value: Any, label: str, options: dict, **kwargs) -> widgets.Widget:
    """``IntText`` for a number, free-text ``Combobox`` for the models and
    the block size, else a ``Dropdown`` that also offers ``value``."""
    if name in ("tensor_parallel_size", "decode_context_parallel_size", "pipeline_parallel_size",
                "pipeline_parallel_rank", "layer", "block", "num_speculative_tokens"):
        return widgets.IntText(value=int(value), description=label, **kwargs)
    if name in ("model", "block_size", "draft_model", "max_num_seqs", "gpu_memory_utilization",
                "max_model_len"):
        extra = {"placeholder": "none"} if name == "draft_model" else {}
        return widgets.Combobox(options=list(options["model" if name == "draft_model" else name]),
                                value=str(value), description=label, ensure_option=False,
                                continuous_update=False, **extra, **kwargs)
    values = list(options[name])
    if value not in values:
        values.append(value)
    return widgets.Dropdown(options=values, value=value, description=label, **kwargs)


class Explorer(widgets.VBox):
    """A ``VBox`` of controls and a tab per panel; a bad value becomes a
    message, never a traceback.

    Attributes: ``state``, ``controls`` (name -> widget; set ``.value`` to
    drive it), ``panels`` (name -> ``HTML``; the ``status`` panel turns red
    with vLLM's message when a start-up check refuses), ``way_out`` (an
    ``HBox`` with one button per way out of that refusal, each applying its
    change to the controls), ``live_button``,
    ``figure_toggle``, ``figure`` (the PNG page map), in the edits tab
    ``stores_chunk`` / ``stores_button`` / ``stores_figure`` / ``stores_panel``
    (what the LMCache control's release stores at that chunk); where another vLLM
    release's environment exists (:func:`releases_at_hand`), a ``releases``
    tab: ``releases`` (a ``SelectMultiple``), ``releases_button``,
    ``matrix_button`` (every LMCache release on each selected vLLM release) and
    ``releases_panel`` (the comparison across releases), else None.
    """

    def __init__(self, model: Any = DEFAULT_MODEL, **controls: Any) -> None:
        self.state = ExplorerState(model, **controls)
        opts = choices()
        c = self.state.controls
        kwargs = {"layout": widgets.Layout(width="230px"), "style": {"description_width": "110px"}}
        wide = {**kwargs, "layout": widgets.Layout(width="470px"),
                "placeholder": "catalog id or path to config.json"}
        self.controls: dict[str, widgets.Widget] = {
            name: _control(name, c[name], label, opts, **(wide if name == "model" else kwargs))
            for name, label in _LABELS.items()
        }
        for name, w in self.controls.items():
            w.observe(self._on_change, names="value")
            w.kvexplore_control = name  # which ExplorerState control it drives
            w.add_class(_css_class("control", name))  # stable hook for browser tests
        self.layer_label = widgets.HTML()
        self.figure_toggle = widgets.Checkbox(value=True, description="figure", indent=False,
                                              layout=widgets.Layout(width="90px"))
        self.figure_toggle.observe(lambda _change: self._draw_figure(), names="value")
        self.figure = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        self.figure.add_class("kvx-figure-page-map")
        self.edit_figures = widgets.VBox()
        self.edit_figures.add_class("kvx-figure-edits")
        self.live_button = widgets.Button(description="Run live round-trip", icon="play",
                                          layout=widgets.Layout(width="200px"))
        self.live_button.on_click(self._on_live)
        self.panels: dict[str, widgets.HTML] = {name: widgets.HTML() for name in PANELS}
        for name, panel in self.panels.items():
            panel.add_class(_css_class("panel", name))
        self.stores_chunk = widgets.IntText(value=256, description="chunk size",
                                            layout=widgets.Layout(width="200px"),
                                            style={"description_width": "100px"})
        self.stores_button = widgets.Button(description="What LMCache stores", icon="database",
                                            layout=widgets.Layout(width="200px"))
        self.stores_button.on_click(self._on_stores)
        self.stores_panel = widgets.HTML()
        self.stores_panel.add_class(_css_class("panel", "lmcache-stores"))
        self.stores_figure = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        self.stores_figure.add_class("kvx-figure-lmcache-stores")
        boxes = {
            "page_map": [widgets.HBox([self.figure_toggle, self.layer_label]), self.figure, self.panels["page_map"]],
            "edits": [self.panels["edits"], self.edit_figures,
                      widgets.HBox([self.stores_chunk, self.stores_button]),
                      self.stores_figure, self.stores_panel],
            "live": [self.live_button, self.panels["live"]],
        }
        tabs = [widgets.VBox(boxes.get(name, [self.panels[name]])) for name in PANELS]
        titles = [_TITLES[n] for n in PANELS]
        self.releases, self.releases_button, self.releases_panel = None, None, None
        self.matrix_button = None
        known = releases_at_hand()
        if len(known) > 1:  # a release control only where another release can answer
            self.releases = widgets.SelectMultiple(options=known, value=known, rows=len(known),
                                                   description="vLLM", layout=widgets.Layout(width="230px"))
            self.releases_button = widgets.Button(description="Compare releases", icon="exchange",
                                                  layout=widgets.Layout(width="200px"))
            self.releases_button.on_click(self._on_releases)
            self.releases_panel = widgets.HTML(message_html(
                "the deployment above in each selected release, each in its own environment "
                "(about half a minute per release)", "info"))
            self.releases_panel.add_class(_css_class("panel", "releases"))
            self.matrix_button = widgets.Button(description="LMCache matrix", icon="th",
                                                layout=widgets.Layout(width="200px"))
            self.matrix_button.on_click(self._on_matrix)
            tabs.append(widgets.VBox([widgets.HBox([self.releases, self.releases_button,
                                                    self.matrix_button]),
                                      self.releases_panel]))
            titles.append("releases")
        small = {"layout": widgets.Layout(width="200px"), "style": {"description_width": "100px"}}
        self.advise_controls = {
            "concurrency": widgets.IntText(value=1, description="at once", **small),
            "shared_prefix": widgets.IntText(value=0, description="shared prefix", **small),
            "gpus": widgets.IntText(value=1, description="GPUs", **small),
            "objective": widgets.Dropdown(options=["concurrency", "prefix_reuse", "gpus"],
                                          value="concurrency", description="objective", **small),
        }
        self.advise_button = widgets.Button(description="What should I run?", icon="search",
                                            layout=widgets.Layout(width="200px"))
        self.advise_button.on_click(self._on_advise)
        self.advise_apply = widgets.Button(description="apply recommended", icon="wrench",
                                           disabled=True, layout=widgets.Layout(width="200px"))
        self.advise_apply.on_click(self._on_advise_apply)
        self.advise_panel = widgets.HTML(message_html(
            "the settings that start on the GPUs above, hold the requests at once and reuse "
            "the shared prefix, searched on vLLM's own code (model, GPU and max model len "
            "from the controls)", "info"))
        self.advise_panel.add_class(_css_class("panel", "advise"))
        self.advise_figure = widgets.Image(format="png", layout=widgets.Layout(display="none"))
        # after the panels' tabs, before the releases tab where there is one
        tabs.insert(len(PANELS), widgets.VBox([
            widgets.HBox([*self.advise_controls.values()]),
            widgets.HBox([self.advise_button, self.advise_apply]),
            self.advise_figure, self.advise_panel]))
        titles.insert(len(PANELS), "advise")
        self.tabs = widgets.Tab(children=tabs, titles=titles)
        self.tabs.observe(lambda _change: self._draw_edit_figures(), names="selected_index")
        ctl = self.controls
        rows = [
            widgets.HBox([ctl["model"], ctl["gpu"], ctl["registration"], ctl["lmcache"]]),
            widgets.HBox([ctl["tensor_parallel_size"], ctl["decode_context_parallel_size"],
                          ctl["pipeline_parallel_size"], ctl["pipeline_parallel_rank"]]),
            widgets.HBox([ctl["block_size"], ctl["attention_backend"], ctl["kv_cache_dtype"],
                          ctl["dtype"]]),
            widgets.HBox([ctl["mamba_cache_mode"], ctl["enable_prefix_caching"], ctl["layer"], ctl["block"]]),
            widgets.HBox([ctl["speculative_method"], ctl["num_speculative_tokens"], ctl["draft_model"]]),
            widgets.HBox([ctl["max_num_seqs"], ctl["gpu_memory_utilization"],
                          ctl["max_model_len"], ctl["cudagraph_mode"]]),
        ]
        self.way_out = widgets.HBox()
        self.way_out.add_class("kvx-way-out")
        self._syncing = False
        super().__init__(children=[*rows, self.panels["status"], self.way_out, self.tabs])
        self.add_class("kvx-explorer")
        self._render(PANELS)

    def _on_change(self, change) -> None:
        if self._syncing:  # a way out is setting the controls: one refresh for all
            return
        try:
            changed = self.state.set(**{change["owner"].kvexplore_control: change["new"]})
        except Exception as exc:  # never a traceback in the notebook
            self.panels["status"].value = message_html(describe_error(exc))
            return
        self._render(changed)

    def _on_way_out(self, index: int) -> None:
        try:
            changed = self.state.apply_way_out(index)
        except Exception as exc:  # never a traceback in the notebook
            self.panels["status"].value = message_html(describe_error(exc))
            return
        self._sync_controls(changed)

    def _sync_controls(self, changed) -> None:
        """Set every control widget to the state's value (one refresh for
        all), then redraw the ``changed`` panels."""
        self._syncing = True
        try:
            for name, w in self.controls.items():
                value = self.state.controls[name]
                if w.value != value:
                    w.value = str(value) if isinstance(w, widgets.Combobox) else value
        finally:
            self._syncing = False
        self._render(changed)

    def _update_way_out(self) -> None:
        """One button per way out of a start-up refusal (each a planned
        change that starts, or says it does not), none when the plan starts."""
        buttons = []
        for i, way in enumerate(self.state.way_out()):
            button = widgets.Button(description=f"apply {way.flags}"[:60],
                                    tooltip=way.text(), icon="wrench",
                                    button_style="success" if way.starts else "warning",
                                    layout=widgets.Layout(width="auto"))
            button.on_click(lambda _b, i=i: self._on_way_out(i))
            buttons.append(button)
        self.way_out.children = ([widgets.HTML("<b>way out:</b>"), *buttons] if buttons else [])

    def _on_advise(self, _button=None) -> None:
        self.advise_button.disabled = True
        self.advise_panel.value = message_html("planning every setting of the search space ...",
                                               "info")
        try:
            values = {name: w.value for name, w in self.advise_controls.items()}
            self.advise_panel.value = self.state.advise(**values).html
            advice = self.state.advice
            self.advise_apply.disabled = advice is None or advice.recommended is None
            _show(self.advise_figure, None if advice is None else
                  figure_png(advice.figure()))
        finally:
            self.advise_button.disabled = False

    def _on_stores(self, _button=None) -> None:
        self.stores_button.disabled = True
        self.stores_panel.value = message_html(
            "running the LMCache release's own connector and server code on this plan ...", "info")
        try:
            self.stores_panel.value = self.state.lmcache_stores(self.stores_chunk.value).html
            stores = self.state.stores
            _show(self.stores_figure, None if stores is None else figure_png(stores.figure()))
        finally:
            self.stores_button.disabled = False

    def _on_advise_apply(self, _button=None) -> None:
        try:
            changed = self.state.apply_advice()
        except Exception as exc:  # never a traceback in the notebook
            self.panels["status"].value = message_html(describe_error(exc))
            return
        self._sync_controls(changed)

    def _on_live(self, _button=None) -> None:
        self.live_button.disabled = True
        self.panels["live"].value = message_html("running: allocating, editing, round-tripping ...", "info")
        try:
            self.state.run_live()  # turns every error into the panel's message
            self.panels["live"].value = self.state.panels["live"].html
        finally:
            self.live_button.disabled = False

    def _on_releases(self, _button=None) -> None:
        self.releases_button.disabled = True
        self.releases_panel.value = message_html("running each release in its own environment ...", "info")
        try:
            self.releases_panel.value = self.state.compare_releases(self.releases.value).html
        finally:
            self.releases_button.disabled = False

    def _on_matrix(self, _button=None) -> None:
        self.matrix_button.disabled = True
        self.releases_panel.value = message_html(
            "asking every LMCache release, each vLLM release in its own environment ...", "info")
        try:
            self.releases_panel.value = self.state.lmcache_matrix(self.releases.value).html
        finally:
            self.matrix_button.disabled = False

    def _render(self, changed) -> None:
        for name in changed:
            panel = self.state.panels.get(name)
            if panel is not None and self.panels[name].value != panel.html:
                self.panels[name].value = panel.html
        if "page_map" in changed or "status" in changed:
            self._update_layer_label()
        if "status" in changed:
            self._update_way_out()
        if "page_map" in changed:
            self._draw_figure()
        if "edits" in changed:
            self._draw_edit_figures()

    def _update_layer_label(self) -> None:
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
        _show(self.figure, self.state.page_map_png() if self.figure_toggle.value else None)

    def _draw_edit_figures(self) -> None:
        """Each group's first layer, drawn only while the edits tab is shown."""
        if self.tabs.selected_index != PANELS.index("edits"):
            return
        children = []
        if self.figure_toggle.value:
            for caption, png in self.state.edit_group_pngs():
                image = widgets.Image(value=png, format="png")
                children += [widgets.HTML(f"<b>{escape(caption)}</b>"), image]
        self.edit_figures.children = children

    def text(self) -> str:
        """Every panel's text form, for notebooks checked by nbval."""
        return "\n\n".join(f"== {name} ==\n{self.state.panels[name].text}" for name in PANELS)


class Compare(widgets.VBox):
    """Two settings side by side: ``Compare(a, b, **b_changes)`` as
    :func:`~kvexplore.explorer.state.compare`.

    Attributes: ``comparison``, ``controls_a`` / ``controls_b`` / ``shared``
    (name -> widget), ``figures`` (two ``Image``), ``table`` (``HTML``).
    """

    SIDE_CONTROLS = ("model", "gpu", "tensor_parallel_size", "kv_cache_dtype", "attention_backend",
                     "block_size")
    SHARED_CONTROLS = VIEW_CONTROLS

    def __init__(self, a: dict | None = None, b: dict | None = None, **b_changes: Any) -> None:
        a = {"model": DEFAULT_MODEL, **(a or {})}
        b = {**a, **(b or {}), **b_changes}
        opts = choices()
        kwargs = {"layout": widgets.Layout(width="260px"), "style": {"description_width": "90px"}}

        def side(values, tag):
            out = {}
            for name in self.SIDE_CONTROLS:
                out[name] = _control(name, values.get(name, CONTROL_DEFAULTS[name]),
                                     f"{tag} {name.split('_')[0]}", opts, **kwargs)
                out[name].add_class(_css_class(f"compare-{tag.lower()}", name))
            return out

        self.controls_a = side(a, "A")
        self.controls_b = side(b, "B")
        self.shared = {name: _control(name, a.get(name, CONTROL_DEFAULTS[name]), name, opts, **kwargs)
                       for name in self.SHARED_CONTROLS}
        for w in [*self.controls_a.values(), *self.controls_b.values(), *self.shared.values()]:
            w.observe(lambda _change: self.refresh(), names="value")
        self.summary = widgets.HTML()
        self.figures = (widgets.Image(format="png"), widgets.Image(format="png"))
        self.captions = (widgets.HTML(), widgets.HTML())
        self.table = widgets.HTML()
        self.table.add_class("kvx-compare-table")
        maps = widgets.HBox([widgets.VBox([self.captions[i], self.figures[i]],
                                          layout=widgets.Layout(width="50%")) for i in (0, 1)])
        super().__init__(children=[
            widgets.HBox([widgets.VBox(list(self.controls_a.values())),
                          widgets.VBox(list(self.controls_b.values())),
                          widgets.VBox(list(self.shared.values()))]),
            self.summary, maps, self.table,
        ])
        self.add_class("kvx-compare")
        self.comparison = None
        self.states: list[ExplorerState] = []
        self.refresh()

    def _values(self, side: dict) -> dict:
        out = {name: w.value for name, w in side.items()}
        out.update({name: w.value for name, w in self.shared.items()})
        return out

    def refresh(self) -> None:
        """Recompare from the controls (never raises into the notebook)."""
        try:
            values = (self._values(self.controls_a), self._values(self.controls_b))
            if self.states:  # keep each side's memoised panels and figures
                for st, v in zip(self.states, values, strict=True):
                    st.set(**v)
            else:
                self.states = [ExplorerState(v.pop("model"), **v) for v in map(dict, values)]
            c = compare(*self.states)
        except Exception as exc:
            self.summary.value = message_html(describe_error(exc))
            return
        self.comparison = c
        self.summary.value = comparison_summary_html(c)
        for i, (st, label) in enumerate(zip((c.a, c.b), c.labels(), strict=True)):
            self.captions[i].value = f"<b>{'AB'[i]}</b>: {escape(label)}"
            _show(self.figures[i], st.page_map_png())
        self.table.value = comparison_table_html(c)


def releases_at_hand() -> list[str]:
    """The installed release and every release whose environment exists, in
    window order."""
    here = installed_release().version
    return [r for r in WINDOW_RELEASES if r == here or r in existing_environments()]


def _show(image: widgets.Image, png: bytes | None) -> None:
    """Show ``png`` in ``image``, or hide ``image`` when there is none."""
    if png and image.value != png:
        image.value = png
    image.layout.display = "" if png else "none"


def _css_class(kind: str, name: str) -> str:
    """``("panel", "page_map")`` -> ``"kvx-panel-page-map"`` (stable DOM hooks)."""
    return f"kvx-{kind}-{name.replace('_', '-')}"


__all__ = ["CONTROL_DEFAULTS", "Compare", "Explorer"]
