"""Small stand-ins for the data tests: a character tokenizer and a counting window source."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kenotron.data.tokenizer import Tokenizer


class CharTokenizer(Tokenizer):
    """One token per character (its code point), so expected streams are easy to write down."""

    name = "chars"
    vocab_size = 0x110000 + 2
    bos_id = 0x110000
    eos_id = 0x110001

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(i) for i in ids)


class CountingWindows:
    """Window k holds tokens k*(seq_len+1) .. (k+1)*(seq_len+1)-1: the position is the content."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.next_index = 0

    def next_window(self) -> np.ndarray:
        width = self.seq_len + 1
        start = self.next_index * width
        self.next_index += 1
        return np.arange(start, start + width, dtype=np.int64)

    def state_dict(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_index = state["next_index"]
