"""The Triton SSD scan: its launchers (`scan_forward`, `scan_backward`, which the Mamba mixer op
runs between its convolution and its gated norm: mamba_mixer_op.py), and the scan alone as a
PyTorch custom op with its backward, `ssd_scan(x, dt, A, B, C, D, dt_bias, chunk_size)`, with
models/common/ssd.py's `ssd_chunked` semantics (the tests and `scripts/bench_mamba2.py --rows
scan` compare it with that scan and with mamba_ssm's).

A custom op (torch.library) rather than an autograd.Function: torch.compile keeps it whole
(no graph break), and under a FakeTensorMode it runs its fake implementation, whose kernels'
buffers the estimator books through kernels/workspace.py. Only the inputs are saved for
backward; the per-chunk states are recomputed there.

Shapes it takes: chunk size, head size and state size powers of two of at least 16 (every
published Mamba-2: 256, 64 and 128), heads a multiple of groups (`supports` says whether a
model qualifies; kenotron/kernel_choice/tuning.py falls back to the PyTorch scan otherwise).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kenotron.kernels.workspace import register_scratch

__all__ = ["scan_backward", "scan_forward", "scan_scratch", "ssd_scan", "supports"]


def supports(chunk_size: int, head_dim: int, state: int) -> bool:
    """Whether the kernels take a mixer of these sizes."""
    return all(v >= 16 and v & (v - 1) == 0 for v in (chunk_size, head_dim, state)) and chunk_size <= 256


def _sizes(x: Tensor, B: Tensor, chunk_size: int) -> dict[str, int]:
    b, length, heads, head_dim = x.shape
    groups, state = B.shape[2], B.shape[3]
    block = min(64, chunk_size)
    split = next(s for s in (8, 4, 2, 1) if (heads // groups) % s == 0)
    return {"b": b, "l": length, "h": heads, "p": head_dim, "g": groups, "n": state, "chunk": chunk_size,
            "nc": -(-length // chunk_size), "block": block, "block_n": min(64, state), "splits": split}


def _forward_buffers(x: Tensor, s: dict[str, int]) -> dict[str, Tensor]:
    f32 = {"dtype": torch.float32, "device": x.device}
    rows = (s["b"], s["h"], s["nc"] * s["chunk"])
    return {
        "dt": torch.empty(rows, **f32), "cs": torch.empty(rows, **f32),
        "cb": torch.empty(s["b"], s["nc"], s["g"], s["chunk"], s["chunk"], **f32),
        "states": torch.empty(s["b"], s["nc"], s["h"], s["n"], s["p"], **f32),
    }


def _last_contiguous(*tensors: Tensor) -> list[Tensor]:
    return [t if t.stride(-1) == 1 else t.contiguous() for t in tensors]


def _precision(x: Tensor) -> str:
    # fp32 inputs stay fp32 in the products (no TF32); bf16 / fp16 run natively on the tensor cores.
    return "ieee" if x.dtype == torch.float32 else "tf32"


def _run_forward_kernels(x, dt, A, B, C, dt_bias, s, buf) -> None:
    # optional package: the Triton kernels load on the first CUDA scan
    from kenotron.kernels.ssd import _dt_kernel, _scores_kernel, _states_kernel

    prec = _precision(x)
    _dt_kernel[(s["b"] * s["h"], s["nc"])](
        dt, dt_bias, A, buf["dt"], buf["cs"], s["l"], s["h"], s["nc"], *dt.stride(), CHUNK=s["chunk"])
    blocks = s["chunk"] // s["block"]
    _scores_kernel[(s["b"] * s["nc"] * s["g"], blocks, blocks)](
        B, C, buf["cb"], s["l"], s["g"], s["nc"], *B.stride()[:3], *C.stride()[:3], CHUNK=s["chunk"], NSTATE=s["n"],
        BLOCK=s["block"], BLOCK_K=s["block_n"], PRECISION=prec)
    _states_kernel[(s["b"] * s["h"], s["n"] // s["block_n"])](
        x, B, buf["dt"], buf["cs"], buf["states"], s["l"], s["h"], s["g"], s["nc"], *x.stride()[:3], *B.stride()[:3],
        CHUNK=s["chunk"], HEADDIM=s["p"], NSTATE=s["n"], BLOCK_N=s["block_n"], BLOCK_K=s["block"], PRECISION=prec)


def scan_forward(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, dt_bias: Tensor, chunk_size: int,
                 y: Tensor) -> None:
    """Write the scan's output into `y` (b, l, heads, head_dim; any strides with the last one 1)."""
    # optional package: Triton kernel, loaded on use
    from kenotron.kernels.ssd import _output_kernel

    s = _sizes(x, B, chunk_size)
    buf = _forward_buffers(x, s)
    _run_forward_kernels(x, dt, A, B, C, dt_bias, s, buf)
    _output_kernel[(s["b"] * s["nc"] * s["h"], s["chunk"] // s["block"])](
        x, C, buf["cb"], buf["dt"], buf["cs"], buf["states"], D, y, s["l"], s["h"], s["g"], s["nc"],
        *x.stride()[:3], *C.stride()[:3], *y.stride()[:3], CHUNK=s["chunk"], HEADDIM=s["p"], NSTATE=s["n"],
        BLOCK=s["block"], BLOCK_K=s["block_n"], PRECISION=_precision(x))


@torch.library.custom_op("kenotron::ssd_scan", mutates_args=())
def ssd_scan(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, dt_bias: Tensor,
             chunk_size: int) -> Tensor:
    """y (b, l, heads, head_dim) of the scan; see ssd_chunked for the arguments."""
    x, dt, B, C = _last_contiguous(x, dt, B, C)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    scan_forward(x, dt, A, B, C, D, dt_bias, chunk_size, y)
    return y


@ssd_scan.register_fake
def _ssd_scan_fake(x, dt, A, B, C, D, dt_bias, chunk_size):
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _backward_buffers(x: Tensor, s: dict[str, int]) -> dict[str, Tensor]:
    f32 = {"dtype": torch.float32, "device": x.device}
    b, h, nc, chunk, blocks = s["b"], s["h"], s["nc"], s["chunk"], s["chunk"] // s["block"]
    return {
        "dstates": torch.empty(b, nc, h, s["n"], s["p"], **f32),
        "ddecay": torch.empty(b, h, nc, s["n"] // s["block_n"], **f32),
        "dcb": torch.empty(b, nc, s["g"], chunk, chunk, **f32),
        "dcs_part": torch.zeros(b, h, nc, blocks, chunk, **f32),
        "dsrc_part": torch.zeros(b, h, nc, blocks, chunk, **f32),
        "dcs_off": torch.empty(b, h, nc * chunk, **f32),
        "ddt": torch.empty(b, h, nc * chunk, **f32),
        "ddt_state": torch.empty(b, h, nc * chunk, **f32),
        "dD_part": torch.empty(b, nc, h, blocks, **f32),
        "dlast_part": torch.empty(b, nc, h, blocks, **f32),
        "dC_part": torch.empty(s["splits"], b * nc * s["g"], chunk, s["n"], **f32),
        "dB_part": torch.empty(s["splits"], b * nc * s["g"], chunk, s["n"], **f32),
        "dA_part": torch.empty(b, h, nc, **f32),
        "dbias_part": torch.empty(b, h, nc, **f32),
    }


def _gathered(part: Tensor, s: dict[str, int]) -> Tensor:
    """(splits, b·chunks·groups, Q, N) partial sums -> (b, l, groups, N)."""
    total = part.sum(0).view(s["b"], s["nc"], s["g"], s["chunk"], s["n"]).transpose(2, 3)
    return total.reshape(s["b"], s["nc"] * s["chunk"], s["g"], s["n"])[:, : s["l"]]


def scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, dt_bias: Tensor,
                  chunk_size: int, dx: Tensor, ddt_raw: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Write the gradients of x and dt into `dx` and `ddt_raw` (any strides with the last one 1, in
    x's and dt's dtypes); return (dA, dB, dC, dD, d dt_bias), dB and dC as fp32 (b, l, groups, N) views."""
    # optional package: Triton kernels, loaded on use
    from kenotron.kernels.ssd_backward import (
        _b_grad_kernel,
        _c_grad_kernel,
        _dt_grad_kernel,
        _score_grad_kernel,
        _state_grad_kernel,
        _x_grad_kernel,
    )

    s = _sizes(x, B, chunk_size)
    buf = _forward_buffers(x, s)
    _run_forward_kernels(x, dt, A, B, C, dt_bias, s, buf)
    grad = _backward_buffers(x, s)
    prec, chunk, block, blocks = _precision(x), s["chunk"], s["block"], s["chunk"] // s["block"]
    sizes = {"CHUNK": chunk, "HEADDIM": s["p"], "NSTATE": s["n"]}
    _state_grad_kernel[(s["b"] * s["h"], s["n"] // s["block_n"])](
        dy, C, buf["cs"], buf["states"], grad["dstates"], grad["ddecay"], s["l"], s["h"], s["g"], s["nc"],
        *dy.stride()[:3], *C.stride()[:3], **sizes, BLOCK_N=s["block_n"], BLOCK_K=block, PRECISION=prec)
    _score_grad_kernel[(s["b"] * s["nc"] * s["g"], blocks, blocks)](
        dy, x, buf["cb"], buf["dt"], buf["cs"], grad["dcb"], grad["dcs_part"], grad["dsrc_part"], s["l"], s["h"], s["g"],
        s["nc"],
        *dy.stride()[:3], *x.stride()[:3], CHUNK=chunk, HEADDIM=s["p"], BLOCK=block, PRECISION=prec)
    _x_grad_kernel[(s["b"] * s["nc"] * s["h"], blocks)](
        x, dy, B, buf["cb"], buf["dt"], buf["cs"], grad["dstates"], D, dx, grad["ddt"], grad["ddt_state"], grad["dD_part"],
        grad["dlast_part"], s["l"], s["h"], s["g"], s["nc"], *x.stride()[:3], *dy.stride()[:3], *B.stride()[:3],
        *dx.stride()[:3], **sizes, BLOCK=block, BLOCK_K=s["block_n"], PRECISION=prec)
    split_heads = s["h"] // s["g"] // s["splits"]
    grid = (s["b"] * s["nc"] * s["g"], blocks, s["splits"])
    _c_grad_kernel[grid](
        dy, C, B, grad["dcb"], buf["cs"], buf["states"], grad["dC_part"], grad["dcs_off"], s["l"], s["h"], s["g"],
        s["nc"], split_heads, *dy.stride()[:3], *C.stride()[:3], *B.stride()[:3], **sizes, BLOCK=block,
        PRECISION=prec, num_warps=8)
    _b_grad_kernel[grid](
        x, B, C, grad["dcb"], buf["dt"], buf["cs"], grad["dstates"], grad["dB_part"], s["l"], s["h"], s["g"], s["nc"],
        split_heads, *x.stride()[:3], *C.stride()[:3], **sizes, BLOCK=block, PRECISION=prec, num_warps=8)
    _dt_grad_kernel[(s["b"] * s["h"], s["nc"])](
        dt, dt_bias, A, buf["dt"], grad["ddt"], grad["ddt_state"], grad["dcs_part"], grad["dsrc_part"], grad["dcs_off"],
        grad["dlast_part"], grad["ddecay"],
        ddt_raw, grad["dA_part"], grad["dbias_part"], s["l"], s["h"], s["nc"], *dt.stride(), *ddt_raw.stride(),
        CHUNK=chunk, BLOCKS=blocks, N_TILES=s["n"] // s["block_n"])
    dA = grad["dA_part"].sum((0, 2)).to(A.dtype)
    dD = grad["dD_part"].sum((0, 1, 3)).to(D.dtype)
    dbias = grad["dbias_part"].sum((0, 2)).to(dt_bias.dtype)
    return dA, _gathered(grad["dB_part"], s), _gathered(grad["dC_part"], s), dD, dbias


def scan_scratch(x: Tensor, B: Tensor, chunk_size: int, backward: bool) -> list[int]:
    """Bytes of each buffer the kernels of one direction allocate and free (made on the meta
    device, which allocates nothing): the estimator's count (kernels/workspace.py)."""
    meta = torch.empty(0, device="meta")
    s = _sizes(x, B, chunk_size)
    buffers = [*_forward_buffers(meta, s).values(), *(_backward_buffers(meta, s).values() if backward else ())]
    return [t.nbytes for t in buffers]


@torch.library.custom_op("kenotron::ssd_scan_backward", mutates_args=())
def ssd_scan_backward(dy: Tensor, x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor, dt_bias: Tensor,
                      chunk_size: int) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, ddt, dA, dB, dC, dD, d dt_bias) of `ssd_scan`."""
    dy, x, dt, B, C = _last_contiguous(dy, x, dt, B, C)
    dx = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    ddt_raw = torch.empty(dt.shape, dtype=dt.dtype, device=dt.device)
    dA, dB, dC, dD, dbias = scan_backward(dy, x, dt, A, B, C, D, dt_bias, chunk_size, dx, ddt_raw)
    return dx, ddt_raw, dA, dB.to(B.dtype).contiguous(), dC.to(C.dtype).contiguous(), dD, dbias


@ssd_scan_backward.register_fake
def _ssd_scan_backward_fake(dy, x, dt, A, B, C, D, dt_bias, chunk_size):
    like = [x, dt, A, B, C, D, dt_bias]
    return tuple(torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in like)


def _setup_context(ctx, inputs, output) -> None:
    x, dt, A, B, C, D, dt_bias, chunk_size = inputs
    ctx.save_for_backward(x, dt, A, B, C, D, dt_bias)
    ctx.chunk_size = chunk_size


def _backward(ctx, dy):
    return (*ssd_scan_backward(dy, *ctx.saved_tensors, ctx.chunk_size), None)


ssd_scan.register_autograd(_backward, setup_context=_setup_context)
register_scratch("kenotron::ssd_scan", lambda x, dt, A, B, C, D, dt_bias, chunk: scan_scratch(x, B, chunk, False))
register_scratch("kenotron::ssd_scan_backward",
                 lambda dy, x, dt, A, B, C, D, dt_bias, chunk: scan_scratch(x, B, chunk, True))
