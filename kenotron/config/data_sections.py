"""The data sections of the job configuration: [tokenizer], [data] (with the entries of its
data.sources blend and data.stages schedule) and [validation]. config/sections.py gathers them
into JobConfig; the docstring rules are its own (a docstring per field, `--help` prints it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from kenotron.config.ranges import RANGE_KEY, at_least, ranged


@dataclass
class Tokenizer:
    path: str = ""
    """A Hugging Face tokenizer folder (tokenizer.json + tokenizer_config.json) or tokenizer.json, a tiktoken BPE file (Llama 3 `tokenizer.model` format), or empty for kenotron's built-in 4k vocabulary."""


@dataclass
class DataSource:
    """One dataset of a blend (an entry of data.sources)."""

    name: str = ""
    """Label in metrics and stage weights; empty: the last part of path (or the dataset name)."""

    dataset: str = "tokenized"
    """Same choices as data.dataset."""

    path: str = ""
    """Same meaning as data.path."""

    weight: float = ranged(1.0, at_least(0))
    """Share of the samples (weights are normalized over the sources)."""

    text_field: str = "text"
    """Column that holds the text (raw-text datasets)."""

    split: str = "train"
    """Split to read (hub datasets)."""


@dataclass
class DataStage:
    """A data stage (an entry of data.stages): from start_step on, its own mixture and sequence length."""

    start_step: int = ranged(0, at_least(0))
    """Optimizer steps completed before the stage begins; the first stage starts at 0."""

    weights: dict[str, float] = field(default_factory=dict, metadata={RANGE_KEY: at_least(0)})
    """Weight of each data.sources entry by name (missing names weigh 0); empty keeps the sources' weights."""

    seq_len: int = ranged(0, at_least(1, (0, "training.seq_len")))
    """Sequence length of the stage, at most training.seq_len; 0 = training.seq_len."""


@dataclass
class Data:
    dataset: str = "builtin"
    """`builtin` (Python's documentation), `tokenized` (datatrove-format token files at data.path), `json`, `jsonl`, `parquet`, `text` or `auto` (local files at data.path), `synthetic` (random ids), or a hub dataset name."""

    path: str = ""
    """Local file or folder for tokenized and the local formats; for a hub dataset, its config name (may be empty)."""

    text_field: str = "text"
    """Column of each record that holds the document text."""

    split: str = "train"
    """Dataset split to read."""

    add_bos: bool = True
    """Start every document with the tokenizer's BOS token (EOS always ends it); raw-text sources only."""

    document_masking: bool = False
    """Attend only within each token's own document of a packed window (block-causal, through FlexAttention); off, attention crosses document borders."""

    sources: list[DataSource] = field(default_factory=list)
    """Several datasets blended by weight (TOML `[[data.sources]]` tables with name, dataset, path, weight, text_field, split); replaces data.dataset and data.path."""

    stages: list[DataStage] = field(default_factory=list)
    """Data stages (TOML `[[data.stages]]` tables with start_step, weights by source name, seq_len); empty: one stage with the sources' weights."""

    shuffle: bool = True
    """Read the windows of tokenized datasets in a seeded order that changes every epoch (raw text is read in order)."""

    seed: int = ranged(0, at_least(0))
    """Seed of the shuffle order."""

    loader: str = ""
    """A custom data loader: `module:function` or `file.py:function` building it; runs that code (see examples/custom-dataloader); empty uses kenotron's."""

    weights_from: str = ""
    """A JSON file of domain weights by source name (a DoReMi proxy run's doremi_weights.json) that replaces the data.sources weights."""


@dataclass
class Validation:
    every: int = ranged(0, at_least(1, (0, "off")))
    """Evaluate the validation loss every this many steps (and after the last step); 0 = off."""

    dataset: str = "tokenized"
    """Same choices as data.dataset."""

    path: str = ""
    """Same meaning as data.path."""

    text_field: str = "text"
    """Column that holds the text (raw-text datasets)."""

    split: str = "validation"
    """Split to read (hub datasets)."""

    batches: int = ranged(10, at_least(1))
    """Global batches per evaluation: the first ones of the dataset, the same every time."""
