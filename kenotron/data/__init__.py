"""Data: tokenizers, documents, pre-tokenized folders, blending, and the layout-invariant loader.

The pipeline, each stage usable on its own:

    tokenizer = build_tokenizer("")                     # built-in 4k BPE, a tiktoken file, or a hub folder
    documents = open_documents("builtin", "")           # endless, resumable documents
    windows   = PackedWindows(documents, tokenizer, seq_len=256)    # or TokenizedWindows(TokenizedFolder(path))
    loader    = GlobalBatchLoader(windows, 256, global_batch_size=8, local_batch_size=2,
                                  dp_rank=0, dp_size=2)
    micro_batches = loader.next_step()                  # this rank's share of step 0

From a job config, `build_data_loader` does all of it (blends, stages, custom loaders) and
prefetches in a background thread. This package knows neither models nor meshes: it is given
a dp rank and size.
"""

from kenotron.data.blend import Interleaver, Stage
from kenotron.data.build import (
    ValidationSet,
    build_data_loader,
    build_text_loader,
    check_data_config,
)
from kenotron.data.corpus import builtin_documents
from kenotron.data.custom import LoaderContext
from kenotron.data.dataset_path import open_documents
from kenotron.data.hf_tokenizer import HFTokenizer
from kenotron.data.loader import (
    GlobalBatchLoader,
    MicroBatch,
    NamedSource,
    check_batch_sizes,
)
from kenotron.data.packing import PackedWindows, document_ids
from kenotron.data.prefetch import Prefetcher
from kenotron.data.shuffle import Permutation
from kenotron.data.sources import SyntheticWindows, TokenizedWindows
from kenotron.data.text_source import (
    Document,
    DocumentSource,
    IndexedDocuments,
    StreamedDocuments,
    list_documents,
)
from kenotron.data.tiktoken_bpe import TiktokenTokenizer, llama3_special_tokens
from kenotron.data.token_files import TokenFileError, TokenizedFolder, open_token_file
from kenotron.data.tokenizer import (
    BUILTIN_TOKENIZER_FILE,
    LLAMA3_SPLIT_PATTERN,
    Tokenizer,
)
from kenotron.data.tokenizer_path import build_tokenizer

__all__ = [
    "BUILTIN_TOKENIZER_FILE",
    "LLAMA3_SPLIT_PATTERN",
    "Document",
    "DocumentSource",
    "GlobalBatchLoader",
    "HFTokenizer",
    "IndexedDocuments",
    "Interleaver",
    "LoaderContext",
    "MicroBatch",
    "NamedSource",
    "PackedWindows",
    "Permutation",
    "Prefetcher",
    "Stage",
    "StreamedDocuments",
    "SyntheticWindows",
    "TiktokenTokenizer",
    "TokenFileError",
    "TokenizedFolder",
    "TokenizedWindows",
    "Tokenizer",
    "ValidationSet",
    "build_data_loader",
    "build_text_loader",
    "build_tokenizer",
    "builtin_documents",
    "check_batch_sizes",
    "check_data_config",
    "document_ids",
    "list_documents",
    "llama3_special_tokens",
    "open_documents",
    "open_token_file",
]
