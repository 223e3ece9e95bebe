"""Packing: documents -> one token stream -> fixed windows of seq_len + 1 tokens.

Each document becomes `[bos] + tokens + [eos]` (bos when asked for and the tokenizer has one),
the documents are concatenated in order, and the stream is cut into consecutive,
non-overlapping windows of seq_len + 1 tokens: a window w gives inputs w[:-1] and labels w[1:].
No token is dropped or repeated; documents run across window borders (no padding). Attention
crosses document borders unless `data.document_masking` is on: the trainer then derives each
token's document from the EOS tokens of the inputs (`document_ids`) and attends within
documents only.

State is the position of the next window's first token: the position of the document it
starts in (as its source gives it: an index, a file offset, a stream state) and the token
offset inside that document. It is O(1) whatever the document sizes, resuming re-tokenizes only
the document the window starts in, and it does not depend on seq_len, so a run may resume (or
a data stage switch) with another sequence length.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from kenotron.data.long_documents import check_encodable, encode_documents
from kenotron.data.text_source import DocumentSource
from kenotron.data.tokenizer import Tokenizer
from kenotron.errors import DataError

logger = logging.getLogger("kenotron")


@dataclass
class _TokenizedDocument:
    position: dict[str, Any]
    tokens: np.ndarray  # int64, [bos] + ids + [eos]
    offset: int  # first token not yet put in a window


class PackedWindows:
    """Windows of `seq_len + 1` token ids (int64 numpy arrays) packed from `documents`.

    `read_ahead` documents are tokenized at a time (on every core when the tokenizer supports
    it); reading ahead moves the document source but not this object's state. `seq_len` may be
    changed between windows.
    """

    def __init__(
        self,
        documents: DocumentSource,
        tokenizer: Tokenizer,
        seq_len: int,
        add_bos: bool = True,
        read_ahead: int = 64,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"training.seq_len={seq_len} must be at least 1")
        if read_ahead < 1:
            raise ValueError(f"read_ahead={read_ahead} must be at least 1")
        self.documents = documents
        self.tokenizer = tokenizer
        self.seq_len = seq_len
        self.add_bos = add_bos
        self.read_ahead = read_ahead
        self._pending: deque[_TokenizedDocument] = deque()
        self._pending_tokens = 0
        # Tokens to skip in the next document read, set by load_state_dict.
        self._resume_offset = 0
        # Tokens per epoch read from its first document on: a whole epoch shorter than one window
        # makes every window repeat the same text, which deserves a warning (once).
        self._epoch_tokens: dict[int, int] = {}
        self._warned_small = False

    @property
    def window_len(self) -> int:
        return self.seq_len + 1

    def _document_tokens(self, ids: list[int]) -> np.ndarray:
        bos = self.tokenizer.bos_id
        tokens = np.empty(len(ids) + 1 + (self.add_bos and bos is not None), dtype=np.int64)
        if len(tokens) > len(ids) + 1:
            tokens[0] = bos
        tokens[len(tokens) - len(ids) - 1 : -1] = ids
        tokens[-1] = self.tokenizer.eos_id
        return tokens

    def _read_documents(self) -> None:
        documents = [self.documents.next_document() for _ in range(self.read_ahead)]
        for document in documents:
            check_encodable(self.tokenizer, document.text, f"document {document.index} of {self.documents.name}")
        # Long documents in bounded pieces, with the same tokens (data/long_documents.py).
        token_ids = encode_documents(self.tokenizer, [d.text for d in documents])
        for document, ids in zip(documents, token_ids, strict=True):
            tokens = self._document_tokens(ids)
            offset, self._resume_offset = self._resume_offset, 0
            if offset >= len(tokens):
                raise DataError(
                    f"packing state points at token {offset} of document {document.index} "
                    f"(epoch {document.epoch}), which has {len(tokens)} tokens; the checkpoint "
                    "was made with other data, tokenizer or data.add_bos"
                )
            self._pending.append(_TokenizedDocument(document.position, tokens, offset))
            self._pending_tokens += len(tokens) - offset
            self._count_epoch_tokens(document.epoch, document.index, len(tokens))

    def _count_epoch_tokens(self, epoch: int, index: int, n_tokens: int) -> None:
        if index == 0:
            self._epoch_tokens[epoch] = 0
            whole = self._epoch_tokens.get(epoch - 1)
            if whole is not None and whole < self.window_len and not self._warned_small:
                self._warned_small = True
                logger.warning(
                    "the whole data set (%s) is %d tokens, fewer than one window of training.seq_len + 1 = %d: "
                    "every window repeats the same text. Give more data or a shorter training.seq_len",
                    self.documents.name, whole, self.window_len,
                )
        if epoch in self._epoch_tokens:
            self._epoch_tokens[epoch] += n_tokens

    def first_epoch_windows(self) -> int | None:
        """Whole windows in one pass over the documents, once a second pass has begun (else None)."""
        if 1 not in self._epoch_tokens or 0 not in self._epoch_tokens:
            return None
        return self._epoch_tokens[0] // self.window_len

    def _take(self, keep: bool) -> np.ndarray | None:
        while self._pending_tokens < self.window_len:
            self._read_documents()
        parts = []
        missing = self.window_len
        while missing:
            head = self._pending[0]
            take = min(missing, len(head.tokens) - head.offset)
            if keep:
                parts.append(head.tokens[head.offset : head.offset + take])
            head.offset += take
            missing -= take
            if head.offset == len(head.tokens):
                self._pending.popleft()
        self._pending_tokens -= self.window_len
        return np.concatenate(parts) if keep else None

    def next_window(self) -> np.ndarray:
        """The next `seq_len + 1` tokens of the packed stream."""
        window = self._take(keep=True)
        assert window is not None
        return window

    def skip_window(self) -> None:
        """Move past the next window without building it (another rank's window)."""
        self._take(keep=False)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.next_window()

    def state_dict(self) -> dict[str, Any]:
        """Where the next window starts: the position of its document and the token offset in it."""
        if self._pending:
            head = self._pending[0]
            return {"document": dict(head.position), "token_offset": head.offset}
        return {"document": self.documents.state_dict(), "token_offset": self._resume_offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._pending.clear()
        self._pending_tokens = 0
        self.documents.load_state_dict(state["document"])
        self._resume_offset = int(state["token_offset"])


def document_ids(tokens: torch.Tensor, eos_id: int) -> torch.Tensor:
    """Each token's document within its window: (batch, seq) int32, counting from 0 per row.

    A document ends with its EOS token, and that EOS belongs to the document it ends: the
    next document starts at the token after it. So the EOS is predicted from its own document
    (the label of the token before it) and itself sees only that document when predicting
    what follows (the next document's BOS, or its first token without data.add_bos). The
    first tokens of a window may be the tail of a document begun in the previous window; they
    form document 0.
    """
    is_eos = (tokens == eos_id).to(torch.int32)
    return torch.cumsum(is_eos, dim=-1, dtype=torch.int32) - is_eos
