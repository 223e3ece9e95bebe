"""Which ops of a training step read the device on the host, and from where.

On a GPU the host runs ahead of the device, queueing kernels; an op whose result the host needs
(a `.item()`, a `bool(tensor)`, an output whose size depends on the values) makes it wait until
the device has run everything queued before it, and the device then idles while the host
launches what follows. This tool finds those ops on any machine, CPU included, by recording every
op that would read the device on the host:

    with HostReads() as reads:
        train_step(job, microbatches)
    print(reads.table())      # op, count, where (a short Python stack, innermost frame first)
    assert not reads.reads

What counts (HOST_READ_OPS): `aten._local_scalar_dense` (item, bool, int, float of a tensor),
`tolist()` and `numpy()` (which read a CPU tensor's memory without an op), ops whose output size
depends on the values (nonzero, masked_select, boolean-mask indexing and index_put, unique,
repeat_interleave without output_size, bincount), `equal`, copies of a device tensor to the
CPU and, seen on a GPU only, copies to it that wait (`_copy_kind`). On a CPU machine every tensor stands for a device tensor: `host_tensors` names the ones a GPU
run keeps in host memory (the optimizers' CPU step counters: `optimizer_step_counters`), whose
reads cost nothing there. On a GPU run a read of a CPU tensor never counts.

Run it over eager code: a compiled region runs as one opaque graph (its own host reads appear as
that graph's). `python -m kenotron.tools.host_reads --steps 3 -- --config X ...` trains a few
steps of a config and prints the table.
"""

from __future__ import annotations

import argparse
import sys
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from kenotron.config import load_config, split_config_arg
from kenotron.tools.step_timeline import HOST_BLOCK_US, HOST_SYNC, STEP_RANGE, read_trace
from kenotron.train.trainer import Trainer, setup_logging

aten = torch.ops.aten

_SIZE_FROM_VALUES = "its output's size depends on the values"
HOST_READ_OPS: dict[Any, str] = {
    aten._local_scalar_dense: "item(), bool(), int() or float() of a tensor",
    aten.nonzero: _SIZE_FROM_VALUES,
    aten.masked_select: _SIZE_FROM_VALUES,
    aten._unique2: _SIZE_FROM_VALUES,
    aten.unique_consecutive: _SIZE_FROM_VALUES,
    aten.unique_dim: _SIZE_FROM_VALUES,
    aten.bincount: "its length is the largest value + 1",
    aten.equal: "returns a Python bool",
    aten.repeat_interleave: "without output_size its output's size depends on the values",
    aten.index: "a boolean mask as index (nonzero inside)",
    aten.index_put: "a boolean mask as index (nonzero inside)",
    aten.index_put_: "a boolean mask as index (nonzero inside)",
    aten._index_put_impl_: "a boolean mask as index (nonzero inside)",
    aten._to_copy: "a copy to the CPU",
    aten.copy_: "a copy to the CPU",  # (or to a GPU: `_copy_kind`)
}
"""The ops that read the device on the host (some only with some arguments: `_reads_host`)."""
TO_HOST = "a copy to the CPU"
BLOCKING = "a copy to the GPU with non_blocking=False (torch then synchronizes the stream)"
PAGEABLE = "a copy to the GPU from unpinned memory (the driver stages it and may wait)"
PYTHON_READS = {"tolist": "tolist() reads every value", "numpy": "numpy() reads every value"}
"""Tensor methods that read the values without an op on a CPU tensor (seen by a TorchFunctionMode)."""
_OWN_FILE = str(Path(__file__).resolve())
_TORCH_DIR = str(Path(torch.__file__).resolve().parent)


@dataclass(frozen=True)
class HostRead:
    """One recorded read."""

    op: str
    """The op (`aten.nonzero.default`) or the tensor method (`Tensor.tolist`)."""
    why: str
    """Why it reads on the host."""
    stack: tuple[str, ...]
    """`file:line function` of the calling frames outside torch, innermost first."""
    label: Any = None
    """What `label()` returned when it was read (e.g. the training step)."""


def _short(filename: str) -> str:
    parts = Path(filename).parts
    for root in ("kenotron", "tests", "scripts"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root):])
    return "/".join(parts[-2:])


def python_stack(depth: int) -> tuple[str, ...]:
    """The `depth` innermost frames of the caller outside torch and this file."""
    frames = []
    frame = sys._getframe(1)
    while frame is not None and len(frames) < depth:
        name = frame.f_code.co_filename
        if not name.startswith((_TORCH_DIR, _OWN_FILE)) and not name.startswith("<"):
            frames.append(f"{_short(name)}:{frame.f_lineno} {frame.f_code.co_name}")
        frame = frame.f_back
    return tuple(frames)


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _reads_host(packet: Any, args: tuple, kwargs: dict) -> bool:
    """Whether this call of a HOST_READ_OPS op reads the device (some do only with some arguments)."""
    if packet is aten.repeat_interleave:
        # output_size is keyword-only; an int count of repeats (self_int) needs no read either.
        return kwargs.get("output_size") is None and not isinstance(args[1] if len(args) > 1 else None, int)
    if packet is aten.index:
        return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1]))
    if packet in (aten.index_put, aten.index_put_, aten._index_put_impl_):
        return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1]))
    if packet in (aten._to_copy, aten.copy_):
        return _copy_kind(packet, args, kwargs) is not None
    return True


def _copy_kind(packet: Any, args: tuple, kwargs: dict) -> str | None:
    """What a copy between the host and a GPU waits for, or None when it waits for nothing:
    TO_HOST (a device tensor to the CPU), BLOCKING (to a GPU with non_blocking=False: torch
    synchronizes the stream after it), PAGEABLE (to a GPU from unpinned memory: the driver stages
    it and may wait)."""
    if packet is aten._to_copy:
        src, device = args[0], kwargs.get("device")
        dst = torch.device(device).type if device is not None else src.device.type
        non_blocking = kwargs.get("non_blocking", False)
    else:
        src, dst = args[1], args[0].device.type
        non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if dst == "cpu" and src.device.type != "cpu":
        return TO_HOST
    if dst == "cuda" and src.device.type == "cpu" and src.numel():
        return PAGEABLE if non_blocking and not src.is_pinned() else BLOCKING if not non_blocking else None
    return None


class _MethodReads(TorchFunctionMode):
    """Sees `tolist()` / `numpy()`, which read a CPU tensor without an op."""

    def __init__(self, owner: HostReads) -> None:
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in PYTHON_READS and args and isinstance(args[0], torch.Tensor):
            self.owner._record(f"Tensor.{name}", PYTHON_READS[name], args[0])
            self.owner._inside_method += 1
            try:
                return func(*args, **(kwargs or {}))
            finally:
                self.owner._inside_method -= 1
        return func(*args, **(kwargs or {}))


class HostReads(TorchDispatchMode):
    """Records the host reads of the code run inside it (module docstring). `host_tensors`: called
    at each candidate read, the tensors that a GPU run keeps in host memory (their reads do not
    count); `label`: called at each read, stored with it (which step it was); `depth`: frames kept."""

    def __init__(self, host_tensors: Callable[[], Iterable[torch.Tensor]] = tuple,
                 label: Callable[[], Any] = lambda: None, depth: int = 4) -> None:
        super().__init__()
        self.host_tensors, self.label, self.depth = host_tensors, label, depth
        self.reads: list[HostRead] = []
        self._derived: weakref.WeakValueDictionary = weakref.WeakValueDictionary()
        """CPU tensors computed from host tensors alone (host memory on a GPU run too)."""
        self._seeds: tuple[Any, set[int]] | None = None
        self._inside_method = 0
        self._methods = _MethodReads(self)

    def __enter__(self):
        self._methods.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        out = super().__exit__(*exc)
        self._methods.__exit__(*exc)
        return out

    def _on_host(self, t: torch.Tensor, look_again: bool = False) -> bool:
        """Whether `t` is host memory on a GPU run (reading it waits for nothing): a CPU tensor
        there; here one of `host_tensors` or computed from them alone. `host_tensors` is called
        again when the label changes (a new batch) and, with `look_again`, when `t` is not among
        them (states made during the step: an optimizer's first)."""
        if t.device.type != "cpu":
            return False
        if torch.cuda.is_initialized():  # a GPU run: every CPU tensor is host memory
            return True
        if self._derived.get(id(t)) is t:
            return True
        try:
            storage = t.untyped_storage().data_ptr()
        except RuntimeError:  # no data (a freed FSDP buffer, a functional collective's wrapper): the device's
            return False
        label = self.label()
        if self._seeds is None or label != self._seeds[0] or (look_again and storage not in self._seeds[1]):
            self._seeds = (label, {h.untyped_storage().data_ptr() for h in self.host_tensors() if h.numel()})
        return storage in self._seeds[1]

    def _record(self, op: str, why: str, tensor: torch.Tensor | None) -> None:
        if tensor is not None and self._on_host(tensor, look_again=True):
            return
        self.reads.append(HostRead(op, why, python_stack(self.depth), self.label()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in HOST_READ_OPS and not self._inside_method and _reads_host(packet, args, kwargs):
            kind = _copy_kind(packet, args, kwargs) if packet in (aten._to_copy, aten.copy_) else None
            if kind in (BLOCKING, PAGEABLE):  # the source is host memory by definition: it counts
                self._record(str(func), kind, None)
            else:
                self._record(str(func), HOST_READ_OPS[packet], (_tensors(args) or [None])[0])
        out = func(*args, **kwargs)
        inputs = _tensors(args) + _tensors(list(kwargs.values()))
        if inputs and all(self._on_host(t) for t in inputs):
            self._derived.update((id(t), t) for t in _tensors(out) if t.device.type == "cpu")
        return out

    def table(self, per: int = 1) -> str:
        """One line per (op, stack) with its count (divided by `per`, e.g. the steps run)."""
        if not self.reads:
            return "no host reads"
        counts = Counter((r.op, r.why, r.stack) for r in self.reads)
        lines = [f"{'reads':>7}  op (why)  <- where"]
        for (op, why, stack), n in counts.most_common():
            lines.append(f"{n / per:7.2f}  {op} ({why})\n" + "".join(f"{'':9}<- {frame}\n" for frame in stack).rstrip())
        return "\n".join(lines)


def optimizer_step_counters(optimizers: Iterable[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The optimizers' `step` states kept on the CPU (torch's AdamW without `capturable`,
    kenotron's fused AdamW): host memory on a GPU run too, read there at no cost."""
    return [s["step"] for o in optimizers for s in o.state.values()
            if isinstance(s.get("step"), torch.Tensor) and s["step"].device.type == "cpu"]


class TrainerSteps:
    """A Trainer's loop seen by HostReads: `label` is the loop iteration a read belongs to (the
    finished steps, plus one while `run_step` runs: step N's passes, optimizer and balance update,
    then its log when N logs), `host_tensors` what a GPU run keeps on the host (the step's batch,
    the optimizers' step counters). It wraps the trainer's `run_step` to know both."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer, self.running, self.batch = trainer, False, []
        run_step = trainer.run_step

        def labelled(microbatches):
            self.running, self.batch = True, [t for mb in microbatches for t in vars(mb).values()
                                              if isinstance(t, torch.Tensor)]
            try:
                return run_step(microbatches)
            finally:
                self.running = False

        trainer.run_step = labelled

    def label(self) -> int:
        return self.trainer.train_state.step + (1 if self.running else 0)

    def host_tensors(self) -> list[torch.Tensor]:
        return self.batch + optimizer_step_counters(self.trainer.job.torch_optimizers)


def record_training(trainer: Trainer) -> HostReads:
    """Train `trainer` to its end (trainer.train()) with every host read recorded, labelled by step."""
    steps = TrainerSteps(trainer)
    reads = HostReads(steps.host_tensors, label=steps.label)
    with reads:
        trainer.train()
    return reads


def blocking_calls(trace: dict) -> list[tuple[str, str, float, float]]:
    """What a GPU trace's host synchronizations were: the runtime calls inside the traced steps
    that tools/step_timeline.py counts as such (a synchronizing call, or any call that blocked
    the host over HOST_BLOCK_US: a launch into a full queue, a copy from pageable memory, the
    allocator freeing), each with the innermost profiler range around it on its thread (the op
    that made it): (call, op, calls per step, host ms per step), the most host time first."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e.get("name") == STEP_RANGE and "dur" in e]
    ranges = [e for e in events if e.get("cat") in ("cpu_op", "user_annotation") and "dur" in e
              and e.get("name") != STEP_RANGE]
    found: Counter = Counter()
    host_us: Counter = Counter()
    for e in events:
        if e.get("cat") != "cuda_runtime" or "dur" not in e or not any(lo <= e["ts"] < hi for lo, hi in steps):
            continue
        if not (HOST_SYNC.match(e["name"]) or e["dur"] > HOST_BLOCK_US):
            continue
        around = [r for r in ranges if r.get("tid") == e.get("tid") and r["ts"] <= e["ts"] < r["ts"] + r["dur"]]
        op = min(around, key=lambda r: r["dur"])["name"] if around else "?"
        found[e["name"], op] += 1
        host_us[e["name"], op] += e["dur"]
    n = max(len(steps), 1)
    return sorted(((call, op, count / n, host_us[call, op] / n / 1e3) for (call, op), count in found.items()),
                  key=lambda row: -row[3])


def main(argv: list[str] | None = None) -> int:
    """Train `--steps` steps of a config (eager) with the reads recorded, and print where they
    are; or, with --trace, say what a GPU trace's host synchronizations were."""
    parser = argparse.ArgumentParser(description="which ops of a training step read the device on the host")
    parser.add_argument("--steps", type=int, default=3, help="training steps")
    parser.add_argument("--log-freq", type=int, default=2, help="metrics.log_freq of the run (the first and last steps log too)")
    parser.add_argument("--trace", nargs="+", metavar="TRACE.json.gz",
                        help="instead: the blocking runtime calls of bench.py --timeline traces, and the op around each")
    args, rest = parser.parse_known_args(argv)
    if args.trace:
        for path in args.trace:
            print(f"{path}: host synchronizations per step (runtime call, the op around it, calls, host ms)")
            for call, op, count, ms in blocking_calls(read_trace(path)):
                print(f"    {call:<24} {op[:70]:<70} {count:5.2f} {ms:8.2f}")
        return 0

    setup_logging(0)
    path, overrides = split_config_arg([a for a in rest if a != "--"])
    cfg = load_config(path, overrides + ["--training.steps", str(args.steps), "--metrics.log_freq",
                                         str(args.log_freq), "--compile.enable", "false"])
    trainer = Trainer(cfg)
    try:
        reads = record_training(trainer)
    finally:
        trainer.close()
    for step in range(1, args.steps + 1):
        mine = [r for r in reads.reads if r.label == step]
        logs = step == 1 or step % args.log_freq == 0 or step == args.steps
        print(f"step {step} ({'log' if logs else 'no log'}): {len(mine)} host reads")
        for read in mine:
            print(f"    {read.op} ({read.why})\n" + "".join(f"        <- {frame}\n" for frame in read.stack).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
