"""Document masking under context parallel through the real trainer on CPU/gloo, against one rank.

The data are short documents (1 to 12 words), so every 32-token window packs several whose
borders fall inside chunks and across the ranks' shards. Same model, seed and batches
(tests/parallel/parity.py): fp32 losses within 1e-6 and first-step gradients within 1e-5 for
cp 2 and 4 (head-tail and contiguous layouts), with FSDP, with TP through the FlexAttention
CP attention (flex_gather.py; the others run kenotron's ring), inside pipeline stages, and under
the all-to-all scheme (cp_scheme ulysses: the whole sequence's mask on every rank). Then the model itself: a
packed document's logits under cp 2 equal its logits alone.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from kenotron.config import load_config
from kenotron.data import document_ids
from kenotron.parallel.context import SequenceDocuments, SequenceLayout
from kenotron.parallel.dims import build_device_meshes
from kenotron.train.resolve import resolve_run
from tests.distributed.pool import run_on_ranks
from tests.parallel.parity import assert_parity, run_steps, write_short_documents

CP2 = ["--parallelism.cp", "2", "--training.local_batch_size", "8"]
LAYOUTS = {
    "cp2": (2, CP2),
    "cp4_contiguous": (4, ["--parallelism.cp", "4", "--training.local_batch_size", "8",
                           "--tuning.cp_load_balance", "false"]),
    "cp2_fsdp2": (4, CP2 + ["--parallelism.dp_shard", "2", "--training.local_batch_size", "4"]),
    "cp2_tp2_flex": (4, CP2 + ["--parallelism.tp", "2", "--tuning.cp_attention", "flex"]),
    # The document ids reach the second stage with the schedule's kwargs, split into microbatches.
    "pp2_cp2_1f1b": (4, CP2 + ["--parallelism.pp", "2", "--parallelism.pp_schedule", "1F1B"]),
    # The all-to-all scheme: each rank attends over the whole sequence with the one-rank mask.
    "cp2_ulysses": (2, CP2 + ["--parallelism.cp_scheme", "ulysses"]),
}


@pytest.fixture(scope="module")
def short_documents(tmp_path_factory) -> list[str]:
    return write_short_documents(tmp_path_factory.mktemp("docs") / "short.jsonl") + ["--training.steps", "2"]


@pytest.fixture(scope="module")
def reference(short_documents, tmp_path_factory):
    return run_steps(short_documents, str(tmp_path_factory.mktemp("ref")), steps=2)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_document_masking_under_context_parallel_matches_one_rank(layout, short_documents, reference, tmp_path):
    world, overrides = LAYOUTS[layout]
    results = run_on_ranks(world, run_steps, short_documents + overrides, str(tmp_path), 2)
    assert_parity(reference, results, loss_tol=1e-6, grad_tol=1e-5)


def _model(world_size: int) -> torch.nn.Module:
    args = ["--model.n_layers", "2", "--training.seq_len", "32", "--data.document_masking", "true"]
    if world_size > 1:
        args += ["--parallelism.cp", str(world_size)]
    run = resolve_run(load_config(None, args), world_size)
    with torch.device("meta"):
        model = run.spec.build(run.model_args)
    if world_size > 1:
        run.plan.apply(model, build_device_meshes(run.dims, "cpu"))
    model.to_empty(device="cpu")
    model.init_weights(seed=0)
    return model


def _packed_logits(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    model, rank = _model(dist.get_world_size()), dist.get_rank()
    layout = SequenceLayout(tokens.shape[1], dist.get_world_size())
    documents = SequenceDocuments(document_ids(tokens, eos_id))
    with torch.no_grad():
        logits = model(layout.shard(tokens, rank), layout.positions(rank), block_mask=documents)
    return logits.full_tensor() if hasattr(logits, "full_tensor") else logits


def test_a_packed_documents_logits_under_context_parallel_equal_its_logits_alone():
    eos = 4081
    gen = torch.Generator().manual_seed(0)
    first, second = torch.randint(0, 4000, (11,), generator=gen), torch.randint(0, 4000, (21,), generator=gen)
    # The second document starts inside chunk 1 and spans the borders of both ranks' chunks.
    tokens = torch.cat([first, torch.tensor([eos]), second[:-1]])[None]
    alone = _model(1)(second[None, :-1])
    layout = SequenceLayout(32, 2)
    packed = layout.unshard(run_on_ranks(2, _packed_logits, tokens, eos))
    torch.testing.assert_close(packed[:, 12:], alone.detach(), atol=2e-5, rtol=1e-5)


# -- the long-context preset and its bad input ----------------------------------------------------


def test_the_long_context_preset_resolves_to_a_document_masked_cp_2_stage():
    run = resolve_run(load_config("debug_long_context", ["--training.device", "cpu"]), 2)
    assert run.dims.cp == 2 and run.cfg.data.document_masking and run.plan.settings.cp_attention == "ring"
    assert [s.seq_len for s in run.cfg.data.stages] == [256, 1024] == [256, run.cfg.training.seq_len]


def test_a_data_stage_length_that_cp_cannot_split_is_refused_before_any_process_group(tmp_path):
    from kenotron.config.presets import PRESETS_DIR

    config = tmp_path / "bad_stage.toml"
    config.write_text((PRESETS_DIR / "debug_long_context.toml").read_text().replace("seq_len = 256", "seq_len = 258"))
    with pytest.raises(Exception, match=r"data.stages\[0\].seq_len=258 is not divisible by tp x 2 x cp = 1 x 2 x 2 = 4 .*"
                                        r"use a multiple of 4"):
        resolve_run(load_config(str(config)), 2)
    assert not dist.is_initialized()
