"""Data: tokenizers, documents, packing and the layout-invariant loader.

The pipeline, each stage usable on its own:

    tokenizer = build_tokenizer("")                     # built-in 4k BPE, or a tiktoken file
    documents = open_documents("builtin", "")           # endless, resumable documents
    windows   = PackedWindows(documents, tokenizer, seq_len=256)
    loader    = GlobalBatchLoader(windows, 256, global_batch_size=8, local_batch_size=2,
                                  dp_rank=0, dp_size=2)
    micro_batches = loader.next_step()                  # this rank's share of step 0

This package knows neither models nor meshes: it is given a dp rank and size.
"""

from kenotron.data.corpus import builtin_documents
from kenotron.data.loader import (
    GlobalBatchLoader,
    MicroBatch,
    WindowSource,
    build_text_loader,
    check_batch_sizes,
)
from kenotron.data.packing import PackedWindows, document_ids
from kenotron.data.text_source import (
    Document,
    DocumentSource,
    IndexedDocuments,
    StreamedDocuments,
    list_documents,
    open_documents,
)
from kenotron.data.hf_tokenizer import HFTokenizer
from kenotron.data.tiktoken_bpe import TiktokenTokenizer, llama3_special_tokens
from kenotron.data.tokenizer import (
    BUILTIN_TOKENIZER_FILE,
    LLAMA3_SPLIT_PATTERN,
    Tokenizer,
    build_tokenizer,
)

__all__ = [
    "BUILTIN_TOKENIZER_FILE",
    "LLAMA3_SPLIT_PATTERN",
    "Document",
    "DocumentSource",
    "GlobalBatchLoader",
    "HFTokenizer",
    "IndexedDocuments",
    "MicroBatch",
    "PackedWindows",
    "StreamedDocuments",
    "TiktokenTokenizer",
    "Tokenizer",
    "WindowSource",
    "build_text_loader",
    "build_tokenizer",
    "builtin_documents",
    "check_batch_sizes",
    "document_ids",
    "list_documents",
    "llama3_special_tokens",
    "open_documents",
]
