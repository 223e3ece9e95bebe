"""A folder written by datatrove itself (its DocumentTokenizer, offline, with a local tokenizer.json)
is read token for token, and trains."""

from __future__ import annotations

import numpy as np
import pytest

from kenotron.data import build_tokenizer, builtin_documents
from kenotron.data.token_files import TokenizedFolder
from tests.data.hf_files import write_hf_tokenizer

pytest.importorskip("datatrove")


@pytest.fixture(scope="module")
def datatrove_folder(tmp_path_factory):
    from datatrove.data import Document
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.tokens import DocumentTokenizer

    root = tmp_path_factory.mktemp("datatrove")
    tokenizer_folder = write_hf_tokenizer(root / "tokenizer")
    texts = builtin_documents()[:300]
    documents = [Document(text=text, id=str(i)) for i, text in enumerate(texts)]
    LocalPipelineExecutor(
        pipeline=[
            documents,
            DocumentTokenizer(output_folder=str(root / "tokenized"), tokenizer_name_or_path=str(
                tokenizer_folder / "tokenizer.json"), eos_token="<|end_of_text|>", seed=0),
        ],
        tasks=1, logging_dir=str(root / "logs"),
    ).run()
    return root, tokenizer_folder, texts


def test_datatrove_folder_holds_kenotron_tokens_of_every_document(datatrove_folder):
    root, tokenizer_folder, texts = datatrove_folder
    folder = TokenizedFolder(root / "tokenized")
    (file,) = folder.files
    assert file.token_size == 2 and file.num_documents == len(texts)
    tokens = folder.read(0, folder.num_tokens)
    ends = file.document_ends().astype(np.int64)
    written = sorted(tuple(tokens[a:b]) for a, b in zip(np.r_[0, ends[:-1]], ends, strict=True))
    tokenizer = build_tokenizer(str(tokenizer_folder))
    expected = sorted((*ids, tokenizer.eos_id) for ids in tokenizer.encode_batch(texts))
    assert written == expected  # datatrove shuffled the documents; each one is kenotron's tokenization


def test_training_reads_the_datatrove_folder(datatrove_folder, tmp_path):
    from kenotron.config import load_config
    from kenotron.train.trainer import run_training

    root, tokenizer_folder, _ = datatrove_folder
    cfg = load_config(None, [
        "--data.dataset", "tokenized", "--data.path", str(root / "tokenized"), "--tokenizer.path",
        str(tokenizer_folder), "--training.steps", "4", "--training.seq_len", "64", "--training.local_batch_size", "2",
        "--metrics.log_freq", "2", "--job.dump_folder", str(tmp_path), "--lr_scheduler.warmup_steps", "1",
    ])
    records = run_training(cfg)
    assert records[-1]["step"] == 4
    assert records[-1]["tokens_seen"] == records[-1]["tokens_seen/tokenized"] == 4 * 2 * 64
    assert records[-1]["data_wait_s"] >= 0
