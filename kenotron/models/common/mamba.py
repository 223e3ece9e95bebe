"""The Mamba-2 mixer and block: in-projection to z, x, B, C and dt, a causal depthwise
convolution, the SSD scan (ssd.py), a gated RMSNorm and the out-projection.

Layout. The in-projection's rows and the convolution's channels are stored group-major: for
each of the `groups` B/C groups, that group's [z, x, B, C, dt] rows (its heads' z and x, its
own B and C, its heads' dt), then the next group. With one group (every published Mamba-2)
that is exactly the Hugging Face / mamba_ssm order [z, x, B, C, dt]; with several, tensor
parallel can split the in-projection and the convolution into whole groups by plain row
slices (the family's HF adapter reorders the rows on conversion). Per-head parameters
(A_log, D, dt bias), the gated norm and the out-projection's input are in head order, which is
group order too.

Tensor parallel (models/mamba2/parallel_hints.py) shards the in-projection by rows and the
out-projection by columns, and the per-channel parameters of the convolution, the scan and
the gated norm along dim 0 (the "channels" style); these are read through `local_tensor`, so
the same code runs on a rank's heads and groups. Nothing else here knows about parallelism.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from kenotron.dtensor import local_tensor
from kenotron.models.common.init import ONES, ZEROS, InitSpec, uniform
from kenotron.models.common.mamba_ops import conv_silu, gated_rms_norm
from kenotron.models.common.norms import RMSNorm
from kenotron.models.common.ssd import ssd_chunked, ssd_step


@dataclass
class SSMLayerState:
    """One Mamba layer's generation state: what the convolution and the scan carry forward."""

    conv: torch.Tensor
    """(batch, kernel - 1, channels): the convolution's last inputs (zeros before the first token)."""
    ssm: torch.Tensor
    """(batch, heads, head_dim, state) in fp32: the scan's state after the last token."""


class CausalConv1d(nn.Module):
    """Depthwise causal convolution over (batch, seq, channels) and its SiLU:
    out_t = silu(bias + sum_k w_k x_{t-K+1+k}).

    Computed as K shifted multiply-adds (mamba_ops.py), which the compiler fuses into one pass;
    the weight has nn.Conv1d's depthwise shape (channels, 1, K).
    """

    def __init__(self, channels: int, kernel: int, bias: bool = True) -> None:
        super().__init__()
        self.channels = channels
        self.kernel = kernel
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel))
        self.bias = nn.Parameter(torch.empty(channels)) if bias else None

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None) -> torch.Tensor:
        """`history` (batch, K - 1, channels): the inputs before x (None: zeros)."""
        weight = local_tensor(self.weight)[:, 0].to(x.dtype)  # (channels, K)
        bias = local_tensor(self.bias).to(x.dtype) if self.bias is not None else None
        return conv_silu(x, weight, bias, history)

    def param_init_specs(self) -> dict[str, InitSpec]:
        # nn.Conv1d's default (mamba_ssm keeps it): uniform with bound 1/sqrt(fan_in), fan_in = K.
        bound = 1 / math.sqrt(self.kernel)
        specs = {"weight": uniform(-bound, bound)}
        if self.bias is not None:
            specs["bias"] = uniform(-bound, bound)
        return specs

    def extra_repr(self) -> str:
        return f"{self.channels}, kernel={self.kernel}, bias={self.bias is not None}"


class GatedRMSNorm(nn.Module):
    """RMSNorm(y * silu(z)) * weight, normalized per group of `group_size` channels (Mamba-2's
    norm before the out-projection: norm_before_gate=False, one group per B/C group)."""

    def __init__(self, dim: int, group_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim = dim
        self.group_size = group_size
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return gated_rms_norm(y, z, local_tensor(self.weight), self.group_size, self.eps)

    def param_init_specs(self) -> dict[str, InitSpec]:
        return {"weight": ONES}

    def extra_repr(self) -> str:
        return f"{self.dim}, group_size={self.group_size}, eps={self.eps}"


class SSDScan(nn.Module):
    """The scan's per-head parameters (A_log, D, dt bias) and the scan itself.

    Training runs ssd_chunked (the whole mixer runs kenotron's Triton op instead when the trainer
    installs it, `use_scan_kernel`); generation runs the chunked form with a carried state and
    the one-token recurrence."""

    def __init__(self, heads: int, chunk_size: int, *, a_init: tuple[float, float], dt_init: tuple[float, float, float]):
        super().__init__()
        self.heads = heads
        self.chunk_size = chunk_size
        self.a_init, self.dt_init = a_init, dt_init
        self.A_log = nn.Parameter(torch.empty(heads))
        self.D = nn.Parameter(torch.empty(heads))
        self.dt_bias = nn.Parameter(torch.empty(heads))

    def parameters_for_scan(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(A, D, dt bias) of this rank's heads, A = -exp(A_log) in fp32."""
        return -torch.exp(local_tensor(self.A_log).float()), local_tensor(self.D), local_tensor(self.dt_bias)

    def forward(self, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                state: SSMLayerState | None = None) -> torch.Tensor:
        """x (b, l, heads, head_dim), dt (b, l, heads), B and C (b, l, groups, N) -> y like x."""
        A, D, dt_bias = self.parameters_for_scan()
        if state is None:
            return ssd_chunked(x, dt, A, B, C, D, dt_bias, self.chunk_size)
        if x.shape[1] == 1:
            return ssd_step(state.ssm, x[:, 0], dt[:, 0], A, B[:, 0], C[:, 0], D, dt_bias)[:, None]
        y, final = ssd_chunked(x, dt, A, B, C, D, dt_bias, self.chunk_size, initial_state=state.ssm,
                               return_final_state=True)
        state.ssm.copy_(final)
        return y

    def param_init_specs(self) -> dict[str, InitSpec]:
        # As mamba_ssm: A uniform on a_init (A_log its log), D = 1, softplus(dt_bias) log-uniform.
        low, high, floor = self.dt_init
        return {
            "A_log": InitSpec("log_uniform", low=self.a_init[0], high=self.a_init[1]),
            "D": ONES,
            "dt_bias": InitSpec("softplus_inverse", low=low, high=high, floor=floor),
        }

    def extra_repr(self) -> str:
        return f"heads={self.heads}, chunk_size={self.chunk_size}"


@dataclass(frozen=True)
class MixerShape:
    """Dimensions of one Mamba-2 mixer."""

    dim: int
    heads: int
    head_dim: int
    groups: int
    state: int
    conv_kernel: int
    chunk_size: int

    @property
    def inner(self) -> int:
        return self.heads * self.head_dim

    @property
    def group_rows(self) -> int:
        """In-projection rows per group: its heads' z and x, its B and C, its heads' dt."""
        heads = self.heads // self.groups
        return 2 * heads * self.head_dim + 2 * self.state + heads

    @property
    def conv_channels(self) -> int:
        return self.inner + 2 * self.groups * self.state


class Mamba2Mixer(nn.Module):
    """x (batch, seq, dim) -> (batch, seq, dim): Mamba-2's sequence mixer (see the module doc)."""

    def __init__(self, shape: MixerShape, *, norm_eps: float, conv_bias: bool, proj_bias: bool,
                 a_init: tuple[float, float], dt_init: tuple[float, float, float], out_std_divisor: float) -> None:
        super().__init__()
        s = self.shape = shape
        self.out_std_divisor = out_std_divisor
        self.in_proj = nn.Linear(s.dim, s.groups * s.group_rows, bias=proj_bias)
        self.conv1d = CausalConv1d(s.conv_channels, s.conv_kernel, bias=conv_bias)
        self.ssm = SSDScan(s.heads, s.chunk_size, a_init=a_init, dt_init=dt_init)
        self.norm = GatedRMSNorm(s.inner, s.inner // s.groups, norm_eps)
        self.out_proj = nn.Linear(s.inner, s.dim, bias=proj_bias)
        self.triton_op = False
        """Whether training runs kenotron's Triton op between the projections (`use_scan_kernel`)."""

    def forward(self, x: torch.Tensor, *, state: SSMLayerState | None = None,
                token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """`state`: this layer's generation state, read and updated; `token_mask` (batch, seq):
        False for left padding, which is kept out of the convolution and the scan."""
        s = self.shape
        bsz, length, _ = x.shape
        proj = self.in_proj(x)
        if self.triton_op and state is None and token_mask is None:
            return self.out_proj(self._triton_mixer(proj))
        group_heads = s.heads // s.groups
        head_rows = group_heads * s.head_dim
        # The groups this rank holds (all of them without tensor parallel).
        proj = proj.view(bsz, length, -1, s.group_rows)
        groups = proj.shape[2]
        z, xbc, dt = proj.split([head_rows, head_rows + 2 * s.state, group_heads], dim=-1)
        xbc = xbc.reshape(bsz, length, -1)
        if token_mask is not None:
            xbc = xbc * token_mask[..., None].to(xbc.dtype)
        history = state.conv if state is not None else None
        conv_in = xbc
        xbc = self.conv1d(xbc, history)
        if state is not None:
            window = torch.cat([history.to(conv_in.dtype), conv_in], dim=1)
            state.conv.copy_(window[:, -(s.conv_kernel - 1):])
        if token_mask is not None:
            xbc = xbc * token_mask[..., None].to(xbc.dtype)
        xs, B, C = xbc.view(bsz, length, groups, -1).split([head_rows, s.state, s.state], dim=-1)
        y = self.ssm(xs.reshape(bsz, length, groups * group_heads, s.head_dim),
                     dt.reshape(bsz, length, groups * group_heads), B, C, state)
        y = self.norm(y.reshape(bsz, length, -1), z.reshape(bsz, length, -1))
        return self.out_proj(y)

    def _triton_mixer(self, proj: torch.Tensor) -> torch.Tensor:
        """The convolution, scan and gated norm in kenotron's one op (kernels/mamba_mixer_op.py)."""
        # on demand: only models with Mamba blocks load the Mamba kernels
        from kenotron.kernels.mamba_mixer_op import mamba_mixer

        s, conv = self.shape, self.conv1d
        A, D, dt_bias = self.ssm.parameters_for_scan()
        weight = local_tensor(conv.weight)[:, 0].to(proj.dtype)
        bias = local_tensor(conv.bias).to(proj.dtype) if conv.bias is not None else None
        out, _, _ = mamba_mixer(proj, weight, bias, A, D, dt_bias, local_tensor(self.norm.weight).to(proj.dtype),
                                s.head_dim, s.state, s.chunk_size, self.norm.eps)
        return out

    def param_init_specs(self) -> dict[str, InitSpec]:
        # mamba_ssm's: nn.Linear's default (uniform, bound 1/sqrt(fan_in)) for the in-projection,
        # the same divided by sqrt(layers) for the out-projection; biases zero.
        s = self.shape
        bound_in, bound_out = 1 / math.sqrt(s.dim), 1 / math.sqrt(s.inner) / self.out_std_divisor
        specs = {"in_proj.weight": uniform(-bound_in, bound_in), "out_proj.weight": uniform(-bound_out, bound_out)}
        for name in ("in_proj", "out_proj"):
            if getattr(self, name).bias is not None:
                specs[f"{name}.bias"] = ZEROS
        for name in ("conv1d", "ssm", "norm"):
            specs.update({f"{name}.{k}": v for k, v in getattr(self, name).param_init_specs().items()})
        return specs


class MambaBlock(nn.Module):
    """x + mixer(norm(x)): a pre-norm residual block around a Mamba-2 mixer."""

    def __init__(self, layer_id: int, dim: int, norm_eps: float, mixer: Mamba2Mixer) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.norm = RMSNorm(dim, norm_eps)
        self.mixer = mixer

    def forward(self, x: torch.Tensor, *, state: SSMLayerState | None = None,
                token_mask: torch.Tensor | None = None) -> torch.Tensor:
        if state is None and token_mask is None:
            return x + self.mixer(self.norm(x))
        return x + self.mixer(self.norm(x), state=state, token_mask=token_mask)

    def param_init_specs(self) -> dict[str, InitSpec]:
        specs = {f"norm.{k}": v for k, v in self.norm.param_init_specs().items()}
        specs.update({f"mixer.{k}": v for k, v in self.mixer.param_init_specs().items()})
        return specs


def unsupported_scan_sizes(model: nn.Module) -> str:
    """The Mamba mixer sizes of `model` that the Triton scan does not take ("" if none), for the
    kernel choice (kenotron/kernel_choice/tuning.py)."""
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    if not mixers:
        return ""
    from kenotron.kernels.ssd_op import supports  # on demand: only models with Mamba blocks load the kernels

    for module in mixers:
        s = module.shape
        if not supports(s.chunk_size, s.head_dim, s.state):
            return f"chunk_size={s.chunk_size}, ssm_head_dim={s.head_dim}, ssm_state={s.state}"
    return ""


def use_scan_kernel(model: nn.Module, kernel: str) -> None:
    """With kernel == "triton", every Mamba mixer of `model` runs its convolution, scan and gated
    norm in kenotron's Triton op in training (the trainer's choice, resolved once:
    kenotron/kernel_choice/tuning.py)."""
    mixers = [m for m in model.modules() if isinstance(m, Mamba2Mixer)]
    if mixers and kernel == "triton":
        # Imported on demand (a run without Mamba blocks never loads the Mamba kernels): this
        # registers kenotron::mamba_mixer before plan.apply, whose selective activation
        # checkpointing keeps the op's outputs once it is registered.
        from kenotron.kernels import mamba_mixer_op  # noqa: F401
    for module in mixers:
        module.triton_op = kernel == "triton"
