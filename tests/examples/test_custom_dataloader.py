"""examples/custom-dataloader: the example loader keeps the protocol (layout-invariant global
batch, exact resume, pipeline feeds), trains through the trainer, and bad loaders fail clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from kenotron.config import ConfigError, load_config
from kenotron.data import build_data_loader, build_tokenizer
from kenotron.data.custom import CheckedLoader, LoaderContext, load_loader_factory

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "custom-dataloader"
SPEC = f"{EXAMPLE / 'loader.py'}:build"
G = 8


TOKENS = Path()  # set by the token_file fixture


@pytest.fixture(scope="module", autouse=True)
def token_file(tmp_path_factory):
    """A .npy of token ids for the example loader's data.path (a tokenized slice of the built-in corpus)."""
    global TOKENS
    from kenotron.data import builtin_documents

    tokenizer = build_tokenizer("")
    ids = [t for doc in tokenizer.encode_batch(builtin_documents()[:60]) for t in [*doc, tokenizer.eos_id]]
    TOKENS = tmp_path_factory.mktemp("npy") / "tokens.npy"
    np.save(TOKENS, np.array(ids, dtype=np.uint16))


def context(rank=0, size=1, local=G, feed_inputs=True, feed_labels=True):
    cfg = load_config(None, ["--training.seq_len", "16", "--data.loader", SPEC, "--data.path", str(TOKENS)])
    return LoaderContext(cfg, build_tokenizer(""), 16, G, local, rank, size, feed_inputs, feed_labels, 4096)


@pytest.fixture(scope="module")
def build():
    return load_loader_factory(SPEC)


def global_batch(loaders):
    return torch.cat([mb.inputs for loader in loaders for mb in loader.next_step()])


def test_example_loader_batches_do_not_depend_on_the_layout_and_resume(build):
    one = build(context())
    expected = [global_batch([one]) for _ in range(4)]
    four = [build(context(r, 4, local=1)) for r in range(4)]
    assert torch.equal(global_batch(four), expected[0])
    assert torch.equal(global_batch(four), expected[1])
    resumed = [build(context(r, 2, local=2)) for r in range(2)]
    for loader in resumed:
        loader.load_state_dict(four[0].state_dict())
    assert torch.equal(global_batch(resumed), expected[2])


def test_example_loader_feeds_pipeline_stages_only_what_they_use(build):
    last = CheckedLoader(build(context(feed_inputs=False)), context(feed_inputs=False), SPEC).next_step()
    assert last[0].inputs is None and last[0].labels.shape == (G, 16)
    middle = build(context(feed_inputs=False, feed_labels=False)).next_step()
    assert middle[0].inputs is None and middle[0].labels is None


def test_example_config_trains_with_the_custom_loader(tmp_path):
    from kenotron.train.trainer import run_training

    cfg = load_config(str(EXAMPLE / "config.toml"), [
        "--training.steps", "3", "--training.seq_len", "32", "--training.local_batch_size", "2",
        "--metrics.log_freq", "1", "--job.dump_folder", str(tmp_path), "--data.loader", SPEC, "--data.path", str(TOKENS),
    ])
    records = run_training(cfg)
    assert [r["step"] for r in records] == [1, 2, 3]
    assert all(r["data_wait_s"] >= 0 for r in records)


def test_loader_path_errors():
    with pytest.raises(ConfigError, match="data.loader='nocolon' is not 'module:function'"):
        load_loader_factory("nocolon")
    with pytest.raises(ConfigError, match=r"cannot import 'no_such_module_xyz' \(ModuleNotFoundError"):
        load_loader_factory("no_such_module_xyz:build")
    with pytest.raises(ConfigError, match=r"cannot import .*missing.py.*no such file"):
        load_loader_factory("missing.py:build")
    with pytest.raises(ConfigError, match="has no callable 'nope'"):
        load_loader_factory(f"{EXAMPLE / 'loader.py'}:nope")


class WrongLoader:
    def __init__(self, batches):
        self.batches = batches

    def next_step(self):
        return self.batches

    def state_dict(self):
        return {}

    def load_state_dict(self, state):
        pass


def test_a_loader_breaking_the_protocol_fails_with_what_was_expected():
    from kenotron.data import MicroBatch

    ctx = context(local=4)
    ok = torch.zeros(4, 16, dtype=torch.int64)
    with pytest.raises(ValueError, match="next_step\\(\\) gave 1 items; expected a list of 2 MicroBatch"):
        CheckedLoader(WrongLoader([MicroBatch(ok, ok)]), ctx, "x:y").next_step()
    with pytest.raises(ValueError, match=r"gave inputs \(4, 15\) torch.int64 on cpu; expected .* \[4, 16\]"):
        CheckedLoader(WrongLoader([MicroBatch(ok[:, 1:], ok)] * 2), ctx, "x:y").next_step()
    with pytest.raises(ConfigError, match="without next_step"):
        CheckedLoader(object(), ctx, "x:y")


def test_build_data_loader_wraps_the_custom_loader():
    cfg = load_config(None, ["--training.seq_len", "16", "--training.local_batch_size", "4", "--data.loader", SPEC,
                             "--data.path", str(TOKENS)])
    loader = build_data_loader(cfg, build_tokenizer(""), vocab_size=4096, global_batch_size=G, dp_rank=1, dp_size=2)
    try:
        batches = loader.next_step()
        assert len(batches) == 1 and batches[0].inputs.shape == (4, 16)
        assert loader.state_dict() == {"step": 1}
    finally:
        loader.close()


def test_the_readmes_two_commands_train_into_two_folders():
    # Two data-parallel ranks make another global batch: another run, which must not share the
    # one-process run's folder.
    readme = (EXAMPLE / "README.md").read_text()
    assert "NPROC=2 ./run_train.sh \\\n    --job.dump_folder outputs/custom-dataloader-dp2" in readme
    assert 'dump_folder = "./outputs/custom-dataloader"' in (EXAMPLE / "config.toml").read_text()
