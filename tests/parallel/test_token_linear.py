"""The "token_linear" style (parallel/tensor.py's LinearOnSequenceShards): a Linear with weights
replicated over tp, applied to this rank's sequence shard under sequence parallel (DeepSeek-V3's
MTP projection). Its product runs on local tensors (torch 2.11 refuses F.linear on a
sequence-sharded DTensor: it flattens a sharded dimension), its output is the local shard, and
the weight's gradient, summed over tp, is the whole sequence's."""

from __future__ import annotations

from unittest import mock

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard

from kenotron.models.deepseek_v3.parallel_hints import DEEPSEEK_V3_TP_STYLES
from kenotron.parallel.tensor import style_object
from tests.distributed.pool import run_on_ranks


def _shard_and_whole() -> dict:
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import parallelize_module

    torch.manual_seed(0)
    whole = nn.Linear(8, 4)
    x = torch.randn(2, 6, 8)
    reference = whole(x)
    reference.square().sum().backward()
    sharded = nn.Linear(8, 4)
    sharded.load_state_dict(whole.state_dict())
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    parallelize_module(sharded, mesh, style_object("token_linear", sharded, sp=True, loss_parallel=False))
    rank, half = dist.get_rank(), x.shape[1] // 2
    shard = DTensor.from_local(x[:, rank * half:(rank + 1) * half], mesh, [Shard(1)], run_check=False)
    linear = F.linear
    inputs = []

    def recording_linear(a, *rest):
        inputs.append(type(a).__name__)
        return linear(a, *rest)

    with mock.patch.object(F, "linear", recording_linear):
        out = sharded(shard)
    out.square().sum().backward()
    return {"inputs": inputs, "out_type": type(out).__name__,
            "out": torch.allclose(out, reference[:, rank * half:(rank + 1) * half].detach(), atol=1e-6),
            "weight_grad": torch.allclose(sharded.weight.grad.full_tensor(), whole.weight.grad, atol=1e-5),
            "bias_grad": torch.allclose(sharded.bias.grad.full_tensor(), whole.bias.grad, atol=1e-5)}


def test_token_linear_multiplies_local_shards_and_sums_its_weight_gradient_over_tp():
    for result in run_on_ranks(2, _shard_and_whole):
        assert result == {"inputs": ["Tensor"], "out_type": "Tensor", "out": True, "weight_grad": True,
                          "bias_grad": True}


def test_deepseek_v3_mtp_projection_takes_the_token_linear_style_only_under_sequence_parallel():
    assert DEEPSEEK_V3_TP_STYLES["layers.*.eh_proj"] == "token_linear"
    assert style_object("token_linear", nn.Linear(2, 2), sp=False, loss_parallel=False) is None
