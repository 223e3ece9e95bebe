"""Coordinate check: how the size of each layer's activations depends on the width, after a few
training steps, under one parametrization (Yang et al.'s test of µP; scripts/mup_coord_check.py).

For every width the model is the same family and flavor with `model.dim`, `model.n_heads`,
`model.n_kv_heads` and `model.ffn_dim` scaled together (heads of a fixed size), trained by the
real trainer for a few steps at one learning rate. After each step a fixed probe batch runs
forward and the root mean square of every probed activation is recorded: the embedding, each
block's attention and MLP outputs (what the block adds to the residual stream), and the logits.

Under spectral µP these stay the same size at every width; under the standard
parametrization they grow with it. `width_exponents` fits log2(RMS) against log2(width) per
activation: a slope near 0 is flat, a slope of 1 doubles with the width.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field

import torch
from torch import nn

from kenotron.config import load_config
from kenotron.train.trainer import Trainer

HEAD_DIM = 32
"""Head size of every width: the model widens by adding heads."""


def width_overrides(width: int, ffn_ratio: int = 3) -> list[str]:
    """`--model.*` values of a model of this width (heads of HEAD_DIM, half as many key/value heads)."""
    if width % (2 * HEAD_DIM):
        raise ValueError(f"width {width} must be a multiple of {2 * HEAD_DIM}")
    heads = width // HEAD_DIM
    return ["--model.dim", str(width), "--model.n_heads", str(heads), "--model.n_kv_heads", str(heads // 2),
            "--model.ffn_dim", str(ffn_ratio * width)]


@dataclass
class CoordCheck:
    """RMS of each probed activation after each step, per width: rms[width][name][step]."""

    parametrization: str
    widths: list[int]
    steps: int
    rms: dict[int, dict[str, list[float]]] = field(default_factory=dict)

    def at_step(self, step: int) -> dict[str, list[float]]:
        """{activation: [RMS at each width]} after `step` steps (0: at init)."""
        names = list(self.rms[self.widths[0]])
        return {name: [self.rms[w][name][step] for w in self.widths] for name in names}


def probe_points(model: nn.Module) -> dict[str, nn.Module]:
    """The modules whose outputs the check measures, by a short name."""
    points: dict[str, nn.Module] = {"embedding": model.tok_embeddings}
    for name, block in model.layers.items():
        points[f"layers.{name}.attention"] = block.attention
        points[f"layers.{name}.feed_forward"] = block.feed_forward
    points["logits"] = model.output
    return points


@torch.no_grad()
def _probe(model: nn.Module, tokens: torch.Tensor) -> dict[str, float]:
    found: dict[str, float] = {}
    hooks = [module.register_forward_hook(lambda _m, _i, out, name=name: found.__setitem__(
        name, out.float().pow(2).mean().sqrt().item())) for name, module in probe_points(model).items()]
    try:
        model(tokens)
    finally:
        for h in hooks:
            h.remove()
    return found


def run_width(width: int, parametrization: str, steps: int, overrides: list[str]) -> dict[str, list[float]]:
    """RMS per probed activation at init and after each of `steps` steps, for one width."""
    with tempfile.TemporaryDirectory() as folder:
        cfg = load_config(None, [
            "--model.parametrization", parametrization, "--training.steps", str(steps), "--job.dump_folder", folder,
            "--training.device", "cpu", "--metrics.tensorboard", "false", "--tuning.loss", "plain",
            *width_overrides(width), *overrides,
        ])
        trainer = Trainer(cfg)
        try:
            probe = trainer.loader.next_step()[0].inputs
            rms = {name: [value] for name, value in _probe(trainer.job.model, probe).items()}
            for _ in range(steps):
                trainer.run_step(trainer.loader.next_step())
                for name, value in _probe(trainer.job.model, probe).items():
                    rms[name].append(value)
        finally:
            trainer.close()
    return rms


def coord_check(widths: list[int], parametrization: str, steps: int = 4, overrides: list[str] = ()) -> CoordCheck:
    """Train every width for `steps` steps and record the activations' RMS (see module doc).

    `overrides` are more `--section.key value` pairs (learning rate, layers, data, ...)."""
    check = CoordCheck(parametrization, list(widths), steps)
    for width in widths:
        check.rms[width] = run_width(width, parametrization, steps, list(overrides))
    return check


def width_exponents(widths: list[int], values: dict[str, list[float]]) -> dict[str, float]:
    """Least-squares slope of log2(value) against log2(width), per activation."""
    xs = [math.log2(w) for w in widths]
    mean_x = sum(xs) / len(xs)
    out = {}
    for name, vals in values.items():
        ys = [math.log2(v) for v in vals]
        mean_y = sum(ys) / len(ys)
        out[name] = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return out
