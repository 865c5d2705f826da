"""How many of vLLM 0.33's hybrid and attention-free architectures plan().

For every architecture in vLLM's model registry
(``vllm.model_executor.models.registry._VLLM_MODELS``) this script

1. imports the model module (once per module, in this process, under
   kvexplore's A100 emulation so module-level platform checks see what a
   kvexplore build sees) and keeps the classes vLLM's own protocol helpers
   ``vllm.model_executor.models.interfaces.is_hybrid`` /
   ``is_attention_free`` accept: Mamba, Mamba2, GDN, short-conv, KDA ...
   layers mixed with attention, or attention-free models.  Modules that fail
   to import are listed with the reason;
2. finds a config class for each of them, in this order:
   transformers' auto model mappings (``MODEL_*_MAPPING_NAMES``) reversed;
   vLLM's own config registry (``vllm.transformers_utils.config._CONFIG_REGISTRY``
   and ``vllm.transformers_utils.configs``) and transformers'
   ``CONFIG_MAPPING_NAMES`` matched by name (``Glm5NextForCausalLM`` ->
   ``Glm5NextTextConfig``); the config of the same class registered under
   another name (``NemotronHPuzzleForCausalLM`` -> ``nemotron_h``) or of a
   registered base class (``ClefFlashForJointSchema(Qwen3_5ForConditionalGeneration)``
   -> ``qwen3_5``).  The class is the one vLLM parses that model_type with
   (its registry, then transformers' ``AutoConfig``).  When the first
   candidate model_type fails, a second (``qwen3_5_text`` / ``qwen3_5``) is
   tried.  Architectures with none (remote-code checkpoints) are listed;
3. instantiates the config class with its defaults, shrinks the text config
   to a few layers (at least 4, or the shortest prefix of the default layer
   pattern that still holds every layer kind of that pattern), truncating or
   filtering every per-layer field (``layer_types``, ``layers_block_type``,
   ``hybrid_override_pattern``, ``full_attn_idxs``, ``hybrid_layer_ids``, ...)
   to match, sets ``architectures=[arch]`` and calls
   ``kvexplore.plan(config_dict, gpu="A100", num_blocks=8)``.

One row per architecture: arch, model_type, and either ``ok`` with the block
size and the layer-kind counts, or the first ~150 characters of the error;
then the fraction planned (of all, and of those with a config class),
failures grouped by a coarse reason (kvexplore emulation gaps, config-class
defaults vLLM cannot build from, checkpoint files beyond config.json, ...),
and each failure's full message with the last vLLM frame of its traceback.
Then it plans every real config bundled with kvexplore (``kvexplore.catalog_names()``,
the files in ``kvexplore/model_configs``) on each of ``--real-gpus`` (default
A100 and H100, kvexplore's default plan arguments) and reports, next to the
defaults' count, how many of the bundled configs plan on every GPU, which
hybrid / attention-free architectures of the registry a real config covers
(its ``architectures[0]``, or another architecture registered with the same vLLM
class), and each failure in one line with vLLM's own message and the last vLLM
frame.

About 40 s on 2 idle cores (imports ~10 s, registry scan ~20 s, plans
~0.1 s each) plus ~1 s per bundled config and GPU.  Always exits 0.

    python3 benchmarks/registry_coverage.py [--gpu A100] [--num-blocks 8] [--only ARCH ...]
        [--real-gpus A100 H100] [--no-real] [--real-only]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import inspect
import io
import logging
import os
import re
import sys
import time
import traceback
import warnings

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
warnings.filterwarnings("ignore")

MIN_LAYERS = 4
MAX_LAYERS = 16
ERR_CHARS = 150
ARCH_SUFFIXES = (
    "ForConditionalGeneration", "ForSequenceClassification", "ForTokenClassification",
    "ForCausalLM", "ForJointSchema", "LMHeadModel", "Model",
)


def _quiet() -> None:
    for name in ("vllm", "transformers", "torch", "kvexplore"):
        logging.getLogger(name).setLevel(logging.ERROR)


def _short(exc: BaseException, n: int = ERR_CHARS) -> str:
    msg = " ".join(str(exc).split())
    m = re.match(r"^vLLM 0\.33 rejects .*? on .*?: (?=[A-Z]\w*: )", msg)
    if m:  # kvexplore's prefix names the model and GPU, which the row already does
        msg = msg[m.end():]
    else:
        msg = f"{type(exc).__name__}: {msg}"
    return msg if len(msg) <= n else msg[: n - 3] + "..."


def _last_vllm_frame(exc: BaseException) -> str:
    """The deepest traceback frame inside vllm/ (following __cause__/__context__)."""
    best = ""
    seen = set()
    e = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        for fs in traceback.extract_tb(e.__traceback__):
            if "/vllm/" in fs.filename:
                rel = fs.filename.split("/site-packages/")[-1]
                best = f"{rel}:{fs.lineno} in {fs.name}: {(fs.line or '').strip()[:100]}"
        e = e.__cause__ or e.__context__
    return best


def _reason(stage: str, exc: BaseException) -> str:
    """A coarse reason for grouping failures."""
    msg = " ".join(str(exc).split())
    root = _root_type(exc)
    if root == "AcceleratorError" or "CUDA error" in msg or "torch.cuda" in msg:
        return f"kvexplore: a CUDA runtime call during the meta build ({root})"
    if "module 'triton' has no attribute" in msg or "TritonPlaceholder" in msg:
        return f"kvexplore: vLLM's Triton placeholder reached at build ({root})"
    if re.search(r"'\w*Config' object has no attribute", msg):
        return f"config class defaults lack a field vLLM reads ({root})"
    if "'NoneType' object is not subscriptable" in msg or "expected float, got NoneType" in msg:
        return f"config class defaults leave a field None that vLLM needs ({root})"
    if re.search(r"preprocessor_config\.json|need a \w+\.json|Can't load", msg):
        return f"needs checkpoint files beyond config.json ({root})"
    return f"vLLM rejects the default values ({stage}: {root})"


def _root_type(exc: BaseException) -> str:
    e, seen = exc, set()
    while (e.__cause__ or e.__context__) is not None and id(e) not in seen:
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return type(e).__name__


# ---------------------------------------------------------------------------
# 1. hybrid / attention-free architectures
# ---------------------------------------------------------------------------


def _emulation(gpu: str):
    """kvexplore's GPU emulation, so module-level platform checks at import
    answer as they do inside kvexplore's own build; a no-op if unavailable."""
    try:
        from kvexplore.planning.emulation import emulate
        from kvexplore.planning.gpus import resolve_gpu

        return emulate(resolve_gpu(gpu))
    except Exception:  # noqa: BLE001 - private API; the script still runs without it
        return contextlib.nullcontext()


def hybrid_archs(gpu: str):
    """({arch: model class}, {arch: import error}, {arch: "hybrid" | "attention-free"},
    number of registered architectures)."""
    from vllm.model_executor.models import registry as R
    from vllm.model_executor.models.interfaces import is_attention_free, is_hybrid

    resolve = getattr(R, "_resolve_module_name", lambda m: f"vllm.model_executor.models.{m}")
    by_module = collections.defaultdict(list)
    for arch, (mod, cls_name) in R._VLLM_MODELS.items():
        by_module[resolve(mod)].append((arch, cls_name))
    found, import_errors, kinds = {}, {}, {}
    with _emulation(gpu):
        for mod_name, entries in by_module.items():
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    module = importlib.import_module(mod_name)
            except Exception as exc:  # noqa: BLE001
                for arch, _ in entries:
                    import_errors[arch] = f"{mod_name}: {_short(exc, 200)}"
                continue
            for arch, cls_name in entries:
                cls = getattr(module, cls_name, None)
                if cls is None:
                    import_errors[arch] = f"{mod_name} has no {cls_name}"
                    continue
                hyb, free = is_hybrid(cls), is_attention_free(cls)
                if hyb or free:
                    found[arch] = cls
                    kinds[arch] = "hybrid" if hyb else "attention-free"
    return found, import_errors, kinds, len(R._VLLM_MODELS)


# ---------------------------------------------------------------------------
# 2. arch -> model_type -> config class
# ---------------------------------------------------------------------------


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def _strip_arch(arch: str) -> str:
    for suffix in ARCH_SUFFIXES:
        if arch.endswith(suffix) and len(arch) > len(suffix):
            return arch[: -len(suffix)]
    return arch


class ConfigIndex:
    def __init__(self) -> None:
        from transformers.models.auto import modeling_auto
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        self.tf_names = dict(CONFIG_MAPPING_NAMES)  # model_type -> class name
        self.arch_to_types: dict[str, list[str]] = collections.defaultdict(list)
        for attr in sorted(dir(modeling_auto)):
            if not (attr.startswith("MODEL_") and attr.endswith("_MAPPING_NAMES")):
                continue
            mapping = getattr(modeling_auto, attr)
            if not isinstance(mapping, dict):
                continue
            for model_type, archs in mapping.items():
                for a in archs if isinstance(archs, (list, tuple)) else [archs]:
                    if model_type not in self.arch_to_types[a]:
                        self.arch_to_types[a].append(model_type)
        try:
            from vllm.transformers_utils.config import _CONFIG_REGISTRY

            self.vllm_registry = _CONFIG_REGISTRY
        except ImportError:
            self.vllm_registry = {}
        # normalised class-name stem / model_type -> model_type
        self.by_name: dict[str, str] = {}
        for mt, cls_name in self.tf_names.items():
            self.by_name.setdefault(_norm(cls_name.removesuffix("Config")), mt)
            self.by_name.setdefault(_norm(mt), mt)
        self._vllm_classes: dict = {}
        for mt in list(self.vllm_registry.keys()):
            self.by_name[_norm(mt)] = mt
        # vLLM-bundled config classes not in the registry (e.g. BailingMoeV3TextConfig)
        try:
            import vllm.transformers_utils.configs as vcfg

            for cls_name in getattr(vcfg, "__all__", []):
                try:
                    cls = getattr(vcfg, cls_name)
                except Exception:  # noqa: BLE001
                    continue
                mt = getattr(cls, "model_type", "")
                if mt and inspect.isclass(cls):
                    self._vllm_classes[mt] = cls
                    self.by_name[_norm(cls_name.removesuffix("Config"))] = mt
        except ImportError:
            pass

    def config_class(self, model_type: str):
        """The class vLLM itself parses ``model_type`` with: its own registry
        first, then transformers' ``AutoConfig``; a vLLM-bundled class that
        neither registers (``BailingMoeV3TextConfig``) last."""
        if model_type in self.vllm_registry:
            return self.vllm_registry[model_type]
        if model_type in self.tf_names:
            from transformers.models.auto.configuration_auto import CONFIG_MAPPING

            return CONFIG_MAPPING[model_type]
        return self._vllm_classes[model_type]

    @staticmethod
    def _order(arch: str, types: list[str]) -> list[str]:
        """Text configs first for text-only heads, composite configs first for
        ``...ForConditionalGeneration``."""
        composite = "ConditionalGeneration" in arch

        def key(mt: str):
            is_text = mt.endswith("_text")
            return (is_text if composite else not is_text, types.index(mt))

        return sorted(types, key=key)

    def _by_name(self, arch: str) -> list[str]:
        stem = _norm(_strip_arch(arch))
        out = []
        for cand in (stem, stem + "text") if "ConditionalGeneration" in arch else (stem + "text", stem):
            mt = self.by_name.get(cand)
            if mt and mt not in out:
                out.append(mt)
        return out

    def model_types(self, arch: str, cls, registered: dict) -> tuple[list[str], str]:
        """Candidate model types for ``arch`` and where they came from."""
        if arch in self.arch_to_types:
            return self._order(arch, self.arch_to_types[arch]), "transformers auto mapping"
        named = self._by_name(arch)
        if named:
            return named, "config class name"
        # the same class registered under another name (NemotronHPuzzleForCausalLM
        # -> NemotronHForCausalLM), or a registered base class
        # (ClefFlashForJointSchema(Qwen3_5ForConditionalGeneration))
        by_cls = collections.defaultdict(list)
        for a, c in registered.items():
            by_cls[c].append(a)
        for c in cls.__mro__:
            for other in sorted(by_cls.get(c, [])) + ([c.__name__] if c is not cls else []):
                if other == arch:
                    continue
                types = self.arch_to_types.get(other) or self._by_name(other)
                if types:
                    how = "same class as" if c is cls else "base class"
                    return self._order(other, list(types)), f"{how} {other}"
        return [], "no transformers or vLLM config class"


# ---------------------------------------------------------------------------
# 3. small config from defaults
# ---------------------------------------------------------------------------

PER_LAYER_ATTRS = ("layer_types", "layers_block_type", "layer_block_types",
                   "hybrid_override_pattern", "mlp_layer_types", "block_types")


def _text_key(cfg, top: dict):
    """The key of the decoder's sub-config in ``top`` (None: the config itself)."""
    try:
        tc = cfg.get_text_config(decoder=True)
    except TypeError:
        tc = cfg.get_text_config()
    except Exception:  # noqa: BLE001
        tc = cfg
    if tc is cfg:
        return None, tc
    for key in top:
        if getattr(cfg, key, None) is tc and isinstance(top[key], dict):
            return key, tc
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(top.get(key), dict):
            return key, getattr(cfg, key, tc)
    return None, tc


def _layer_count(tc, td: dict) -> int | None:
    n = td.get("num_hidden_layers") or getattr(tc, "num_hidden_layers", None)
    if isinstance(n, int):
        return n
    for attr in PER_LAYER_ATTRS:
        v = getattr(tc, attr, None)
        if isinstance(v, (list, tuple, str)) and v:
            return len(v)
    return None


def _per_layer_patterns(tc, td: dict, n_layers: int) -> list:
    """Every per-layer sequence (dict fields and config properties) of length n_layers."""
    pats = []
    for key, v in td.items():
        if isinstance(v, (list, tuple)) and len(v) == n_layers and n_layers > 1:
            pats.append(list(v))
        elif isinstance(v, str) and "pattern" in key and len(v) == n_layers:
            pats.append(list(v))
    for attr in PER_LAYER_ATTRS:
        try:
            v = getattr(tc, attr, None)
        except Exception:  # noqa: BLE001
            continue
        if isinstance(v, (list, tuple, str)) and len(v) == n_layers:
            pats.append(list(v))
    return pats


def _hashable(x):
    return repr(x) if isinstance(x, (list, dict)) else x


def _shrunk_count(pats: list, n_layers: int) -> int:
    """At least MIN_LAYERS, and long enough that every per-layer pattern keeps
    all its distinct values (Jamba's attention layer is its 5th; Zamba2's first
    shared-attention block its 7th)."""
    n = min(MIN_LAYERS, n_layers)
    for pat in pats:
        kinds = {_hashable(x) for x in pat}
        for i in range(len(pat)):
            if {_hashable(x) for x in pat[: i + 1]} == kinds:
                n = max(n, i + 1)
                break
    return min(n, n_layers, max(MAX_LAYERS, MIN_LAYERS))


INDEX_KEY = re.compile(r"(idxs?|ids|indices|_layers)$")


def _shrink_dict(td: dict, n_layers: int, n: int) -> list[str]:
    """Truncate / filter td's per-layer fields in place; returns what changed."""
    changed = []
    if "num_hidden_layers" in td:
        td["num_hidden_layers"] = n
        changed.append(f"num_hidden_layers={n}")
    for key, v in list(td.items()):
        if key == "num_hidden_layers":
            continue
        if isinstance(v, (list, tuple)) and len(v) == n_layers and n_layers > 1:
            td[key] = list(v)[:n]
            changed.append(f"{key}[:{n}]")
        elif isinstance(v, str) and "pattern" in key and len(v) == n_layers:
            td[key] = v[:n]
            changed.append(f"{key}[:{n}]")
        elif (isinstance(v, (list, tuple)) and v and INDEX_KEY.search(key)
              and all(isinstance(x, int) and not isinstance(x, bool) for x in v)
              and max(v) <= n_layers):
            one_based = max(v) == n_layers or min(v) >= 1 and key.endswith("_layers")
            keep = [x for x in v if (x <= n if one_based else x < n)]
            if keep != list(v):
                td[key] = keep
                changed.append(f"{key} filtered")
        elif isinstance(v, dict) and not v.get("model_type"):
            # nested per-layer settings, e.g. KimiLinear's linear_attn_config
            for sub, sv in list(v.items()):
                if (isinstance(sv, list) and sv and INDEX_KEY.search(sub)
                        and all(isinstance(x, int) for x in sv) and max(sv) <= n_layers):
                    keep = [x for x in sv if x <= n]  # KDA layer lists are 1-based
                    if keep != sv:
                        v[sub] = keep
                        changed.append(f"{key}.{sub} filtered")
    return changed


def small_config(cfg_cls, arch: str) -> tuple[dict, str]:
    """The config class's defaults, shrunk, as a config.json dict."""
    cfg = cfg_cls()
    top = cfg.to_dict()
    key, tc = _text_key(cfg, top)
    td = top if key is None else top[key]
    n_layers = _layer_count(tc, td)
    note = ""
    if n_layers:
        pats = _per_layer_patterns(tc, td, n_layers)
        n = _shrunk_count(pats, n_layers)
        if n < n_layers:
            changed = _shrink_dict(td, n_layers, n)
            note = f"{n_layers}->{n} layers" + (f" ({key})" if key else "")
            if not changed:
                note += " [nothing to shrink]"
        else:
            note = f"{n_layers} layers"
    top["architectures"] = [arch]
    top.setdefault("model_type", getattr(cfg_cls, "model_type", ""))
    if not top.get("model_type"):
        top["model_type"] = getattr(cfg, "model_type", "")
    # check the dict reads back with consistent per-layer fields
    try:
        back = cfg_cls(**{k: v for k, v in top.items() if k not in ("model_type", "transformers_version")})
        _, btc = _text_key(back, back.to_dict())
    except Exception as exc:  # noqa: BLE001 - vLLM reads it itself; just say so
        return top, note + f" [WARN reading back: {_short(exc, 80)}]"
    bn = getattr(btc, "num_hidden_layers", None)
    for attr in PER_LAYER_ATTRS:
        try:
            v = getattr(btc, attr, None)
        except Exception:  # noqa: BLE001
            continue
        if isinstance(v, (list, tuple)) and isinstance(bn, int) and len(v) != bn:
            note += f" [WARN {attr} has {len(v)} entries for {bn} layers]"
    return top, note


# ---------------------------------------------------------------------------
# 4. the bundled real configs
# ---------------------------------------------------------------------------


def _one_line(exc: BaseException, n: int = 300) -> str:
    """vLLM's (or kvexplore's) message in one line, with the last vLLM frame."""
    msg = _short(exc, n)
    frame = _last_vllm_frame(exc)
    if frame:
        msg += f"  [at {frame.split(': ', 1)[0]}]"
    return msg


def plan_real_configs(gpus: list[str], found: dict, kinds: dict):
    """Plan every bundled config on every GPU.

    Returns ``(rows, failures, covered)``: one row per config (name,
    architecture, registry kind or None, {gpu: result text}), the failures as
    ``(name, gpu, one-line reason)`` and {registry arch: [configs covering it]}
    (exact architecture, or one registered with the same vLLM class).
    """
    import kvexplore
    from kvexplore.planning.models import load_model_config

    by_cls = collections.defaultdict(list)
    for a, c in found.items():
        by_cls[c].append(a)
    rows, failures = [], []
    covered: dict[str, list[tuple[str, str | None, bool]]] = collections.defaultdict(list)
    for name in kvexplore.catalog_names():
        try:
            arch = (load_model_config(name).config.get("architectures") or ["?"])[0]
        except Exception as exc:  # noqa: BLE001 - kvexplore refuses the file itself
            arch = "?"
            rows.append((name, arch, None, {g: f"FAIL (load) {_short(exc)}" for g in gpus}))
            failures.extend((name, g, _one_line(exc)) for g in gpus)
            continue
        results = {}
        for gpu in gpus:
            t = time.perf_counter()
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    p = kvexplore.plan(name, gpu=gpu)
                results[gpu] = (f"ok  block_size={p.block_size}  {_kind_counts(p)}"
                                f"  {time.perf_counter() - t:.1f}s")
            except Exception as exc:  # noqa: BLE001
                results[gpu] = f"FAIL {_short(exc)}"
                failures.append((name, gpu, _one_line(exc)))
        kind = kinds.get(arch)
        rows.append((name, arch, kind, results))
        if arch in found:
            planned_everywhere = all(r.startswith("ok") for r in results.values())
            for other in by_cls[found[arch]]:
                covered[other].append((name, None if other == arch else arch, planned_everywhere))
    return rows, failures, covered


def _covering(entries, exact: bool) -> str:
    out = []
    for name, via, ok in entries:
        if (via is None) != exact:
            continue
        text = name if via is None else f"{name} (same class as {via})"
        out.append(text + ("" if ok else " [does not plan]"))
    return ", ".join(out)


def report_real_configs(args, found: dict, kinds: dict, defaults_line: str) -> None:
    gpus = list(dict.fromkeys(args.real_gpus))
    print(f"\nbundled real configs (kvexplore/model_configs) on {', '.join(gpus)}, "
          "kvexplore's default plan arguments:")
    rows, failures, covered = plan_real_configs(gpus, found, kinds)
    w = max((len(r[0]) for r in rows), default=10)
    wa = max((len(r[1]) for r in rows), default=10)
    for name, arch, kind, results in rows:
        tag = kind or "not hybrid"
        for i, gpu in enumerate(gpus):
            head = f"{name:<{w}}  {arch:<{wa}}  {tag:<14}" if i == 0 else " " * (w + wa + 18)
            print(f"{head}  {gpu:<5} {results[gpu]}", flush=True)
    ok = [r for r in rows if all(v.startswith("ok") for v in r[3].values())]
    hybrid_rows = [r for r in rows if r[2]]
    hybrid_ok = [r for r in hybrid_rows if r in ok]
    archs = sorted(found)
    exact = sorted(a for a in archs if any(via is None for _, via, _ in covered.get(a, [])))
    by_class = sorted(a for a in archs if a in covered and a not in exact)
    print()
    print("summary:")
    print(f"  defaults:     {defaults_line}")
    print(f"  real configs: planned {len(ok)} of {len(rows)} bundled configs on every one of "
          f"{', '.join(gpus)} ({len(hybrid_ok)} of {len(hybrid_rows)} hybrid/attention-free)")
    print(f"  registry hybrid/attention-free architectures with a real config: {len(exact)} of "
          f"{len(archs)} by name, {len(exact) + len(by_class)} counting the same vLLM class")
    for a in exact:
        print(f"    {a}: {_covering(covered[a], exact=True)}")
    for a in by_class:
        print(f"    {a}: {_covering(covered[a], exact=False)}")
    missing = [a for a in archs if a not in covered]
    print(f"  without a real config ({len(missing)}): {', '.join(missing)}")
    if failures:
        print(f"\nreal-config failures ({len(failures)}):")
        for name, gpu, why in failures:
            print(f"- {name} [{gpu}]: {why}")
    else:
        print("\nreal-config failures: none")


# ---------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------


def _kind_counts(p) -> str:
    c = collections.Counter(li.kind for li in p.layers)
    return ", ".join(f"{k} x{v}" for k, v in sorted(c.items()))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpu", default="A100")
    ap.add_argument("--num-blocks", type=int, default=8)
    ap.add_argument("--only", nargs="*", help="architectures to run (default: all found)")
    ap.add_argument("--no-details", action="store_true", help="skip the per-failure frames")
    ap.add_argument("--real-gpus", nargs="+", default=["A100", "H100"],
                    help="GPUs to plan the bundled real configs on (default: A100 H100)")
    ap.add_argument("--no-real", action="store_true", help="skip the bundled real configs")
    ap.add_argument("--real-only", action="store_true",
                    help="plan only the bundled real configs (still scans the registry)")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    _quiet()
    import kvexplore  # noqa: F401  (imports vLLM)

    _quiet()
    t_import = time.perf_counter() - t0
    found, import_errors, kinds, total = hybrid_archs(args.gpu)
    _quiet()
    t_scan = time.perf_counter() - t0 - t_import
    print(f"vLLM registry: {total} architectures; {len(found)} hybrid/attention-free; "
          f"{len(import_errors)} not importable  (imports {t_import:.0f} s, scan {t_scan:.0f} s)")
    for arch, why in sorted(import_errors.items()):
        print(f"  not importable: {arch}: {why}")
    print()

    index = ConfigIndex()
    archs = sorted(found)
    if args.only:
        archs = [a for a in archs if a in set(args.only)]
    if args.real_only:
        archs = []

    failures, details = collections.defaultdict(list), []
    planned = no_config = 0
    w = max((len(a) for a in archs), default=10)
    print(f"{'architecture':<{w}}  {'kind':<14}  {'model_type':<20}  result")
    for arch in archs:
        t = time.perf_counter()
        types, source = index.model_types(arch, found[arch], found)
        if not types:
            no_config += 1
            result = f"skipped: {source}"
            failures["no config class (remote code only)"].append(arch)
            print(f"{arch:<{w}}  {kinds[arch]:<14}  {'-':<20}  {result}", flush=True)
            continue
        first_err = None
        used_mt, note = types[0], ""
        for mt in types[:2]:
            try:
                d, note = small_config(index.config_class(mt), arch)
            except Exception as exc:  # noqa: BLE001 - the config class itself refused
                err = ("config", exc)
                first_err = first_err or (mt, err)
                continue
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    p = kvexplore.plan(d, gpu=args.gpu, num_blocks=args.num_blocks)
            except Exception as exc:  # noqa: BLE001
                first_err = first_err or (mt, ("plan", exc))
                continue
            used_mt = mt
            planned += 1
            first_err = None
            result = f"ok  block_size={p.block_size}  {_kind_counts(p)}  [{note}]"
            break
        if first_err is not None:
            used_mt, (stage, exc) = first_err
            failures[_reason(stage, exc)].append(arch)
            result = f"FAIL ({stage}) {_short(exc)}"
            details.append((arch, used_mt, stage, exc))
        dt = time.perf_counter() - t
        src = "" if source == "transformers auto mapping" else f" (via {source})"
        print(f"{arch:<{w}}  {kinds[arch]:<14}  {used_mt:<20}  {result}  {dt:.1f}s{src}", flush=True)

    n = len(archs)
    with_cfg = n - no_config
    defaults_line = (f"planned {planned} of {n} hybrid/attention-free architectures "
                     f"({100 * planned / max(n, 1):.0f}%); {planned} of {with_cfg} with a "
                     f"transformers or vLLM config class "
                     f"({100 * planned / max(with_cfg, 1):.0f}%)")
    if args.real_only:
        defaults_line = "not run (--real-only)"
    print()
    print(defaults_line)
    if failures:
        print("\nnot planned, by reason:")
        for reason, items in sorted(failures.items(), key=lambda kv: -len(kv[1])):
            print(f"  {reason} ({len(items)}): {', '.join(items)}")
    if details and not args.no_details:
        print("\nfailure details (full message; last vLLM frame):")
        for arch, mt, stage, exc in details:
            msg = " ".join(str(exc).split())
            print(f"- {arch} [{mt}] {stage}: {type(exc).__name__}: {msg[:600]}")
            frame = _last_vllm_frame(exc)
            if frame:
                print(f"    at {frame}")
    if not args.no_real:
        report_real_configs(args, found, kinds, defaults_line)
    print(f"\ntotal {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001 - the brief: exit 0 regardless
        traceback.print_exc()
    sys.exit(0)
