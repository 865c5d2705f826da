"""The Explorer's logic in plain Python: controls -> plan -> panels.

:class:`ExplorerState` holds the control values (what the widget's controls
show), builds the plan with :func:`kvexplore.plan` and renders every panel to
text and HTML.  :mod:`kvexplore.explorer.widgets` is a thin ipywidgets layer over it;
tests drive this class (or the widget's controls) without a browser.

Why a separate class: the widget must never show a traceback and must stay
usable after a bad value, and each control change must cost well under 100 ms.
So every user error (``KVExploreError``, a ``ValueError``) becomes a message
in the ``status`` panel, panels are memoised by exactly the inputs they read
(the page map by ``(plan, layer, block, registration)``, the summary by the
plan alone ...), and :meth:`ExplorerState.set` reports which panels changed so
the widget re-renders only those.

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
>>> s.error.startswith("tensor_parallel_size=3")
True
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.planning.gpus import DEFAULT_GPU
from kvexplore.planning.models import DEFAULT_MODEL

#: Controls and their defaults ("auto" = let vLLM choose).
CONTROL_DEFAULTS: dict[str, Any] = {
    "model": DEFAULT_MODEL,
    "gpu": DEFAULT_GPU,
    "tensor_parallel_size": 1,
    "decode_context_parallel_size": 1,
    "block_size": "auto",
    "kv_cache_dtype": "auto",
    "dtype": "auto",
    "attention_backend": "auto",
    "mamba_cache_mode": "auto",
    "enable_prefix_caching": "auto",
    "registration": "unified",
    "layer": 0,
    "block": 0,
}

#: Controls that change the plan (the rest only pick what to look at).
PLAN_CONTROLS = (
    "model",
    "gpu",
    "tensor_parallel_size",
    "decode_context_parallel_size",
    "block_size",
    "kv_cache_dtype",
    "dtype",
    "attention_backend",
    "mamba_cache_mode",
    "enable_prefix_caching",
)

PANELS = ("status", "summary", "memory", "page_map", "edits", "offload", "live")

#: Blocks exercised by the live round-trip on CPU (all blocks on CUDA): a
#: CPU round-trip of all 16 blocks of Qwen3.5-0.8B takes about 10 s.
CPU_ROUNDTRIP_BLOCKS = 2
#: The live panel refuses CPU allocations above this many bytes.
MAX_CPU_ALLOCATION = 8 << 30


@dataclass(frozen=True)
class Panel:
    """One panel's rendered state: ``text`` (deterministic; tests and nbval
    compare it), ``html`` (what the widget shows), ``ok`` (False for a
    message in place of content)."""

    name: str
    text: str
    html: str
    ok: bool = True


def _message_panel(name: str, text: str, level: str = "error") -> Panel:
    from kvexplore.rendering.html import message_html

    return Panel(name, text, message_html(text, level), ok=False)


def choices() -> dict[str, list]:
    """Options for the dropdown controls, from kvexplore's and vLLM's lists."""
    from typing import get_args

    from vllm.config.cache import CacheDType

    from kvexplore.planning.backends import COMMON_BACKENDS
    from kvexplore.planning.gpus import gpus
    from kvexplore.planning.models import catalog_names
    from kvexplore.planning.planner import MAMBA_CACHE_MODES, MODEL_DTYPES
    from kvexplore.registration import REGISTRATIONS

    return {
        "model": catalog_names(),
        "gpu": gpus().gpu.tolist(),
        "kv_cache_dtype": list(get_args(CacheDType)),
        "dtype": list(MODEL_DTYPES),
        "attention_backend": ["auto", *COMMON_BACKENDS],
        "enable_prefix_caching": ["auto", True, False],
        "mamba_cache_mode": ["auto", *MAMBA_CACHE_MODES],
        "registration": list(REGISTRATIONS),
        "block_size": ["auto", "16", "32", "64", "128", "256", "544", "1088"],
    }


def _as_int(name: str, value: Any, *, auto: bool = False) -> int | None:
    """``'544'`` -> 544; ``'auto'``/``''``/None -> None when ``auto``."""
    if auto and (value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto"))):
        return None
    minimum = 0 if name in ("layer", "block") else 1
    parsed: int | None = None
    if isinstance(value, int) and not isinstance(value, bool):
        parsed = value
    elif isinstance(value, str) and value.strip().lstrip("-").isdigit():
        parsed = int(value.strip())
    if parsed is None or parsed < minimum:
        allowed = f"an integer >= {minimum}"
        if auto:
            allowed = "'auto' or " + allowed
        raise KVExploreError(f"{name}={value!r} is invalid; expected {allowed}")
    return parsed


class ExplorerState:
    """Controls -> plan -> panels, without any widget.

    ``set(**changes)`` applies control changes and returns the names of the
    panels whose content changed.  ``panels[name]`` is a :class:`Panel`;
    ``error`` is the last user error (None when the controls are valid);
    ``plan`` the current plan (None after an error that prevents planning).
    """

    def __init__(self, model: Any = DEFAULT_MODEL, **controls: Any) -> None:
        unknown = [k for k in controls if k not in CONTROL_DEFAULTS]
        if unknown:
            raise KVExploreError(
                f"unknown Explorer control(s) {unknown}; expected {list(CONTROL_DEFAULTS)}"
            )
        self.controls: dict[str, Any] = {**CONTROL_DEFAULTS, **controls, "model": model}
        self.panels: dict[str, Panel] = {}
        self.error: str | None = None
        self.note: str | None = None
        self.plan = None
        self._memo: OrderedDict = OrderedDict()
        self._lock = threading.Lock()
        self._live_key = None
        self.refresh()

    # -- control handling ----------------------------------------------------
    def set(self, **changes: Any) -> tuple[str, ...]:
        """Apply control changes; return the panels that changed (in PANELS order)."""
        unknown = [k for k in changes if k not in CONTROL_DEFAULTS]
        if unknown:
            raise KVExploreError(
                f"unknown Explorer control(s) {unknown}; expected {list(CONTROL_DEFAULTS)}"
            )
        self.controls.update(changes)
        return self.refresh()

    def plan_kwargs(self) -> dict[str, Any]:
        """``kvexplore.plan`` keywords from the controls (raises on bad values)."""
        c = self.controls
        mode = c["mamba_cache_mode"]
        backend = c["attention_backend"]
        caching = c["enable_prefix_caching"]
        return {
            "gpu": c["gpu"],
            "tensor_parallel_size": _as_int("tensor_parallel_size", c["tensor_parallel_size"]),
            "decode_context_parallel_size": _as_int(
                "decode_context_parallel_size", c["decode_context_parallel_size"]
            ),
            "block_size": _as_int("block_size", c["block_size"], auto=True),
            "kv_cache_dtype": c["kv_cache_dtype"],
            "dtype": c["dtype"],
            "attention_backend": None if backend in (None, "auto") else backend,
            "mamba_cache_mode": None if mode in (None, "auto") else mode,
            "enable_prefix_caching": None if caching in (None, "auto") else caching,
        }

    def _memoised(self, key: tuple, build: Callable[[], Any]) -> Any:
        """Memoise a panel by ``key``; ``key[1]`` is ``id(plan)`` and the plan
        object itself is kept with the value, so a recycled id never hits."""
        plan = self.plan
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and hit[0] is plan:
                self._memo.move_to_end(key)
                return hit[1]
        value = build()
        with self._lock:
            self._memo[key] = (plan, value)
            while len(self._memo) > 256:
                self._memo.popitem(last=False)
        return value

    def refresh(self) -> tuple[str, ...]:
        """Recompute every panel from the controls; return the changed ones."""
        before = dict(self.panels)
        new: dict[str, Panel] = {}
        self.error = None
        self.note = None
        try:
            self.plan = self._plan()
        except Exception as exc:  # user errors and anything vLLM raised
            self.plan = None
            self.error = _describe_error(exc)
            msg = f"no plan: {self.error}"
            for name in PANELS[1:]:
                new[name] = _message_panel(name, msg, "warning")
            new["status"] = _message_panel("status", self.error)
            return self._commit(before, new)
        p = self.plan
        new["summary"] = self._memoised(("summary", id(p)), lambda: _summary_panel(p))
        new["memory"] = self._memoised(("memory", id(p)), lambda: _memory_panel(p))
        new["offload"] = self._memoised(("offload", id(p)), lambda: _offload_panel(p))
        registration = self.controls["registration"]
        try:
            new["edits"] = self._memoised(("edits", id(p), registration), lambda: _edits_panel(p, registration))
        except Exception as exc:
            self.error = _describe_error(exc)
            new["edits"] = _message_panel("edits", self.error)
        try:
            layer = self._layer()
            block = _as_int("block", self.controls["block"])
            key = ("page_map", id(p), layer, block, registration)
            new["page_map"] = self._memoised(key, lambda: _page_map_panel(p, layer, block, registration))
        except Exception as exc:
            self.error = _describe_error(exc)
            new["page_map"] = _message_panel("page_map", self.error)
        live_key = (id(p), registration)
        if self._live_key == live_key and "live" in before:
            new["live"] = before["live"]
        else:
            new["live"] = Panel("live", "live tensors: not run for this configuration (press Run)",
                                _live_idle_html(), ok=True)
        if self.error:
            new["status"] = _message_panel("status", self.error)
        else:
            text = f"{p!r}" + (f"\n{self.note}" if self.note else "")
            from kvexplore.rendering.html import message_html

            new["status"] = Panel("status", text, message_html(text, "info"))
        return self._commit(before, new)

    def _commit(self, before: dict[str, Panel], new: dict[str, Panel]) -> tuple[str, ...]:
        self.panels = new
        return tuple(n for n in PANELS if before.get(n) != new.get(n))

    def _plan(self):
        from kvexplore.planning.planner import plan

        kwargs = self.plan_kwargs()
        model = self.controls["model"]
        if isinstance(model, str) and not model.strip():
            raise KVExploreError("model='' is empty; expected a catalog id or a path to a config.json")
        return plan(model.strip() if isinstance(model, str) else model, **kwargs)

    def _layer(self) -> int:
        """Position of the layer control's value: an int position, its text, or a layer name."""
        from kvexplore.rendering.layouts import resolve_layer

        layer = self.controls["layer"]
        if isinstance(layer, str) and layer.strip().lstrip("-").isdigit():
            layer = int(layer.strip())
        pos, _ = resolve_layer(self.plan, layer)
        return pos

    def layer_options(self) -> list[tuple[str, int]]:
        """``(label, position)`` per KV-cache layer of the current plan."""
        if self.plan is None:
            return []
        return [(f"{i}: {info.name} ({info.kind})", i) for i, info in enumerate(self.plan.layers)]

    # -- figures (on demand; the widget draws them only when asked) -----------
    def page_map_figure(self):
        """Matplotlib page map for the current controls, or None after an error."""
        if self.plan is None or not self.panels.get("page_map", Panel("", "", "", False)).ok:
            return None
        from kvexplore.rendering.layouts import page_map

        return page_map(self.plan, self._layer(), block=_as_int("block", self.controls["block"]),
                        registration=self.controls["registration"], edited=True)

    # -- live tensors --------------------------------------------------------
    def run_live(self, device: str | None = None, *, blocks: Any = "default") -> Panel:
        """Allocate the registered caches, apply the edits, ``verify_roundtrip``.

        ``device`` None: CUDA when available, else CPU.  ``blocks``: the block
        ids to exercise; ``"default"`` means all on CUDA and the first
        :data:`CPU_ROUNDTRIP_BLOCKS` on CPU.  The result replaces the ``live``
        panel (an error becomes its message) and is returned.
        """
        try:
            panel = self._run_live(device, blocks)
        except Exception as exc:
            panel = _message_panel("live", f"live tensors failed: {_describe_error(exc)}")
        if self.plan is not None:
            self._live_key = (id(self.plan), self.controls["registration"])
        self.panels = {**self.panels, "live": panel}
        return panel

    def _run_live(self, device, blocks) -> Panel:
        import torch

        if self.plan is None:
            raise KVExploreError(f"no plan to allocate: {self.error}")
        p = self.plan
        registration = self.controls["registration"]
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        total = max((t.offset + t.size for t in p.kv_cache_config.kv_cache_tensors), default=0)
        if str(device).startswith("cpu") and total > MAX_CPU_ALLOCATION:
            raise KVExploreError(
                f"the KV cache of this plan is {total:,} B; the live panel allocates at most "
                f"{MAX_CPU_ALLOCATION:,} B on CPU (run on a CUDA machine, or lower num_blocks)"
            )
        try:
            from kvexplore.editing.roundtrip import verify_roundtrip
            from kvexplore.editing.rules import apply_kv_cache_group_edits
        except ImportError as exc:
            raise KVExploreError(f"live round-trip unavailable: {exc}") from None
        caches = p.allocate(device, registration=registration)
        edited = apply_kv_cache_group_edits(p.kv_cache_config, caches, kv_layout=p.kv_cache_layout.name)
        if blocks == "default":
            blocks = None if str(device).startswith("cuda") else list(range(min(CPU_ROUNDTRIP_BLOCKS, p.num_blocks)))
        report = verify_roundtrip(p.kv_cache_config, caches, edited, blocks=blocks)
        table = report.table
        cols = [c for c in ("group", "layer", "regions", "blocks", "bytes", "ok", "detail") if c in table.columns]
        device_type = torch.device(device).type
        verdict = "OK" if report.ok else f"FAILED on {len(report.failures())} layer(s)"
        chosen = "all blocks" if blocks is None else f"blocks {list(blocks)}"
        head = (f"round-trip {verdict}: {len(table)} layers, {report.bytes_checked:,} bytes "
                f"on {device_type} ({registration}, {chosen})")
        text = head + "\n" + (table[cols].to_string(index=False) if len(table) else "(no layers)")
        from kvexplore.rendering.html import message_html, table_html

        html = message_html(head, "info" if report.ok else "error") + table_html(table[cols])
        del caches, edited
        return Panel("live", text, html, ok=bool(report.ok))


def _describe_error(exc: BaseException) -> str:
    if isinstance(exc, ValueError):
        return str(exc)
    return f"unexpected {type(exc).__name__}: {exc} (please report this)"


def _live_idle_html() -> str:
    from kvexplore.rendering.html import message_html

    return message_html(
        "live tensors: not run for this configuration. Run allocates the registered "
        "caches (CUDA if available, else CPU), applies the edits and runs verify_roundtrip.",
        "info",
    )


# ---------------------------------------------------------------------------
# Panel renderers (pure functions of the plan and view controls)
# ---------------------------------------------------------------------------


def _summary_panel(p) -> Panel:
    from kvexplore.rendering.html import plan_html

    rows = "\n".join(f"  {q}: {v}" for q, v in zip(p.summary["quantity"], p.summary["value"], strict=True))
    text = f"{p!r}\n{rows}\nderivation:\n" + "\n".join(f"  {line}" for line in p.explain().splitlines())
    return Panel("summary", text, plan_html(p))


def _memory_panel(p) -> Panel:
    from kvexplore.rendering.html import pairs_html, table_html

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
    return Panel("memory", text, pairs_html(pairs) + table_html(gt[cols]))


def _page_map_panel(p, layer: int, block: int, registration: str) -> Panel:
    from kvexplore.rendering.html import page_layout_html
    from kvexplore.rendering.layouts import page_layout

    lay = page_layout(p, layer, block=block, registration=registration, edited=True)
    return Panel("page_map", lay.text(), page_layout_html(lay))


def _edits_panel(p, registration: str) -> Panel:
    from kvexplore.rendering.html import message_html, table_html

    parts_text: list[str] = []
    parts_html: list[str] = []
    try:
        from kvexplore.editing.validation import check_kv_cache_groups

        verdicts = check_kv_cache_groups(p.kv_cache_config)
        parts_text.append("validation:\n" + verdicts.to_string(index=False))
        parts_html.append("<p><b>validation</b></p>" + table_html(verdicts))
    except ImportError as exc:
        msg = f"validation unavailable: kvexplore.editing.validation could not be imported ({exc})"
        parts_text.append(msg)
        parts_html.append(message_html(msg, "warning"))
    try:
        from kvexplore.editing.plan_edits import plan_edits

        result = plan_edits(p, registration)
        cols = ["group", "layer", "kind", "rule", "shape_before", "shape_after", "stride_after", "declined"]
        report = result.report[[c for c in cols if c in result.report.columns]]
        summary = result.summary() if hasattr(result, "summary") else f"{len(result)} layers"
        parts_text.append(f"edits ({registration}): {summary}\n" + report.to_string(index=False))
        parts_html.append(f"<p><b>edits ({registration})</b>: {_esc(summary)}</p>" + table_html(report))
        ok = True
    except ValueError as exc:
        msg = f"edits ({registration}) rejected: {exc}"
        parts_text.append(msg)
        parts_html.append(message_html(msg))
        ok = False
    return Panel("edits", "\n".join(parts_text), "".join(parts_html), ok=ok)


def _esc(text: str) -> str:
    from html import escape

    return escape(text)


def _offload_panel(p) -> Panel:
    from kvexplore.rendering.html import message_html, pre_html

    try:
        from kvexplore.offloading.config import offload_config
    except ImportError as exc:
        msg = f"offloading config unavailable: kvexplore.offloading.config could not be imported ({exc})"
        return Panel("offload", msg, message_html(msg, "warning"), ok=False)
    try:
        result = offload_config(p)
    except ValueError as exc:
        msg = f"vLLM's build_offloading_config rejects this plan: {exc}"
        return Panel("offload", msg, message_html(msg), ok=False)
    # The config names the materialised config directory (a temp path): hide it
    # so the text form is the same on every run.
    where = str(p.model.config_dir)
    text = f"{result!r}\n{result.explain()}".replace(where, "<config_dir>")
    return Panel("offload", text, pre_html(text))


__all__ = ["CONTROL_DEFAULTS", "ExplorerState", "PANELS", "PLAN_CONTROLS", "Panel", "choices"]
