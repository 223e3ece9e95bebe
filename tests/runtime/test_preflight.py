"""The config-only checks (runtime/degrees.py, runtime/preflight.py, kernel_choice/config_checks.py):
the errors resolve_run gives, from modules the launcher imports before torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.kernel_choice.target import Target
from kenotron.runtime.degrees import layout_degrees
from kenotron.runtime.preflight import preflight, resolve_degrees, resolve_model
from kenotron.train.resolve import resolve_run

ROOT = Path(__file__).resolve().parents[2]


def test_layout_degrees_give_the_batch_and_accumulation_of_the_world():
    cfg = load_config("debug", ["--training.global_batch_size", "16"])
    dims, global_batch, accum = layout_degrees(cfg, 2)
    assert (dims.dp, global_batch, accum) == (2, 16, 2)


@pytest.mark.parametrize("overrides, world, message", [
    (["--parallelism.tp", "3"], 2, "does not divide the world size 2"),
    (["--parallelism.tp", "3"], 3, "tp=3 does not divide n_heads=8"),
    (["--training.global_batch_size", "6"], 4, "global_batch_size"),
])
def test_the_preflight_errors_are_resolve_runs(overrides, world, message):
    cfg = load_config("debug", overrides)
    with pytest.raises(ConfigError, match=message) as early:
        spec, args = resolve_model(cfg)
        resolve_degrees(cfg, world, spec, args, "cpu")
    with pytest.raises(ConfigError) as full:
        resolve_run(cfg, world, Target("cpu"))
    assert str(early.value) == str(full.value)


def test_the_config_only_checks_import_no_torch():
    code = ("import sys; import kenotron.runtime.degrees, kenotron.launch.launcher; "
            "assert 'torch' not in sys.modules, 'torch imported'; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.stdout.strip() == "ok", proc.stderr[-2000:]


# Each family's shape errors, as the launcher meets them: (config, overrides, world size, error).
SHAPE_ERRORS = [
    ("debug.toml", ["--parallelism.tp", "3"], 3, "tp=3 does not divide n_heads=8"),
    ("debug.toml", ["--model.n_heads", "6"], 1, "model.dim=256 is not a multiple of model.n_heads=6"),
    ("debug.toml", ["--moe.aux_loss_coef", "0.1"], 1, "model.name='llama3' has no experts"),
    ("mixtral_debug.toml", ["--parallelism.ep", "3"], 3, "parallelism.ep=3 does not divide the 8 experts"),
    ("qwen3_moe_debug.toml", ["--model.moe.top_k", "99"], 1, "model.moe.top_k=99 must lie in [1, n_experts=8]"),
    ("mamba2_debug.toml", ["--parallelism.tp", "3"], 3, "tp=3 does not divide ssm heads"),
    ("mamba2_debug.toml", ["--data.document_masking", "true"], 1, "data.document_masking=true is not supported"),
    ("qwen2_debug.toml", ["--model.parametrization", "spectral_mup"], 1, "qwen2 debug ties them"),
    ("debug.toml", ["--checkpoint.remote_folder", "bucket/prefix"], 1, "must look like s3://bucket/prefix"),
    ("debug.toml", ["--parallelism.pp", "2", "--parallelism.pp_schedule", "ZBVZeroBubble", "--compile.enable",
                    "true"], 2, "compiled blocks do not support"),
]


def test_the_model_shape_checks_of_every_kind_of_family_import_no_torch():
    """The launcher's second round (resolve_model, resolve_degrees) runs before torch is imported:
    its errors come in well under the 2 s that importing torch alone takes on two cores."""
    code = f"""
import sys
from kenotron.config import ConfigError, load_config
from kenotron.runtime.preflight import preflight, resolve_degrees, resolve_model
for name, overrides, world, _ in {SHAPE_ERRORS!r}:
    cfg = load_config(name.removesuffix(".toml"), overrides)
    try:
        spec, args = resolve_model(cfg)
        resolve_degrees(cfg, world, spec, args, "cpu")
        print("no error")
    except ConfigError as e:
        print(e)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1:] == ["torch not imported"], proc.stdout + proc.stderr[-2000:]
    for (*_, expected), error in zip(SHAPE_ERRORS, lines[:-1], strict=True):
        assert expected in error


# Each family of kernel-choice errors, as the launcher meets them before torch:
# (config, overrides, world size, target as (device type, cuda major, triton), error).
KERNEL_ERRORS = [
    ("debug.toml", ["--tuning.loss", "fused", "--parallelism.pp", "2"], 2, ("cpu", 0, False),
     "tuning.loss='fused' does not combine with pipeline parallel"),
    ("mamba2_debug.toml", ["--parallelism.cp", "2"], 2, ("cpu", 0, False),
     "parallelism.cp=2 is not supported by model.name='mamba2'"),
    ("debug.toml", ["--parallelism.cp", "2", "--tuning.cp_attention", "torch"], 2, ("cpu", 0, False),
     "tuning.cp_attention='torch' needs CUDA"),
    ("debug.toml", ["--model.attention_backend", "cudnn"], 1, ("cpu", 0, False),
     "model.attention_backend='cudnn' is a CUDA kernel and this run is on cpu"),
    ("debug.toml", ["--model.attention_backend", "flash_attn"], 1, ("cpu", 0, False),
     "model.attention_backend='flash_attn' needs CUDA (flash-attn has no CPU kernel)"),
    ("debug.toml", ["--tuning.eager_kernels", "triton"], 1, ("cuda", 9, False),
     "tuning.eager_kernels='triton' needs the triton package"),
    ("debug.toml", ["--training.param_dtype", "bfloat16", "--tuning.mixed_precision", "master_weights"], 2,
     ("cuda", 9, True), "tuning.mixed_precision='master_weights' runs on one device"),
]


def test_the_kernel_choice_errors_of_every_kind_come_before_torch_is_imported():
    """The launcher's torch-free round (preflight) refuses what the kernel choices cannot run,
    for the machine it describes; flash-attn counts as installed (a module in sys.modules), so
    that its refusal on a CPU is the one reached."""
    code = f"""
import sys, types
sys.modules["flash_attn"] = types.ModuleType("flash_attn")
from kenotron.config import ConfigError, load_config
from kenotron.kernel_choice.target import Target
from kenotron.runtime.preflight import preflight
for name, overrides, world, target, _ in {KERNEL_ERRORS!r}:
    try:
        preflight(load_config(name.removesuffix(".toml"), overrides), world, Target(*target))
        print("no error")
    except ConfigError as e:
        print(e)
print("torch imported" if "torch" in sys.modules else "torch not imported")
"""
    proc = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    lines = proc.stdout.strip().splitlines()
    assert lines[-1:] == ["torch not imported"], proc.stdout + proc.stderr[-2000:]
    for (*_, expected), error in zip(KERNEL_ERRORS, lines[:-1], strict=True):
        assert expected in error


@pytest.mark.parametrize("case", [KERNEL_ERRORS[0], KERNEL_ERRORS[1], KERNEL_ERRORS[5]], ids=["fused-tp", "cp-mamba2",
                                                                                            "triton-missing"])
def test_the_kernel_choice_errors_before_torch_are_resolve_runs(case):
    name, overrides, world, target, message = case
    cfg = load_config(name.removesuffix(".toml"), overrides)
    with pytest.raises(ConfigError, match=message) as early:
        preflight(cfg, world, Target(*target))
    with pytest.raises(ConfigError) as full:
        resolve_run(cfg, world, Target(*target))
    assert str(early.value) == str(full.value)
