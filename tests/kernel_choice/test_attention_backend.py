"""Attention backends through the trainer: flex with and without document masking, the block
masks built per batch, and the config checks that stop unusable combinations before training."""

from __future__ import annotations

import sys

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.kernel_choice.attention_backend import BlockMasks, attention_context
from kenotron.kernel_choice.config_checks import resolve_attention_backend
from kenotron.kernel_choice.target import Target
from kenotron.models.common.flex_attention import dense_mask
from kenotron.planner import AnalyticModel, step_time
from kenotron.train.trainer import resolve_run, run_training
from tests.compile_alone import compiled_alone
from tests.models.fake_flash_attn import fake_flash_attn
from tests.models.fake_flash_attn4 import fake_flash_attn4
from tests.parallel.parity import run_steps

TINY = [
    "--training.seq_len", "64", "--training.local_batch_size", "4", "--metrics.log_freq", "5",
    "--lr_scheduler.warmup_steps", "5",
]
DOCS = ["--data.document_masking", "true"]


def test_auto_means_flex_with_document_masking_and_flex_needs_no_sdpa_context():
    assert resolve_attention_backend("auto", True) == "flex"
    assert resolve_attention_backend("auto", False) == "auto"
    assert resolve_attention_backend("flex", False) == "flex"
    for backend in ("flex", "flash_attn"):
        with attention_context(backend, torch.device("cpu")):
            pass


def test_block_masks_are_causal_and_kept_or_per_batch_documents():
    eos = 2
    tokens = torch.tensor([[5, 6, eos, 7, 8, 9, eos, 1], [5, 5, 5, 5, 5, 5, 5, 5]])
    causal = BlockMasks(None, None)
    assert causal(tokens) is causal(tokens)  # depends on the length only
    assert torch.equal(dense_mask(causal(tokens))[0, 0], torch.ones(8, 8, dtype=torch.bool).tril())
    masks = BlockMasks(eos, sliding_window=2)
    dense = dense_mask(masks(tokens))
    assert dense.shape == (2, 1, 8, 8)
    # Row 0: documents [0..2], [3..6], [7]; the window keeps the token and the one before.
    assert dense[0, 0, 4].tolist() == [False, False, False, True, True, False, False, False]
    assert dense[0, 0, 3].tolist() == [False, False, False, True, False, False, False, False]
    assert dense[0, 0, 7].tolist() == [False] * 7 + [True]
    assert dense[1, 0, 5].tolist() == [False, False, False, False, True, True, False, False]


def test_training_with_document_masking_runs_and_the_loss_falls(tmp_path):
    cfg = load_config(None, TINY + DOCS + ["--training.steps", "10", "--job.dump_folder", str(tmp_path)])
    records = run_training(cfg)
    assert [r["step"] for r in records] == [1, 5, 10]  # the first step, then every 5
    # Windows differ in difficulty (steps 16-30 would be harder with or without masking), so
    # compare steps 2-5 (the record at step 5) with steps 6-10, before those windows.
    assert records[-1]["loss_avg"] < records[1]["loss_avg"] - 1.0
    assert 'document_masking = true' in (tmp_path / "config.toml").read_text()


@pytest.fixture(scope="module")
def documents(tmp_path_factory) -> dict:
    """Parity steps with document masking: flex's first loss differs from SDPA's, and selective
    activation checkpointing trains the same."""
    return run_steps(DOCS, str(tmp_path_factory.mktemp("documents")))


def test_flex_without_documents_trains_like_sdpa(documents, tmp_path):
    sdpa = run_steps([], str(tmp_path / "sdpa"))
    flex = run_steps(["--model.attention_backend", "flex"], str(tmp_path / "flex"))
    for a, b in zip(sdpa["losses"], flex["losses"], strict=True):
        assert abs(a - b) < 1e-6, (a, b)
    for name, g in sdpa["grads"].items():
        torch.testing.assert_close(flex["grads"][name], g, atol=1e-6, rtol=0, msg=name)
    # The built-in corpus's documents are short: masking them changes the very first loss.
    assert abs(documents["losses"][0] - sdpa["losses"][0]) > 1e-4


@pytest.mark.slow
def test_compiled_blocks_with_document_masking_match_eager(tmp_path):
    eager = run_steps(DOCS + ["--model.n_layers", "1"], str(tmp_path / "eager"), 2)
    # Inductor's scalar C++ kernels in a process of their own (tests/compile_alone.py): the same graph,
    # half the g++ time on a cold cache.
    compiled = compiled_alone(run_steps, DOCS + ["--model.n_layers", "1", "--compile.enable", "true"],
                              str(tmp_path / "c"), 2)
    for a, b in zip(eager["losses"], compiled["losses"], strict=True):
        assert abs(a - b) < 1e-5, (a, b)


# -- refused before training ----------------------------------------------------------------


def refused(overrides: list[str], world_size: int = 1, target: Target | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        resolve_run(load_config(None, overrides), world_size, target)
    return str(info.value)


def test_document_masking_with_an_sdpa_backend_is_refused():
    msg = refused(DOCS + ["--model.attention_backend", "cudnn"])
    assert "data.document_masking=true needs FlexAttention, but model.attention_backend='cudnn'" in msg
    assert "set model.attention_backend to 'flex' or 'auto'" in msg


def test_document_masking_under_context_parallel_picks_flex_on_cuda_and_the_ring_on_cpu():
    cp2 = DOCS + ["--parallelism.cp", "2"]
    assert resolve_run(load_config(None, cp2), 2).plan.settings.cp_attention == "flex"  # planned for CUDA
    on_cpu = resolve_run(load_config(None, cp2 + ["--training.device", "cpu"]), 2)
    assert on_cpu.plan.settings.cp_attention == "ring"
    assert resolve_run(load_config(None, ["--parallelism.cp", "2"]), 2).plan.settings.cp_attention == "torch"


def test_document_masking_with_torchs_context_parallel_ring_is_refused():
    msg = refused(DOCS + ["--parallelism.cp", "2", "--tuning.cp_attention", "torch"], world_size=2)
    assert "data.document_masking=true under context parallel needs a document mask per chunk pair" in msg
    assert "use 'auto' (FlexAttention on CUDA), 'flex' or 'ring'" in msg


def test_flex_with_pipeline_parallel_is_refused():
    msg = refused(["--model.attention_backend", "flex", "--parallelism.pp", "2"], world_size=2)
    assert "model.attention_backend='flex' does not combine with pipeline parallel (parallelism.pp=2) without context" in msg
    assert "use pp=1 or parallelism.cp > 1" in msg


def test_flash_attn_without_the_package_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)  # `import flash_attn` fails
    # This machine, a Hopper GPU (the launcher's and the trainer's target): its packages are the run's.
    msg = refused(["--model.attention_backend", "flash_attn"], target=Target("cuda", 9, True))
    assert "model.attention_backend='flash_attn' needs the flash-attn package, which is not installed" in msg
    assert "pip install flash-attn" in msg


def test_a_gpu_machine_planned_from_a_cpu_takes_flash_attn_without_the_package_and_prices_it_faster(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", None)
    overrides = ["--training.seq_len", "4096", "--training.local_batch_size", "4", "--compile.enable", "true"]
    flash = resolve_run(load_config("llama3_1b", overrides + ["--model.attention_backend", "flash_attn"]), 1,
                        check_data=False)  # Target.planned: the estimator's GPU machine, not this one
    assert flash.choices.attention_backend == "flash_attn"
    cudnn = resolve_run(load_config("llama3_1b", overrides), 1, check_data=False)
    speedup = (step_time(flash, AnalyticModel(flash)).tokens_per_s_per_gpu
               / step_time(cudnn, AnalyticModel(cudnn)).tokens_per_s_per_gpu)
    # FA4 against cuDNN on one H200, the same lease: 66,389 / 64,100 (docs/performance.md, runs 109 and 112).
    assert speedup == pytest.approx(66_389 / 64_100, abs=0.02)


def test_flash_attn_needs_cuda_bf16_no_short_window_and_a_compilable_version(monkeypatch):
    monkeypatch.setitem(sys.modules, "flash_attn", fake_flash_attn("2.6.3"))
    flash = ["--model.attention_backend", "flash_attn"]
    assert "needs CUDA" in refused(flash + ["--training.device", "cpu"])
    # The remaining checks, as on a GPU machine (resolve_run plans for the GPU machine the config names):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (8, 0))  # an A100
    assert "set training.param_dtype='bfloat16'" in refused(flash)
    bf16 = flash + ["--training.param_dtype", "bfloat16"]
    msg = refused(bf16 + ["--model.name", "mistral", "--training.seq_len", "256"])
    assert "128-token sliding window, shorter than training.seq_len=256" in msg
    assert "use model.attention_backend='flex'" in msg
    assert "pip install 'flash-attn>=2.7'" in refused(bf16 + ["--compile.enable", "true"])
    resolve_run(load_config(None, bf16), world_size=1)  # eager, no window: accepted
    msg = refused(bf16 + ["--parallelism.cp", "2"], world_size=2)
    assert "does not combine with context parallel (parallelism.cp=2) here: parallelism.cp_scheme='auto' may run" in msg
    assert "use parallelism.cp_scheme='ulysses'" in msg
    # The all-to-all runs the layer's kernel on the whole sequence of its heads: accepted where the
    # heads split over every cp rank, refused where a ring spans the rest.
    ulysses = bf16 + ["--parallelism.cp_scheme", "ulysses"]
    resolve_run(load_config(None, ulysses + ["--parallelism.cp", "2"]), world_size=2)
    msg = refused(ulysses + ["--parallelism.cp", "16"], world_size=16)
    assert "heads per tensor-parallel rank split over 8 of the 16 cp ranks, and the ring over the other 2" in msg
    # On an H100 with FlashAttention-4 installed, FA4 runs (kenotron's custom ops): compile is fine.
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *device: (9, 0))
    monkeypatch.setitem(sys.modules, "flash_attn_interface", None)
    monkeypatch.setitem(sys.modules, "flash_attn.cute.interface", fake_flash_attn4())
    resolve_run(load_config(None, bf16 + ["--compile.enable", "true"]), world_size=1)


def test_selective_activation_checkpointing_saves_flex_attention_and_trains_the_same(documents, tmp_path):
    from kenotron.parallel.activation_checkpoint import _ops_to_save

    assert torch.ops.higher_order.flex_attention in _ops_to_save()
    checkpointed = run_steps(DOCS + ["--activation_checkpoint.mode", "selective-op"], str(tmp_path / "ac"))
    assert documents["losses"] == checkpointed["losses"]


def test_auto_picks_flash_attention_3_or_4_only_where_it_computes_the_same_attention(monkeypatch):
    import kenotron.kernel_choice.attention_backend as ab
    from kenotron.models import get_model_spec
    from kenotron.models.common.flash_attention import (
        FlashAttention,
        FlashAttnUnavailable,
    )

    installed = {"version": 4}

    def load(device_major):
        if installed["version"] is None:
            raise FlashAttnUnavailable("none installed")
        return FlashAttention(lambda *a, **k: None, installed["version"])

    monkeypatch.setattr(ab, "load_flash_attention", load)

    def picks(*overrides, cp=1, major=9, flavor=("llama3", "debug"), all_to_all=1):
        cfg = load_config(None, ["--training.param_dtype", "bfloat16", "--training.device", "cuda",
                                 "--model.name", flavor[0], "--model.flavor", flavor[1], *overrides])
        spec = get_model_spec(cfg.model.name)
        with torch.device("meta"):
            model = spec.build(spec.flavors[cfg.model.flavor])
        return ab.auto_picks_flash_attn(cfg, cp, model, major, all_to_all)

    assert picks()
    assert not picks(major=8)  # Ampere: FlashAttention-3/4 are Hopper and later
    assert not picks(major=0)  # no GPU
    assert not picks("--training.param_dtype", "float32")
    assert not picks("--training.deterministic", "true")
    assert not picks("--data.document_masking", "true")
    assert not picks(cp=2)  # the ring (or a ring inside the all-to-all) replaces the kernel
    assert not picks(cp=4, all_to_all=2)
    assert picks(cp=2, all_to_all=2)  # the all-to-all over all of cp runs the kernel whole
    assert not picks("--training.seq_len", "256", flavor=("mistral", "debug"))  # window shorter than seq
    installed["version"] = 3
    assert picks()
    installed["version"] = 2  # FlashAttention-2 is slower than cuDNN's SDPA on Hopper
    assert not picks()
    installed["version"] = None
    assert not picks()


@pytest.mark.parametrize("backend", ["cudnn", "efficient"])
def test_a_cuda_only_sdpa_kernel_is_refused_on_a_cpu_before_any_process_group(backend):
    from kenotron.kernel_choice.target import Target

    cfg = load_config(None, ["--model.attention_backend", backend, "--training.device", "cpu"])
    with pytest.raises(ConfigError, match=rf"model.attention_backend='{backend}' is a CUDA kernel and this run is on cpu"):
        resolve_run(cfg, 1, Target.of(torch.device("cpu")))


@pytest.mark.parametrize(("model", "device", "backend", "narrow"), [
    ("deepseek_v3", "cuda", "auto", True),  # MLA on a GPU machine planned from here: cuDNN takes both widths
    ("deepseek_v3", "cuda", "cudnn", True),
    ("deepseek_v3", "cuda", "flex", True),  # FlexAttention's compiled kernel takes both widths too
    ("deepseek_v3", "cuda", "efficient", False),
    ("deepseek_v3", "cpu", "auto", False),  # the CPU's SDPA falls back to its math kernel with two widths
    ("llama3", "cuda", "auto", False),  # keys and values of one width: nothing to choose
])
def test_mla_values_go_unpadded_only_to_cudnn_or_flex_on_cuda(model, device, backend, narrow):
    cfg = load_config(None, ["--model.name", model, "--model.attention_backend", backend])
    target = Target("cuda", 9, True, packages_here=False) if device == "cuda" else Target("cpu")
    assert resolve_run(cfg, 1, target).choices.narrow_values is narrow
