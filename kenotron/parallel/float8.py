"""float8 training of the linear layers, and of the MoE layers' routed experts, through torchao
(optional dependency, imported lazily).

Each eligible `nn.Linear` becomes a torchao `Float8Linear`: its matmuls run in float8 with
dynamic scales (per tensor for "tensorwise", per row for "rowwise"), weights and master
copies stay in their usual dtype, so optimizer and checkpoints are unchanged. Applied before
tensor parallel and FSDP (torchao's Float8Linear composes with both; with "tensorwise" FSDP
can all-gather the float8 weights). The output projection stays in bf16 (its gradient feeds
the loss directly; float8 there costs accuracy for little speed), as do layers whose
dimensions are not multiples of 16 (the float8 GEMM needs them).

Routed experts (`float8.experts`): each GroupedExperts' two grouped GEMMs run through torchao's
rowwise float8 grouped GEMM (dynamic per-row scales of the tokens, per-column of each expert's
weight, in forward and backward), its groups padded to 16 rows as that kernel needs; the
weights stay in their dtype. It needs the "grouped_mm" expert kernel (tuning.expert_kernel:
CUDA, compute capability 9+, bf16).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging

import torch
from torch import nn

from kenotron.errors import ConfigError
from kenotron.models.common.experts import GroupedExperts

FLOAT8_RECIPES = ("tensorwise", "rowwise")
logger = logging.getLogger("kenotron")

INSTALL_HINT = "pip install 'kenotron[float8]' (torchao)"


def check_float8_available() -> None:
    """Refuse float8 before any process group exists when torchao is missing (ConfigError with the fix)."""
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(f"float8.enable=true needs torchao, which is not installed: {INSTALL_HINT}; "
                          f"or set float8.enable=false")


def use_fast_cpu_float8(device_type: str) -> bool:
    """On a CPU, turn oneDNN off for this process (True when it did, with one warning): oneDNN has only
    a reference float8 matmul on CPUs with AMX / AVX10, far slower than torch's own
    CPU `_scaled_mm`, which then runs. CPU float8 is for checking numerics, not for speed."""
    if device_type != "cpu" or not torch.backends.mkldnn.enabled:
        return False
    torch.backends.mkldnn.enabled = False
    logger.warning("float8 on a CPU checks numerics only (no speed): oneDNN is off for this run, so torch's own "
                   "float8 matmul runs instead of oneDNN's much slower reference kernel")
    return True


def float8_eligible(module: nn.Module, fqn: str) -> bool:
    if not isinstance(module, nn.Linear) or fqn.split(".")[-1] == "output":
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def convert_to_float8(model: nn.Module, recipe: str, *, fsdp_float8_all_gather: bool = False) -> int:
    """Swap eligible Linear layers for float8 ones in place; returns how many were converted."""
    if recipe not in FLOAT8_RECIPES:
        raise ValueError(f"float8 recipe {recipe!r} is not one of {', '.join(FLOAT8_RECIPES)}")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"float8 training needs torchao: {INSTALL_HINT}") from e
    config = Float8LinearConfig.from_recipe_name(recipe)
    if recipe == "tensorwise" and fsdp_float8_all_gather:
        config = dataclasses.replace(config, enable_fsdp_float8_all_gather=True)
    before = sum(isinstance(m, nn.Linear) for m in model.modules())
    convert_to_float8_training(model, module_filter_fn=float8_eligible, config=config)
    after = sum(type(m) is nn.Linear for m in model.modules())
    return before - after


FLOAT8_GROUP_ROWS = 16
"""Rows each expert's group is padded to for the float8 grouped GEMM (its kernels' requirement)."""


def check_float8_experts(enable: bool, experts: bool, expert_kernel: str, is_moe: bool) -> None:
    """float8.experts' config, before any process group (ConfigError naming the fix)."""
    if not experts:
        return
    if not enable:
        raise ConfigError("float8.experts=true needs float8.enable=true (the experts' float8 is part of float8 training)")
    if not is_moe:
        raise ConfigError("float8.experts=true but the model has no MoE layer; set float8.experts=false")
    if expert_kernel != "grouped_mm":
        raise ConfigError(f"float8.experts=true needs the grouped_mm expert kernel, but tuning.expert_kernel resolves to "
                          f"{expert_kernel!r} here: it needs CUDA with compute capability 9+ and bf16; or set "
                          f"float8.experts=false")


def float8_grouped_mm(x: torch.Tensor, w_t: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """GroupedExperts' product in float8: torchao's rowwise-scaled grouped GEMM, output in x's dtype."""
    from torchao.prototype.moe_training.fp8_grouped_mm import _to_fp8_rowwise_then_scaled_grouped_mm

    return _to_fp8_rowwise_then_scaled_grouped_mm(x, w_t, offsets, out_dtype=torch.bfloat16,
                                                  pad_token_groups_for_grouped_mm=False).to(x.dtype)


def convert_experts_to_float8(model: nn.Module) -> int:
    """Route every GroupedExperts of `model` through `float8_grouped_mm`; returns how many. Raises
    ValueError naming the fix when the experts' kernel or sizes cannot run it."""
    converted = 0
    for name, experts in model.named_modules():
        if not isinstance(experts, GroupedExperts):
            continue
        if experts.kernel != "grouped_mm":
            raise ValueError(f"float8.experts=true needs the grouped_mm expert kernel, but {name} runs "
                             f"{experts.kernel!r}: set tuning.expert_kernel=grouped_mm (CUDA, compute capability 9+, "
                             f"bf16) or float8.experts=false")
        dim, ffn = experts.w13.shape[-1], experts.ffn_dim
        if dim % 16 or ffn % 16:
            raise ValueError(f"float8.experts=true needs the model width ({dim}) and the expert width ({ffn}) to be "
                             f"multiples of 16; set float8.experts=false")
        experts.grouped_mm = float8_grouped_mm
        experts.row_alignment = FLOAT8_GROUP_ROWS
        converted += 1
    return converted
