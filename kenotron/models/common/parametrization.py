"""Spectral µP: initialization and per-matrix learning rates by fan-in and fan-out.

After Yang, Simon & Bernstein, "A Spectral Condition for Feature Learning" (2023): features
keep learning at every width when each weight matrix W, and each of its updates ΔW, has a
spectral norm of order sqrt(fan_out / fan_in). Both rules below come from that condition,
with the fans of the whole (unsharded) matrix, so a tensor-parallel shard or an FSDP shard
gets exactly the values of the single-device model.

- Init: std = (1 / sqrt(fan_in)) * min(1, sqrt(fan_out / fan_in)) for every weight matrix.
- Learning rate: AdamW divides each gradient entry by its own scale, so its update has entries
  of size ~lr whatever the width, and a low-rank update of such entries has spectral norm
  ~lr * sqrt(fan_in * fan_out). The condition then asks for lr ∝ 1 / fan_in (the rule
  fan_out / fan_in is SGD's, whose updates carry the gradient's own scale: docs/mup.md).
  A matrix with fan-in n trains at optimizer.lr * MUP_BASE_WIDTH / n.

The vocabulary is not a width: the embedding reads one-hot tokens (fan-in counted as 1, so
std 1 and the base learning rate) and the output layer's classes do not grow with the model
(fan-out counted as 1, so std 1 / fan_in, the paper's output layer). Vectors (norm scales,
biases) keep their init and the base learning rate.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from torch import nn

from kenotron.errors import ConfigError
from kenotron.models.common.init import InitSpec

PARAMETRIZATIONS = ("standard", "spectral_mup")

MUP_BASE_WIDTH = 256
"""Fan-in at which a matrix trains at optimizer.lr under spectral µP: the width of every family's
debug flavor, where the default optimizer.lr was chosen."""


@dataclass(frozen=True)
class Fans:
    """Input and output sizes of one weight matrix of the whole model (not of a shard)."""

    fan_in: int
    fan_out: int

    @property
    def reads_tokens(self) -> bool:
        """An input layer of one-hot tokens (an embedding)."""
        return self.fan_in == 1


def spectral_std(fans: Fans) -> float:
    """The paper's init scale: (1 / sqrt(fan_in)) * min(1, sqrt(fan_out / fan_in))."""
    return min(1.0, math.sqrt(fans.fan_out / fans.fan_in)) / math.sqrt(fans.fan_in)


def spectral_lr_scale(fans: Fans | None) -> float:
    """AdamW learning-rate multiplier: 1 for vectors and embeddings, MUP_BASE_WIDTH / fan_in else."""
    if fans is None or fans.reads_tokens:
        return 1.0
    return MUP_BASE_WIDTH / fans.fan_in


def matrix_fans(model: nn.Module) -> dict[str, Fans]:
    """Fans of every weight matrix of `model` by parameter name, from the global shapes (a
    DTensor's shape is the whole tensor's; so is a meta tensor's).

    Linear weights (out, in) and embeddings (vocab, dim) are known; any module may state its
    own with a `param_fans()` method ({local parameter name: Fans}), which is how the decoder
    marks its output layer. Another parameter of two or more dimensions has no known fans, and
    spectral µP refuses the model rather than guess.
    """
    declared: dict[str, Fans] = {}
    for prefix, module in model.named_modules():
        if hasattr(module, "param_fans"):
            declared.update({f"{prefix}.{k}" if prefix else k: v for k, v in module.param_fans().items()})
    fans: dict[str, Fans] = {}
    for name, param in model.named_parameters():
        if name in declared:
            fans[name] = declared[name]
            continue
        if param.ndim < 2:
            continue
        owner_name, _, local = name.rpartition(".")
        owner = model.get_submodule(owner_name)
        if isinstance(owner, nn.Embedding) and local == "weight":
            fans[name] = Fans(1, param.shape[1])
        elif isinstance(owner, nn.Linear) and local == "weight":
            fans[name] = Fans(param.shape[1], param.shape[0])
        else:
            raise ConfigError(
                f"model.parametrization='spectral_mup' needs the fan-in and fan-out of {name} (shape "
                f"{tuple(param.shape)}), which is neither a Linear nor an Embedding weight; give its module a "
                f"param_fans() method (models/common/parametrization.py) or use model.parametrization='standard'"
            )
    return fans


def spectral_init_specs(model: nn.Module, specs: dict[str, InitSpec]) -> dict[str, InitSpec]:
    """`specs` (the family's standard init) with every random weight matrix at the spectral std."""
    out = dict(specs)
    for name, fans in matrix_fans(model).items():
        spec = out.get(name)
        if spec is not None and spec.kind in ("normal", "trunc_normal"):
            out[name] = dataclasses.replace(spec, std=spectral_std(fans))
    return out


def spectral_lr_scales(model: nn.Module) -> dict[str, float]:
    """Learning-rate multiplier of every parameter of `model` that is not at the base rate."""
    return {name: spectral_lr_scale(fans) for name, fans in matrix_fans(model).items()
            if spectral_lr_scale(fans) != 1.0}
