"""The loader over tokenized folders, blends and stages: the global batch is layout-invariant,
each rank reads only its own windows, and resume is exact across layouts, epochs and stage switches."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from kenotron.data.blend import Stage, check_weights
from kenotron.data.loader import GlobalBatchLoader, NamedSource
from kenotron.data.packing import PackedWindows
from kenotron.data.sources import TokenizedWindows
from kenotron.data.text_source import list_documents
from kenotron.data.token_files import TokenFileWriter, TokenizedFolder
from tests.data.fakes import CharTokenizer

SEQ, G = 7, 8
A_BASE, B_BASE = 0, 1_000_000  # token values say which dataset and where


def token_folder(path, base, n_tokens, files=3):
    """A folder whose token at stream position i is base + i, split over several files."""
    path.mkdir(parents=True)
    cuts = np.linspace(0, n_tokens, files + 1).astype(int)
    for f, (lo, hi) in enumerate(itertools.pairwise(cuts)):
        writer = TokenFileWriter(path / f"{f:05d}.ds", 4, "positions")
        for start in range(lo, hi, 10):
            writer.write(np.arange(base + start, base + min(start + 10, hi)))
        writer.close()
    return path


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    return token_folder(root / "a", A_BASE, 8 * 40 + 5), token_folder(root / "b", B_BASE, 8 * 25 + 3)


class CountingReads:
    """Wraps a random-access source and remembers which windows were asked for."""

    def __init__(self, source):
        self.source, self.asked = source, []

    def windows(self, indices, window_len):
        self.asked += list(indices)
        return self.source.windows(indices, window_len)


def sources(folders, shuffle=True, count=False):
    out = []
    for name, folder in zip(("a", "b"), folders, strict=True):
        source = TokenizedWindows(TokenizedFolder(folder), shuffle=shuffle, seed=5, name=name)
        out.append(NamedSource(name, CountingReads(source) if count else source))
    return out


STAGES = [Stage(0, check_weights([3, 1], "w"), SEQ), Stage(4, check_weights([1, 3], "w"), SEQ)]


def loaders(folders, b, d, stages=STAGES, **kwargs):
    return [GlobalBatchLoader(sources(folders, **kwargs), SEQ, G, b, r, d, stages=stages, vocab_size=2_000_000)
            for r in range(d)]


def global_batch(loaders_):
    return torch.cat([mb.inputs for loader in loaders_ for mb in loader.next_step()])


@pytest.mark.parametrize(("b", "d"), [(1, 2), (2, 2), (1, 4), (2, 4), (4, 2)])
def test_blend_of_tokenized_folders_is_layout_invariant(folders, b, d):
    reference = loaders(folders, G, 1)
    others = loaders(folders, b, d)
    for _ in range(7):  # across the stage switch at step 4
        assert torch.equal(global_batch(others), global_batch(reference))


def test_each_rank_reads_only_its_own_windows(folders):
    ranks = loaders(folders, 1, 4, count=True)
    for _ in range(3):
        global_batch(ranks)
    for loader in ranks:
        asked = sum(len(s.source.asked) for s in loader.sources)
        assert asked == 3 * G // 4
    all_asked = [(s.name, i) for loader in ranks for s in loader.sources for i in s.source.asked]
    assert len(set(all_asked)) == len(all_asked) == 3 * G


def test_stages_switch_mixture_at_their_start_step(folders):
    (loader,) = loaders(folders, G, 1)
    from_a = []
    for _ in range(8):
        batch = loader.next_step()[0].inputs
        from_a.append(int((batch[:, 0] < B_BASE).sum()))
    assert from_a[:4] == [6, 6, 6, 6]  # 3:1 over 8 samples
    assert from_a[4:] == [2, 2, 2, 2]  # 1:3 from step 4 on
    tokens = loader.tokens_by_dataset()
    assert tokens == {"a": 32 * SEQ, "b": 32 * SEQ}


@pytest.mark.parametrize("stop", [2, 4, 5, 9])
def test_resume_under_another_layout_across_stages_and_epochs(folders, stop):
    expected = []
    reference = loaders(folders, G, 1)
    for _ in range(14):  # dataset b (25 windows) wraps into its next epochs
        expected.append(global_batch(reference))
    first = loaders(folders, 2, 2)
    for _ in range(stop):
        global_batch(first)
    states = [loader.state_dict() for loader in first]
    assert all(s == states[0] for s in states)
    resumed = loaders(folders, 1, 4)
    for loader in resumed:
        loader.load_state_dict(states[0])
    for step in range(stop, 14):
        assert torch.equal(global_batch(resumed), expected[step])


def test_every_epoch_visits_every_window_once_in_a_new_order(folders):
    (loader,) = loaders(folders, G, 1, stages=[Stage(0, (1.0, 0.0), SEQ)])
    n = (8 * 40 + 5) // (SEQ + 1)  # 40 windows of folder a
    starts = torch.cat([loader.next_step()[0].inputs[:, 0] for _ in range(10)])  # 80 windows: 2 epochs
    first, second = starts[:n].tolist(), starts[n : 2 * n].tolist()
    every = [w * (SEQ + 1) for w in range(n)]
    assert sorted(first) == sorted(second) == every
    assert first != second and first != every


def test_shorter_stage_seq_len_continues_each_dataset(folders):
    stages = [Stage(0, (0.5, 0.5), SEQ), Stage(2, (0.5, 0.5), 3)]
    (loader,) = loaders(folders, G, 1, stages=stages, shuffle=False)
    loader.next_step()
    loader.next_step()
    assert loader.last_seq_len == SEQ
    batch = loader.next_step()[0]
    assert batch.inputs.shape == (G, 3) and loader.last_seq_len == 3
    # Each dataset gave 8 windows of 8 tokens: it continues at token 64 in windows of 4.
    firsts = sorted(batch.inputs[:, 0].tolist())
    assert firsts == [64, 68, 72, 76, B_BASE + 64, B_BASE + 68, B_BASE + 72, B_BASE + 76]
    assert loader.tokens_by_dataset() == {"a": 8 * SEQ + 4 * 3, "b": 8 * SEQ + 4 * 3}


def test_token_id_beyond_the_vocabulary_is_a_clear_error(folders):
    loader = GlobalBatchLoader(sources(folders), SEQ, G, G, vocab_size=1000)
    with pytest.raises(ValueError, match=r"dataset 'b' \(.*b\) holds token id 10\d+, beyond the model's vocabulary "
                                         r"of 1000: it was tokenized with another tokenizer"):
        loader.next_step()


def test_pipeline_stages_get_only_what_they_use(folders):
    first = GlobalBatchLoader(sources(folders), SEQ, G, 2, stages=STAGES, feed_labels=False)
    last = GlobalBatchLoader(sources(folders), SEQ, G, 2, stages=STAGES, feed_inputs=False)
    middle = GlobalBatchLoader(sources(folders, count=True), SEQ, G, 2, stages=STAGES, feed_inputs=False,
                               feed_labels=False)
    a, b, m = first.next_step(), last.next_step(), middle.next_step()
    assert len(a) == len(b) == len(m) == 4
    assert all(mb.labels is None for mb in a) and all(mb.inputs is None for mb in b)
    assert all(mb.inputs is None and mb.labels is None for mb in m)
    assert not any(s.source.asked for s in middle.sources)  # nothing read at all
    assert torch.equal(a[1].inputs[:, 1:], b[1].labels[:, :-1])
    assert middle.state_dict() == first.state_dict()


def test_raw_text_and_tokenized_blend_is_layout_invariant_and_resumes(folders):
    texts = [f"doc {i} " + "x" * (i % 13) for i in range(50)]

    def make(b, d):
        out = []
        for r in range(d):
            text = PackedWindows(list_documents("docs", texts), CharTokenizer(), SEQ, read_ahead=3)
            blend = [sources(folders)[0], NamedSource("text", text)]
            out.append(GlobalBatchLoader(blend, SEQ, G, b, r, d, stages=[Stage(0, (0.5, 0.5), SEQ)]))
        return out

    reference = make(G, 1)
    expected = [global_batch(reference) for _ in range(6)]
    two = make(1, 2)
    for step in range(3):
        assert torch.equal(global_batch(two), expected[step])
    resumed = make(4, 2)
    for loader in resumed:
        loader.load_state_dict(two[1].state_dict())
    for step in range(3, 6):
        assert torch.equal(global_batch(resumed), expected[step])


def test_a_checkpoint_of_other_datasets_is_refused(folders):
    (loader,) = loaders(folders, G, 1)
    state = loader.state_dict()
    other = GlobalBatchLoader([sources(folders)[0]], SEQ, G, G)
    with pytest.raises(ValueError, match=r"from datasets \['a', 'b'\], this run's from \['a'\]"):
        other.load_state_dict(state)


def test_a_data_position_from_an_older_kenotron_is_refused_with_the_fix(folders):
    (loader,) = loaders(folders, G, 1)
    with pytest.raises(ValueError, match="saved by an older kenotron.*exclude_from_loading dataloader"):
        loader.load_state_dict({"step": 3, "global_batch_size": G, "windows": {"epoch": 0, "document_index": 5}})
