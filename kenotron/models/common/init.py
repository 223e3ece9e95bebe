"""Parameter initialization that gives the same weights under any parallel layout.

A model declares *how* each parameter is initialized (`param_init_specs()`: FQN -> InitSpec);
`init_parameters` does it. Each parameter draws from its own generator, seeded from the run
seed and the parameter's name, so the result depends neither on the order modules are
visited nor on which of them a rank holds (a pipeline stage keeps only some blocks). A
parameter that is a DTensor (sharded by FSDP or tensor parallel) is generated at full size
on its device, one parameter at a time, and each rank keeps its own shard: the weights are
bit-identical to the single-device ones for the same device type.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor


@dataclass(frozen=True)
class InitSpec:
    """Distribution of one parameter's initial values."""

    kind: Literal["normal", "trunc_normal", "ones", "zeros", "uniform", "log_uniform", "softplus_inverse"]
    """normal(0, std), normal(0, std) truncated at +-3 std, all ones, all zeros, uniform on
    [low, high], log of a uniform draw on [low, high] (Mamba's A_log), or the softplus inverse of
    exp(uniform on [log low, log high]) floored at `floor` (Mamba's dt bias: softplus(bias) is
    then log-uniform between low and high)."""
    std: float = 0.0
    """Standard deviation for the normal kinds."""
    low: float = 0.0
    """Lower bound of the uniform kinds."""
    high: float = 0.0
    """Upper bound of the uniform kinds."""
    floor: float = 0.0
    """softplus_inverse: the smallest value softplus(parameter) starts at."""


RANDOM_KINDS = ("normal", "trunc_normal", "uniform", "log_uniform", "softplus_inverse")
ONES = InitSpec("ones")
ZEROS = InitSpec("zeros")


def trunc_normal(std: float) -> InitSpec:
    return InitSpec("trunc_normal", std)


def normal(std: float) -> InitSpec:
    return InitSpec("normal", std)


def uniform(low: float, high: float) -> InitSpec:
    return InitSpec("uniform", low=low, high=high)


def param_seed(seed: int, fqn: str) -> int:
    """A per-parameter seed: stable across processes and Python runs (no hash randomization)."""
    return (seed * 1_000_003 + zlib.crc32(fqn.encode())) % (2**63)


def fill_(tensor: torch.Tensor, spec: InitSpec, generator: torch.Generator | None) -> None:
    if spec.kind == "ones":
        nn.init.ones_(tensor)
    elif spec.kind == "zeros":
        nn.init.zeros_(tensor)
    elif spec.kind == "normal":
        nn.init.normal_(tensor, 0.0, spec.std, generator=generator)
    elif spec.kind == "trunc_normal":
        nn.init.trunc_normal_(tensor, 0.0, spec.std, -3 * spec.std, 3 * spec.std, generator=generator)
    elif spec.kind == "uniform":
        nn.init.uniform_(tensor, spec.low, spec.high, generator=generator)
    elif spec.kind == "log_uniform":
        tensor.copy_(torch.empty_like(tensor, dtype=torch.float32).uniform_(spec.low, spec.high, generator=generator)
                     .log())
    elif spec.kind == "softplus_inverse":
        draw = torch.empty_like(tensor, dtype=torch.float32).uniform_(generator=generator)
        value = torch.exp(draw * (math.log(spec.high) - math.log(spec.low)) + math.log(spec.low)).clamp(min=spec.floor)
        tensor.copy_(value + torch.log(-torch.expm1(-value)))  # softplus(value + log(1 - e^-value)) = value
    else:
        raise ValueError(f"unknown init kind {spec.kind!r}; use one of {', '.join(RANDOM_KINDS + ('ones', 'zeros'))}")


@torch.no_grad()
def init_parameters(model: nn.Module, specs: dict[str, InitSpec], seed: int) -> None:
    """Initialize every parameter of `model` from `specs`, layout-invariantly (see module doc)."""
    for fqn, param in model.named_parameters():
        if fqn not in specs:
            raise KeyError(f"no init spec for parameter {fqn!r}; add it to the model's param_init_specs()")
        spec = specs[fqn]
        device = param.device_mesh.device_type if isinstance(param, DTensor) else param.device
        generator = None
        if spec.kind in RANDOM_KINDS:
            generator = torch.Generator(device=device).manual_seed(param_seed(seed, fqn))
        if isinstance(param, DTensor):
            full = torch.empty(param.shape, dtype=param.dtype, device=device)
            fill_(full, spec, generator)
            # src_data_rank=None: every rank holds the same full tensor, so each just slices.
            shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(shard.to_local())
        else:
            fill_(param, spec, generator)


def prefixed(prefix: str, specs: dict[str, InitSpec]) -> dict[str, InitSpec]:
    """Specs of a child module, keyed by their name in the parent."""
    return {f"{prefix}.{name}": spec for name, spec in specs.items()}
