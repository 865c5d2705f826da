"""The Explorer's logic without widgets: controls -> plan -> panels.

A user error (a ``ValueError``) becomes a message panel, never a traceback;
panels and PNG figures are memoised per plan (:func:`kvexplore.memo.per_plan`).
:func:`compare` puts two states side by side.

>>> s = ExplorerState("Qwen/Qwen3.5-0.8B")
>>> s.plan.block_size  # on the default GPU, an H100
576
>>> _ = s.set(gpu="A100")
>>> s.plan.block_size
544
>>> s.set(attention_backend="FLASHINFER", layer=3)  # doctest: +ELLIPSIS
(...'page_map'...)
>>> "17 kernel pages" in s.panels["page_map"].text
True
>>> _ = s.set(tensor_parallel_size=3)
>>> "divisible by tensor parallel size (3)" in s.error
True
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvexplore.advising import Workload, advise
from kvexplore.display import Displayable, register_forms
from kvexplore.editing.lmcache import lmcache_releases
from kvexplore.editing.plan_edits import plan_edits
from kvexplore.editing.roundtrip import verify_roundtrip
from kvexplore.editing.rules import apply_kv_cache_group_edits
from kvexplore.editing.validation import check_kv_cache_groups
from kvexplore.errors import KVExploreError
from kvexplore.memo import per_plan
from kvexplore.offloading.config import offload_config
from kvexplore.planning.backends import COMMON_BACKENDS
from kvexplore.planning.gpus import DEFAULT_GPU, gpus
from kvexplore.planning.inputs import MAMBA_CACHE_MODES, MODEL_DTYPES, PLAN_DEFAULTS
from kvexplore.planning.models import DEFAULT_MODEL, catalog_names
from kvexplore.planning.planner import plan as make_plan
from kvexplore.planning.release import kv_cache_dtypes
from kvexplore.registration import REGISTRATIONS, allocate, backing_bytes
from kvexplore.rendering import editing, figures, html, layouts
from kvexplore.versions import compare_versions, compatibility

#: The ``plan()`` keywords the Explorer has a control for, in display order.
EXPLORED_KEYWORDS = (
    "tensor_parallel_size", "decode_context_parallel_size", "pipeline_parallel_size",
    "pipeline_parallel_rank", "block_size", "kv_cache_dtype", "dtype", "attention_backend",
    "mamba_cache_mode", "enable_prefix_caching", "max_num_seqs", "gpu_memory_utilization",
    "max_model_len",
)

#: ``compilation_config["cudagraph_mode"]`` choices of the CUDA-graph control
#: ("auto": vLLM's default for the deployment).
CUDAGRAPH_MODES = ("auto", "FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL", "PIECEWISE", "NONE")

#: Controls and their defaults ("auto" = let vLLM choose: a keyword whose
#: ``plan()`` default is ``None``); a keyword's default is ``plan()``'s.
CONTROL_DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "gpu": DEFAULT_GPU,
    **{k: "auto" if PLAN_DEFAULTS[k] is None else PLAN_DEFAULTS[k] for k in EXPLORED_KEYWORDS},
    "cudagraph_mode": "auto",
    "speculative_method": "none",
    "num_speculative_tokens": 3,
    "draft_model": "",
    "registration": "unified",
    "lmcache": "auto",
    "layer": 0,
    "block": 0,
}

#: ``speculative_config`` methods the speculative control offers ("none": no drafter).
SPECULATIVE_METHODS = ("none", "mtp", "eagle", "eagle3", "draft_model", "ngram")

#: Controls that pick what to look at; the others (:data:`PLAN_CONTROLS`) change the plan.
VIEW_CONTROLS = ("registration", "lmcache", "layer", "block")
PLAN_CONTROLS = tuple(k for k in CONTROL_DEFAULTS if k not in VIEW_CONTROLS)

PANELS = ("status", "summary", "memory", "page_map", "edits", "offload", "live")

#: Blocks the live panel allocates for a plan sized by vLLM's memory profile.
LIVE_BLOCKS = 16
#: Blocks exercised by the live round-trip on CPU (all blocks on CUDA).
CPU_ROUNDTRIP_BLOCKS = 2
#: The live panel refuses CPU allocations above this many bytes.
MAX_CPU_ALLOCATION = 8 << 30
#: Resolution of the Explorer's PNG page maps (a 10-inch figure is 720 px wide).
FIGURE_DPI = 72


@dataclass(frozen=True)
class Panel:
    """One panel: deterministic ``text``, ``html``, ``ok`` (False for a
    message in place of content)."""

    name: str
    text: str
    html: str
    ok: bool = True


def _message_panel(name: str, text: str, level: str = "error") -> Panel:
    return Panel(name, text, html.message_html(text, level), ok=False)


_LIVE_IDLE = Panel("live", "live tensors: not run for this configuration (press Run)", html.message_html(
    "live tensors: not run for this configuration. Run allocates the registered "
    "caches (CUDA if available, else CPU), applies the edits and runs verify_roundtrip.", "info"))


def choices() -> dict[str, list]:
    """Options for the dropdown controls, from kvexplore's and vLLM's lists."""
    return {
        "model": catalog_names(),
        "gpu": gpus().gpu.tolist(),
        "kv_cache_dtype": list(kv_cache_dtypes()),
        "dtype": list(MODEL_DTYPES),
        "attention_backend": ["auto", *COMMON_BACKENDS],
        "enable_prefix_caching": ["auto", True, False],
        "mamba_cache_mode": ["auto", *MAMBA_CACHE_MODES],
        "registration": list(REGISTRATIONS),
        "lmcache": ["auto", *lmcache_releases()],
        "block_size": ["auto", "16", "32", "64", "128", "256", "544", "1088"],
        "speculative_method": list(SPECULATIVE_METHODS),
        "max_num_seqs": ["auto", "64", "128", "256", "512", "1024"],
        "gpu_memory_utilization": ["auto", "0.8", "0.85", "0.9", "0.92", "0.95"],
        "max_model_len": ["auto", "4096", "32768", "131072", "262144"],
        "cudagraph_mode": list(CUDAGRAPH_MODES),
    }


def _control_int(name: str, value: Any, *, auto: bool = False) -> int | None:
    """``'544'`` -> 544; ``'auto'``/``''``/None -> None when ``auto``."""
    if auto and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto"))):
        return None
    minimum = 0 if name in ("layer", "block", "pipeline_parallel_rank", "shared_prefix") else 1
    parsed: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        parsed = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        parsed = int(value.strip())
    if parsed is None or parsed < minimum:
        allowed = ("'auto' or " if auto else "") + f"an integer >= {minimum}"
        raise KVExploreError(f"{name}={value!r} is invalid; expected {allowed}")
    return parsed


def _control_fraction(name: str, value: Any) -> float | None:
    """``'0.9'`` -> 0.9; ``'auto'``/``''``/None -> None (vLLM's default)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = -1.0
    if isinstance(value, bool) or not 0 < number <= 1:
        raise KVExploreError(f"{name}={value!r} is invalid; expected 'auto' or a number in (0, 1]")
    return number


def _auto(value: Any) -> Any:
    """None (let vLLM choose) for ``'auto'``, else ``value``."""
    return None if value in (None, "auto") else value


def _check_controls(names) -> None:
    unknown = [k for k in names if k not in CONTROL_DEFAULTS]
    if unknown:
        raise KVExploreError(
            f"unknown Explorer control(s) {unknown}; expected {list(CONTROL_DEFAULTS)}"
        )


def _speculative_config(c: dict) -> dict | None:
    """The ``speculative_config`` of the speculative controls (None for
    method "none")."""
    method = c["speculative_method"]
    if method in (None, "", "none"):
        return None
    spec: dict[str, Any] = {
        "method": method,
        "num_speculative_tokens": _control_int("num_speculative_tokens",
                                               c["num_speculative_tokens"]),
    }
    draft = c["draft_model"]
    if isinstance(draft, str) and draft.strip():
        spec["model"] = draft.strip()
    if method == "ngram":
        spec["prompt_lookup_max"] = spec["num_speculative_tokens"]
    return spec


class ExplorerState:
    """Controls -> plan -> panels.

    ``panels[name]`` is a :class:`Panel`; ``error`` the last user error (None
    when the controls are valid); ``plan`` the current plan (None when
    planning failed).  An unknown control name raises ``KVExploreError``.
    """

    def __init__(self, model: Any = DEFAULT_MODEL, **controls: Any) -> None:
        _check_controls(controls)
        self.controls: dict[str, Any] = {**CONTROL_DEFAULTS, **controls, "model": model}
        self.panels: dict[str, Panel] = {}
        self.error: str | None = None
        self.plan = None
        self.advice = None
        self.stores = None
        self._live_key = None
        self.refresh()

    def set(self, **changes: Any) -> tuple[str, ...]:
        """Apply control changes; return the panels that changed (in PANELS order)."""
        _check_controls(changes)
        self.controls.update(changes)
        return self.refresh()

    def plan_kwargs(self) -> dict[str, Any]:
        """``kvexplore.plan`` keywords from the controls (raises on bad values)."""
        c = self.controls
        return {
            "gpu": c["gpu"],
            "tensor_parallel_size": _control_int("tensor_parallel_size", c["tensor_parallel_size"]),
            "decode_context_parallel_size": _control_int(
                "decode_context_parallel_size", c["decode_context_parallel_size"]
            ),
            "pipeline_parallel_size": _control_int("pipeline_parallel_size",
                                                   c["pipeline_parallel_size"]),
            "pipeline_parallel_rank": _control_int("pipeline_parallel_rank",
                                                   c["pipeline_parallel_rank"]),
            "block_size": _control_int("block_size", c["block_size"], auto=True),
            "kv_cache_dtype": c["kv_cache_dtype"],
            "dtype": c["dtype"],
            "attention_backend": _auto(c["attention_backend"]),
            "mamba_cache_mode": _auto(c["mamba_cache_mode"]),
            "enable_prefix_caching": _auto(c["enable_prefix_caching"]),
            "speculative_config": _speculative_config(c),
            "max_num_seqs": _control_int("max_num_seqs", c["max_num_seqs"], auto=True),
            "gpu_memory_utilization": _control_fraction("gpu_memory_utilization",
                                                        c["gpu_memory_utilization"]),
            "max_model_len": _control_int("max_model_len", c["max_model_len"], auto=True),
            "compilation_config": (None if _auto(c["cudagraph_mode"]) is None
                                   else {"cudagraph_mode": c["cudagraph_mode"]}),
        }

    def way_out(self) -> tuple:
        """The current plan's way out of its start-up refusal
        (:meth:`kvexplore.Plan.way_out`, each planned); ``()`` when it starts
        or there is no plan."""
        if self.plan is None or self.plan.admission is None or self.plan.admission.ok:
            return ()
        return self.plan.way_out()

    def apply_way_out(self, index: int = 0) -> tuple[str, ...]:
        """Set the controls to way out ``index`` of :meth:`way_out` (its
        ``max_num_seqs``, ``gpu_memory_utilization``, ``max_model_len`` and
        CUDA-graph mode); return the panels that changed."""
        ways = self.way_out()
        if not 0 <= index < len(ways):
            raise KVExploreError(
                f"way out {index!r} does not exist; expected 0 to {len(ways) - 1} "
                "(the plan's way_out())" if ways else
                f"way out {index!r} does not exist: the plan starts (no way out needed)")
        changes: dict[str, Any] = {}
        for name, value in ways[index].change.items():
            if name == "compilation_config":
                changes["cudagraph_mode"] = value.get("cudagraph_mode", "auto")
            elif name in CONTROL_DEFAULTS:
                changes[name] = str(value)
        return self.set(**changes)

    def advise(self, *, concurrency: Any = 1, shared_prefix: Any = 0, gpus: Any = 1,
               objective: str = "concurrency") -> Panel:
        """:func:`kvexplore.advise` for the controls' model and GPU, the
        workload's length the ``max_model_len`` control (``auto``: the
        model's), ``concurrency`` requests at once and a ``shared_prefix``:
        the ``advise`` panel (the recommendation, its command and every
        setting), or a message naming what was refused.  The answer is kept
        in :attr:`advice` (for its figure and :meth:`apply_advice`)."""
        try:
            c = self.controls
            workload = Workload(
                max_model_len=_control_int("max_model_len", c["max_model_len"], auto=True),
                concurrency=_control_int("concurrency", concurrency),
                shared_prefix=_control_int("shared_prefix", shared_prefix))
            self.advice = advise(c["model"], gpu=c["gpu"], gpus=_control_int("gpus", gpus),
                                 workload=workload, objective=objective)
        except Exception as exc:  # never a traceback in the notebook
            self.advice = None
            return _message_panel("advise", describe_error(exc))
        return Panel("advise", self.advice.text(), self.advice._repr_html_())

    def apply_advice(self) -> tuple[str, ...]:
        """Set the controls to the recommended setting of the last
        :meth:`advise` (TP, prefix caching, ``max_num_seqs``, utilization; an
        argument without a control, such as ``prefix_match_unit``, stays in
        the command); return the panels that changed."""
        rec = self.advice.recommended if self.advice is not None else None
        if rec is None:
            raise KVExploreError("no recommended setting to apply; expected advise() first, "
                                 "with a setting that starts")
        changes: dict[str, Any] = {
            "tensor_parallel_size": int(rec.get("tensor_parallel_size", 1)),
            "max_num_seqs": str(rec.get("max_num_seqs", "auto")),
            "gpu_memory_utilization": str(rec.get("gpu_memory_utilization", "auto")),
            "enable_prefix_caching": rec.get("enable_prefix_caching", "auto"),
        }
        return self.set(**{k: v for k, v in changes.items() if k in CONTROL_DEFAULTS})

    def lmcache_stores(self, chunk_size: Any = 256) -> Panel:
        """:func:`kvexplore.lmcache_layout` for the current plan and the
        LMCache control's release (``auto``: the installed LMCache, else the
        newest stable) at ``chunk_size``: the ``lmcache_stores`` panel (the
        verdict, the groups and the bytes one chunk stores), or a message
        naming what was refused.  The answer is kept in :attr:`stores` (for
        its figure)."""
        from kvexplore.connectors.lmcache_layout import lmcache_layout

        try:
            if self.plan is None:
                raise KVExploreError(f"no plan: {self.error}; expected a deployment that plans")
            self.stores = lmcache_layout(self.plan, lmcache=_auto(self.controls["lmcache"]),
                                         chunk_size=_control_int("chunk_size", chunk_size))
        except Exception as exc:  # never a traceback in the notebook
            self.stores = None
            return _message_panel("lmcache_stores", describe_error(exc))
        return Panel("lmcache_stores", self.stores.text(), self.stores._repr_html_())

    def compare_releases(self, releases) -> Panel:
        """The current deployment in each vLLM release of ``releases``, each
        answered in its own environment (:func:`kvexplore.compare_versions`):
        the ``releases`` panel, or a message naming what was refused."""
        try:
            c = compare_versions(self.controls["model"], vllm=list(releases), **self.plan_kwargs())
        except Exception as exc:  # never a traceback in the notebook
            return _message_panel("releases", describe_error(exc))
        return Panel("releases", c.text(), c._repr_html_())

    def lmcache_matrix(self, releases) -> Panel:
        """The current deployment under each vLLM release of ``releases`` and
        every LMCache release (:func:`kvexplore.compatibility`, the
        registration control's registration): the ``releases`` panel, or a
        message naming what was refused."""
        try:
            c = compatibility(self.controls["model"], vllm=list(releases),
                              registration=self.controls["registration"], **self.plan_kwargs())
        except Exception as exc:  # never a traceback in the notebook
            return _message_panel("releases", describe_error(exc))
        return Panel("releases", c.text(), c._repr_html_())

    def refresh(self) -> tuple[str, ...]:
        """Recompute every panel from the controls; return the changed ones."""
        before = dict(self.panels)
        new: dict[str, Panel] = {}
        self.error = None
        try:
            kwargs = self.plan_kwargs()
            model = self.controls["model"]
            if isinstance(model, str) and not model.strip():
                raise KVExploreError("model='' is empty; expected a catalog id or a path to a config.json")
            self.plan = make_plan(model.strip() if isinstance(model, str) else model, **kwargs)
        except Exception as exc:  # user errors and anything vLLM raised
            self.plan = None
            self.error = describe_error(exc)
            msg = f"no plan: {self.error}"
            for name in PANELS[1:]:
                new[name] = _message_panel(name, msg, "warning")
            new["status"] = _message_panel("status", self.error)
            return self._commit(before, new)
        p = self.plan
        new["summary"] = per_plan(p, ("explorer", "summary"), lambda: Panel("summary", p.text(), p._repr_html_()))
        new["memory"] = per_plan(p, ("explorer", "memory"), lambda: _memory_panel(p))
        new["offload"] = per_plan(p, ("explorer", "offload"), lambda: _offload_panel(p))
        registration = self.controls["registration"]
        lmcache = _auto(self.controls["lmcache"])
        try:
            new["edits"] = per_plan(p, ("explorer", "edits", registration, lmcache),
                                    lambda: _edits_panel(p, registration, lmcache))
        except Exception as exc:
            self.error = describe_error(exc)
            new["edits"] = _message_panel("edits", self.error)
        try:
            layer, block = self._view()
            key = ("explorer", "page_map", layer, block, registration)
            new["page_map"] = per_plan(p, key, lambda: _page_map_panel(p, layer, block, registration))
        except Exception as exc:
            self.error = describe_error(exc)
            new["page_map"] = _message_panel("page_map", self.error)
        if self._live_key == (p, registration, lmcache) and "live" in before:  # plans compare by identity
            new["live"] = before["live"]
        else:
            new["live"] = _LIVE_IDLE
        if self.error:
            new["status"] = _message_panel("status", self.error)
        elif p.admission is not None and not p.admission.ok:
            text = f"{p!r}\nstart-up: {p.admission.text()}"
            new["status"] = Panel("status", text, html.message_html(text, "error"), ok=False)
        else:
            new["status"] = Panel("status", f"{p!r}", html.message_html(f"{p!r}", "info"))
        return self._commit(before, new)

    def _commit(self, before: dict[str, Panel], new: dict[str, Panel]) -> tuple[str, ...]:
        self.panels = new
        return tuple(n for n in PANELS if before.get(n) != new.get(n))

    def _layer(self) -> int:
        """Position of the layer control's value: an int position, its text, or a layer name."""
        layer = self.controls["layer"]
        if isinstance(layer, str) and layer.strip().lstrip("-").isdigit():
            layer = int(layer.strip())
        pos, _ = layouts.resolve_layer(self.plan, layer)
        return pos

    def _view(self) -> tuple[int, int]:
        """``(layer position, block)`` from the view controls (raises on bad values)."""
        return self._layer(), _control_int("block", self.controls["block"])

    def page_map_png(self, layer: int | None = None, block: int | None = None) -> bytes | None:
        """The page map as PNG bytes (memoised), or None after an error;
        ``layer``/``block`` default to the controls."""
        if self.plan is None or (layer is None and not self.panels["page_map"].ok):
            return None
        p = self.plan
        registration = self.controls["registration"]
        try:
            layer = self._layer() if layer is None else layer
            block = _control_int("block", self.controls["block"]) if block is None else block
        except ValueError:
            return None
        key = ("explorer", "png", layer, block, registration)
        return per_plan(p, key, lambda: _page_map_png(p, layer, block, registration))

    def edit_group_pngs(self) -> list[tuple[str, bytes]]:
        """``(caption, PNG)`` of block 0 of each group's first layer (empty
        after an error)."""
        if self.plan is None:
            return []
        positions = {info.name: i for i, info in enumerate(self.plan.layers)}
        out = []
        for gid, group in enumerate(self.plan.groups):
            name = group.layer_names[0] if group.layer_names else None
            pos = positions.get(name)
            if pos is None:
                continue
            try:
                png = self.page_map_png(pos, 0)
            except ValueError:
                continue
            if png:
                out.append((f"group {gid}: {name} (layer {pos}), block 0", png))
        return out

    def run_live(self, device: str | None = None, *, blocks: Any = "default") -> Panel:
        """Allocate the registered caches, apply the edits, ``verify_roundtrip``;
        the result (or the error as a message) becomes the ``live`` panel.

        ``device`` None: CUDA when available, else CPU.  A plan sized by vLLM's
        memory profile is allocated with :data:`LIVE_BLOCKS` blocks, others as
        planned.  ``blocks``: ``"default"`` is all on CUDA, the first
        :data:`CPU_ROUNDTRIP_BLOCKS` on CPU.
        """
        try:
            panel = self._run_live(device, blocks)
        except Exception as exc:
            panel = _message_panel("live", f"live tensors failed: {describe_error(exc)}")
        if self.plan is not None:
            self._live_key = (self.plan, self.controls["registration"],
                              _auto(self.controls["lmcache"]))
        self.panels = {**self.panels, "live": panel}
        return panel

    def _run_live(self, device, blocks) -> Panel:
        if self.plan is None:
            raise KVExploreError(f"no plan to allocate: {self.error}")
        p = self.plan
        if p.sized_by_profile:
            p = p.with_num_blocks(LIVE_BLOCKS)
        registration = self.controls["registration"]
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        total = backing_bytes(p)
        if str(device).startswith("cpu") and total > MAX_CPU_ALLOCATION:
            raise KVExploreError(
                f"the KV cache of this plan is {total:,} B; the live panel allocates at most "
                f"{MAX_CPU_ALLOCATION:,} B on CPU (run on a CUDA machine, or lower num_blocks)"
            )
        caches = allocate(p, device=device, registration=registration)
        edited = apply_kv_cache_group_edits(p.kv_cache_config, caches,
                                            lmcache=_auto(self.controls["lmcache"]))
        if blocks == "default":
            blocks = None if str(device).startswith("cuda") else list(range(min(CPU_ROUNDTRIP_BLOCKS, p.num_blocks)))
        report = verify_roundtrip(p.kv_cache_config, caches, edited, blocks=blocks)
        table = report.table[editing.ROUNDTRIP_COLUMNS]
        verdict = "OK" if report.ok else f"FAILED on {len(report.failures())} layer(s)"
        chosen = "all blocks" if blocks is None else f"blocks {list(blocks)}"
        head = (f"round-trip {verdict}: {len(table)} layers, {report.bytes_checked:,} bytes "
                f"on {torch.device(device).type} ({registration}, LMCache {edited.lmcache}'s "
                f"edits, {chosen})")
        text = head + "\n" + (table.to_string(index=False) if len(table) else "(no layers)")
        body = html.message_html(head, "info" if report.ok else "error") + html.table_html(table)
        return Panel("live", text, body, ok=bool(report.ok))


def describe_error(exc: BaseException) -> str:
    if isinstance(exc, ValueError):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc} (please report this)"


def _memory_panel(p) -> Panel:
    gt = p.group_table
    pairs = [
        ("tokens_per_gib", f"{p.tokens_per_gib:,}"),
        ("bytes_per_block", f"{p.bytes_per_block:,}"),
        ("bytes_per_token", f"{p.bytes_per_token:,.1f}"),
        ("padding_bytes_per_block", f"{p.padding_bytes_per_block:,}"),
        ("padding_share", f"{100 * p.padding_share:.2f}%"),
        ("num_blocks", p.num_blocks),
        ("kv_cache_bytes", f"{p.bytes_per_block * p.num_blocks:,}"),
    ]
    cols = ["group", "kind", "layers", "page_bytes", "real_page_bytes", "padding_bytes", "padding_share"]
    text = "\n".join(f"{k}: {v}" for k, v in pairs) + "\n" + gt[cols].to_string(index=False)
    return Panel("memory", text, html.pairs_html(pairs) + html.table_html(gt[cols]))


def edited_layout(p, layer: int, block: int, registration: str):
    """``page_layout(..., edited=True)``, memoised per plan and view."""
    return per_plan(p, ("page_layout", layer, block, registration),
                    lambda: layouts.page_layout(p, layer, block=block, registration=registration,
                                                edited=True))


def _page_map_panel(p, layer: int, block: int, registration: str) -> Panel:
    lay = edited_layout(p, layer, block, registration)
    return Panel("page_map", lay.text(), html.page_layout_html(lay))


def _page_map_png(p, layer: int, block: int, registration: str) -> bytes:
    lay = edited_layout(p, layer, block, registration)
    return figure_png(figures.page_figure(lay, title=False, legend_row=False))


def figure_png(fig, dpi: int = FIGURE_DPI) -> bytes:
    """A matplotlib Figure as PNG bytes, without the version metadata."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, metadata={"Software": None})
    return buf.getvalue()


def _edits_panel(p, registration: str, lmcache: str | None = None) -> Panel:
    verdicts = check_kv_cache_groups(p.kv_cache_config, lmcache=lmcache)
    try:
        result = plan_edits(p, registration, lmcache=lmcache)
    except ValueError as exc:
        text, body = editing.edits_panel(verdicts, registration, error=f"edits ({registration}) rejected: {exc}")
        return Panel("edits", text, body, ok=False)
    groups = editing.edit_groups(result.report)
    positions = {info.name: i for i, info in enumerate(p.layers)}
    bars = {g.group: html.page_bars_html(edited_layout(p, positions[g.first_layer], 0, registration))
            for g in groups if g.first_layer in positions}
    return Panel("edits", *editing.edits_panel(verdicts, registration, result.summary(), groups, bars))


def _offload_panel(p) -> Panel:
    try:
        result = offload_config(p)
    except ValueError as exc:
        msg = f"vLLM's build_offloading_config rejects this plan: {exc}"
        return Panel("offload", msg, html.message_html(msg), ok=False)
    # hide the temporary config directory so the text is deterministic
    where = str(p.model.config_dir)
    text = f"{result!r}\n{result.explain()}".replace(where, "<config_dir>")
    return Panel("offload", text, html.pre_html(text))


#: Page-map numbers compared between the two sides (PageLayout attributes).
PAGE_MAP_QUANTITIES = ("block_size", "kernel_block_size", "kernel_pages", "page_bytes",
                       "real_bytes", "padding_bytes", "page_offset")


@dataclass(frozen=True)
class CompareRow:
    """One compared quantity of ``section`` (``plan``, ``group N``, ``page
    map``): the values of sides A and B."""

    section: str
    quantity: str
    a: str
    b: str

    @property
    def differs(self) -> bool:
        return self.a != self.b


def _value_text(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_value_text(v) for v in value) + ")"
    return str(value)


def _plan_rows(p) -> dict[tuple[str, str], str]:
    rows = {("plan", str(q)): _value_text(v) for q, v in p.summary_rows()}
    rows[("plan", "layers")] = str(len(p.layers))
    rows[("plan", "drafter")] = p.drafter.text() if p.drafter is not None else "none"
    cols = ["kind", "layers", "block_size", "kernel_block_size", "page_bytes", "real_page_bytes",
            "padding_bytes", "dtype", "backend"]
    for rec in p.group_table.to_dict("records"):
        for col in cols:
            rows[(f"group {rec['group']}", col)] = _value_text(rec[col])
    return rows


def _page_map_rows(lay) -> dict[tuple[str, str], str]:
    rows = {("page map", q): _value_text(getattr(lay, q)) for q in PAGE_MAP_QUANTITIES}
    rows[("page map", "layer")] = f"{lay.layer} ({lay.label or lay.kind}, group {lay.group})"
    totals: dict[str, list[int]] = {}
    for seg in lay.segments:  # one row per kind of segment, however many kernel pages
        totals.setdefault(seg.kind, []).append(seg.size)
    for base, sizes in totals.items():
        each = f" ({len(sizes)} x {sizes[0]:,})" if len(sizes) > 1 and len(set(sizes)) == 1 else ""
        rows[("page map", f"{base} bytes")] = f"{sum(sizes):,}{each}"
    if lay.edited is not None:
        e = lay.edited
        rows[("page map", "edited view")] = (f"{list(e.shape)} {e.dtype}" if e.shape is not None else e.note)
    return rows


@dataclass(frozen=True)
class Comparison(Displayable):
    """Two :class:`ExplorerState` and their compared ``rows`` (plan, groups,
    then the page map); a side that cannot plan has no rows.  ``text()``
    (also its ``repr``) and ``_repr_html_()`` are its display forms
    (:data:`FORMS`); it has no figure."""

    a: ExplorerState
    b: ExplorerState
    rows: tuple[CompareRow, ...]

    @property
    def differences(self) -> tuple[CompareRow, ...]:
        return tuple(r for r in self.rows if r.differs)

    def row(self, quantity: str, section: str = "plan") -> CompareRow:
        for r in self.rows:
            if r.section == section and r.quantity == quantity:
                return r
        raise KVExploreError(f"no compared quantity {quantity!r} in section {section!r}; "
                             f"expected one of {sorted({r.quantity for r in self.rows if r.section == section})}")

    def labels(self) -> tuple[str, str]:
        """Short names of the sides: the controls where they differ."""
        ca, cb = self.a.controls, self.b.controls
        keys = [k for k in PLAN_CONTROLS if ca.get(k) != cb.get(k)] or ["model"]
        return (", ".join(f"{k}={ca[k]}" for k in keys), ", ".join(f"{k}={cb[k]}" for k in keys))

    def page_map_callouts(self) -> list[str]:
        """The page-map numbers that differ, as ``quantity: A -> B`` lines."""
        return [f"{r.quantity}: {r.a} (A) vs {r.b} (B)" for r in self.differences if r.section == "page map"]

    def __repr__(self) -> str:
        return self.text()


def comparison_text(c: Comparison) -> str:
    """``Comparison.text()``: the two sides' labels and errors, how many
    quantities differ, then every compared row (``*``: it differs)."""
    la, lb = c.labels()
    lines = [f"A: {la}", f"B: {lb}"]
    for side, st in (("A", c.a), ("B", c.b)):
        if st.error:
            lines.append(f"{side} error: {st.error}")
    lines.append(f"{len(c.differences)} of {len(c.rows)} compared quantities differ")
    for r in c.rows:
        mark = "*" if r.differs else " "
        lines.append(f"{mark} {r.section:<10} {r.quantity:<32} {r.a:<24} {r.b}")
    return "\n".join(lines)


def comparison_html(c: Comparison) -> str:
    """``Comparison._repr_html_()``: each side's page bars, then the table."""
    lays = (_page_layout_of(c.a), _page_layout_of(c.b))
    return html.comparison_html(c, *("" if lay is None else html.page_bars_html(lay) for lay in lays))


def _page_layout_of(st: ExplorerState):
    if st.plan is None:
        return None
    try:
        return edited_layout(st.plan, *st._view(), st.controls["registration"])
    except ValueError:
        return None


def _compared_rows(st: ExplorerState) -> dict[tuple[str, str], str]:
    rows = _plan_rows(st.plan) if st.plan is not None else {}
    lay = _page_layout_of(st)
    if lay is not None:
        rows.update(_page_map_rows(lay))
    return rows


def compare(a_controls: Mapping[str, Any] | ExplorerState,
            b_controls: Mapping[str, Any] | ExplorerState | None = None,
            **b_changes: Any) -> Comparison:
    """Two settings side by side, each Explorer controls or an
    :class:`ExplorerState` (used as is); B's controls are A's updated with
    ``b_controls`` and ``b_changes``.

    >>> c = compare({"model": "Qwen/Qwen3.5-0.8B", "gpu": "A100"}, gpu="H100")
    >>> c.row("block_size")
    CompareRow(section='plan', quantity='block_size', a='544', b='576')
    >>> c.row("tensor_parallel_size").differs
    False
    """
    def state(controls, name="a_controls") -> ExplorerState:
        if isinstance(controls, ExplorerState):
            return controls
        if not isinstance(controls, Mapping):
            raise KVExploreError(
                f"{name} is a {type(controls).__name__} ({controls!r:.60}); expected a mapping of "
                f"Explorer controls ({', '.join(CONTROL_DEFAULTS)}) or an ExplorerState"
            )
        controls = dict(controls)
        model = controls.pop("model", DEFAULT_MODEL)
        return ExplorerState(model, **controls)

    a = state(a_controls)
    if b_controls is None or isinstance(b_controls, Mapping):
        b_controls = {**a.controls, **(b_controls or {}), **b_changes}
    b = state(b_controls, "b_controls")
    ra, rb = _compared_rows(a), _compared_rows(b)
    keys = list(dict.fromkeys([*ra, *rb]))
    rows = tuple(CompareRow(sec, q, ra.get((sec, q), "-"), rb.get((sec, q), "-")) for sec, q in keys)
    return Comparison(a, b, rows)


#: ``Comparison`` -> its ``(text, html, figure)`` forms, registered here,
#: where the type is defined (:func:`kvexplore.display.register_forms`).
FORMS = {Comparison: (comparison_text, comparison_html, None)}
register_forms(FORMS)


__all__ = [
    "CONTROL_DEFAULTS",
    "describe_error",
    "CompareRow",
    "Comparison",
    "ExplorerState",
    "PANELS",
    "CUDAGRAPH_MODES",
    "EXPLORED_KEYWORDS",
    "PLAN_CONTROLS",
    "Panel",
    "VIEW_CONTROLS",
    "choices",
    "compare",
    "figure_png",
]
