"""A vLLM start-up log, read: every figure it states, each with its line.

:func:`read_log` takes a log's text (or a path to it) and returns a frozen
:class:`VllmLog`.  It knows the lines vLLM prints while it starts an engine,
across releases:

* the engine banner (``v1/engine/core.py``: ``Initializing a V1 LLM engine
  (v0.31.0) with config: model='...', dtype=torch.bfloat16,
  max_seq_len=262144, tensor_parallel_size=8, ...``; V0's ``Initializing an
  LLM engine (v0.5.4) with config``), the API server's ``non-default args:
  {...}`` and its logo's ``version 0.19.0`` / ``model ...``;
* memory: ``Model loading took X GiB memory`` (``gpu_model_runner.load_model``;
  older ``Loading model weights took X GB``, which vLLM prints as bytes /
  2**30), ``Available KV cache memory: X GiB`` (``gpu_worker.py:
  determine_available_memory``), the older breakdown (``total_gpu_memory (..)
  x gpu_memory_utilization (..) = ..``; ``model weights take ..;
  non_torch_memory takes ..; PyTorch activation peak memory takes ..; the rest
  of the memory reserved for KV Cache is ..``), V0's ``Memory profiling
  results: total_gpu_memory=.. peak_torch_memory=.. non_torch_memory=..
  kv_cache_size=..``, ``Estimated CUDA graph memory: X GiB total``,
  ``Graph capturing finished in N secs, took X GiB`` and ``The current
  --gpu-memory-utilization=0.9000 is equivalent to
  --gpu-memory-utilization=0.8874 ...``;
* layout: ``Setting attention block size to N tokens``, ``Padding mamba page
  size by P%``, ``kv cache group sizes (...)``, ``kv lcm block sizes N``,
  ``Using X backend`` / ``Using X attention backend out of potential
  backends``, ``Using BLHNC KV cache layout``, ``Add N padding layers, may
  waste at most P% KV cache memory``;
* capacity: ``GPU KV cache size: N tokens`` and ``Maximum concurrency for L
  tokens per request: Cx`` (one line from 0.31, two before), ``# GPU blocks:
  N``, and a refusal's ``the estimated maximum model length is N``;
* the card: ``NVIDIA H200 (139.81 GiB)``.

Timestamps, process prefixes (``(EngineCore_DP0 pid=123)``, ``[rank0]:``,
``(Worker_TP1 pid=..)``, journald's ``host python3[pid]:``), ANSI colours and
interleaved workers are tolerated: a figure is found wherever it sits in a
line.  Numbers are read strictly: thousands separators in groups of three,
the unit as printed (GiB, or vLLM's ``GB``), a concurrency only with its ``x``.
A line that names a figure but does not carry a readable value (a paste cut
off mid-line) is listed in :attr:`VllmLog.unread`; two different values for
one figure are listed in :attr:`VllmLog.contradictions` and never averaged.

>>> log = read_log("GPU KV cache size: 2,631,546 tokens, Maximum concurrency for "
...                "262,144 tokens per request: 10.04x")
>>> log.get("kv_cache_size_tokens"), log.get("max_concurrency"), log.get("max_model_len")
(2631546, 10.04, 262144)
"""

from __future__ import annotations

import ast
import os
import pathlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import pandas as pd

from kvexplore.display import Displayable
from kvexplore.errors import KVExploreError
from kvexplore.layout import FrozenDict, GiB
from kvexplore.logs.figures import ARG_KEYS, BANNER_KEYS, DEPLOYMENT, FIGURES


@dataclass(frozen=True)
class LogFigure:
    """One figure as one line states it.

    ``value`` is normalised (bytes as ``int``, tokens as ``int``, fractions and
    percentages as ``float``, names as ``str``); ``text`` is the value as
    printed; ``resolution`` is half a unit of the last printed digit (bytes
    for a ``GiB`` figure, else in the value's unit; 0 when exact);
    ``line`` is 1-based; ``process`` is the line's process tag
    (``EngineCore_DP0 pid=123``, ``Worker_TP1 pid=7``, ``rank0``) or None;
    ``where`` says which vLLM line stated it."""

    name: str
    value: Any
    text: str
    line: int
    source: str = field(repr=False)
    process: str | None = None
    where: str = ""
    resolution: float = 0.0


# ---------------------------------------------------------------------------
# numbers, read strictly
# ---------------------------------------------------------------------------

_INT = r"(?<![\d,.])(?:\d{1,3}(?:,\d{3})+|\d+)(?!\d)(?!,\d)(?!\.\d)"
_DEC = r"\d+(?:\.\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")
_PROCESS = re.compile(
    r"\((?P<tag>[A-Za-z][\w.]*(?: rank=\d+)?(?: pid=\d+)?(?:, ip=[\d.]+)?)\)|\[(?P<rank>rank\d+)\]:"
)


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def _decimals_half(text: str) -> float:
    """Half a unit of the last printed digit of ``text`` (``"28.98"`` -> 0.005)."""
    digits = len(text.split(".")[1]) if "." in text else 0
    return 0.5 * 10.0**-digits


def _gib(text: str) -> tuple[int, float]:
    """Bytes and resolution (bytes) of a figure printed in GiB."""
    return round(float(text) * GiB), _decimals_half(text) * GiB


# ---------------------------------------------------------------------------
# line rules: (regex, handler) -> figures
# ---------------------------------------------------------------------------

Found = list[tuple[str, Any, str, float]]  # (name, value, text, resolution)


def _memory(name: str, group: str = "x") -> Callable[[re.Match], Found]:
    def handle(m: re.Match) -> Found:
        value, res = _gib(m[group])
        return [(name, value, m[group] + " GiB", res)]

    return handle


def _weights_gb(m: re.Match) -> Found:
    value, res = _gib(m["x"])
    return [("weight_bytes", value, m["x"] + " GB (vLLM's bytes / 2**30)", res)]


def _breakdown_total(m: re.Match) -> Found:
    total, total_res = _gib(m["total"])
    requested, req_res = _gib(m["req"])
    return [
        ("total_memory_bytes", total, m["total"] + "GiB", total_res),
        (
            "gpu_memory_utilization",
            float(m["util"]),
            m["util"],
            _decimals_half(m["util"]),
        ),
        ("requested_memory_bytes", requested, m["req"] + "GiB", req_res),
    ]


def _breakdown_terms(m: re.Match) -> Found:
    out = []
    for name, group in (
        ("weight_bytes", "w"),
        ("non_torch_bytes", "nt"),
        ("activation_peak_bytes", "act"),
        ("kv_cache_memory_bytes", "kv"),
    ):
        value, res = _gib(m[group])
        out.append((name, value, m[group] + "GiB", res))
    return out


_V0_PROFILE_KEYS = {
    "total_gpu_memory": "total_memory_bytes",
    "peak_torch_memory": "peak_torch_bytes",
    "non_torch_memory": "non_torch_bytes",
    "kv_cache_size": "kv_cache_memory_bytes",
}


def _v0_profile(m: re.Match) -> Found:
    out: Found = []
    for key, x in re.findall(r"(\w+)=(" + _DEC + r")GiB", m[0]):
        if key in _V0_PROFILE_KEYS:
            value, res = _gib(x)
            out.append((_V0_PROFILE_KEYS[key], value, x + "GiB", res))
    util = re.search(r"gpu_memory_utilization=(" + _DEC + r")", m[0])
    if util:
        out.append(
            ("gpu_memory_utilization", float(util[1]), util[1], _decimals_half(util[1]))
        )
    return out


def _equivalent(m: re.Match) -> Found:
    out = [
        ("gpu_memory_utilization", float(m["cur"]), m["cur"], _decimals_half(m["cur"])),
        ("equivalent_utilization", float(m["eq"]), m["eq"], _decimals_half(m["eq"])),
    ]
    if m["sug"]:
        out.append(
            (
                "suggested_utilization",
                float(m["sug"]),
                m["sug"],
                _decimals_half(m["sug"]),
            )
        )
    return out


def _free_memory(m: re.Match) -> Found:
    out = []
    total, res = _gib(m["total"])
    out.append(("total_memory_bytes", total, m["total"] + " GiB", res))
    out.append(
        (
            "gpu_memory_utilization",
            float(m["util"]),
            m["util"],
            _decimals_half(m["util"]),
        )
    )
    for name, group in (
        ("requested_memory_bytes", "req"),
        ("activation_peak_bytes", "act"),
        ("cudagraph_bytes", "cg"),
        ("kv_cache_memory_bytes", "kv"),
    ):
        if m[group]:
            value, r = _gib(m[group])
            out.append((name, value, m[group] + " GiB", r))
    return out


def _group_sizes(m: re.Match) -> Found:
    sizes = tuple(int(s) for s in re.findall(r"\d+", m["sizes"]))
    return [("kv_cache_group_block_sizes", sizes, m["sizes"], 0.0)]


def _capacity_tokens(m: re.Match) -> Found:
    return [("kv_cache_size_tokens", _int(m["n"]), m["n"], 0.0)]


def _concurrency(m: re.Match) -> Found:
    return [
        ("max_model_len", _int(m["len"]), m["len"], 0.0),
        ("max_concurrency", float(m["c"]), m["c"] + "x", _decimals_half(m["c"])),
    ]


def _refusal(m: re.Match) -> Found:
    out: Found = [("max_model_len", _int(m["len"]), m["len"], 0.0)]
    needed, res = _gib(m["need"])
    out.append(("needed_kv_cache_bytes", needed, m["need"] + " GiB", res))
    avail, res = _gib(m["avail"])
    out.append(("kv_cache_memory_bytes", avail, m["avail"] + " GiB", res))
    if m["est"]:
        out.append(("estimated_max_model_len", _int(m["est"]), m["est"], 0.0))
    return out


def _simple(
    name: str,
    conv: Callable[[str], Any] = _int,
    suffix: str = "",
    resolution: Callable[[str], float] | None = None,
) -> Callable[[re.Match], Found]:
    def handle(m: re.Match) -> Found:
        return [
            (
                name,
                conv(m["x"]),
                m["x"] + suffix,
                resolution(m["x"]) if resolution else 0.0,
            )
        ]

    return handle


def _padding_layers(m: re.Match) -> Found:
    return [
        ("padding_layers", int(m["n"]), m["n"], 0.0),
        (
            "padding_layers_waste_percent",
            float(m["p"]),
            m["p"] + "%",
            _decimals_half(m["p"]),
        ),
    ]


def _gpu_card(m: re.Match) -> Found:
    total, res = _gib(m["mem"])
    return [
        ("gpu_name", m["name"].strip(), m["name"].strip(), 0.0),
        ("total_memory_bytes", total, m["mem"] + " GiB", res),
    ]


def _logo(m: re.Match) -> Found:
    name = "vllm_version" if m["key"] == "version" else "model"
    return [(name, m["val"], m["val"], 0.0)]


@dataclass(frozen=True)
class LineRule:
    """How one kind of vLLM line is read: ``where`` names the line,
    ``keyword`` is the words that name its figures (None when the value is
    the phrase itself: a backend's, a layout's or a card's name, the logo),
    ``pattern`` matches the line with its values and ``read`` turns a match
    into ``(figure, value, text, resolution)`` tuples."""

    where: str
    keyword: str | None
    pattern: re.Pattern
    read: Callable[[re.Match], Found]


#: Every line rule, in the order a line is tried.
RULES: tuple[LineRule, ...] = (
    LineRule(
        "Model loading took",
        "Model loading took",
        re.compile(r"Model loading took (?P<x>" + _DEC + r") ?GiB"),
        _memory("weight_bytes"),
    ),
    LineRule(
        "Loading model weights took",
        "Loading model weights took",
        re.compile(r"Loading model weights took (?P<x>" + _DEC + r") ?GB\b"),
        _weights_gb,
    ),
    LineRule(
        "Available KV cache memory",
        "Available KV cache memory",
        re.compile(r"Available KV cache memory: (?P<x>" + _DEC + r") ?GiB"),
        _memory("kv_cache_memory_bytes"),
    ),
    LineRule(
        "total_gpu_memory x gpu_memory_utilization",
        "total_gpu_memory",
        re.compile(
            r"total_gpu_memory \((?P<total>"
            + _DEC
            + r") ?GiB\) x gpu_memory_utilization \((?P<util>"
            + _DEC
            + r")\) = (?P<req>"
            + _DEC
            + r") ?GiB"
        ),
        _breakdown_total,
    ),
    LineRule(
        "model weights take ...",
        "model weights take",
        re.compile(
            r"model weights take (?P<w>"
            + _DEC
            + r") ?GiB; non_torch_memory takes (?P<nt>"
            + _DEC
            + r") ?GiB; PyTorch activation peak memory takes (?P<act>"
            + _DEC
            + r") ?GiB; the rest of "
            r"the memory reserved for KV Cache is (?P<kv>" + _DEC + r") ?GiB"
        ),
        _breakdown_terms,
    ),
    LineRule(
        "Memory profiling results",
        "Memory profiling results",
        re.compile(r"Memory profiling results: .*kv_cache_size=" + _DEC + r"GiB.*"),
        _v0_profile,
    ),
    LineRule(
        "Free memory on device",
        "Free memory on device",
        re.compile(
            r"Free memory on device \("
            + _DEC
            + r"/(?P<total>"
            + _DEC
            + r") GiB\) on startup\. Desired "
            r"GPU memory utilization is \((?P<util>"
            + _DEC
            + r"), (?P<req>"
            + _DEC
            + r") GiB\)\. .*?"
            r"(?P<act>"
            + _DEC
            + r") GiB for peak activation, and (?P<cg>"
            + _DEC
            + r") GiB for "
            r"CUDAGraph memory\..*?Current kv cache memory in use is (?P<kv>"
            + _DEC
            + r") GiB"
        ),
        _free_memory,
    ),
    LineRule(
        "Estimated CUDA graph memory",
        "Estimated CUDA graph memory",
        re.compile(r"Estimated CUDA graph memory: (?P<x>" + _DEC + r") ?GiB"),
        _memory("cudagraph_bytes"),
    ),
    LineRule(
        "Graph capturing finished",
        "Graph capturing finished",
        re.compile(
            r"Graph capturing finished in \d+ secs?, took (?P<x>" + _DEC + r") ?GiB"
        ),
        _memory("cudagraph_capture_bytes"),
    ),
    LineRule(
        "is equivalent to --gpu-memory-utilization",
        "is equivalent to",
        re.compile(
            r"--gpu-memory-utilization=(?P<cur>"
            + _DEC
            + r") is equivalent to --gpu-memory-utilization="
            r"(?P<eq>"
            + _DEC
            + r")(?:.*?increase --gpu-memory-utilization to (?P<sug>"
            + _DEC
            + r")(?!\d))?"
        ),
        _equivalent,
    ),
    LineRule(
        "Setting attention block size",
        "Setting attention block size",
        re.compile(
            r"(?<!\[XPU\])Setting attention block size to (?P<x>" + _INT + r") tokens"
        ),
        _simple("attention_block_size"),
    ),
    LineRule(
        "Padding mamba page size",
        "Padding mamba page size",
        re.compile(r"Padding mamba page size by (?P<x>" + _DEC + r")%"),
        _simple("mamba_padding_percent", float, "%", _decimals_half),
    ),
    LineRule(
        "kv cache group sizes",
        "kv cache group sizes",
        re.compile(
            r"kv cache group sizes (?P<sizes>[\(\[]\s*\d+(?:\s*,\s*\d+)*\s*,?\s*[\)\]])"
        ),
        _group_sizes,
    ),
    LineRule(
        "kv lcm block sizes",
        "kv lcm block sizes",
        re.compile(r"kv lcm block sizes (?P<x>" + _INT + r")"),
        _simple("kv_lcm_block_size"),
    ),
    LineRule(
        "Using X backend",
        None,
        re.compile(
            r"Using (?P<x>[A-Z][A-Z0-9_]+) (?:attention )?backend(?: out of potential backends|\b)"
        ),
        _simple("attention_backend", str),
    ),
    LineRule(
        "Using X KV cache layout",
        "KV cache layout",
        re.compile(r"Using (?P<x>[A-Z]{3,5}) KV cache layout"),
        _simple("kv_cache_layout", str),
    ),
    LineRule(
        "Add N padding layers",
        "padding layers",
        re.compile(
            r"Add (?P<n>\d+) padding layers?, may waste at most (?P<p>" + _DEC + r")%"
        ),
        _padding_layers,
    ),
    LineRule(
        "GPU KV cache size",
        "KV cache size:",
        re.compile(r"GPU KV cache size: (?P<n>" + _INT + r") tokens"),
        _capacity_tokens,
    ),
    LineRule(
        "Maximum concurrency for",
        "Maximum concurrency",
        re.compile(
            r"Maximum concurrency for (?P<len>"
            + _INT
            + r") tokens per request: (?P<c>"
            + _DEC
            + r")x"
        ),
        _concurrency,
    ),
    LineRule(
        "# GPU blocks",
        "GPU blocks:",
        re.compile(r"(?:#\s*)?GPU blocks: (?P<x>" + _INT + r")"),
        _simple("num_gpu_blocks"),
    ),
    LineRule(
        "Using max model len",
        "Using max model len",
        re.compile(r"Using max model len (?P<x>" + _INT + r")"),
        _simple("max_model_len"),
    ),
    LineRule(
        "Chunked prefill is enabled",
        "Chunked prefill is enabled",
        re.compile(
            r"Chunked prefill is enabled with max_num_batched_tokens=(?P<x>"
            + _INT
            + r")"
        ),
        _simple("max_num_batched_tokens"),
    ),
    LineRule(
        "To serve at least one request",
        "KV cache is needed",
        re.compile(
            r"max seq len \((?P<len>"
            + _INT
            + r")\), \((?P<need>"
            + _DEC
            + r") GiB KV cache is needed, "
            r"which is larger than the available KV cache memory \((?P<avail>"
            + _DEC
            + r") GiB\)\."
            r"(?: Based on the available memory, the estimated maximum model length is (?P<est>"
            + _INT
            + r")\.)?"
        ),
        _refusal,
    ),
    LineRule(
        "the card",
        None,
        re.compile(
            r"(?P<name>NVIDIA [A-Za-z0-9][A-Za-z0-9 \-]*?) \((?P<mem>"
            + _DEC
            + r") ?GiB\)"
        ),
        _gpu_card,
    ),
    LineRule(
        "vLLM API server version",
        "API server version",
        re.compile(r"vLLM API server version (?P<val>[0-9][\w.+\-]*)"),
        lambda m: [("vllm_version", m["val"], m["val"], 0.0)],
    ),
    LineRule(
        "the logo",
        None,
        re.compile(r"[█▀▄]\s+(?P<key>version|model)\s+(?P<val>\S+)\s*$"),
        _logo,
    ),
)

#: Words of a line that states a figure: a line with one of them and no rule
#: that reads it is listed as unread.  The line rules' keywords and the two
#: structured lines (the engine banner, ``non-default args``).
_KEYWORDS = re.compile(
    "|".join(re.escape(k) for k in (*(r.keyword for r in RULES if r.keyword),
                                     "with config", "non-default args"))
)

_BANNER = re.compile(
    r"Initializing an? (?:(?P<engine>V[01]) )?LLM engine \(v(?P<version>[0-9][\w.+\-]*)\) with config:?"
)


def _split_top(text: str) -> Iterator[str]:
    """``text`` split at top-level commas (not inside brackets or quotes)."""
    depth, quote, start = 0, None, 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            yield text[start:i]
            start = i + 1
    yield text[start:]


def _banner_value(raw: str) -> tuple[bool, Any]:
    """``(complete, value)`` of one banner value as vLLM prints it."""
    raw = raw.strip()
    if not raw:
        return False, None
    if raw[0] in "'\"":
        if len(raw) < 2 or raw[-1] != raw[0]:
            return False, None  # cut off inside the quotes
        return True, raw[1:-1]
    if (
        raw.count("(") != raw.count(")")
        or raw.count("{") != raw.count("}")
        or raw.count("[") != raw.count("]")
    ):
        return False, None
    if raw in ("None", "True", "False"):
        return True, {"None": None, "True": True, "False": False}[raw]
    if re.fullmatch(r"-?\d+", raw):
        return True, int(raw)
    if re.fullmatch(r"-?\d+\.\d*", raw):
        return True, float(raw)
    if raw.startswith("torch."):
        return True, raw.removeprefix("torch.")
    return True, raw


def _speculative(value: Any) -> Any:
    """The banner's ``SpeculativeConfig(method='mtp', ..., num_spec_tokens=3)``
    as ``{"method": "mtp", "num_speculative_tokens": 3}``; other values as given."""
    if not isinstance(value, str) or not value.startswith("SpeculativeConfig("):
        return value
    method = re.search(r"method='?([\w-]+)'?", value)
    tokens = re.search(r"num_spec(?:ulative)?_tokens=(\d+)", value)
    if method is None or tokens is None:
        return value
    return FrozenDict({"method": method[1], "num_speculative_tokens": int(tokens[1])})


def _banner_pairs(text: str) -> tuple[dict[str, tuple[Any, str]], bool]:
    """Banner ``key=value`` pairs -> ``{key: (value, raw)}``, and whether a
    pair was cut off."""
    out: dict[str, tuple[Any, str]] = {}
    cut = False
    parts = list(_split_top(text))
    for i, part in enumerate(parts):
        if "=" not in part:
            cut = cut or (i == len(parts) - 1 and bool(part.strip()))
            continue
        key, raw = part.split("=", 1)
        key = key.strip()
        complete, value = _banner_value(raw)
        if not complete or (i == len(parts) - 1 and not raw.strip()):
            cut = True
            continue
        if re.fullmatch(r"\w+", key):
            out[key] = (value, raw.strip())
    return out, cut


def _args_dict(text: str) -> tuple[dict[str, Any], bool]:
    """The API server's ``non-default args: {...}`` as a dict, and whether it
    was read whole (a cut-off or non-literal dict is read key by key)."""
    start = text.find("{")
    try:
        value = ast.literal_eval(text[start:])
        if isinstance(value, dict):
            return value, True
    except (ValueError, SyntaxError):
        pass
    out: dict[str, Any] = {}
    pattern = r"'(\w+)': ('[^']*'|True|False|None|-?\d+(?:\.\d+)?|\{[^{}]*\})(?=[,}])"
    for key, raw in re.findall(pattern, text[start:]):
        try:
            out[key] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
    return out, False


def _process(line: str) -> str | None:
    m = _PROCESS.search(line)
    if m is None:
        return None
    return m["tag"] or m["rank"]


# ---------------------------------------------------------------------------
# the result
# ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class VllmLog(Displayable):
    """Every figure a vLLM start-up log states (:data:`FIGURES`), each with
    its line; what it could not read; what it contradicts.

    ``figures`` holds every statement in log order (a figure printed by
    several workers appears once per line); :meth:`get` gives a figure's one
    value, and refuses a contradicted one.  ``unread`` lists ``(line,
    text)`` of lines that name a figure without a readable value (a paste
    cut off mid-line); ``contradictions`` lists each figure stated with two
    or more different values.  ``name`` is the file's name, or None;
    ``raw`` the log as read (what another release's environment reads
    again to check it there)."""

    figures: tuple[LogFigure, ...]
    unread: tuple[tuple[int, str], ...]
    num_lines: int
    name: str | None = None
    raw: str = field(default="", repr=False, compare=False)

    def __contains__(self, name: str) -> bool:
        return any(f.name == name for f in self.figures)

    def statements(self, name: str) -> tuple[LogFigure, ...]:
        """Every statement of figure ``name``, in log order."""
        self._check_name(name)
        return tuple(f for f in self.figures if f.name == name)

    def _check_name(self, name: str) -> None:
        if name not in FIGURES:
            raise KVExploreError(
                f"figure {name!r} is unknown; expected one of {sorted(FIGURES)}"
            )

    def get(self, name: str, default: Any = None) -> Any:
        """The value the log states for ``name`` (``default`` when it states
        none); a contradicted figure is refused with both values and lines."""
        stated = self.statements(name)
        if not stated:
            return default
        values = {_hashable(f.value) for f in stated}
        if len(values) > 1:
            raise KVExploreError(
                f"the log contradicts itself on {name}: "
                + "; ".join(f"{f.text} (line {f.line})" for f in _distinct(stated))
                + "; expected one value (pass the figure you trust as a keyword)"
            )
        return stated[0].value

    def first(self, name: str) -> LogFigure | None:
        """The first statement of ``name``, or None."""
        stated = self.statements(name)
        return stated[0] if stated else None

    @cached_property
    def contradictions(self) -> pd.DataFrame:
        """One row per figure stated with different values: ``figure``,
        ``values`` (as printed, with their lines)."""
        rows = []
        for name in FIGURES:
            stated = [f for f in self.figures if f.name == name]
            if len({_hashable(f.value) for f in stated}) > 1:
                rows.append(
                    {
                        "figure": name,
                        "values": "; ".join(
                            f"{f.text} (line {f.line}{', ' + f.process if f.process else ''})"
                            for f in _distinct(stated)
                        ),
                    }
                )
        return pd.DataFrame(rows, columns=["figure", "values"])

    @cached_property
    def table(self) -> pd.DataFrame:
        """One row per figure (first statement), with how many lines state it."""
        rows = []
        for name, (kind, description) in FIGURES.items():
            stated = [f for f in self.figures if f.name == name]
            if not stated:
                continue
            first = stated[0]
            contradicted = len({_hashable(f.value) for f in stated}) > 1
            rows.append(
                {
                    "figure": name,
                    "kind": kind,
                    "what": description,
                    "value": first.value,
                    "as printed": first.text,
                    "line": first.line,
                    "statements": len(stated),
                    "contradicted": contradicted,
                    "vllm line": first.where,
                }
            )
        table = pd.DataFrame(
            rows,
            columns=[
                "figure",
                "kind",
                "what",
                "value",
                "as printed",
                "line",
                "statements",
                "contradicted",
                "vllm line",
            ],
        )
        table["value"] = pd.Series([r["value"] for r in rows], dtype=object)
        return table

    @property
    def release(self) -> str | None:
        """The vLLM release that printed the log (``"0.31.0"``), if stated."""
        stated = self.statements("vllm_version")
        return stated[0].value if stated else None

    @cached_property
    def deployment(self) -> FrozenDict:
        """The deployment the log implies: each :data:`DEPLOYMENT` figure it
        states (the first value where contradicted; see :attr:`contradictions`)."""
        return FrozenDict(
            {
                name: self.statements(name)[0].value
                for name in DEPLOYMENT
                if name in self
            }
        )

    @property
    def not_stated(self) -> tuple[str, ...]:
        """The :data:`DEPLOYMENT` figures the log does not state."""
        return tuple(name for name in DEPLOYMENT if name not in self)

    def explain(self) -> str:
        """Every figure, one line each, with its line number and vLLM line."""
        lines = [
            f"{f.name} = {f.text} (line {f.line}: {f.where}"
            + (f"; {f.process}" if f.process else "")
            + ")"
            for f in self.figures
        ]
        lines += [f"unread line {n}: {text[:120]}" for n, text in self.unread]
        lines += [
            f"contradiction: {r.figure}: {r.values}"
            for r in self.contradictions.itertuples()
        ]
        return "\n".join(lines)


def _hashable(value: Any) -> Any:
    if isinstance(value, dict):
        return repr(sorted(value.items(), key=repr))
    if isinstance(value, list):
        return tuple(value)
    return value


def _distinct(stated) -> list[LogFigure]:
    seen, out = set(), []
    for f in stated:
        key = _hashable(f.value)
        if key not in seen:
            seen.add(key)
            out.append(f)
    return out


# ---------------------------------------------------------------------------
# read_log()
# ---------------------------------------------------------------------------

_SGLANG = re.compile(
    r"KV Cache is allocated\. #tokens|sglang|\[TP\d+\] Load weight", re.IGNORECASE
)


def _text_of(text_or_path: Any) -> tuple[str, str | None]:
    """The log's text and its file name (None for text)."""
    if isinstance(text_or_path, os.PathLike):
        path = pathlib.Path(text_or_path)
    elif isinstance(text_or_path, bytes):
        return _decode(text_or_path, "the bytes given"), None
    elif isinstance(text_or_path, str):
        if "\n" in text_or_path or len(text_or_path) > 4096:
            return text_or_path, None
        candidate = pathlib.Path(text_or_path)
        try:
            is_file = candidate.is_file()
        except OSError:
            is_file = False
        if not is_file:
            if re.search(r"\.(log|txt|out)$", text_or_path) and not _KEYWORDS.search(
                text_or_path
            ):
                raise KVExploreError(
                    f"log {text_or_path!r} is not a file; expected the path of a vLLM start-up "
                    "log or the log's text"
                )
            return text_or_path, None
        path = candidate
    else:
        raise KVExploreError(
            f"text_or_path={text_or_path!r} is invalid; expected a vLLM start-up log's text or "
            "the path of a file holding it"
        )
    if not path.is_file():
        raise KVExploreError(
            f"log {str(path)!r} is not a file; expected the path of a vLLM start-up log"
        )
    return _decode(path.read_bytes(), repr(str(path))), path.name


def _decode(data: bytes, what: str) -> str:
    if b"\x00" in data[:65536]:
        raise KVExploreError(
            f"{what} is binary (NUL bytes); expected a vLLM start-up log as text"
        )
    text = data.decode("utf-8", errors="replace")
    sample = text[:65536]
    if sample and sample.count("\ufffd") > max(8, len(sample) // 100):
        raise KVExploreError(
            f"{what} is not UTF-8 text; expected a vLLM start-up log as text"
        )
    return text


def _banner_figures(lines: list[str], i: int, m: re.Match) -> tuple[Found, bool]:
    """Figures of the banner starting at line ``i``; True when it was cut off."""
    found: Found = [("vllm_version", m["version"], m["version"], 0.0)]
    if m["engine"]:
        found.append(("engine", m["engine"], m["engine"], 0.0))
    rest = lines[i][m.end() :]
    if "model=" not in rest:  # the banner's config on a following line of a paste
        for nxt in lines[i + 1 : i + 4]:
            if "model=" in nxt:
                rest = nxt[nxt.index("model=") :]
                break
    pairs, cut = _banner_pairs(rest)
    for key, name in BANNER_KEYS.items():
        if key in pairs:
            value, raw = pairs[key]
            if name == "speculative_config":
                value = _speculative(value)
            found.append((name, value, raw, 0.0))
    for key in ("served_model_name",):
        if "model" not in pairs and key in pairs:
            found.append(("model", pairs[key][0], pairs[key][1], 0.0))
    return found, cut or "model" not in pairs


def _rejoined(lines: list[str]) -> list[str]:
    """``lines`` with a capacity line that a terminal or a paste wrapped after
    ``Maximum concurrency`` joined to its continuation (the next line, which
    starts with ``for``); the continuation's place is left empty, so line
    numbers stay the file's."""
    out = list(lines)
    for i in range(len(out) - 1):
        if out[i].rstrip().endswith("Maximum concurrency") and \
                out[i + 1].lstrip().startswith("for "):
            out[i] = out[i].rstrip() + " " + out[i + 1].strip()
            out[i + 1] = ""
    return out


def _args_figures(line: str, number: int, process: str | None) -> tuple[list[LogFigure], bool]:
    """Figures of the API server's ``non-default args: {...}`` on ``line``;
    True when the dict was cut off."""
    args, whole = _args_dict(line[line.index("non-default args:") :])
    given = {figure: args[key] for key, figure in ARG_KEYS.items() if key in args}
    if "model" not in given and "model_tag" in args:
        given["model"] = args["model_tag"]
    figures = [
        LogFigure(name, FrozenDict(value) if isinstance(value, dict) else value, repr(value),
                  number, line, process, "non-default args")
        for name, value in given.items()
    ]
    return figures, not whole


def _rule_figures(line: str, number: int, process: str | None) -> tuple[list[LogFigure], bool]:
    """Figures every line rule reads from ``line``; True when the line names a
    figure (a rule's keyword) outside every span a rule read."""
    figures, spans = [], []
    for rule in RULES:
        for m in rule.pattern.finditer(line):
            try:
                found = rule.read(m)
            except (ValueError, OverflowError):
                # a number past what Python reads (its integer-string limit)
                # or a float overflow: the figure is not readable
                continue
            figures += [LogFigure(n, v, t, number, line, process, rule.where, r)
                        for n, v, t, r in found]
            spans.append(m.span())
    unread = any(not any(a <= k.start() < b for a, b in spans) for k in _KEYWORDS.finditer(line))
    return figures, unread


def read_log(text_or_path: Any) -> VllmLog:
    """Read a vLLM start-up log (its text, bytes, or a path) into a
    :class:`VllmLog` (see the module doc for the lines read).

    Refuses, with a :class:`KVExploreError` naming what was given: a path that
    is not a file, an empty log, a binary file, and a text with no vLLM
    start-up line (an SGLang log is named as such)."""
    text, name = _text_of(text_or_path)
    what = f"log {name!r}" if name else "the log given"
    if not text.strip():
        raise KVExploreError(f"{what} is empty; expected a vLLM start-up log")
    lines = _rejoined([_ANSI.sub("", raw).rstrip("\r") for raw in text.split("\n")])
    figures: list[LogFigure] = []
    unread: list[tuple[int, str]] = []
    for i, line in enumerate(lines):
        if not line.strip() or line.lstrip().startswith("#") and "GPU blocks" not in line:
            continue
        process = _process(line)
        banner = _BANNER.search(line)
        if banner:
            found, cut = _banner_figures(lines, i, banner)
            read = [LogFigure(n, v, t, i + 1, line, process, "the engine banner", r)
                    for n, v, t, r in found]
        elif "non-default args:" in line:
            read, cut = _args_figures(line, i + 1, process)
        else:
            read, cut = _rule_figures(line, i + 1, process)
        figures += read
        if cut:  # a figure named, its value not readable
            unread.append((i + 1, line.strip()))
    if not figures:
        if _SGLANG.search(text):
            raise KVExploreError(
                f"{what} looks like an SGLang log ('KV Cache is allocated. #tokens'); "
                "expected a vLLM start-up log (lines such as 'GPU KV cache size: N tokens')"
            )
        raise KVExploreError(
            f"no vLLM start-up figure found in {what} ({len(lines)} lines); "
            "expected lines such as 'Initializing a V1 LLM engine (v0.31.0) with config: ...', "
            "'Available KV cache memory: X GiB' or 'GPU KV cache size: N tokens'"
        )
    return VllmLog(
        figures=tuple(figures), unread=tuple(unread), num_lines=len(lines), name=name,
        raw=text,
    )


__all__ = ["DEPLOYMENT", "FIGURES", "LineRule", "LogFigure", "RULES", "VllmLog", "read_log"]
