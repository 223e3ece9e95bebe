"""Does AdamW on a side stream hide under the next step's forward? One GPU.

    python scripts/bench_overlap.py [--shape "8B width"] [--programs 8 16 32]

The update of block i is all the next forward needs before block i runs, so the optimizer can
run on a second stream while the forward goes on, each block waiting (an event) for its own
parameters. AdamW only moves memory, the forward's matmuls only compute; whether they share the
GPU depends on how many SMs the update takes: a kernel with one program per 1024 elements fills
every SM between two matmuls, one with a few striding programs (`programs`) leaves the rest to
the matmuls. Prints, per variant, ms for (update + forward), ten back-to-back repetitions, the
real model's forward (eager, no grad) and master-weight AdamW (bf16 parameters and gradients,
fp32 masters and moments).
"""

from __future__ import annotations

import argparse
import statistics

import torch

from kenotron.kernels.adamw import adamw_update_
from kenotron.models.llama3.args import Llama3Args
from kenotron.models.llama3.model import Llama3

SHAPES = {
    # name: (Llama3Args overrides, batch, seq)
    "8B width": ({"dim": 4096, "n_layers": 8, "ffn_dim": 14336}, 2, 8192),
    "1B": ({"dim": 2048, "n_layers": 16, "ffn_dim": 8192, "tie_embeddings": True}, 4, 4096),
}


class Setup:
    def __init__(self, shape: str) -> None:
        overrides, batch, seq = SHAPES[shape]
        with torch.device("meta"):
            self.model = Llama3(Llama3Args(**overrides, max_seq_len=seq))
        self.model.to_empty(device="cuda")
        self.model.init_weights()
        m = self.model
        # The order the next forward needs them in: embedding, blocks, final norm and output.
        self.groups = [[m.tok_embeddings.weight]] + [list(b.parameters()) for b in m.layers.values()]
        self.groups.append([m.norm.weight] + ([] if overrides.get("tie_embeddings") else [m.output.weight]))
        self.state = {}
        with torch.no_grad():
            for p in m.parameters():
                master = p.detach().clone()
                p.data = p.data.to(torch.bfloat16)
                p.grad = torch.randn_like(p) * 1e-3
                self.state[p] = (torch.zeros_like(master), torch.zeros_like(master), master)
        self.model.rope_cos.data = self.model.rope_cos.data.to(torch.bfloat16)
        self.model.rope_sin.data = self.model.rope_sin.data.to(torch.bfloat16)
        self.tokens = torch.randint(0, 128256, (batch, seq), device="cuda")
        self.n = sum(p.numel() for p in m.parameters())
        self.scale = torch.tensor(1.3, device="cuda")
        self.events = [torch.cuda.Event() for _ in self.groups]
        self.waiting = False
        modules = [m.tok_embeddings, *m.layers.values(), m.norm]
        for module, event in zip(modules, self.events, strict=True):
            module.register_forward_pre_hook(lambda _m, _a, e=event: self._wait(e))

    def _wait(self, event: torch.cuda.Event) -> None:
        if self.waiting:
            torch.cuda.current_stream().wait_event(event)

    def update(self, params, programs: int | None) -> None:
        for p in params:
            m, v, w = self.state[p]
            adamw_update_(p, p.grad, m, v, lr=1e-5, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, step=3,
                          grad_scale=self.scale, master=w, programs=programs)

    def forward(self) -> None:
        with torch.no_grad():
            self.model(self.tokens)

    def serial(self) -> None:
        for g in self.groups:
            self.update(g, None)
        self.forward()

    def overlapped(self, side: torch.cuda.Stream, programs: int | None, urgent: int) -> None:
        """The first `urgent` groups at full width, the rest with `programs` programs each."""
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for i, (g, e) in enumerate(zip(self.groups, self.events, strict=True)):
                self.update(g, None if i < urgent else programs)
                e.record()
        self.waiting = True
        self.forward()
        self.waiting = False


def timed(fn, reps: int = 10, rounds: int = 3) -> float:
    """Median over `rounds` of the mean ms per call of `reps` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    means = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize()
        means.append(start.elapsed_time(end) / reps)
    return statistics.median(means)


def bench_shape(shape: str, programs: list[int]) -> None:
    s = Setup(shape)
    rows = {"forward alone": timed(s.forward), "update alone": timed(lambda: [s.update(g, None) for g in s.groups])}
    for p in programs:
        rows[f"update alone, {p} programs"] = timed(lambda p=p: [s.update(g, p) for g in s.groups])
    rows["serial (update, then forward)"] = serial = timed(s.serial)
    for prio in (0, -1):
        side = torch.cuda.Stream(priority=prio)
        rows[f"side stream (priority {prio}), full width"] = timed(lambda side=side: s.overlapped(side, None, 0))
    side = torch.cuda.Stream()
    for urgent in (1, 2):
        for p in programs:
            rows[f"side stream, first {urgent} full, then {p} programs"] = timed(
                lambda p=p, u=urgent: s.overlapped(side, p, u))
    for name, ms in rows.items():
        print(f"| {shape} ({s.n / 1e9:.2f} B) | {name} | {ms:.2f} | {serial - ms:+.2f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--programs", type=int, nargs="+", default=[8, 16, 24, 32, 66])
    args = parser.parse_args()
    print(f"{torch.cuda.get_device_name()}\n| shape | variant | ms | gain vs serial |\n|---|---|---|---|")
    for shape in args.shape:
        bench_shape(shape, args.programs)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
