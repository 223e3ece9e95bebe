"""Mamba-2 1.3B training, kenotron beside mamba_ssm's own MambaLMHeadModel, one table.

    python scripts/bench_mamba2.py --mamba-ssm-src path/to/mamba_ssm-2.3.0             # every row
    python scripts/bench_mamba2.py --rows kenotron-compiled,kenotron-eager             # kenotron only
    python scripts/bench_mamba2.py --mamba-ssm-src ... --rows scan,mamba_ssm-compiled  # the scans alone, one reference

Shape: 48 layers of width 2048 (state 128, heads of 64, one group, chunks of 256), vocabulary
50288, batch 8 x 2048 tokens, bf16, AdamW, on one GPU. Rows:

- kenotron-compiled / kenotron-eager: the trainer on synthetic tokens (kenotron/tools/bench.py's
  case runner; preset h200-1gpu-mamba2), its defaults for one GPU: bf16 parameters with fp32
  masters in its Triton AdamW, its Triton SSD scan, the fused loss, per-block torch.compile.
- mamba_ssm-eager / mamba_ssm-compiled: mamba_ssm 2.3.x's MambaLMHeadModel (Mamba2 layers,
  use_mem_eff_path off, fused add+RMSNorm in its Triton kernel, tied embeddings) in a plain loop:
  fp32 parameters under bf16 autocast, torch's fused AdamW, cross-entropy on the logits; compiled
  = torch.compile of the whole model. Run from its source tree (`--mamba-ssm-src`: its Python and
  Triton code; its CUDA extensions are not built: the Mamba-1 `selective_scan_cuda`, which
  Mamba-2 does not use, is stubbed so the package imports, and without `causal_conv1d` its
  convolution is torch's nn.Conv1d).
- scan: one layer's scan alone, forward + backward, kenotron's Triton kernels against
  mamba_ssm's `mamba_chunk_scan_combined`, bf16.

Each row runs in a process of its own. Timings: median over the timed steps after warm-up
steps, on CUDA events; memory: the largest allocated and reserved over the timed steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

ROWS = ("scan", "kenotron-compiled", "kenotron-eager", "mamba_ssm-eager", "mamba_ssm-compiled")
BATCH, SEQ, VOCAB = 8, 2048, 50277


def _import_mamba_ssm(src: str):
    """mamba_ssm from its source tree, without its CUDA extensions (see the module doc)."""
    sys.path.insert(0, src)
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    import mamba_ssm

    return mamba_ssm


def reference_worker(src: str, compiled: bool, warmup: int, steps: int) -> dict:
    import torch
    import torch.nn.functional as F

    _import_mamba_ssm(src)
    from mamba_ssm.models.config_mamba import MambaConfig
    from mamba_ssm.models.mixer_seq_simple import MambaLMHeadModel

    torch.manual_seed(0)
    config = MambaConfig(d_model=2048, n_layer=48, vocab_size=VOCAB, ssm_cfg={"layer": "Mamba2", "use_mem_eff_path": False},
                         rms_norm=True, residual_in_fp32=True, fused_add_norm=True, pad_vocab_size_multiple=16,
                         tie_embeddings=True)
    model = MambaLMHeadModel(config, device="cuda", dtype=torch.float32)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, fused=True)
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), device="cuda")
    inputs, labels = tokens[:, :-1], tokens[:, 1:]

    def step() -> torch.Tensor:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = forward(inputs).logits
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    losses = []
    for i in range(steps):
        events[i].record()
        losses.append(step())
    events[steps].record()
    torch.cuda.synchronize()
    times = [events[i].elapsed_time(events[i + 1]) / 1e3 for i in range(steps)]
    return {"tokens_per_sec": BATCH * SEQ / statistics.median(times),
            "memory_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
            "memory_reserved_gib": torch.cuda.max_memory_reserved() / 2**30, "loss_last": losses[-1].item(),
            "params": sum(p.numel() for p in model.parameters())}


def scan_worker(src: str) -> dict:
    """Forward + backward of one 1.3B layer's scan: kenotron's kernels and mamba_ssm's, bf16."""
    import torch
    import triton.testing

    from kenotron.kernels.ssd_op import ssd_scan

    _import_mamba_ssm(src)
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    torch.manual_seed(0)
    heads, head_dim, state = 64, 64, 128
    x = torch.randn(BATCH, SEQ, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    dt = (torch.randn(BATCH, SEQ, heads, device="cuda") - 2).bfloat16()
    A = -torch.rand(heads, device="cuda") * 15 - 1
    B, C = (torch.randn(BATCH, SEQ, 1, state, device="cuda", dtype=torch.bfloat16) / 8 for _ in range(2))
    D, bias = torch.ones(heads, device="cuda"), torch.randn(heads, device="cuda") - 4
    leaves = [t.requires_grad_() for t in (x, dt, A, B, C, D, bias)]
    dy = torch.randn_like(x)

    def ours():
        torch.autograd.grad(ssd_scan(*leaves, 256), leaves, dy)

    def theirs():
        y = mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, dt_bias=bias, dt_softplus=True)
        torch.autograd.grad(y, leaves, dy)

    def forward_only(fn):
        with torch.no_grad():
            fn()

    out = {}
    for name, fn in (("kenotron", ours), ("mamba_ssm", theirs)):
        fn()
        out[f"{name}_fwd_bwd_ms"] = triton.testing.do_bench(fn, warmup=5, rep=40)
    out["kenotron_fwd_ms"] = triton.testing.do_bench(lambda: forward_only(lambda: ssd_scan(*leaves, 256)), rep=40)
    out["mamba_ssm_fwd_ms"] = triton.testing.do_bench(lambda: forward_only(
        lambda: mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, dt_bias=bias, dt_softplus=True)), rep=40)
    with torch.no_grad():
        ref = mamba_chunk_scan_combined(x, dt, A, B, C, 256, D=D, dt_bias=bias, dt_softplus=True).float()
        out["max_diff_vs_mamba_ssm"] = (ssd_scan(*leaves, 256).float() - ref).abs().max().item() / ref.abs().max().item()
    return out


def run_in_process(args: list[str], timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "row.json")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, __file__, "--worker", out, *args], capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0 or not os.path.exists(out):
            lines = (proc.stdout + proc.stderr).strip().splitlines()
            cause = next((ln for ln in lines if "Error" in ln or "out of memory" in ln.lower()), lines[-1] if lines else "")
            return {"error": cause.strip()[:300], "tail": "\n".join(lines[-12:])}
        return {**json.loads(Path(out).read_text()), "wall_s": time.perf_counter() - t0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mamba-ssm-src", default="", help="mamba_ssm 2.3.x source tree (unpacked sdist)")
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=420)
    parser.add_argument("--profile", action="store_true", help="print the top CUDA kernels of the kenotron rows")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--kind", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        if args.kind == "scan":
            result = scan_worker(args.mamba_ssm_src)
        else:
            result = reference_worker(args.mamba_ssm_src, args.kind == "mamba_ssm-compiled", args.warmup, args.steps)
        Path(args.worker).write_text(json.dumps(result))
        return 0

    from kenotron.tools.bench import PRESETS, format_row, run_case

    rows = [r for r in args.rows.split(",") if r]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        parser.error(f"unknown rows {unknown}; use {', '.join(ROWS)}")
    if any(not r.startswith("kenotron") for r in rows) and not args.mamba_ssm_src:
        parser.error("the scan and mamba_ssm rows need --mamba-ssm-src")
    print("| row | tokens/s | peak GiB alloc / reserved | last loss | notes |\n|---|---|---|---|---|", flush=True)
    common = ["--mamba-ssm-src", args.mamba_ssm_src, "--warmup", str(args.warmup), "--steps", str(args.steps)]
    results = {}
    for row in rows:
        if row.startswith("kenotron"):
            name = "1.3B b8x2048 " + row.removeprefix("kenotron-")
            r = run_case(name, PRESETS["h200-1gpu-mamba2"][name], 1, args.warmup, args.steps, args.timeout,
                         profile=args.profile)
            results[row] = r
            print(format_row(r).replace(f"| {name} |", f"| {row} |", 1), flush=True)
            if r.get("profile"):
                print(r.pop("profile"), flush=True)
            continue
        r = run_in_process(common + ["--kind", row], args.timeout)
        results[row] = r
        if "error" in r:
            print(f"| {row} | failed: {r['error']} | | | |\n{r['tail']}", flush=True)
        elif row == "scan":
            print(f"| scan (one layer, fwd+bwd) | kenotron {r['kenotron_fwd_bwd_ms']:.3f} ms, mamba_ssm "
                  f"{r['mamba_ssm_fwd_bwd_ms']:.3f} ms | | | forward {r['kenotron_fwd_ms']:.3f} vs "
                  f"{r['mamba_ssm_fwd_ms']:.3f} ms; outputs differ by {r['max_diff_vs_mamba_ssm']:.1e} (relative) |",
                  flush=True)
        else:
            print(f"| {row} | {r['tokens_per_sec']:,.0f} | {r['memory_allocated_gib']:.1f} / "
                  f"{r['memory_reserved_gib']:.1f} | {r['loss_last']:.3f} | {r['params'] / 1e9:.3f} B parameters |",
                  flush=True)
    ours, ref = results.get("kenotron-compiled", {}), results.get("mamba_ssm-compiled", {})
    if "tokens_per_sec" in ours and "tokens_per_sec" in ref:
        print(f"\nkenotron compiled / mamba_ssm compiled: {ours['tokens_per_sec'] / ref['tokens_per_sec']:.3f}x", flush=True)
    return 0 if all("error" not in r for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
