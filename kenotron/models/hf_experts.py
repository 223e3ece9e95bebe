"""Expert weights between kenotron's stacked tensors and the hub's per-expert tensors.

kenotron (like transformers in memory) keeps the experts of a layer in 3-D tensors:
`experts.w13` (experts, 2F, dim) is every expert's [gate; up], `experts.w2` its down
projection. Checkpoints on the hub store one 2-D tensor per expert and projection
(`mlp.experts.3.gate_proj.weight`). A family's adapter names the per-expert parts of each
stacked tensor with "{e}" for the expert index, in row order:

    {"feed_forward.experts.w13": ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight")}

Export slices the stacked tensor (views, no copy); import stacks (a copy), one expert at a time.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence

import torch


class ExpertKeyError(ValueError):
    """Per-expert tensors that do not make up a whole stacked tensor."""


@functools.cache
def _pattern(template: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(template).replace(re.escape("{e}"), r"(\d+)") + "$")


def match_expert_key(suffix: str, expert_keys: Mapping[str, tuple[str, ...]]) -> tuple[str, int, int] | None:
    """(kenotron suffix, expert index, part index) of an HF layer-key suffix, or None."""
    for ours, parts in expert_keys.items():
        for part, template in enumerate(parts):
            m = _pattern(template).match(suffix)
            if m:
                return ours, int(m.group(1)), part
    return None


def split_experts(stacked: torch.Tensor, prefix: str, parts: tuple[str, ...]) -> dict[str, torch.Tensor]:
    """{prefix + per-expert key: view} of a stacked (experts, rows, cols) tensor."""
    n_experts, rows = stacked.shape[0], stacked.shape[1]
    if rows % len(parts):
        raise ExpertKeyError(f"{prefix}: {rows} rows do not split into {len(parts)} equal parts")
    step = rows // len(parts)
    return {
        prefix + template.format(e=e): stacked[e, i * step:(i + 1) * step]
        for e in range(n_experts) for i, template in enumerate(parts)
    }


def expert_sources(pieces: Mapping[tuple[int, int], str], n_experts: int, n_parts: int, name: str) -> tuple[str, ...]:
    """The per-expert keys of a stacked tensor, {(expert, part): HF key}, in its row order
    (expert 0's parts, expert 1's, ...), every expert and part present."""
    _check_complete(set(pieces), n_experts, n_parts, name)
    return tuple(pieces[e, i] for e in range(n_experts) for i in range(n_parts))


def stack_experts(keys: Sequence[str], n_parts: int, read: Callable[[str], torch.Tensor], name: str) -> torch.Tensor:
    """The stacked (experts, rows, cols) tensor of the per-expert `keys` (as `expert_sources`
    orders them), each read with `read` and copied in: besides the result, one expert's parts
    at most are in memory. The experts must agree in shape."""
    n_experts = len(keys) // n_parts
    out: torch.Tensor | None = None
    for e in range(n_experts):
        pieces = [read(k) for k in keys[e * n_parts:(e + 1) * n_parts]]
        if out is None:
            shapes = [tuple(p.shape) for p in pieces]
            out = pieces[0].new_empty((n_experts, sum(s[0] for s in shapes), *shapes[0][1:]))
        row = 0
        for piece, shape in zip(pieces, shapes, strict=True):
            if tuple(piece.shape) != shape:
                raise ExpertKeyError(f"{name}: expert {e} has shape {tuple(piece.shape)}, expert 0 has {shape}")
            out[e, row:row + shape[0]] = piece
            row += shape[0]
        del pieces  # copied into `out`
    return out


def _check_complete(present: set[tuple[int, int]], n_experts: int, n_parts: int, name: str) -> None:
    experts = {e for e, _ in present}
    if experts != set(range(n_experts)):
        missing = sorted(set(range(n_experts)) - experts)
        extra = sorted(experts - set(range(n_experts)))
        what = f"lacks experts {missing[:8]}" if missing else f"has experts {extra[:8]} beyond {n_experts}"
        raise ExpertKeyError(f"{name} {what}: the checkpoint's expert count differs from the model's "
                             f"({n_experts}); build the model from the checkpoint's config")
    for e in range(n_experts):
        for i in range(n_parts):
            if (e, i) not in present:
                raise ExpertKeyError(f"{name}: expert {e} lacks part {i}")
