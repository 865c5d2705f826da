"""The drafter of a speculative deployment, built by vLLM's own speculator code.

:func:`build_drafter` runs what Model Runner V2 runs next to the target model:
``init_speculator`` (``vllm/v1/worker/gpu/spec_decode/__init__.py``) and
``DraftModelSpeculator.load_model`` (``spec_decode/speculator.py``), whose
new attention layers the runner's ``get_kv_cache_spec`` gives KV cache with
``is_draft=True``.  The draft model is built by vLLM's ``create_model`` on the
meta device, loading no weights.  Methods whose speculator is not a
``DraftModelSpeculator`` (``ngram``, ``suffix``, ...) add no layers.

Qwen3.5-0.8B with ``{"method": "mtp", "num_speculative_tokens": 3}``: its
config's ``mtp_num_hidden_layers: 1`` gives one draft attention layer,
``mtp.layers.0.self_attn.attn`` (``Qwen3_5MTP``), 2 KV heads x 256.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from kvexplore.display import Displayable
from kvexplore.planning import release
from kvexplore.planning.emulation import patch_attributes


@dataclass(frozen=True)
class Drafter(Displayable):
    """What a ``speculative_config`` adds to the deployment.

    ``speculator`` is vLLM's speculator class name or ``None`` when the method
    builds no model; ``layer_names`` the ``is_draft`` attention layers it adds;
    ``weight_bytes`` the draft's tensor bytes the target does not already hold.
    :meth:`summary` says it in one line; ``text()`` and ``_repr_html_()`` are
    its display forms (:mod:`kvexplore.display`); it has no figure.
    """

    method: str
    num_speculative_tokens: int
    speculator: str | None
    architecture: str | None
    layer_names: tuple[str, ...]
    weight_bytes: int
    dcp_size: int

    @property
    def adds_layers(self) -> bool:
        return bool(self.layer_names)

    def summary(self) -> str:
        """One line: the method, its speculator and the layers it adds."""
        head = f"{self.method} x {self.num_speculative_tokens} draft tokens"
        if self.speculator is None:
            return f"{head}: no draft model, so no KV cache layers are added"
        return (f"{head}: vLLM's {self.speculator} builds {self.architecture}, "
                f"{len(self.layer_names)} draft attention layer(s) "
                f"({', '.join(self.layer_names[:3])}{' ...' if len(self.layer_names) > 3 else ''})")


def _meta_loader_patch() -> list:
    """vLLM's model loaders build the draft on the meta device, loading nothing."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader
    from vllm.utils.torch_utils import set_default_torch_dtype

    def load_model(self, vllm_config, model_config, prefix=""):
        with set_default_torch_dtype(model_config.dtype), torch.device("meta"):
            return self.create_model(vllm_config=vllm_config, model_config=model_config,
                                     prefix=prefix)

    return [(BaseModelLoader, "load_model", load_model)]


def _natural(name: str) -> list:
    """``"m.layers.10.attn"`` after ``"m.layers.9.attn"``: numbers compare as numbers."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def _own_parameter_bytes(draft: torch.nn.Module, target: torch.nn.Module) -> int:
    """Bytes of the draft's parameters and buffers the target does not hold."""
    shared = {id(t) for t in (*target.parameters(), *target.buffers())}
    return sum(t.numel() * t.element_size() for t in (*draft.parameters(), *draft.buffers())
               if id(t) not in shared)


def build_drafter(vc, target: torch.nn.Module) -> Drafter | None:
    """The drafter of ``vc.speculative_config`` (``None`` without one), built
    next to ``target`` inside the build's emulation and parallel groups."""
    spec = vc.speculative_config
    if spec is None:
        return None
    none = Drafter(spec.method, int(spec.num_speculative_tokens), None, None, (), 0,
                   int(vc.parallel_config.decode_context_parallel_size))
    if release.builds_no_draft_model(spec) or not release.uses_v2_model_runner(vc):
        return none
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    with patch_attributes(_meta_loader_patch()):
        speculator = release.init_speculator(vc, torch.device("meta"))
        if not isinstance(speculator, DraftModelSpeculator):
            return replace(none, speculator=type(speculator).__name__)
        speculator.load_model(target)
    return replace(
        none,
        speculator=type(speculator).__name__,
        architecture=(spec.draft_model_config.architectures or [None])[0],
        layer_names=tuple(sorted(speculator.draft_attn_layer_names, key=_natural)),
        weight_bytes=_own_parameter_bytes(speculator.model, target),
        dcp_size=int(speculator.dcp_size),
    )


def draft_specs(specs: dict, drafter: Drafter | None, target_dcp: int) -> dict:
    """As Model Runner V2's ``get_kv_cache_spec``: a draft at DCP 1 under a DCP
    target keeps a replicated cache (``dcp_sharded=False``)."""
    if drafter is None or not (drafter.dcp_size == 1 and target_dcp > 1):
        return specs
    return {name: replace(s, dcp_sharded=False) if name in drafter.layer_names else s
            for name, s in specs.items()}


__all__ = ["Drafter", "build_drafter", "draft_specs"]
