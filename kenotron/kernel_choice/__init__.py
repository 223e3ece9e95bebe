"""Which kernels run, and how: every device-dependent choice of a run, made once in resolve_run
before any process group, plus what makes the chosen attention backend run.

- `tuning`: the `[tuning]` kernel fields (eager RoPE/SwiGLU, Mamba-2's scan, the fused loss's
  chunk step, the gradient norm, AdamW, the MoE experts), from plain values.
- `attention_backend`: `model.attention_backend` (SDPA kernels, flex, flash_attn), its checks,
  the SDPA context around forward, flash-attn installed into the attention modules, and the
  FlexAttention block masks.
- `target`: the machine the choices are made for (`Target`), told without torch for the launcher.
- `config_checks`: `settle_kernels`, every choice and refusal that needs no built model, from the
  config, the mesh degrees, the model's args and the Target; no torch, so the launcher runs it
  before importing torch (runtime/preflight.py) and resolve_run runs the same function.
- `choices`: `resolve_choices`, which completes those with the meta model into one frozen
  `Choices` (attention backend, kernels, fused loss, how bf16 runs).

Why a room of its own, not a part of `kernels/`: a choice reads the config, the model's
structure (Mamba sizes, sliding window, output layer), the mesh degrees and the installed
flash-attn, so it sits above `models` and `parallel`; the kernels sit below `models`, which
call them. One room cannot be both without an import cycle, and taking plain values would leave
the reading of the config and the model in a second place, `train/`. The kernels therefore
stay torch and triton only, and this room is imported by train and estimate (and, for its
torch-free checks, by runtime/preflight.py and the launcher).
"""
