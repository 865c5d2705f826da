"""The offloading config's parallel sizes are the plan's, and vLLM's.

For plans at several (TP, PP, DP, DCP), every parallel size
``offload_config`` reports equals the plan's own ``ParallelConfig`` and what
vLLM's ``build_offloading_config`` reports when called on a ``ParallelConfig``
built at the plan's sizes (``tests/offload_reference.py``).  The options cannot
restate them: a different value is refused by name, in Python and on the
command line.
"""

from __future__ import annotations

import dataclasses
import json

import pytest
from offload_reference import vllm_offload_inputs
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import (
    build_offloading_config,
)

import kvexplore
from kvexplore.cli import main
from kvexplore.errors import KVExploreError
from kvexplore.offloading.config import offload_config
from kvexplore.offloading.options import PLAN_PARALLEL_KEYWORDS, OffloadOptions

QWEN = "Qwen/Qwen3.5-0.8B"

#: (TP, PP, DP, DCP) and the pipeline stage shown.
DEPLOYMENTS = [
    (1, 1, 2, 1, 0),
    (2, 2, 1, 1, 1),
    (4, 1, 2, 2, 0),
    (1, 2, 2, 1, 0),
]

#: ``OffloadingParallelConfig`` field -> ``ParallelConfig`` attribute.
SIZES = {
    "tp_size": "tensor_parallel_size",
    "pp_size": "pipeline_parallel_size",
    "dcp_size": "decode_context_parallel_size",
    "pcp_size": "prefill_context_parallel_size",
    "data_parallel_size": "data_parallel_size",
}


def _plan(tp, pp, dp, dcp, stage):
    return kvexplore.plan(
        QWEN,
        gpu="H100",
        num_blocks=64,
        tensor_parallel_size=tp,
        pipeline_parallel_size=pp,
        pipeline_parallel_rank=stage,
        data_parallel_size=dp,
        decode_context_parallel_size=dcp,
    )


@pytest.mark.parametrize(
    "deployment", DEPLOYMENTS, ids=lambda d: "tp{}-pp{}-dp{}-dcp{}".format(*d)
)
@pytest.mark.parametrize(
    "options", [{}, {"distributed_executor_backend": "external_launcher"}]
)
def test_every_parallel_size_is_the_plans_and_vllms(deployment, options):
    tp, pp, dp, dcp, _ = deployment
    p = _plan(*deployment)
    pc = p.parallel_config
    assert (
        pc.tensor_parallel_size,
        pc.pipeline_parallel_size,
        pc.data_parallel_size,
        pc.decode_context_parallel_size,
    ) == (tp, pp, dp, dcp)
    mine = offload_config(p, **options).config.parallel
    vc, kc = vllm_offload_inputs(p, **options)
    theirs = build_offloading_config(vc, kc).parallel
    for field, attr in SIZES.items():
        assert getattr(mine, field) == getattr(pc, attr), (field, mine, pc)
    assert dataclasses.asdict(mine) == dataclasses.asdict(theirs)
    # DP > 1 leaves the local DP rank unset (SPMD only), as vLLM's ParallelConfig does
    assert (
        mine.data_parallel_rank_local
        == pc.data_parallel_rank_local
        == theirs.data_parallel_rank_local
    )
    world = pp * tp * (dp if options else 1)
    assert mine.world_size == world


def test_the_data_parallel_plan_explains_its_own_size():
    p = _plan(1, 1, 2, 1, 0)
    r = offload_config(p)
    assert r.config.parallel.data_parallel_size == 2
    assert r.rule("parallel.data_parallel_rank_local") == "DP 2: set only in SPMD mode"
    assert r.to_dict()["inputs"]["data_parallel_size"] == 2
    # a restated size is accepted at the plan's value, with the same answer
    assert (
        offload_config(
            p, data_parallel_size=2, data_parallel_rank=1
        ).config.parallel.data_parallel_index
        == 1
    )
    assert offload_config(p, data_parallel_size=2).config == r.config


@pytest.mark.parametrize("name", PLAN_PARALLEL_KEYWORDS)
def test_a_different_size_is_refused_by_name(name):
    p = _plan(1, 1, 2, 1, 0)
    ours = {"data_parallel_size": 2}.get(name, 1)
    with pytest.raises(KVExploreError) as info:
        offload_config(p, **{name: ours + 2})
    text = str(info.value)
    for fact in (
        f"{name}={ours + 2}",
        f"plan's {name}={ours}",
        f"plan(..., {name}={ours + 2})",
    ):
        assert fact in text, (fact, text)
    with pytest.raises(KVExploreError, match=f"{name}=2 is not an offload option"):
        OffloadOptions.from_kwargs(**{name: 2})
    assert name not in OffloadOptions.names()


def test_cli_dp_gives_the_plans_size(capsys):
    argv = [
        "offload",
        QWEN,
        "--gpu",
        "H100",
        "--num-blocks",
        "64",
        "--dp",
        "2",
        "--json",
        "--no-cache",
    ]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["parallel"]["data_parallel_size"] == 2
    assert data["parallel"]["data_parallel_rank_local"] is None
    assert data["inputs"]["data_parallel_size"] == 2
