"""Tokenize text data once, into a folder of datatrove-format token files (`kenotron preprocess`).

    preprocess("jsonl", "raw/", "tokenized/", tokenizer_path="", workers=8)

The input is cut into tasks (one per file; large JSON Lines files into byte ranges of whole
lines; hub datasets into their shards), each tokenized by one of `workers` processes into its
own token file `<task>.ds` (+ .index, .metadata), named so that sorted file order is input
order. Each document becomes `[bos] + tokens + [eos]`, as the trainer packs raw text, so an
unshuffled tokenized folder gives exactly the windows the raw text would.

Resumable: a task's files take their real names only when it is complete (kenotron.data.
token_files.TokenFileWriter), so running the same command again skips finished tasks and redoes
the rest. `preprocess.json` in the output folder records what the folder was made from; a
second run with other inputs or another tokenizer is refused instead of mixing them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from kenotron.data.corpus import builtin_documents
from kenotron.data.dataset_path import open_documents
from kenotron.data.local_files import is_json_array, resolve_local_files
from kenotron.data.long_documents import check_encodable, encode_documents
from kenotron.data.text_source import LOCAL_FORMATS, import_datasets, text_of
from kenotron.data.token_files import TokenFileWriter, token_size_for
from kenotron.data.tokenizer import cpu_count
from kenotron.data.tokenizer_path import build_tokenizer

MANIFEST = "preprocess.json"
_BATCH_DOCUMENTS = 256


@dataclass(frozen=True)
class Task:
    """One unit of work: documents of `source` (a file, a byte range of one, a shard, a slice)."""

    number: int
    dataset: str
    path: str
    start: int = 0  # byte offset (jsonl ranges), shard index (hub) or document index (builtin)
    end: int = -1  # exclusive; -1: to the end
    size: int = 0  # bytes, for the progress bar (0: unknown)

    @property
    def output(self) -> str:
        return f"{self.number:05d}.ds"


def _jsonl_ranges(path: Path, chunk_bytes: int) -> list[tuple[int, int]]:
    """Byte ranges of about `chunk_bytes`, each starting at the beginning of a line."""
    size = path.stat().st_size
    cuts = [0]
    with open(path, "rb") as f:
        while cuts[-1] + chunk_bytes < size:
            f.seek(cuts[-1] + chunk_bytes)
            f.readline()  # to the start of the next line
            if f.tell() >= size:
                break
            cuts.append(f.tell())
    return list(zip(cuts, cuts[1:] + [size], strict=True))


def plan_tasks(dataset: str, path: str, split: str = "train", chunk_bytes: int = 256 << 20) -> list[Task]:
    """The tasks of an input, in input order."""
    tasks: list[Task] = []
    if dataset in LOCAL_FORMATS or dataset == "auto":
        fmt, files = resolve_local_files(dataset, path)
        for file in files:
            size = file.stat().st_size
            if fmt == "jsonl" and not is_json_array(file):
                for start, end in _jsonl_ranges(file, chunk_bytes):
                    tasks.append(Task(len(tasks), fmt, str(file), start, end, end - start))
            else:
                tasks.append(Task(len(tasks), fmt, str(file), size=size))
        return tasks
    if dataset == "builtin":
        count = len(builtin_documents())
        step = max(1, -(-count // cpu_count()))
        return [Task(i, "builtin", "", start, min(start + step, count)) for i, start in enumerate(range(0, count, step))]
    data = _hub(dataset, path, split)
    return [Task(i, dataset, path, i) for i in range(max(1, getattr(data, "n_shards", 1)))]


def _hub(dataset: str, config_name: str, split: str) -> Any:
    return import_datasets().load_dataset(dataset, name=config_name or None, split=split, streaming=True)


def _task_texts(task: Task, text_field: str, split: str) -> Iterator[tuple[str, int]]:
    """(text, input bytes consumed) of each document of a task."""
    if task.dataset == "jsonl" and task.end >= 0:
        with open(task.path, "rb") as f:
            f.seek(task.start)
            while f.tell() < task.end:
                line = f.readline()
                if not line:
                    break
                if line.strip():
                    yield text_of(json.loads(line), text_field, task.path), len(line)
                else:
                    yield "", -len(line)  # a blank line: bytes only
        return
    if task.dataset in LOCAL_FORMATS:
        source = open_documents(task.dataset, task.path, text_field)
        while True:
            document = source.next_document()
            if document.epoch:
                return
            yield document.text, 0
    if task.dataset == "builtin":
        for text in builtin_documents()[task.start : task.end]:
            yield text, 0
        return
    data = _hub(task.dataset, task.path, split)
    if getattr(data, "n_shards", 1) > 1:
        data = data.shard(num_shards=data.n_shards, index=task.start)
    for record in data:
        yield text_of(record, text_field, task.dataset), 0


@dataclass(frozen=True)
class _Job:
    output: str
    tokenizer_path: str
    text_field: str
    split: str
    add_bos: bool


_progress: Any = None  # (documents, tokens, bytes) shared counters, set in each worker


def _init_worker(progress: Any) -> None:
    global _progress
    _progress = progress
    # One worker per core already: the tokenizers' own thread pools stay at one thread.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"


def _run_task(job: _Job, task: Task) -> int:
    """Tokenize one task into its token file; returns its token count."""
    tokenizer = build_tokenizer(job.tokenizer_path)
    if hasattr(tokenizer, "threads"):
        tokenizer.threads = 1
    bos = [tokenizer.bos_id] if job.add_bos and tokenizer.bos_id is not None else []
    writer = TokenFileWriter(Path(job.output) / task.output, token_size_for(tokenizer.vocab_size), tokenizer.name)
    texts: list[str] = []
    consumed = 0

    def flush() -> None:
        nonlocal consumed
        tokens = 0
        for text in texts:
            check_encodable(tokenizer, text, f"a document of {task.path}")
        for ids in encode_documents(tokenizer, texts):  # long ones in bounded pieces, same tokens
            document = np.array(bos + ids + [tokenizer.eos_id])
            writer.write(document)
            tokens += len(document)
        if _progress is not None:
            with _progress.get_lock():
                _progress[0] += len(texts)
                _progress[1] += tokens
                _progress[2] += consumed
        texts.clear()
        consumed = 0

    for text, size in _task_texts(task, job.text_field, job.split):
        consumed += abs(size)
        if size < 0:
            continue
        texts.append(text)
        if len(texts) == _BATCH_DOCUMENTS:
            flush()
    flush()
    writer.close()
    return writer.num_tokens


def _check_manifest(output: Path, manifest: dict[str, Any]) -> None:
    path = output / MANIFEST
    if path.is_file():
        existing = json.loads(path.read_text())
        if existing != manifest:
            changed = sorted(k for k in manifest if existing.get(k) != manifest[k])
            raise ValueError(
                f"{str(output)!r} holds the output of another preprocessing ({', '.join(changed)} differ); use a new "
                "output folder, or delete this one to start over"
            )
    else:
        output.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(manifest, indent=1) + "\n")


def preprocess(
    dataset: str, path: str, output: str | Path, tokenizer_path: str = "", *, text_field: str = "text",
    split: str = "train", add_bos: bool = True, workers: int = 0, chunk_bytes: int = 256 << 20,
    progress: bool = True,
) -> dict[str, int]:
    """Tokenize `dataset`/`path` into `output` (see the module docstring); returns counts of this run."""
    output = Path(output)
    tokenizer = build_tokenizer(tokenizer_path)
    tasks = plan_tasks(dataset, path, split, chunk_bytes)
    manifest = {
        "dataset": dataset, "path": str(Path(path).resolve()) if path and dataset != "builtin" else path,
        "split": split, "text_field": text_field, "tokenizer": tokenizer.name, "vocab_size": tokenizer.vocab_size,
        "add_bos": add_bos, "tasks": [asdict(t) for t in tasks],
    }
    _check_manifest(output, manifest)
    todo = [t for t in tasks if not (output / (t.output + ".metadata")).is_file()]
    job = _Job(str(output), tokenizer_path, text_field, split, add_bos)
    workers = max(1, min(workers or cpu_count(), len(todo) or 1))
    context = mp.get_context("spawn")  # fresh processes: no inherited threads or tokenizer pools
    counters = context.Array("q", 3)
    total_bytes = sum(t.size for t in todo)
    bar = _progress_bar(progress, total_bytes, len(tasks) - len(todo), len(tasks))
    tokens = 0
    if todo and workers == 1:  # in this process: no start-up cost (tests, small inputs)
        global _progress
        _progress = counters
        try:
            for finished, task in enumerate(todo, start=len(tasks) - len(todo) + 1):
                tokens += _run_task(job, task)
                bar(counters[:], finished)
        finally:
            _progress = None
    elif todo:
        with context.Pool(workers, initializer=_init_worker, initargs=(counters,)) as pool:
            pending = [pool.apply_async(_run_task, (job, task)) for task in todo]
            while pending:
                time.sleep(0.2)
                done = [p for p in pending if p.ready()]
                for p in done:
                    tokens += p.get()  # raises a worker's error here
                    pending.remove(p)
                bar(counters[:], len(tasks) - len(pending))
    bar(counters[:], len(tasks), close=True)
    return {"tasks": len(tasks), "skipped": len(tasks) - len(todo), "documents": int(counters[0]), "tokens": tokens}


def _progress_bar(enabled: bool, total_bytes: int, done: int, tasks: int) -> Any:
    """A tqdm bar over input bytes (or documents when the size is unknown) with tokens in its postfix."""
    if not enabled:
        return lambda *args, **kwargs: None
    bar = tqdm(total=total_bytes or None, unit="B" if total_bytes else "doc", unit_scale=True, desc="tokenizing",
               mininterval=1.0)
    shown: list[Any] = [None]

    def update(counts: list[int], finished: int, close: bool = False) -> None:
        documents, tokens, consumed = counts
        if (counts, finished) != shown[0]:
            shown[0] = (list(counts), finished)
            bar.n = consumed if total_bytes else documents
            bar.set_postfix_str(f"{tokens:,} tokens, {documents:,} docs, tasks {finished}/{tasks}", refresh=False)
            bar.update(0)
        if close:
            bar.close()

    update([0, 0, 0], done)
    return update
