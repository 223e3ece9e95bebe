"""torch.compile per transformer block.

Compiling each block separately (rather than the whole model) keeps graphs small, lets every
block reuse the first one's compiled code, and composes with FSDP's per-block hooks.
`Module.compile()` compiles in place, so parameter names keep no `_orig_mod.` prefix.
"""

from __future__ import annotations

from torch import nn


def compile_blocks(blocks: dict[str, nn.Module] | nn.ModuleDict, *, fullgraph: bool = True) -> None:
    for block in blocks.values():
        block.compile(fullgraph=fullgraph)
