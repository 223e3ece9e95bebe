import numpy as np
import pytest
import torch

from kenotron.data.build import build_text_loader
from kenotron.data.loader import GlobalBatchLoader
from kenotron.data.packing import PackedWindows
from kenotron.data.text_source import list_documents
from kenotron.data.tokenizer_path import build_tokenizer
from tests.data.fakes import CountingWindows

SEQ_LEN = 6
GLOBAL = 8
LAYOUTS = [(b, d) for b in (1, 2, 4) for d in (1, 2, 4) if GLOBAL % (b * d) == 0]


def global_batches(steps: int, windows_source=None) -> list[torch.Tensor]:
    """The global batch of each step, from the 1-rank loader with one micro-batch of G."""
    loader = GlobalBatchLoader(windows_source or CountingWindows(SEQ_LEN), SEQ_LEN, GLOBAL, GLOBAL)
    return [loader.next_step()[0].inputs for _ in range(steps)]


def rank_loaders(local_batch_size: int, dp_size: int, make_source=None) -> list[GlobalBatchLoader]:
    make_source = make_source or (lambda: CountingWindows(SEQ_LEN))
    return [
        GlobalBatchLoader(make_source(), SEQ_LEN, GLOBAL, local_batch_size, rank, dp_size)
        for rank in range(dp_size)
    ]


@pytest.mark.parametrize(("local_batch_size", "dp_size"), LAYOUTS)
def test_global_batch_does_not_depend_on_layout(local_batch_size, dp_size):
    steps = 4
    expected = global_batches(steps)
    loaders = rank_loaders(local_batch_size, dp_size)
    for step in range(steps):
        per_rank = [loader.next_step() for loader in loaders]
        for micro_batches in per_rank:
            assert len(micro_batches) == GLOBAL // (local_batch_size * dp_size)
            for mb in micro_batches:
                assert mb.inputs.shape == mb.labels.shape == (local_batch_size, SEQ_LEN)
                assert mb.inputs.dtype == mb.labels.dtype == torch.int64
                assert torch.equal(mb.inputs[:, 1:], mb.labels[:, :-1])
        # Rank order, then micro-batch order, gives back the global batch.
        union = torch.cat([mb.inputs for micro_batches in per_rank for mb in micro_batches])
        assert torch.equal(union, expected[step])
        # Ranks hold disjoint windows (a window's first token identifies it).
        firsts = [set(torch.cat([mb.inputs for mb in m])[:, 0].tolist()) for m in per_rank]
        assert sum(len(f) for f in firsts) == len(set().union(*firsts)) == GLOBAL


def test_step_s_holds_windows_s_times_g_onwards():
    batches = global_batches(3)
    for step, batch in enumerate(batches):
        window_ids = (batch[:, 0] // (SEQ_LEN + 1)).tolist()
        assert window_ids == list(range(step * GLOBAL, (step + 1) * GLOBAL))


@pytest.mark.parametrize(("local_batch_size", "dp_size"), LAYOUTS)
@pytest.mark.parametrize("resume_step", [0, 1, 3])
def test_resume_reproduces_the_uninterrupted_run(local_batch_size, dp_size, resume_step):
    steps = 5
    uninterrupted = rank_loaders(local_batch_size, dp_size)
    expected = [[loader.next_step() for loader in uninterrupted] for _ in range(steps)]

    interrupted = rank_loaders(local_batch_size, dp_size)
    for _ in range(resume_step):
        for loader in interrupted:
            loader.next_step()
    states = [loader.state_dict() for loader in interrupted]
    assert all(state == states[0] for state in states)  # the same on every rank

    resumed = rank_loaders(local_batch_size, dp_size)
    for loader, state in zip(resumed, states, strict=True):
        loader.load_state_dict(state)
    for step in range(resume_step, steps):
        for rank, loader in enumerate(resumed):
            got, want = loader.next_step(), expected[step][rank]
            assert all(torch.equal(g.inputs, w.inputs) for g, w in zip(got, want, strict=True))
            assert all(torch.equal(g.labels, w.labels) for g, w in zip(got, want, strict=True))
    assert resumed[0].step == steps


def test_checkpoint_resumes_under_another_layout():
    expected = global_batches(4)
    two_ranks = rank_loaders(local_batch_size=2, dp_size=2)
    for _ in range(2):
        for loader in two_ranks:
            loader.next_step()
    state = two_ranks[0].state_dict()
    one_rank = GlobalBatchLoader(CountingWindows(SEQ_LEN), SEQ_LEN, GLOBAL, 1)
    one_rank.load_state_dict(state)
    for step in (2, 3):
        assert torch.equal(torch.cat([mb.inputs for mb in one_rank.next_step()]), expected[step])


def test_text_pipeline_is_layout_invariant_and_resumable():
    tokenizer = build_tokenizer("")
    texts = [f"Document {i} says {'hello ' * (i % 7)}and ends." for i in range(60)]

    def make_source():
        return PackedWindows(list_documents("docs", texts), tokenizer, SEQ_LEN, read_ahead=4)

    expected = global_batches(6, make_source())
    loaders = rank_loaders(local_batch_size=1, dp_size=4, make_source=make_source)
    for step in range(3):
        union = torch.cat([mb.inputs for loader in loaders for mb in loader.next_step()])
        assert torch.equal(union, expected[step])
    resumed = rank_loaders(local_batch_size=2, dp_size=2, make_source=make_source)
    for loader in resumed:
        loader.load_state_dict(loaders[0].state_dict())
    for step in range(3, 6):
        union = torch.cat([mb.inputs for loader in resumed for mb in loader.next_step()])
        assert torch.equal(union, expected[step])


def test_divisibility_error():
    with pytest.raises(ValueError) as error:
        GlobalBatchLoader(CountingWindows(SEQ_LEN), SEQ_LEN, 10, 4, 0, 2)
    assert str(error.value) == (
        "training.global_batch_size=10 is not divisible by local_batch_size × dp = 4 × 2 = 8; "
        "use a multiple of 8"
    )


def test_divisibility_is_checked_before_opening_data():
    with pytest.raises(ValueError, match="global_batch_size=6 is not divisible"):
        build_text_loader(build_tokenizer(""), "jsonl", "/no/such/file.jsonl", 8, 6, 4, 0, 1)


def test_other_argument_errors():
    with pytest.raises(ValueError, match="dp_rank=2 is out of range for dp_size=2"):
        GlobalBatchLoader(CountingWindows(SEQ_LEN), SEQ_LEN, 8, 2, 2, 2)
    with pytest.raises(ValueError, match="training.local_batch_size=0"):
        GlobalBatchLoader(CountingWindows(SEQ_LEN), SEQ_LEN, 8, 0, 0, 1)
    class FixedWindows:  # a sequential source of the wrong width that the loader cannot resize
        def next_window(self):
            return np.arange(SEQ_LEN + 2)

    loader = GlobalBatchLoader(FixedWindows(), SEQ_LEN, 8, 2)
    with pytest.raises(ValueError, match=r"shape \(8,\), expected \(7,\)"):
        loader.next_step()


def test_minus_one_means_no_accumulation():
    loader = GlobalBatchLoader(CountingWindows(SEQ_LEN), SEQ_LEN, -1, 2, 1, 4)
    assert loader.global_batch_size == 8
    assert loader.micro_batches_per_step == 1


def test_builtin_loader_end_to_end():
    loader = build_text_loader(build_tokenizer(""), "builtin", "", 32, 4, 2, dp_rank=1, dp_size=2)
    micro_batches = next(iter(loader))
    assert len(micro_batches) == 1
    assert micro_batches[0].inputs.shape == (2, 32)
    assert int(micro_batches[0].inputs.max()) < 4096
