"""DoReMi (kenotron/train/doremi.py): the domain-weight update against a hand computation, the
per-domain sums, and reference -> proxy -> main through the trainer on the built-in corpus split
into domains plus a domain of random tokens; a proxy under data parallel (2 ranks) against the
one-rank proxy; the checks before any process group."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.data.sample_data import write_domain_data
from kenotron.train.doremi import DomainWeights, domain_sums
from kenotron.train.resolve import resolve_run
from kenotron.train.trainer import run_training
from tests.distributed.pool import run_on_ranks
from tests.train.short_run import read_records, train_until

TINY = [
    "--model.n_layers", "1", "--training.seq_len", "32", "--training.local_batch_size", "6",
    "--metrics.log_freq", "3", "--metrics.tensorboard", "false", "--lr_scheduler.warmup_steps", "2",
    "--training.device", "cpu",
]


def test_the_weight_update_matches_a_hand_computation():
    w = DomainWeights(["a", "b", "c"], step_size=0.5, smoothing=0.1)
    steps = [[1.0, 0.0, 2.0], [0.0, 3.0, 0.5]]
    alpha, history = [1 / 3] * 3, []
    for lam in steps:  # α' = α·exp(ηλ); α = (1 − c)·α'/Σα' + c/k
        raw = [a * math.exp(0.5 * x) for a, x in zip(alpha, lam)]
        alpha = [0.9 * r / sum(raw) + 0.1 / 3 for r in raw]
        history.append(alpha)
        got = w.update(torch.tensor(lam))
        assert got.tolist() == pytest.approx(alpha, rel=1e-12)
    assert w.average().tolist() == pytest.approx([(x + y) / 2 for x, y in zip(*history)], rel=1e-12)
    assert sum(w.average().tolist()) == pytest.approx(1.0)


def test_the_domain_with_the_larger_excess_loss_gains_weight_and_smoothing_keeps_the_others_alive():
    w = DomainWeights(["easy", "hard"], step_size=1.0, smoothing=1e-3)
    for _ in range(50):
        w.update(torch.tensor([0.0, 1.0]))
    assert w.alpha[1] > 0.99 and w.alpha[0] >= 1e-3 / 2 - 1e-12  # c / k is the floor
    w.update(torch.tensor([1e6, 0.0]))  # exp(1e6) would overflow: computed in log space
    assert torch.isfinite(w.alpha).all() and w.alpha[0] > 0.99


def test_the_weights_resume_from_their_state():
    w = DomainWeights(["a", "b"])
    w.update(torch.tensor([0.3, 0.1]))
    again = DomainWeights(["a", "b"])
    again.load_state_dict(json.loads(json.dumps(w.state_dict())))
    assert again.update(torch.tensor([0.0, 1.0])).tolist() == w.update(torch.tensor([0.0, 1.0])).tolist()
    with pytest.raises(ValueError, match="same data.sources"):
        DomainWeights(["a", "c"]).load_state_dict(w.state_dict())


def test_domain_sums_add_each_sequence_to_its_domain():
    values = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert domain_sums(values, torch.tensor([2, 0, 2]), 3).tolist() == [7.0, 0.0, 14.0]


def _sources(data: dict[str, Path], weights: dict[str, float] | None = None) -> str:
    weights = weights or {}
    tables = [f'{{name = "{name}", dataset = "jsonl", path = "{path}", weight = {weights.get(name, 1.0)}}}'
              for name, path in data.items()]
    tables.append(f'{{name = "noise", dataset = "synthetic", weight = {weights.get("noise", 1.0)}}}')
    return "[" + ", ".join(tables) + "]"


def _train(folder: Path, *overrides: str, stop_after: int = 0) -> list[dict]:
    return train_until(load_config(None, [*TINY, "--job.dump_folder", str(folder), *overrides]), stop_after) or []


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """A reference model trained on given weights (the built-in corpus' two domains and noise)."""
    root = tmp_path_factory.mktemp("doremi")
    data = write_domain_data(root / "data")
    given = _sources(data, {"reference": 0.5, "stdlib": 0.3, "noise": 0.2})
    _train(root / "reference", "--data.sources", given, "--training.steps", "24", "--checkpoint.enable", "true",
           "--checkpoint.interval", "24")
    return root, data, root / "reference" / "checkpoints" / "step-000024"


def test_reference_proxy_main_learns_weights_that_drop_the_noise_and_the_next_run_samples_by_them(reference):
    root, data, checkpoint = reference
    uniform = _sources(data)
    records = _train(root / "proxy", "--data.sources", uniform, "--training.steps", "12",
                     "--doremi.reference", str(checkpoint))
    learned = json.loads((root / "proxy" / "doremi_weights.json").read_text())
    weights = learned["weights"]
    assert learned["steps"] == 12 and sum(weights.values()) == pytest.approx(1.0)
    # Random tokens: the reference is no better than the proxy there, so no excess loss and
    # the weight falls to the smoothing floor; the learnable domains take the rest.
    assert weights["noise"] < 0.1 < min(weights["reference"], weights["stdlib"]), weights
    last = records[-1]
    for name in ("reference", "stdlib", "noise"):
        assert {f"domain_loss/{name}", f"reference_loss/{name}", f"excess_loss/{name}", f"domain_weight/{name}",
                f"domain_weight_avg/{name}"} <= set(last)
    assert last["domain_weight_avg/noise"] == pytest.approx(weights["noise"])
    assert last["reference_loss/stdlib"] < last["domain_loss/stdlib"]  # the trained reference is ahead
    # The unweighted loss the proxy reports is the token-weighted mean of its per-domain losses.
    assert last["loss"] == pytest.approx(sum(last[f"domain_loss/{n}"] for n in weights) / 3, rel=1e-5)

    main = _train(root / "main", "--data.sources", uniform, "--training.steps", "5", "--metrics.log_freq", "5",
                  "--data.weights_from", str(root / "proxy" / "doremi_weights.json"))
    seen = {n: main[-1][f"tokens_seen/{n}"] / 32 for n in weights}  # sequences per domain
    total = sum(seen.values())
    assert total == 30
    for name, w in weights.items():  # the blend's interleaving: within 2 sequences of w·N
        assert abs(seen[name] - w * total) < 2, (seen, weights)


PROXY_STEPS = 4


def _proxy_args(sources: str, checkpoint: str) -> list[str]:
    """A 4-step proxy with a record every step."""
    return ["--data.sources", sources, "--training.steps", str(PROXY_STEPS), "--doremi.reference", checkpoint,
            "--metrics.log_freq", "1"]


def _proxy(folder: str, sources: str, checkpoint: str, overrides: list[str]) -> None:
    """One proxy run (on every rank of a pool, or in this process)."""
    run_training(load_config(None, [*TINY, "--job.dump_folder", folder, *_proxy_args(sources, checkpoint),
                                    *overrides]))


def _read(folder: Path) -> tuple[dict, list[dict]]:
    """doremi_weights.json and the metrics records of a run."""
    records = read_records(folder)
    return json.loads((folder / "doremi_weights.json").read_text()), records


@pytest.fixture(scope="module")
def one_rank_proxy(reference):
    root, data, checkpoint = reference
    _proxy(str(root / "whole"), _sources(data), str(checkpoint), [])
    return _read(root / "whole")


def test_a_resumed_proxy_learns_the_same_weights_as_one_run(reference, one_rank_proxy):
    root, data, checkpoint = reference
    saving = ["--checkpoint.enable", "true", "--checkpoint.interval", "2"]
    args = _proxy_args(_sources(data), str(checkpoint)) + saving
    _train(root / "halves", *args, stop_after=2)
    _train(root / "halves", *args)
    assert _read(root / "halves")[0] == one_rank_proxy[0]


@pytest.mark.parametrize("layout", [
    ["--training.local_batch_size", "3"],  # FSDP 2
    ["--parallelism.dp_replicate", "2", "--parallelism.dp_shard", "1", "--training.local_batch_size", "3"],  # DDP
], ids=["fsdp2", "ddp2"])
def test_a_data_parallel_proxy_learns_the_weights_and_logs_the_losses_of_one_rank(layout, reference,
                                                                                 one_rank_proxy, tmp_path):
    _, data, checkpoint = reference
    run_on_ranks(2, _proxy, str(tmp_path), _sources(data), str(checkpoint), layout)
    (weights, records), (ref_weights, ref_records) = _read(tmp_path), one_rank_proxy
    assert weights["steps"] == ref_weights["steps"] == PROXY_STEPS
    for key in ("weights", "last"):
        assert weights[key] == pytest.approx(ref_weights[key], abs=1e-6), key
    assert [r["step"] for r in records] == [r["step"] for r in ref_records] == list(range(1, PROXY_STEPS + 1))
    per_domain = ("domain_loss/", "reference_loss/", "excess_loss/", "domain_weight/", "domain_weight_avg/")
    for rec, ref in zip(records, ref_records, strict=True):
        keys = ["loss", "grad_norm"] + [k for k in ref if k.startswith(per_domain)]  # grad_norm: the DRO gradient's scale
        assert len(keys) == 2 + 5 * 3
        for key in keys:  # fp32 reductions in another order: equal to ~1e-6
            assert rec[key] == pytest.approx(ref[key], abs=1e-5), (rec["step"], key, rec[key], ref[key])


def _resolve(*overrides: str) -> None:
    """resolve_run (every check before a process group); a refusal is one line."""
    try:
        resolve_run(load_config(None, [*TINY, *overrides]), 1)
    except ConfigError as err:
        assert "\n" not in str(err), str(err)
        raise


def test_doremi_settings_are_checked_before_training(reference, tmp_path):
    _, data, checkpoint = reference
    uniform, ref = ["--data.sources", _sources(data)], ["--doremi.reference", str(checkpoint)]
    with pytest.raises(ConfigError, match="samples every domain equally"):
        _resolve("--data.sources", _sources(data, {"noise": 3.0}), *ref)
    with pytest.raises(ConfigError, match="parallelism.tp=1"):
        _resolve(*uniform, *ref, "--parallelism.tp", "2")
    with pytest.raises(ConfigError, match="not a loadable checkpoint"):
        _resolve(*uniform, "--doremi.reference", str(tmp_path / "nothing"))
    with pytest.raises(ConfigError, match="another shape"):
        _resolve(*uniform, *ref, "--model.n_layers", "2")
    with pytest.raises(ConfigError, match="several domains"):
        _resolve(*ref)
    with pytest.raises(ConfigError, match="doremi.step_size=0.0 must be > 0"):
        _resolve(*uniform, *ref, "--doremi.step_size", "0")
    for smoothing in ("-0.1", "1.5"):
        with pytest.raises(ConfigError, match=rf"doremi.smoothing={float(smoothing)} must lie in \[0, 1\]"):
            _resolve(*uniform, *ref, "--doremi.smoothing", smoothing)
    with pytest.raises(ConfigError, match="tuning.loss='fused' does not combine with DoReMi"):
        _resolve(*uniform, *ref, "--tuning.loss", "fused")
    loader = ["--data.loader", "examples.custom-dataloader.loader:build"]  # refused before it is imported
    with pytest.raises(ConfigError, match="which a custom data.loader replaces; drop data.loader"):
        _resolve(*uniform, *ref, *loader)
    with pytest.raises(ConfigError, match=r"at least 3"):
        _resolve(*uniform, *ref, "--training.local_batch_size", "2")
    weights = tmp_path / "w.json"
    weights.write_text(json.dumps({"weights": {"reference": 1.0, "code": 1.0}}))
    with pytest.raises(ConfigError, match=r"gives weights for \['code', 'reference'\] but data.sources are"):
        _resolve(*uniform, "--data.weights_from", str(weights))
    with pytest.raises(ConfigError, match="data.sources is empty"):
        _resolve("--data.weights_from", str(weights))
    learned = tmp_path / "learned.json"
    learned.write_text(json.dumps({"weights": {"reference": 0.5, "stdlib": 0.3, "noise": 0.2}}))
    with pytest.raises(ConfigError, match="data.loader replaces it with a custom loader; drop one of them"):
        _resolve(*uniform, "--data.weights_from", str(learned), *loader)
