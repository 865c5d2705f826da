"""Configs kvexplore did not choose: Gated-DeltaNet and Mamba2 hybrids drawn
by hypothesis (a fixed draw: head counts, head sizes, convolution width, layer
pattern, TP, KV dtype, GPU) are planned and compared with the installed vLLM's
own block-size path (``tests/reference.py``: a fresh ``ModelConfig`` and
``Platform.update_block_size_for_backend`` on a stand-in config) and with the
state and page sizes counted by hand from the drawn config:

* a Gated-DeltaNet layer's state is its convolution window,
  ``(2 * key_heads * key_dim + value_heads * value_dim) / TP`` channels x
  ``(conv_kernel - 1)`` in the model dtype, and its recurrent state,
  ``value_heads / TP x key_dim x value_dim`` float32 values (the config's
  ``mamba_ssm_dtype``);
* a Mamba2 layer's state (GraniteMoeHybrid) is its convolution window,
  ``(expand x hidden + 2 x groups x state_size) / TP`` channels x
  ``(conv_kernel - 1)``, the groups first raised to TP when TP does not divide
  them (each rank keeps the groups its heads read), and its recurrent state,
  ``heads / TP x head_dim x state_size``, both in the model dtype (the
  config names no SSM dtype);
* an attention layer's page is ``block_size`` tokens x K and V x the KV heads
  of a rank (at least one: vLLM replicates them when TP exceeds them) x
  ``head_dim`` x the KV dtype's bytes, and every layer's page is that one.
"""

import copy
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import vllm_alignment

import kvexplore

BASE = kvexplore.load_model_config("Qwen/Qwen3.5-0.8B").config
GRANITE = kvexplore.load_model_config("ibm-granite/granite-4.0-h-350m").config

KV_BYTES = {"auto": 2, "fp8": 1}
#: (tensor_parallel_size, kv_cache_dtype, gpu) of a drawn deployment.
DEPLOYMENTS = st.tuples(st.sampled_from([1, 2]), st.sampled_from(["auto", "fp8"]),
                        st.sampled_from(["A100", "H100"]))
MROPE = {64: [3, 3, 2], 128: [6, 5, 5], 256: [11, 11, 10]}


@st.composite
def gdn_hybrids(draw):
    key_heads = draw(st.sampled_from([2, 4, 8, 16]))
    value_heads = key_heads * draw(st.sampled_from([1, 2]))
    heads = draw(st.sampled_from([4, 8, 16]))
    kv_heads = draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
    interval = draw(st.sampled_from([2, 3, 4]))
    layers = interval * draw(st.sampled_from([1, 2, 3]))
    head_dim = draw(st.sampled_from([64, 128, 256]))
    # the multimodal rotary sections cover the rotary quarter of a head:
    # sum(mrope_section) == head_dim * partial_rotary_factor / 2
    rope = dict(BASE["text_config"]["rope_parameters"], mrope_section=MROPE[head_dim])
    text = dict(
        BASE["text_config"],
        linear_num_key_heads=key_heads,
        linear_num_value_heads=value_heads,
        linear_key_head_dim=draw(st.sampled_from([64, 128])),
        linear_value_head_dim=draw(st.sampled_from([64, 128])),
        linear_conv_kernel_dim=draw(st.sampled_from([2, 3, 4])),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        rope_parameters=rope,
        full_attention_interval=interval,
        num_hidden_layers=layers,
        layer_types=[
            "full_attention" if (i + 1) % interval == 0 else "linear_attention"
            for i in range(layers)
        ],
    )
    config = copy.deepcopy(BASE)
    config["text_config"] = text
    return (config, *draw(DEPLOYMENTS))


def gdn_state_bytes(text: dict, tp: int) -> int:
    channels = (
        2 * text["linear_num_key_heads"] * text["linear_key_head_dim"]
        + text["linear_num_value_heads"] * text["linear_value_head_dim"]
    )
    conv = channels // tp * (text["linear_conv_kernel_dim"] - 1) * 2
    ssm = (
        text["linear_num_value_heads"] // tp
        * text["linear_key_head_dim"]
        * text["linear_value_head_dim"]
        * 4
    )
    return conv + ssm


def state_bytes(spec) -> int:
    """The bytes of one Mamba layer's states in a block, from its spec's shapes."""
    return sum(math.prod(shape) * dtype.itemsize
               for shape, dtype in zip(spec.shapes, spec.dtypes, strict=True))


def check_drawn_plan(config: dict, tp: int, kv_dtype: str, gpu: str, *, kv_heads: int,
                     head_size: int, state: int, mamba_layers: int, layers: int) -> None:
    """Plan ``config`` and compare it with vLLM's own block-size path and with
    the hand counts: every page is ``block_size`` tokens x K and V x the KV
    heads of a rank x ``head_size`` x the KV dtype's bytes; every Mamba layer
    holds ``state`` bytes; vLLM pads the Mamba page to the attention page only
    where the state is smaller (a state that fills the page leaves
    ``mamba_page_size_padded`` None)."""
    src = kvexplore.load_model_config(config)
    p = kvexplore.plan(src, gpu=gpu, tensor_parallel_size=tp, kv_cache_dtype=kv_dtype,
                       num_blocks=8)
    ref = vllm_alignment(str(src.config_dir), tensor_parallel_size=tp,
                         kv_cache_dtype=kv_dtype, backend_name=p.attention_backend, gpu=gpu)
    assert (p.block_size, p.mamba_page_size_padded) == (ref.block_size, ref.mamba_page_size_padded)
    page = p.block_size * 2 * max(1, kv_heads // tp) * head_size * KV_BYTES[kv_dtype]
    assert {s.page_size_bytes for s in p.layer_specs.values()} == {page}
    mamba = [s for s in p.layer_specs.values() if type(s).__name__ == "MambaSpec"]
    assert len(mamba) == mamba_layers and len(p.layer_specs) == layers
    assert {state_bytes(s) for s in mamba} == {state}
    assert page >= state
    assert p.mamba_page_size_padded == (page if state < page else None)


@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(gdn_hybrids())
def test_a_drawn_hybrid_plans_as_vllm_aligns_it(case):
    config, tp, kv_dtype, gpu = case
    text = config["text_config"]
    check_drawn_plan(config, tp, kv_dtype, gpu, kv_heads=text["num_key_value_heads"],
                     head_size=text["head_dim"], state=gdn_state_bytes(text, tp),
                     mamba_layers=text["layer_types"].count("linear_attention"),
                     layers=text["num_hidden_layers"])


def test_the_hand_count_is_the_catalog_qwen35_page():
    """The hand count on the bundled config: Qwen3.5-0.8B's GDN state is
    (2*16*128 + 16*128) x 3 x 2 B + 16 x 128 x 128 x 4 B = 1,085,440 B at TP 1."""
    assert gdn_state_bytes(BASE["text_config"], 1) == 1_085_440
    p = kvexplore.plan("Qwen/Qwen3.5-0.8B", gpu="A100", num_blocks=8)
    spec = next(s for s in p.layer_specs.values() if type(s).__name__ == "MambaSpec")
    assert state_bytes(spec) == 1_085_440


def test_a_state_that_fills_the_attention_page_is_not_padded():
    """By hand: 8 key and 16 value heads of 64, convolution width 2, one KV head
    of 64. The GDN state is (2 x 8 x 64 + 16 x 64) x 1 x 2 B + 16 x 64 x 64 x
    4 B = 266,240 B; an attention token is 2 x 1 x 64 x 2 B = 256 B, so 1,040
    tokens (16 x cdiv(266,240, 16 x 256)) fill exactly 266,240 B: vLLM
    (Platform.update_block_size_for_backend) returns before padding, and
    mamba_page_size_padded stays None."""
    rope = dict(BASE["text_config"]["rope_parameters"], mrope_section=MROPE[64])
    text = dict(BASE["text_config"], head_dim=64, linear_conv_kernel_dim=2,
                linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=8,
                linear_num_value_heads=16, num_attention_heads=4, num_key_value_heads=1,
                num_hidden_layers=2, full_attention_interval=2, rope_parameters=rope,
                layer_types=["linear_attention", "full_attention"])
    config = copy.deepcopy(BASE)
    config["text_config"] = text
    assert gdn_state_bytes(text, 1) == 266_240 == 1_040 * 256
    src = kvexplore.load_model_config(config)
    p = kvexplore.plan(src, gpu="A100", num_blocks=8)
    ref = vllm_alignment(str(src.config_dir), backend_name=p.attention_backend, gpu="A100")
    assert (p.block_size, p.mamba_page_size, p.mamba_page_size_padded) == (1_040, 266_240, None)
    assert (ref.block_size, ref.mamba_page_size_padded) == (1_040, None)


@st.composite
def mamba2_hybrids(draw):
    heads = draw(st.sampled_from([16, 32, 48, 64]))
    head_dim = draw(st.sampled_from([32, 64]))
    hidden = heads * head_dim // 2  # expand 2: the Mamba2 heads span expand x hidden
    attention_heads = draw(st.sampled_from([a for a in (8, 12, 16) if hidden % a == 0]))
    layers = draw(st.integers(min_value=2, max_value=6))
    attention_at = draw(st.sets(st.integers(0, layers - 1), min_size=1, max_size=layers - 1))
    config = dict(
        GRANITE,
        mamba_n_heads=heads,
        mamba_d_head=head_dim,
        mamba_expand=2,
        hidden_size=hidden,
        mamba_n_groups=draw(st.sampled_from([g for g in (1, 2, 4, 8) if heads % g == 0])),
        mamba_d_state=draw(st.sampled_from([64, 128])),
        mamba_d_conv=draw(st.sampled_from([2, 4])),
        num_attention_heads=attention_heads,
        num_key_value_heads=draw(st.sampled_from([h for h in (1, 2, 4) if attention_heads % h == 0])),
        num_hidden_layers=layers,
        layer_types=["attention" if i in attention_at else "mamba" for i in range(layers)],
    )
    return (config, *draw(DEPLOYMENTS))


def mamba2_state_bytes(config: dict, tp: int) -> int:
    groups = config["mamba_n_groups"]
    if groups % tp:
        groups = tp  # raised to TP (vLLM: extra_groups_for_head_shards)
    channels = config["mamba_expand"] * config["hidden_size"] + 2 * groups * config["mamba_d_state"]
    conv = channels // tp * (config["mamba_d_conv"] - 1) * 2
    ssm = config["mamba_n_heads"] // tp * config["mamba_d_head"] * config["mamba_d_state"] * 2
    return conv + ssm


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(mamba2_hybrids())
def test_a_drawn_mamba2_hybrid_plans_as_vllm_aligns_it(case):
    config, tp, kv_dtype, gpu = case
    check_drawn_plan(config, tp, kv_dtype, gpu, kv_heads=config["num_key_value_heads"],
                     head_size=config["hidden_size"] // config["num_attention_heads"],
                     state=mamba2_state_bytes(config, tp),
                     mamba_layers=config["layer_types"].count("mamba"),
                     layers=config["num_hidden_layers"])


def test_the_hand_count_is_the_catalog_granite_state():
    """The hand count on the bundled config: granite-4.0-h-350m's Mamba2 state is
    (2 x 768 + 2 x 1 x 128) x 3 x 2 B + 48 x 32 x 128 x 2 B = 403,968 B at TP 1;
    at TP 2 its one group is raised to 2: (1,536 + 2 x 2 x 128) / 2 x 3 x 2 B +
    24 x 32 x 128 x 2 B = 202,752 B."""
    assert mamba2_state_bytes(GRANITE, 1) == 403_968
    assert mamba2_state_bytes(GRANITE, 2) == 202_752
    for tp, state in ((1, 403_968), (2, 202_752)):
        p = kvexplore.plan("ibm-granite/granite-4.0-h-350m", gpu="A100",
                           tensor_parallel_size=tp, num_blocks=8)
        spec = next(s for s in p.layer_specs.values() if type(s).__name__ == "MambaSpec")
        assert state_bytes(spec) == state
