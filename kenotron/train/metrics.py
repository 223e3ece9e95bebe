"""Training metrics: one progress line and one JSON record per log step, TensorBoard optional.

Records go to `<dump_folder>/metrics.jsonl`, one JSON object per line, with at least:
step, loss (this step's), loss_avg (mean over the steps since the previous record), grad_norm, lr, tokens_per_sec (per device), tflops (per device), mfu (percent, or
null on a device with no known peak), memory_gib (peak: CUDA max allocated, or the process's
peak RSS on CPU), elapsed_s (since training started), plus tokens_seen, step_time_s,
data_wait_s (seconds per step the loop waited for its batch) and tokens_seen/<dataset>. MoE
models add aux_loss and z_loss (the last step's, mean over layers) and per layer L
moe_load_max/L and moe_load_mean/L (token copies per expert) and moe_aux/L.
Validation records (`record_validation`) are lines of their own: step, val_loss, val_ppl,
val_tokens and val_time_s; TensorBoard gets them as val/loss and val/ppl.

A log record's device values (the losses, the gradient norm, the extensions' loads and losses,
the divergence checks' state) are read on the host in one copy (`read_on_host`): on a GPU each
read waits for every kernel queued before it, and the device idles until the host has queued the
next step. Steps that do not log read nothing (tools/host_reads.py finds reads that creep in).
"""

from __future__ import annotations

import json
import logging
import math
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kenotron.dtensor import full_tensor
from kenotron.train.flops import peak_flops

logger = logging.getLogger("kenotron")

SCALAR_KEYS = ("loss", "grad_norm", "lr", "tokens_per_sec", "tflops", "mfu", "memory_gib")
"""The scalars TensorBoard and Weights & Biases get, as `train/<key>`."""
RECORD_KEYS = (
    "step", "loss", "loss_avg", "grad_norm", "lr", "tokens_per_sec", "tflops", "mfu",
    "memory_gib", "elapsed_s", "tokens_seen", "step_time_s",
)


@dataclass
class Deferred:
    """Device values whose host-side use waits for the record's one read (`read_on_host`)."""

    values: torch.Tensor
    """Any shape, on the device; read flattened."""
    finish: Callable[[list[float]], dict[str, Any]]
    """Gets the values as Python floats, returns the record keys they make (it may raise, or warn)."""


def read_on_host(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every device value read on the host in one copy: a 0-d tensor becomes a float,
    a larger one a flat list, a Deferred's key is replaced by the keys its `finish` returns (in
    order: one that raises stops the rest); anything else is kept as it is."""
    read = {k: v.values if isinstance(v, Deferred) else v for k, v in values.items()
            if isinstance(v, (torch.Tensor, Deferred))}
    if not read:
        return dict(values)
    flat = [full_tensor(t.detach()).reshape(-1).to(torch.float64) for t in read.values()]
    host = torch.cat(flat).tolist()  # the one read: float64 keeps int64 step numbers exact
    out: dict[str, Any] = {}
    start = 0
    for key, value in values.items():
        if key not in read:
            out[key] = value
            continue
        n = read[key].numel()
        part, start = host[start:start + n], start + n
        if isinstance(value, Deferred):
            out.update(value.finish(part))
        else:
            out[key] = part[0] if value.dim() == 0 else part
    return out


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process so far: CUDA max allocated, else peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    scale = 1 if sys.platform != "darwin" else 1 / 1024  # macOS reports bytes
    return rss_kib * scale / 2**20


def device_peak_flops(device: torch.device) -> tuple[str, float | None]:
    """(device name, peak bf16 FLOP/s or None)."""
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"{device.type} ({torch.get_num_threads()} threads)"
    return name, peak_flops(name)


@dataclass
class MetricsLogger:
    """Turns per-step numbers into records; writes them on rank 0 only.

    Throughput is measured over the window since the previous record (so the first record
    includes warm-up and compilation), per device: global tokens / seconds / world size.
    """

    dump_folder: Path
    flops_per_token: float
    world_size: int
    device: torch.device
    write: bool = True
    tensorboard: bool = False
    total_steps: int = 0
    """training.steps, for the `step/total` and the ETA of the progress line (0: not shown)."""
    log_freq: int = 1
    wandb: Any = None
    """An optional extra sink with `log(record)` and `close()` (kenotron/train/wandb_logger.py)."""
    _start: float = field(default_factory=time.perf_counter, init=False)
    _window_start: float = field(default_factory=time.perf_counter, init=False)
    _window_tokens: int = field(default=0, init=False)
    _window_steps: int = field(default=0, init=False)
    _tb: Any = field(default=None, init=False)
    _jsonl: Any = field(default=None, init=False)
    _first_step: int | None = field(default=None, init=False)
    _rate_origin: tuple[int, float] | None = field(default=None, init=False)
    """(step, time) of this launch's first record: the ETA uses the pace since then (no warm-up)."""
    _peak: float | None = field(default=None, init=False)
    _warned_peak: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        name, self._peak = device_peak_flops(self.device)
        self.device_name = name

    def open(self, purge_step: int | None = None) -> None:
        """Open metrics.jsonl (appending) and TensorBoard's writer; `purge_step` tells TensorBoard to
        drop the events at and after that step written earlier (a resumed run's replayed steps)."""
        if not self.write or self._jsonl is not None:
            return
        self.dump_folder.mkdir(parents=True, exist_ok=True)
        self._jsonl = (self.dump_folder / "metrics.jsonl").open("a", buffering=1)
        if self.tensorboard:
            # Imported here: needs the optional tensorboard package.
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.dump_folder / "tb"), purge_step=purge_step)

    def should_log(self, step: int) -> bool:
        """A record at the first step of this launch, every log_freq steps, and at the last step."""
        if self._first_step is None:
            self._first_step = step
        return step == self._first_step or step % self.log_freq == 0 or step == self.total_steps

    def reset_clock(self) -> None:
        """Start timing now (call right before the first training step)."""
        self._start = self._window_start = time.perf_counter()
        self._window_tokens = self._window_steps = 0

    def count(self, global_tokens: int) -> None:
        """Account one finished optimizer step that consumed `global_tokens` tokens."""
        self._window_tokens += global_tokens
        self._window_steps += 1

    def record(
        self, *, step: int, loss: float, grad_norm: float, lr: float, tokens_seen: int, loss_avg: float | None = None,
        extra: dict[str, float] | None = None,
    ) -> dict[str, Any]:
        """Close the window at this step: build, print and write the record (with `extra` keys
        added: the data loader's figures, an MoE model's per-layer expert loads and losses)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        seconds = max(now - self._window_start, 1e-9)
        tps = self._window_tokens / seconds / self.world_size
        tflops = tps * self.flops_per_token / 1e12
        if self._peak is None and not self._warned_peak:
            # A CPU has no peak in the table by design (an info line); an unknown GPU is worth a warning.
            log = logger.warning if self.device.type == "cuda" else logger.info
            log("no peak FLOP/s known for device %r: MFU is not reported", self.device_name)
            self._warned_peak = True
        mfu = 100.0 * tflops * 1e12 / self._peak if self._peak else None
        rec = {
            "step": step,
            "loss": loss,
            "loss_avg": loss if loss_avg is None else loss_avg,
            "grad_norm": grad_norm,
            "lr": lr,
            "tokens_per_sec": tps,
            "tflops": tflops,
            "mfu": mfu,
            "memory_gib": peak_memory_gib(self.device),
            "elapsed_s": now - self._start,
            "tokens_seen": tokens_seen,
            "step_time_s": seconds / max(self._window_steps, 1),
        }
        rec.update(extra or {})
        eta = self._eta(step, now, rec["step_time_s"])
        self._window_start, self._window_tokens, self._window_steps = now, 0, 0
        if self.write:
            self.open()
            self._jsonl.write(json.dumps(rec) + "\n")
            if self._tb is not None:
                for key in (*SCALAR_KEYS, *(extra or {})):
                    if rec[key] is not None:
                        self._tb.add_scalar(f"train/{key}", rec[key], step)
            if self.wandb is not None:
                self.wandb.log(rec)
            logger.info(format_record(rec, total_steps=self.total_steps, eta_s=eta))
        return rec

    def record_validation(self, *, step: int, loss: float, tokens: int, seconds: float) -> dict[str, Any]:
        """Write one validation record (mean token loss over the validation batches, its
        perplexity). Its time is left out of the training throughput."""
        self._window_start += seconds
        rec = {"step": step, "val_loss": loss, "val_ppl": math.exp(min(loss, 700.0)), "val_tokens": tokens,
               "val_time_s": seconds}
        if self.write:
            self.open()
            self._jsonl.write(json.dumps(rec) + "\n")
            if self._tb is not None:
                self._tb.add_scalar("val/loss", loss, step)
                self._tb.add_scalar("val/ppl", rec["val_ppl"], step)
            if self.wandb is not None:
                self.wandb.log(rec)
            logger.info("step %6d | validation loss %.4f | perplexity %.2f | %s tokens | %.1fs", step, loss,
                        rec["val_ppl"], _si(tokens), seconds)
        return rec

    def _eta(self, step: int, now: float, step_time_s: float) -> float | None:
        if not self.total_steps:
            return None
        if self._rate_origin is None or step <= self._rate_origin[0]:
            self._rate_origin = (step, now)
            return None  # the first record's pace includes start-up and compilation
        else:
            step_time_s = (now - self._rate_origin[1]) / (step - self._rate_origin[0])
        return max(self.total_steps - step, 0) * step_time_s

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self.wandb is not None:
            self.wandb.close()
            self.wandb = None


def _si(x: float) -> str:
    for unit, scale in (("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.0f}"


def format_duration(seconds: float) -> str:
    """`42s`, `3m05s`, `2h07m`."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def format_record(rec: dict[str, Any], *, total_steps: int = 0, eta_s: float | None = None) -> str:
    """The one-line progress view of a record: step/total, losses, speed, memory, elapsed and ETA."""
    mfu = f"{rec['mfu']:.1f}%" if rec["mfu"] is not None else "n/a"
    width = len(str(total_steps)) if total_steps else 6
    step = f"{rec['step']:>{width}}/{total_steps}" if total_steps else f"{rec['step']:>6}"
    eta = f" | ETA {format_duration(eta_s)}" if eta_s is not None else ""
    moe = f" | aux {rec['aux_loss']:.4f}" if "aux_loss" in rec else ""
    return (
        f"step {step} | loss {rec['loss']:.4f} (avg {rec['loss_avg']:.4f}) | grad_norm {rec['grad_norm']:.3f} | lr {rec['lr']:.2e} | "
        f"{_si(rec['tokens_per_sec'])} tok/s | {rec['tflops']:.3g} TFLOP/s | MFU {mfu} | "
        f"mem {rec['memory_gib']:.2f} GiB{moe} | {format_duration(rec['elapsed_s'])}{eta}"
        + (f" | data wait {rec['data_wait_s'] * 1e3:.1f} ms/step" if rec.get("data_wait_s") is not None else "")
        + (f" | slow rank {rec['slowest_rank']}: {rec['slowest_rank_s'] * 1e3:.1f} ms/step of compute, median "
           f"{rec['median_rank_s'] * 1e3:.1f}" if rec.get("slow_rank_named") else "")
    )
