"""Which parameters Muon steps, at which rate, and the table that says so at start-up.

Muon is for the hidden matrices: every nn.Linear weight inside the model (attention and MLP
projections, MoE routers, Mamba's projections) and every MoE expert's matrices (GroupedExperts'
3-D weights, a batch of matrices each). AdamW keeps what is not a hidden matrix: embeddings
(they read one-hot tokens), the output layer (the weight a module declares through
`param_fans()` with the vocabulary as its fan-out), norms, biases, other vectors, convolution
kernels, and a "matrix" with one row or column (a scalar gate), whose orthogonal form is just
its direction. `optimizer.muon_include` / `muon_exclude` (fnmatch patterns on names) move
parameters across; what Muon gets must be a matrix or a 3-D batch of them.

The learning-rate rule (`optimizer.muon_lr_rule`) turns the orthogonalized update O (singular
values ~1, so entries of RMS ~1 / sqrt(max(m, n))) into a step at AdamW's lr:

- match_rms_adamw (Moonlight, "Muon is Scalable for LLM Training", 2025): lr * 0.2 *
  sqrt(max(m, n)) * O has RMS ~0.2 lr, the RMS of a typical AdamW update, so the lr and the
  weight decay tuned for AdamW carry over. The default under the standard parametrization.
- spectral: lr * 0.2 * sqrt(MUP_BASE_WIDTH) * sqrt(fan_out / fan_in) * O. Spectral µP asks
  each update's spectral norm to be ~sqrt(fan_out / fan_in) (models/common/parametrization.py);
  O's is ~1, so this is the rule that transfers the lr across widths. At the base width (256,
  a square matrix) it equals match_rms_adamw (0.2 * 16 = 3.2), so one lr tuned on the debug
  model means the same under both. The default under spectral µP, whose AdamW groups keep
  their own per-matrix rates (the output layer's lr * 256 / fan_in): the two compose because
  each parameter gets exactly one of the two rules.
"""

from __future__ import annotations

import fnmatch
import math
from typing import Any

from torch import nn

from kenotron.config import ConfigError
from kenotron.config import Optimizer as OptimizerConfig
from kenotron.models.common.experts import GroupedExperts
from kenotron.models.common.parametrization import MUP_BASE_WIDTH, spectral_lr_scales

MOONLIGHT_RMS = 0.2
"""The update RMS (in units of lr) Moonlight matches to AdamW's."""


def resolved_lr_rule(cfg: OptimizerConfig, parametrization: str) -> str:
    """optimizer.muon_lr_rule with 'auto' settled by the parametrization."""
    if cfg.muon_lr_rule != "auto":
        return cfg.muon_lr_rule
    return "spectral" if parametrization == "spectral_mup" else "match_rms_adamw"


def update_scale(shape: tuple[int, ...], rule: str) -> float:
    """The factor on lr for a Muon matrix (out, in), or a batch of them (..., out, in)."""
    fan_out, fan_in = shape[-2], shape[-1]
    if rule == "match_rms_adamw":
        return MOONLIGHT_RMS * math.sqrt(max(fan_out, fan_in))
    if rule == "spectral":
        return MOONLIGHT_RMS * math.sqrt(MUP_BASE_WIDTH) * math.sqrt(fan_out / fan_in)
    raise ConfigError(f"optimizer.muon_lr_rule={rule!r} does not exist; use 'auto', 'match_rms_adamw' or 'spectral'")


def _declared_outputs(model: nn.Module) -> set[str]:
    """Weights a module declares with the vocabulary as fan-out (the output layer)."""
    out = set()
    for prefix, module in model.named_modules():
        if hasattr(module, "param_fans"):
            out.update(f"{prefix}.{k}" if prefix else k for k, fans in module.param_fans().items() if fans.fan_out == 1)
    return out


def muon_names(model: nn.Module, include: list[str], exclude: list[str]) -> set[str]:
    """Names of the parameters Muon steps (module docstring); ConfigError for an included
    parameter that is no matrix."""
    outputs = _declared_outputs(model)
    chosen: set[str] = set()
    for prefix, module in model.named_modules():
        if isinstance(module, nn.Linear):
            locals_ = ["weight"]
        elif isinstance(module, GroupedExperts):
            locals_ = ["w13", "w2"]
        else:
            continue
        for local in locals_:
            name = f"{prefix}.{local}" if prefix else local
            p = getattr(module, local)
            if name not in outputs and min(p.shape[-2:]) > 1:
                chosen.add(name)
    named = dict(model.named_parameters())  # a tied weight under its first name
    chosen &= set(named)
    for name, p in named.items():
        pattern = next((pat for pat in include if fnmatch.fnmatchcase(name, pat)), None)
        if pattern is None:
            continue
        if p.ndim not in (2, 3):
            raise ConfigError(f"optimizer.muon_include pattern {pattern!r} puts {name} (shape {tuple(p.shape)}) in "
                              f"Muon, which steps matrices or 3-D batches of them; narrow the pattern or add "
                              f"{name!r} to optimizer.muon_exclude")
        chosen.add(name)
    return {n for n in chosen if not any(fnmatch.fnmatchcase(n, pat) for pat in exclude)}


def muon_param_groups(model: nn.Module, cfg: OptimizerConfig, parametrization: str) -> list[dict[str, Any]]:
    """Muon groups (one per update scale, `muon=True`) then AdamW groups (decay for matrices and
    embeddings, none for vectors; spectral µP's rates under spectral_mup), in parameter order."""
    rule = resolved_lr_rule(cfg, parametrization)
    muon = muon_names(model, cfg.muon_include, cfg.muon_exclude)
    adamw_scales = spectral_lr_scales(model) if parametrization == "spectral_mup" else {}
    groups: dict[tuple, dict[str, Any]] = {}
    seen: set[int] = set()
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        if name in muon:
            scale = update_scale(tuple(p.shape), rule)
            group = groups.setdefault(("muon", scale), {"params": [], "muon": True, "update_scale": scale,
                                                        "weight_decay": cfg.weight_decay, "lr": cfg.lr})
        else:
            decay, lr_scale = p.ndim >= 2, adamw_scales.get(name, 1.0)
            group = groups.setdefault(("adamw", decay, lr_scale), {
                "params": [], "muon": False, "weight_decay": cfg.weight_decay if decay else 0.0,
                "lr": cfg.lr * lr_scale})
        group["params"].append(p)
    return sorted(groups.values(), key=lambda g: not g["muon"])


def group_table(model: nn.Module, groups: list[dict[str, Any]]) -> str:
    """One line per group: optimizer, lr (and Muon's update scale), weight decay, tensors,
    elements, and the first parameter names (the start-up table of docs/optimizers.md)."""
    names = {id(p): n for n, p in model.named_parameters()}
    lines = [f"{'optimizer':<9} {'lr':>9} {'scale':>7} {'wd':>6} {'tensors':>7} {'elements':>12}  parameters"]
    for g in groups:
        params = [p for p in g["params"] if id(p) in names]
        if not params:
            continue
        shown = ", ".join(names[id(p)] for p in params[:3]) + (f", ... ({len(params) - 3} more)" if len(params) > 3 else "")
        scale = f"{g['update_scale']:.3g}" if g["muon"] else "-"
        lines.append(f"{'muon' if g['muon'] else 'adamw':<9} {g['lr']:>9.3g} {scale:>7} {g['weight_decay']:>6.3g} "
                     f"{len(params):>7} {sum(p.numel() for p in params):>12,}  {shown}")
    return "\n".join(lines)
