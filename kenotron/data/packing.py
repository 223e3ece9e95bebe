"""Packing: documents -> one token stream -> fixed windows of seq_len + 1 tokens.

Each document becomes `[bos] + tokens + [eos]` (bos optional), the documents are concatenated
in order, and the stream is cut into consecutive, non-overlapping windows of seq_len + 1
tokens: a window w gives inputs w[:-1] and labels w[1:]. No token is dropped or repeated;
documents run across window borders (no padding). Attention crosses document borders unless
`data.document_masking` is on: the trainer then derives each token's document from the EOS
tokens of the inputs (`document_ids`) and attends within documents only.

State is the position of the next window's first token: (epoch, document index, token offset
inside that document's tokens). It is three integers whatever the document sizes, and
resuming re-tokenizes only the document the window starts in. It does not depend on
seq_len, so a run may resume with another sequence length.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from kenotron.data.text_source import DocumentSource
from kenotron.data.tokenizer import Tokenizer
from kenotron.errors import DataError

logger = logging.getLogger("kenotron")


@dataclass
class _TokenizedDocument:
    epoch: int
    index: int
    tokens: np.ndarray  # int64, [bos] + ids + [eos]
    offset: int  # first token not yet put in a window


class PackedWindows:
    """Windows of `seq_len + 1` token ids (int64 numpy arrays) packed from `documents`.

    `read_ahead` documents are tokenized at a time (on several threads when the tokenizer
    supports it); reading ahead moves the document source but not this object's state.
    """

    def __init__(
        self,
        documents: DocumentSource,
        tokenizer: Tokenizer,
        seq_len: int,
        add_bos: bool = True,
        read_ahead: int = 16,
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
        head = [self.tokenizer.bos_id] if self.add_bos else []
        return np.array(head + ids + [self.tokenizer.eos_id], dtype=np.int64)

    def _read_documents(self) -> None:
        documents = [self.documents.next_document() for _ in range(self.read_ahead)]
        token_ids = self.tokenizer.encode_batch([d.text for d in documents])
        for document, ids in zip(documents, token_ids, strict=True):
            tokens = self._document_tokens(ids)
            offset, self._resume_offset = self._resume_offset, 0
            if offset >= len(tokens):
                raise DataError(
                    f"packing state points at token {offset} of document {document.index} "
                    f"(epoch {document.epoch}), which has {len(tokens)} tokens; the checkpoint "
                    "was made with other data, tokenizer or data.add_bos"
                )
            self._pending.append(_TokenizedDocument(document.epoch, document.index, tokens, offset))
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

    def next_window(self) -> np.ndarray:
        """The next `seq_len + 1` tokens of the packed stream."""
        while self._pending_tokens < self.window_len:
            self._read_documents()
        parts = []
        missing = self.window_len
        while missing:
            head = self._pending[0]
            take = min(missing, len(head.tokens) - head.offset)
            parts.append(head.tokens[head.offset : head.offset + take])
            head.offset += take
            missing -= take
            if head.offset == len(head.tokens):
                self._pending.popleft()
        self._pending_tokens -= self.window_len
        return np.concatenate(parts)

    def __iter__(self) -> Iterator[np.ndarray]:
        while True:
            yield self.next_window()

    def state_dict(self) -> dict[str, int]:
        """Where the next window starts: epoch, document index and token offset in it."""
        if self._pending:
            head = self._pending[0]
            return {"epoch": head.epoch, "document_index": head.index, "token_offset": head.offset}
        position = self.documents.state_dict()
        return {
            "epoch": position["epoch"],
            "document_index": position["index"],
            "token_offset": self._resume_offset,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self._pending.clear()
        self._pending_tokens = 0
        self.documents.load_state_dict({"epoch": state["epoch"], "index": state["document_index"]})
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
