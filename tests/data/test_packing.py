import itertools

import numpy as np
import pytest

from kenotron.data.packing import PackedWindows
from kenotron.data.text_source import list_documents
from kenotron.data.tokenizer_path import build_tokenizer
from tests.data.fakes import CharTokenizer

DOCUMENTS = ["ab", "cdefg", "", "h", "ijklmnopqrstuvwxyz", "0123", "<|end_of_text|>"]
BOS, EOS = CharTokenizer.bos_id, CharTokenizer.eos_id


def expected_stream(add_bos: bool, epochs: int) -> list[int]:
    stream = []
    for text in DOCUMENTS * epochs:
        stream += ([BOS] if add_bos else []) + [ord(c) for c in text] + [EOS]
    return stream


def packer(seq_len: int, add_bos: bool = True, read_ahead: int = 3) -> PackedWindows:
    documents = list_documents("test documents", DOCUMENTS)
    tokenizer = CharTokenizer()
    return PackedWindows(documents, tokenizer, seq_len, add_bos=add_bos, read_ahead=read_ahead)


@pytest.mark.parametrize("add_bos", [True, False])
@pytest.mark.parametrize("seq_len", [1, 4, 7, 40])
def test_windows_are_consecutive_cuts_of_the_stream(seq_len, add_bos):
    windows = packer(seq_len, add_bos)
    count = 30
    got = [windows.next_window() for _ in range(count)]
    assert all(w.dtype == np.int64 and w.shape == (seq_len + 1,) for w in got)
    # Concatenated, the windows are exactly the stream: nothing lost, nothing repeated,
    # documents in order, and the stream goes on into the next epochs.
    stream = expected_stream(add_bos, epochs=count * (seq_len + 1) // 30 + 2)
    assert np.concatenate(got).tolist() == stream[: count * (seq_len + 1)]


def test_bos_and_eos_placement():
    windows = packer(seq_len=9)
    first, second = windows.next_window().tolist(), windows.next_window().tolist()
    assert first == [BOS, ord("a"), ord("b"), EOS, BOS, *map(ord, "cdefg")]
    # The empty document still contributes its BOS and EOS.
    assert second[:6] == [EOS, BOS, EOS, BOS, ord("h"), EOS]


def test_special_token_text_in_documents_is_plain_text():
    tokenizer = build_tokenizer("")
    documents = list_documents("docs", ["<|begin_of_text|><|end_of_text|>"])
    windows = PackedWindows(documents, tokenizer, seq_len=2048)
    window = windows.next_window().tolist()
    # One document per epoch: BOS/EOS only at its borders.
    body = window[1 : window.index(tokenizer.eos_id)]
    assert tokenizer.bos_id not in body
    assert tokenizer.decode(body) == "<|begin_of_text|><|end_of_text|>"


@pytest.mark.parametrize("read_ahead", [1, 2, 16])
@pytest.mark.parametrize("seq_len", [1, 5, 64])
def test_resume_is_exact(seq_len, read_ahead):
    reference = packer(seq_len, read_ahead=read_ahead)
    all_windows = [reference.next_window().tolist() for _ in range(25)]
    for stop in range(25):
        run = packer(seq_len, read_ahead=read_ahead)
        for _ in range(stop):
            run.next_window()
        state = run.state_dict()
        resumed = packer(seq_len, read_ahead=5)  # fresh source, other read-ahead
        resumed.load_state_dict(state)
        assert resumed.state_dict() == state
        assert [resumed.next_window().tolist() for _ in range(25 - stop)] == all_windows[stop:]


def test_state_is_a_position_in_the_documents():
    windows = packer(seq_len=4)
    assert windows.state_dict() == {"document": {"epoch": 0, "index": 0}, "token_offset": 0}
    windows.next_window()  # [BOS a b EOS BOS]: next window starts at "c" of document 1
    assert windows.state_dict() == {"document": {"epoch": 0, "index": 1}, "token_offset": 1}
    for _ in range(20):
        windows.next_window()
    assert windows.state_dict()["document"]["epoch"] >= 1


def test_resume_with_a_different_seq_len_continues_the_stream():
    first = packer(seq_len=4)
    head = [first.next_window() for _ in range(3)]
    second = packer(seq_len=9)
    second.load_state_dict(first.state_dict())
    tail = second.next_window()
    assert np.concatenate([*head, tail]).tolist() == expected_stream(True, 1)[: 15 + 10]


def test_state_from_other_data_is_rejected():
    windows = packer(seq_len=4)
    windows.load_state_dict({"document": {"epoch": 0, "index": 0}, "token_offset": 99})
    with pytest.raises(ValueError, match="token 99 of document 0.*has 4 tokens"):
        windows.next_window()


def test_real_tokenizer_windows_decode_to_the_documents():
    tokenizer = build_tokenizer("")
    texts = [f"Document number {i}: some text, code `x = {i}`, and emoji 🙂." for i in range(40)]
    windows = PackedWindows(list_documents("docs", texts), tokenizer, seq_len=32, add_bos=False)
    tokens = list(itertools.chain.from_iterable(windows.next_window() for _ in range(20)))
    decoded = tokenizer.decode([t for t in tokens if t != tokenizer.eos_id])
    assert "".join(texts).startswith(decoded[:-10])


def test_bad_seq_len():
    with pytest.raises(ValueError, match="training.seq_len=0"):
        packer(seq_len=0)


def test_document_ids_count_eos_tokens_and_eos_belongs_to_the_document_it_ends():
    import torch

    from kenotron.data.packing import document_ids

    # A window starting inside a document ("tail"), then two whole ones, then the start of a fourth.
    tokens = torch.tensor([[7, 8, EOS, BOS, 9, EOS, BOS, EOS, BOS, 6]])
    assert document_ids(tokens, EOS).tolist() == [[0, 0, 0, 1, 1, 1, 2, 2, 3, 3]]
    assert document_ids(tokens, EOS).dtype == torch.int32
    # Rows are independent, a window without EOS is one document, and a window ending on EOS
    # keeps that EOS in its last document.
    rows = torch.tensor([[1, 2, 3, 4], [EOS, 1, 2, EOS]])
    assert document_ids(rows, EOS).tolist() == [[0, 0, 0, 0], [0, 1, 1, 1]]


def test_document_ids_of_packed_windows_match_the_documents():
    import torch

    from kenotron.data.packing import document_ids

    windows = packer(seq_len=39, add_bos=True)
    window = torch.from_numpy(windows.next_window())[None]
    ids = document_ids(window, EOS)[0].tolist()
    # Every document is BOS ... EOS: the document index changes exactly after each EOS.
    for i in range(1, window.shape[1]):
        assert ids[i] == ids[i - 1] + (window[0, i - 1].item() == EOS)
    assert ids[0] == 0 and window[0, 0].item() == BOS
