"""Model configs: the bundled catalog, loading (:func:`load_model_config`, read
again on every call, so an edited ``config.json`` is a new source) and layer kinds.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from kvexplore.errors import KVExploreError
from kvexplore.paths import cache_dir, cache_folder
from kvexplore.planning.release import release_name

DEFAULT_MODEL = "Qwen/Qwen3.5-0.8B"

_CATALOG_PACKAGE = "kvexplore.model_configs"


def _catalog_files() -> dict[str, Path]:
    """Map 'org/name' ids to the bundled config files."""
    root = resources.files(_CATALOG_PACKAGE)
    out: dict[str, Path] = {}
    for entry in root.iterdir():
        if entry.name.endswith(".json") and "--" in entry.name:
            org, name = entry.name[: -len(".json")].split("--", 1)
            out[f"{org}/{name}"] = Path(str(entry))
    return dict(sorted(out.items()))


def catalog_names() -> list[str]:
    """Hugging Face ids of the bundled model configs."""
    return list(_catalog_files())


def _read_config(path: Path, where: str) -> dict[str, Any]:
    """The parsed ``config.json`` at ``path`` (``where`` names it in errors)."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise KVExploreError(
            f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}); expected a "
            "Hugging Face config.json"
        ) from None
    except OSError as exc:
        raise KVExploreError(f"{path} cannot be read ({exc.strerror}); expected a readable "
                             "config.json") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise KVExploreError(
            f"{where} is not valid JSON ({exc.msg} at line {exc.lineno}, "
            f"column {exc.colno}); expected a Hugging Face config.json object"
        ) from None
    if not isinstance(data, dict):
        raise KVExploreError(
            f"{where} holds a JSON {type(data).__name__}; expected a JSON object "
            "(a Hugging Face config.json)"
        )
    return _decode_special_floats(data)


def _decode_special_floats(value: Any) -> Any:
    """transformers >= 5 writes inf as ``{"__float__": "Infinity"}``."""
    if isinstance(value, dict):
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: _decode_special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode_special_floats(v) for v in value]
    return value


def _check_transformers_format(data: Mapping[str, Any], where: str) -> None:
    """Refuse configs vLLM cannot read, naming the missing keys."""
    missing = [k for k in ("architectures", "model_type") if not data.get(k)]
    if missing:
        archs = data.get("architectures") or []
        arch = f" (architecture {archs[0]})" if archs else ""
        hint = ""
        if "ssm_cfg" in data or "d_model" in data:
            hint = (
                " This looks like the original mamba_ssm format; use the "
                "transformers-format variant of the checkpoint (e.g. the '-hf' "
                "repository) instead."
            )
        raise KVExploreError(
            f"{where}{arch} is missing {missing}: {release_name()} needs a transformers-format "
            f"config.json with 'architectures' and 'model_type'.{hint}"
        )


@dataclass(frozen=True)
class ModelSource:
    """One model config, ready for planning; hashable by its content.

    ``name`` is what the user asked for (catalog id, path, hub id or
    ``"<dict>"``); ``digest`` the SHA-256 of the config's canonical JSON
    (and of its :data:`QUANT_CONFIG_FILE`, if any); ``config_dir`` holds the
    files vLLM reads.
    """

    name: str
    digest: str
    config_dir: Path = field(repr=False, compare=False)
    _text: str = field(repr=False, compare=False)

    @property
    def config(self) -> dict[str, Any]:
        """A fresh copy of the parsed ``config.json`` on every read."""
        return json.loads(self._text)

    @property
    def architecture(self) -> str:
        data = json.loads(self._text)
        archs = data.get("architectures") or []
        return archs[0] if archs else str(data.get("model_type"))

    @property
    def served_name(self) -> str | None:
        """The id vLLM would serve this model as (``--model Qwen/Qwen3.5-0.8B``),
        or None for a path, dict or config object."""
        return None if self.name.startswith("<") or _looks_like_path(self.name) else self.name

    def __repr__(self) -> str:
        return f"ModelSource({self.name!r}, architecture={self.architecture!r})"


_WRITE_LOCK = threading.Lock()


def configs_dir() -> Path:
    """The folder of the ``config.json`` files vLLM reads, one sub-folder per
    content digest (``kvexplore.paths.cache_dir() / "configs"``): the same
    content is the same folder in every process, so nothing is left to remove."""
    return cache_dir() / "configs"


#: The file vLLM reads the quantization config from when ``config.json`` has
#: none (``transformers_utils/config.py: get_config``; ModelOpt 0.29 and older).
QUANT_CONFIG_FILE = "hf_quant_config.json"


def _materialise(name: str, config: dict[str, Any], quant_config: dict | None = None) -> ModelSource:
    """A :class:`ModelSource` for ``config`` (and the checkpoint's
    :data:`QUANT_CONFIG_FILE`, if any), written once per content digest."""
    text = json.dumps(config, sort_keys=True, allow_nan=True)
    files = {"config.json": config}
    content = text
    if quant_config is not None:
        files = {QUANT_CONFIG_FILE: quant_config, **files}  # config.json written last
        content += json.dumps(quant_config, sort_keys=True, allow_nan=True)
    digest = hashlib.sha256(content.encode()).hexdigest()
    d = configs_dir() / digest[:32]
    with _WRITE_LOCK:
        if not (d / "config.json").is_file():
            cache_folder("configs", d.name)  # refuses a cache folder it cannot write
            for file, data in files.items():  # config.json's presence means complete
                # one staging name per process and thread; the rename is atomic
                staged = d / f".{file}.{os.getpid()}.{threading.get_ident()}"
                staged.write_text(json.dumps(data, indent=1, allow_nan=True))
                staged.replace(d / file)
    return ModelSource(name=name, digest=digest, config_dir=d, _text=text)


def _quant_config_beside(path: Path, config: Mapping[str, Any]) -> dict | None:
    """The :data:`QUANT_CONFIG_FILE` next to ``path`` that vLLM would read:
    only when ``config`` has no ``quantization_config``."""
    beside = path.with_name(QUANT_CONFIG_FILE)
    if config.get("quantization_config") is not None or not beside.is_file():
        return None
    return _read_config(beside, str(beside))


def load_model_config(source: Any) -> ModelSource:
    """Load a model config from any of the forms users have at hand.

    ``source`` may be: a catalog id (``"Qwen/Qwen3.5-0.8B"``, see
    :func:`catalog`); a path to a ``config.json`` or to a directory holding one
    (with the :data:`QUANT_CONFIG_FILE` beside it, as vLLM reads it); a
    ``dict``; a ``transformers.PretrainedConfig``; or an existing
    :class:`ModelSource` (returned as is).  A hub id that is not bundled is
    fetched with ``huggingface_hub`` when online.

    >>> load_model_config("Qwen/Qwen3.5-0.8B").architecture
    'Qwen3_5ForConditionalGeneration'
    """
    if isinstance(source, ModelSource):
        return source
    if isinstance(source, Mapping):
        config = _decode_special_floats(json_ready(source, "config"))
        _check_transformers_format(config, "the config dict")
        return _materialise("<dict>", config)
    if hasattr(source, "to_dict") and hasattr(source, "model_type"):
        config = _decode_special_floats(json_ready(source.to_dict(), "config"))
        if not config.get("architectures"):
            archs = getattr(source, "architectures", None)
            if archs:
                config["architectures"] = list(archs)
        _check_transformers_format(config, f"the {type(source).__name__}")
        return _materialise(f"<{type(source).__name__}>", config)
    if isinstance(source, Path):
        source = str(source)
    if not isinstance(source, str):
        raise KVExploreError(
            f"model source {source!r} of type {type(source).__name__} is not "
            "supported; expected a catalog id, a path to config.json or its "
            "directory, a dict, or a transformers PretrainedConfig"
        )
    files = _catalog_files()
    if source in files:
        return _materialise(source, _read_config(files[source], f"catalog file for {source}"))
    path = Path(source).expanduser()
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        config = _read_config(path, str(path))
        _check_transformers_format(config, str(path))
        return _materialise(source, config, _quant_config_beside(path, config))
    if _looks_like_path(source):
        raise KVExploreError(
            f"config path {source!r} does not exist; expected a config.json "
            "file or a directory holding one"
        )
    return _from_hub(source, files)


def _looks_like_path(source: str) -> bool:
    return (
        source.startswith((".", "/", "~"))
        or source.endswith(".json")
        or source.count("/") != 1
    )


def json_ready(value: Any, where: str, _seen: tuple = ()) -> Any:
    """A deep copy of ``value`` as JSON data: keys as strings, tuples as lists,
    a ``torch.dtype`` by its name, numpy scalars unwrapped; anything else, or
    a container that holds itself, is refused naming where (``config['x'][0]``)."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if id(value) in _seen:
        raise KVExploreError(f"{where} holds itself; expected a tree of JSON values")
    if isinstance(value, Mapping):
        seen = (*_seen, id(value))
        return {str(k): json_ready(v, f"{where}[{k!r}]", seen) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        seen = (*_seen, id(value))
        return [json_ready(v, f"{where}[{i}]", seen) for i, v in enumerate(value)]
    text = str(value)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    if hasattr(value, "item") and hasattr(value, "dtype"):
        return json_ready(value.item(), where, _seen)
    raise KVExploreError(
        f"{where}={value!r} is a {type(value).__name__}; expected JSON values (str, "
        "number, bool, None, lists and dicts of them) as in a config.json"
    )


def _hub_reachable(timeout: float = 2.0) -> str | None:
    """None when the Hugging Face hub can be fetched from, else why not."""
    import socket

    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return "HF_HUB_OFFLINE is set"
    host = constants.ENDPOINT.split("://", 1)[-1].split("/", 1)[0]
    try:
        socket.create_connection((host, 443), timeout=timeout).close()
    except OSError as exc:
        return f"{host} cannot be reached ({exc.strerror or type(exc).__name__})"
    return None


def _from_hub(repo_id: str, files: Mapping[str, Path]) -> ModelSource:
    """``config.json`` of a hub repository: the local hub cache, else the hub
    (with a :data:`QUANT_CONFIG_FILE` already in the same cached snapshot)."""
    from huggingface_hub import hf_hub_download

    close = difflib.get_close_matches(repo_id, list(files), n=3, cutoff=0.4)
    hint = f" Close catalog matches: {close}." if close else ""
    try:
        local = hf_hub_download(repo_id, "config.json", local_files_only=True)
    except Exception:
        offline = _hub_reachable()
        try:
            if offline:
                raise OSError(offline)
            local = hf_hub_download(repo_id, "config.json")
        except Exception as exc:
            why = offline or type(exc).__name__
            raise KVExploreError(
                f"unknown model {repo_id!r}: it is not in the bundled catalog and could not "
                f"be fetched from the Hugging Face hub ({why}).{hint} See kvexplore.catalog() "
                "for the bundled models, or pass a path to a config.json."
            ) from None
    config = _read_config(Path(local), local)
    _check_transformers_format(config, f"hub config of {repo_id}")
    return _materialise(repo_id, config, _quant_config_beside(Path(local), config))


#: Kinds of KV-cache-bearing layers the planner knows.
FULL = "full_attention"
SLIDING = "sliding_window"
MLA = "mla_attention"
CROSS = "cross_attention"
MAMBA = "mamba"


@dataclass(frozen=True)
class LayerInfo:
    """One KV-cache-bearing layer: vLLM's layer name and what kind it is.

    ``kind`` is :data:`MAMBA`, :data:`FULL`, ...; ``mixer`` a Mamba spec's
    ``mamba_type`` (``"short_conv"``, ``"gdn_attn"``, ...; None for attention);
    ``is_draft`` marks the layers a speculative config's drafter adds.
    """

    index: int
    name: str
    kind: str
    sliding_window: int | None = None
    mixer: str | None = None
    is_draft: bool = False

    @property
    def label(self) -> str:
        """``"mamba (short_conv)"``, ``"full_attention (draft)"``."""
        extra = [x for x in (self.mixer, "draft" if self.is_draft else None) if x]
        return f"{self.kind} ({', '.join(extra)})" if extra else self.kind


__all__ = [
    "DEFAULT_MODEL",
    "LayerInfo",
    "ModelSource",
    "catalog_names",
    "load_model_config",
]
