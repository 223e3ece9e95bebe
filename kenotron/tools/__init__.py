"""Benchmark and profiling harness over the real trainer; scripts/ holds the command-line entry points.

- `bench`: one table row per training configuration (tokens/s, MFU, memory), presets included.
- `bench_worker`: one case of `bench` inside its own process (the trainer, timed; JSON back).
- `block_trace`: per-block times and memory of one step (`bench.py --trace`).
- `kernel_profile`: the top CUDA kernels of a few steps (`bench.py --profile`), and a CUDA-event timer.
"""
