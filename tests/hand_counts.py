"""Facts counted by hand from a model's ``config.json``: an oracle for tests
that does not run kvexplore's or vLLM's model code."""

from __future__ import annotations

import math


def llama_weight_bytes(cfg: dict, tensor_parallel_size: int = 1) -> tuple[int, int]:
    """``(parameter bytes, buffer bytes)`` one rank of a Llama-architecture
    model holds in bf16 at ``tensor_parallel_size``, from the config's fields.

    Parameters: the untied embedding and LM head (``vocab x hidden`` each),
    per layer the q/o projections (``hidden x hidden`` each), the k/v
    projections (``hidden x kv_heads x head_dim`` each) and the gate/up/down
    MLP (``3 x hidden x intermediate``), all split over TP ranks; the
    ``2 x layers + 1`` RMSNorm weights of ``hidden`` values, whole on every
    rank.  Buffers: one rotary cos/sin cache of ``max_position_embeddings x
    head_dim`` bf16 values shared by every layer, and four fp32 scales (k, v,
    q, prob) per attention layer.
    """
    layers, hidden = cfg["num_hidden_layers"], cfg["hidden_size"]
    inter, vocab = cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head = cfg.get("head_dim") or hidden // heads
    tp = tensor_parallel_size
    sharded = 2 * vocab * hidden + layers * (
        2 * hidden * hidden + 2 * hidden * kv_heads * head + 3 * hidden * inter
    )
    assert sharded % tp == 0 and math.gcd(vocab, 64 * tp) == 64 * tp  # no vocab padding
    norms = (2 * layers + 1) * hidden
    params = 2 * (sharded // tp + norms)
    buffers = cfg["max_position_embeddings"] * head * 2 + 4 * 4 * layers
    return params, buffers
