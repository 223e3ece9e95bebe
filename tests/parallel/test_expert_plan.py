"""The plan of an MoE family shows where its experts go: print(plan) names the MoE layers and the
expert modules, plan.describe places expert weights over ep and the ranks ep leaves, the rest as
data-parallel weights; the mesh splits dp_shard in two under ep. No process group needed."""

from __future__ import annotations

import torch

from kenotron.models import get_model_spec
from kenotron.parallel import ParallelDims, plan_for


def _model_and_plan():
    spec = get_model_spec("qwen3_moe")
    with torch.device("meta"):
        model = spec.build(spec.model_args("debug", n_layers=2))
    return model, plan_for(spec)


def test_print_names_the_moe_layers_and_their_experts():
    _, plan = _model_and_plan()
    text = str(plan)
    assert "MoE layers: layers.*.feed_forward" in text
    assert ("experts: layers.*.feed_forward.experts (sharded over ep on the expert dim; own FSDP unit over efsdp, "
            "outside FSDP where efsdp x dp_replicate is 1)") in text


def test_describe_places_expert_weights_over_ep_then_the_ranks_ep_leaves():
    model, plan = _model_and_plan()
    rows = {r["name"]: r for r in plan.describe(model, {"dp_shard": 8, "ep": 2, "tp": 2})}
    w13 = rows["layers.0.feed_forward.experts.w13"]  # 8 experts x 512 x 256
    assert w13["placements"] == {"dp_shard": "S(0)", "ep": "S(0)", "tp": "R"}
    assert w13["local_shape"] == (1, 512, 256)  # 8 experts / ep 2 / efsdp 4
    gate = rows["layers.0.feed_forward.router.gate.weight"]  # replicated over tp, FSDP over dp_shard
    assert gate["placements"] == {"dp_shard": "S(0)", "ep": "(dp)", "tp": "R"} and gate["local_shape"] == (1, 256)
    wq = rows["layers.0.attention.wq.weight"]
    assert wq["placements"]["tp"] == "S(0)" and wq["local_shape"] == (32, 256)
    text = plan.format_description(model, {"dp_shard": 8, "ep": 2})
    assert "layers.0.feed_forward.experts.w2" in text and "ep" in text.splitlines()[0]


def test_ep_splits_dp_shard_into_efsdp_and_the_ranks_it_borrows():
    dims = ParallelDims.from_degrees(16, dp_shard=8, tp=2, ep=4)
    assert dims.efsdp == 2
    assert dims.mesh_shape() == (("efsdp", "dp_shard_in_ep", "tp"), (2, 4, 2))
    assert dims.degrees()["ep"] == 4 and dims.dp == 8
    with_cp = ParallelDims.from_degrees(8, dp_shard=2, cp=2, tp=2, ep=4)
    assert with_cp.mesh_shape() == (("efsdp", "dp_shard_in_ep", "cp", "tp"), (1, 2, 2, 2))
