"""From the config to a loader: the one place the trainer (and a notebook) builds its data.

    check_data_config(cfg, tokenizer, vocab_size)            # before any process group: one clear error
    loader = build_data_loader(cfg, tokenizer, vocab_size=V, global_batch_size=G, dp_rank=r, dp_size=D)
    micro_batches = loader.next_step()                       # prefetched in a background thread
    validation = build_validation_set(cfg, tokenizer, ...)   # when [validation] every > 0

`data.sources` blends several datasets (`data.dataset` / `data.path` is the one-source
shorthand), `data.stages` switches mixtures and sequence lengths at given steps, and
`data.loader` replaces all of it with a custom loader (kenotron.data.custom).
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kenotron.config import ConfigError, JobConfig
from kenotron.data.blend import Stage, check_stages, check_weights
from kenotron.data.custom import CheckedLoader, LoaderContext, load_loader_factory
from kenotron.data.dataset_path import open_documents
from kenotron.data.loader import (
    GlobalBatchLoader,
    MicroBatch,
    NamedSource,
    check_batch_sizes,
)
from kenotron.data.packing import PackedWindows
from kenotron.data.prefetch import Prefetcher
from kenotron.data.sources import SyntheticWindows, TokenizedWindows, is_random_access
from kenotron.data.text_source import LOCAL_FORMATS
from kenotron.data.token_files import TokenFileError, TokenizedFolder
from kenotron.data.tokenizer import Tokenizer

logger = logging.getLogger("kenotron")


@dataclass(frozen=True)
class SourceSpec:
    """One dataset as the config names it."""

    name: str
    dataset: str
    path: str
    weight: float = 1.0
    text_field: str = "text"
    split: str = "train"
    path_key: str = "data.path"
    """The config key that holds `path`, for error messages."""


def _default_name(dataset: str, path: str) -> str:
    return Path(path.rstrip("/")).name if path else dataset


def source_specs(cfg: JobConfig) -> list[SourceSpec]:
    """data.sources, or the one source of data.dataset / data.path."""
    d = cfg.data
    if not d.sources:
        if d.weights_from:
            raise ConfigError("data.weights_from gives the weights of a blend, but data.sources is empty; list the "
                              "sources ([[data.sources]] tables) the weights are for")
        return [SourceSpec(_default_name(d.dataset, d.path), d.dataset, d.path, 1.0, d.text_field, d.split)]
    specs = [
        SourceSpec(s.name or _default_name(s.dataset, s.path), s.dataset, s.path, s.weight, s.text_field, s.split,
                   f"data.sources[{i}].path")
        for i, s in enumerate(d.sources)
    ]
    names = [s.name for s in specs]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"data.sources has several sources named {repeated[0]!r}; give each its own name")
    if d.weights_from:
        learned = read_weights_file(d.weights_from, names)
        specs = [dataclasses.replace(s, weight=learned[s.name]) for s in specs]
    return specs


def read_weights_file(path: str, names: list[str]) -> dict[str, float]:
    """The weight of each of `names` in a JSON file `{"weights": {name: weight, ...}}` (what a
    DoReMi proxy run writes, doremi_weights.json); ConfigError when it is missing or does not
    name exactly these sources."""
    where = f"data.weights_from={path!r}"
    try:
        weights = json.loads(Path(path).read_text())["weights"]
    except FileNotFoundError:
        raise ConfigError(f"{where} does not exist; give the doremi_weights.json of a DoReMi proxy run") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ConfigError(f"{where} is not a JSON file with a 'weights' table of weights by source name ({err})") from None
    if not isinstance(weights, dict) or sorted(weights) != sorted(names):
        got = sorted(weights) if isinstance(weights, dict) else weights
        raise ConfigError(f"{where} gives weights for {got} but data.sources are {sorted(names)}; the sources must "
                          "have the names of the run that learned the weights")
    bad = {k: v for k, v in weights.items() if isinstance(v, bool) or not isinstance(v, (int, float))}
    if bad:
        raise ConfigError(f"{where}: the weight of {next(iter(bad))!r} is {next(iter(bad.values()))!r}, not a number")
    return {k: float(v) for k, v in weights.items()}


def data_stages(cfg: JobConfig, specs: list[SourceSpec]) -> list[Stage]:
    """The checked stages (weights normalized, seq_len resolved); one stage when data.stages is empty."""
    names = [s.name for s in specs]
    seq_len = cfg.training.seq_len
    try:
        where = f"data.weights_from={cfg.data.weights_from!r}" if cfg.data.weights_from else "data.sources weights"
        base = check_weights([s.weight for s in specs], where)
        if not cfg.data.stages:
            return [Stage(0, base, seq_len)]
        stages = []
        for i, stage in enumerate(cfg.data.stages):
            unknown = sorted(set(stage.weights) - set(names))
            if unknown:
                raise ValueError(f"data.stages[{i}].weights names {unknown[0]!r}, which is not a data source ({names})")
            weights = (check_weights([stage.weights.get(n, 0.0) for n in names], f"data.stages[{i}].weights")
                       if stage.weights else base)
            length = stage.seq_len or seq_len
            if not 0 < length <= seq_len:
                raise ValueError(
                    f"data.stages[{i}].seq_len={stage.seq_len} must lie in 1..training.seq_len={seq_len} (the model is "
                    "built for training.seq_len; raise it for a longer stage)"
                )
            stages.append(Stage(stage.start_step, weights, length))
        check_stages(stages)
        if cfg.parallelism.pp > 1 and len({s.seq_len for s in stages}) > 1:
            raise ValueError(
                "data.stages with different seq_len do not combine with pipeline parallel (the schedule's buffers have "
                "one shape); use one seq_len or parallelism.pp=1"
            )
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return stages


def open_source(spec: SourceSpec, cfg: JobConfig, tokenizer: Tokenizer, vocab_size: int) -> Any:
    """The window source of one dataset (kenotron.data.sources)."""
    if spec.dataset == "synthetic":
        return SyntheticWindows(vocab_size or tokenizer.vocab_size, seed=cfg.data.seed, name=spec.name)
    if spec.dataset == "tokenized":
        if not spec.path:
            raise ConfigError(f"dataset {spec.name!r} is tokenized but its path is empty; give the folder of .ds files")
        try:
            folder = TokenizedFolder(spec.path)
        except TokenFileError as err:
            raise ConfigError(str(err)) from None
        except FileNotFoundError as err:  # named by the key that holds the path (validation.path, ...)
            raise FileNotFoundError(f"{spec.path_key}={spec.path!r}: {err}") from None
        _warn_on_other_tokenizer(folder, tokenizer)
        return TokenizedWindows(folder, shuffle=cfg.data.shuffle, seed=cfg.data.seed, name=spec.name)
    try:
        documents = open_documents(spec.dataset, spec.path, spec.text_field, spec.split, spec.path_key)
    except ValueError as err:
        raise ConfigError(str(err)) from None
    return PackedWindows(documents, tokenizer, cfg.training.seq_len, add_bos=cfg.data.add_bos)


def _warn_on_other_tokenizer(folder: TokenizedFolder, tokenizer: Tokenizer) -> None:
    """Token files name the tokenizer that wrote them (datatrove writes its path): say so when it
    does not look like tokenizer.path's, since ids of another vocabulary train silently wrong."""
    names = [n for n in folder.tokenizer_names if n]
    mine = tokenizer.name.lower()
    if names and not any(mine in n.lower() or Path(n).parent.name.lower() == mine for n in names):
        logger.warning("%s was tokenized with %s, but tokenizer.path gives %r: check they are the same vocabulary",
                       folder.folder, " / ".join(repr(n) for n in names), tokenizer.name)


def check_data_config(cfg: JobConfig, tokenizer: Tokenizer, vocab_size: int, global_batch_size: int) -> None:
    """Every data check that needs no process group: sources, weights, stages, the custom loader,
    the tokenized folders (opened and checked), local text (its first document read), and the
    validation set's settings and size (for tokenized data)."""
    if cfg.data.loader:
        if cfg.data.weights_from:
            raise ConfigError("data.weights_from sets the weights of kenotron's blend, but data.loader replaces it with "
                              "a custom loader; drop one of them")
        load_loader_factory(cfg.data.loader)
    else:
        specs = source_specs(cfg)
        data_stages(cfg, specs)
        for spec in specs:
            if spec.dataset == "tokenized" or spec.dataset in LOCAL_FORMATS or spec.dataset == "auto":
                source = open_source(spec, cfg, tokenizer, vocab_size)
                if isinstance(source, TokenizedWindows):
                    source.num_windows(cfg.training.seq_len + 1)
    v = cfg.validation
    if v.every < 0 or v.batches < 1:
        raise ConfigError(f"validation.every={v.every} must be >= 0 and validation.batches={v.batches} >= 1")
    if not v.every:
        return
    if (v.dataset == "tokenized" or v.dataset in LOCAL_FORMATS or v.dataset == "auto") and not v.path:
        raise ConfigError(f"validation.every={v.every} but validation.path is empty; give the validation data")
    if v.dataset == "tokenized":
        _check_validation_size(cfg, open_source(_validation_spec(cfg), cfg, tokenizer, vocab_size), global_batch_size)
    elif v.dataset in LOCAL_FORMATS or v.dataset == "auto":
        open_source(_validation_spec(cfg), cfg, tokenizer, vocab_size)  # reads its first document


def _validation_spec(cfg: JobConfig) -> SourceSpec:
    v = cfg.validation
    return SourceSpec("validation", v.dataset, v.path, 1.0, v.text_field, v.split, "validation.path")


def _check_validation_size(cfg: JobConfig, source: Any, global_batch_size: int, available: int | None = None) -> None:
    """ConfigError in one line when the validation data holds fewer windows than
    validation.batches global batches (`available`: the windows of raw text, counted by reading it)."""
    v, seq_len = cfg.validation, cfg.training.seq_len
    wanted = v.batches * global_batch_size
    if available is None:
        available = source.num_windows(seq_len + 1) if isinstance(source, TokenizedWindows) else wanted
    if available >= wanted:
        return
    where = f"validation.path={v.path!r}" if v.path else f"validation.dataset={v.dataset!r}"
    most = available // global_batch_size
    fix = (f"lower validation.batches to {most} or give more validation data" if most else
           f"give more validation data (it holds less than one global batch of {global_batch_size} windows)")
    raise ConfigError(
        f"{where} holds {available} window(s) of training.seq_len + 1 = {seq_len + 1} tokens, fewer than validation.batches "
        f"x global batch = {v.batches} x {global_batch_size} = {wanted}; {fix}"
    )


def _context(cfg: JobConfig, tokenizer: Tokenizer, vocab_size: int, global_batch_size: int, dp_rank: int,
             dp_size: int, feed_inputs: bool, feed_labels: bool) -> LoaderContext:
    return LoaderContext(cfg, tokenizer, cfg.training.seq_len, global_batch_size, cfg.training.local_batch_size,
                         dp_rank, dp_size, feed_inputs, feed_labels, vocab_size)


def build_data_loader(
    cfg: JobConfig,
    tokenizer: Tokenizer,
    *,
    vocab_size: int,
    global_batch_size: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    feed_inputs: bool = True,
    feed_labels: bool = True,
) -> Prefetcher:
    """This rank's training loader, prefetching in a background thread (see the module docstring)."""
    check_batch_sizes(global_batch_size, cfg.training.local_batch_size, dp_size)
    if cfg.data.loader:
        ctx = _context(cfg, tokenizer, vocab_size, global_batch_size, dp_rank, dp_size, feed_inputs, feed_labels)
        loader: Any = CheckedLoader(load_loader_factory(cfg.data.loader)(ctx), ctx, cfg.data.loader)
    else:
        specs = source_specs(cfg)
        stages = data_stages(cfg, specs)
        sources = [NamedSource(s.name, open_source(s, cfg, tokenizer, vocab_size)) for s in specs]
        loader = GlobalBatchLoader(
            sources, cfg.training.seq_len, global_batch_size, cfg.training.local_batch_size, dp_rank, dp_size,
            stages=stages, feed_inputs=feed_inputs, feed_labels=feed_labels, vocab_size=vocab_size,
        )
    return Prefetcher(loader)


class ValidationSet:
    """The first `validation.batches` global batches of the validation data, this rank's share.

    The same batches every evaluation. Random-access data (tokenized folders) is re-read each
    time; raw text is tokenized once, at construction, and kept. A set smaller than the
    batches asked for is an error here, before training starts.
    """

    def __init__(self, cfg: JobConfig, tokenizer: Tokenizer, *, vocab_size: int, global_batch_size: int,
                 dp_rank: int = 0, dp_size: int = 1, feed_inputs: bool = True, feed_labels: bool = True) -> None:
        v = cfg.validation
        seq_len = cfg.training.seq_len
        source = open_source(_validation_spec(cfg), cfg, tokenizer, vocab_size)
        if isinstance(source, TokenizedWindows):
            source.shuffle = False
        self.batches = v.batches

        def loader() -> GlobalBatchLoader:
            return GlobalBatchLoader(
                NamedSource("validation", source), seq_len, global_batch_size, cfg.training.local_batch_size,
                dp_rank, dp_size, feed_inputs=feed_inputs, feed_labels=feed_labels, vocab_size=vocab_size,
            )

        self._loader = loader
        self._cached: list[list[MicroBatch]] | None = None
        available = None
        if not is_random_access(source):
            try:
                self._cached = [loader().next_step() for _ in range(v.batches)]
            except ValueError as err:
                raise ConfigError(f"the validation set {v.path or v.dataset!r}: {err}") from None
            if source.documents.epoch:  # the batches went round the data: count what one pass holds
                available = source.first_epoch_windows() or 0
        _check_validation_size(cfg, source, global_batch_size, available)

    def __iter__(self) -> Any:
        """This rank's micro-batches of each validation batch, in order."""
        if self._cached is not None:
            yield from self._cached
            return
        loader = self._loader()
        for _ in range(self.batches):
            yield loader.next_step()


def build_text_loader(
    tokenizer: Tokenizer, dataset: str, path: str, seq_len: int, global_batch_size: int, local_batch_size: int,
    dp_rank: int = 0, dp_size: int = 1, text_field: str = "text", split: str = "train", add_bos: bool = True,
    synthetic_vocab_size: int = 0,
) -> GlobalBatchLoader:
    """One dataset -> this rank's micro-batches, without prefetch (notebooks and tests)."""
    if global_batch_size != -1:
        check_batch_sizes(global_batch_size, local_batch_size, dp_size)
    cfg = JobConfig()
    cfg.training.seq_len = seq_len
    cfg.data.add_bos = add_bos
    spec = SourceSpec(_default_name(dataset, path), dataset, path, 1.0, text_field, split)
    source = open_source(spec, cfg, tokenizer, synthetic_vocab_size)
    return GlobalBatchLoader(source, seq_len, global_batch_size, local_batch_size, dp_rank, dp_size)
