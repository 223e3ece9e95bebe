"""`kenotron generate` (scripts/run_generate.py): text from a run, a checkpoint or an HF folder, with a cache
(attention keys and values; a Mamba model's recurrent state).

    kenotron generate --run outputs/debug --prompt "def fib(n):" --max-new-tokens 64
    kenotron generate --hf hf_out --prompt "def fib(n):" --temperature 0.8 --top-k 50 --top-p 0.95
    kenotron generate --model llama3 --flavor debug --prompt "The" --prompt "import" --device cuda

Where the model comes from:
- `--run PATH` (or `--checkpoint PATH`): a training run folder (its latest complete checkpoint),
  its checkpoints/ folder, or one step folder (full or model-only). Text goes through the
  tokenizer the run trained with (its config.toml), unless `--tokenizer` names another.
- `--hf FOLDER`: config.json + model.safetensors (or a sharded model.safetensors.index.json),
  converted by the family's HF adapter. Text goes through the folder's tokenizer.json (needs
  the `tokenizers` package), else its tokenizer.model (tiktoken), unless `--tokenizer` is given.
- `--model NAME --flavor F`: a kenotron model built here with random weights (smoke tests).
Without a tokenizer of its own (`--model`, a checkpoint outside a run folder), text goes through
`--tokenizer` (empty: kenotron's built-in 4096-token BPE).

`--prompt-ids "1 2 3"` feeds token ids directly and prints ids (no tokenizer needed).
A batch of prompts is left-padded to a common length; padding is masked out of attention.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from kenotron.checkpoint import CheckpointError
from kenotron.checkpoint.hf_files import read_hf_config
from kenotron.checkpoint.locate import find_checkpoint
from kenotron.data import build_tokenizer
from kenotron.generate import (
    SamplingConfig,
    build_kenotron_model,
    cache_description,
    generate,
    load_checkpoint_model,
    load_hf_model,
)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TextCodec(Protocol):
    """What generation needs from a tokenizer."""

    bos_id: int | None
    eos_id: int | None

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


@dataclass
class HFTokenizerFile:
    """A folder's tokenizer.json through the `tokenizers` package. Its own post-processor adds
    the special tokens the model expects (Llama's BOS; none for Qwen), so `bos_id` stays None."""

    path: Path
    eos_id: int | None
    add_special_tokens: bool = True
    bos_id: int | None = None

    def __post_init__(self) -> None:
        try:
            from tokenizers import Tokenizer  # optional package (the hf extra): tokenizer.json only
        except ImportError as err:
            raise SystemExit(
                f"reading {self.path} needs the `tokenizers` package (pip install tokenizers), or pass "
                f"--tokenizer with a tiktoken file, or --prompt-ids"
            ) from err
        self._tokenizer = Tokenizer.from_file(str(self.path))

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=self.add_special_tokens).ids

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids)


def parse_args(argv: list[str] | None = None, prog: str = "kenotron generate") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    source = parser.add_argument_group("model")
    source.add_argument("--hf", default="", help="Hugging Face checkpoint folder (config.json + safetensors)")
    source.add_argument("--run", "--checkpoint", dest="checkpoint", default="",
                        help="a run folder (its latest checkpoint), its checkpoints/ folder, or a step folder")
    source.add_argument("--model", default="", help="kenotron family with random weights, e.g. qwen3 (with --flavor)")
    source.add_argument("--flavor", default="debug", help="kenotron flavor of --model")
    source.add_argument("--vocab-size", type=int, default=0, help="override the flavor's vocabulary (0: keep)")
    text = parser.add_argument_group("prompts")
    text.add_argument("--prompt", action="append", default=[], help="a text prompt (repeat for a batch)")
    text.add_argument("--prompt-ids", action="append", default=[], help='token ids, e.g. "1 2 3" (repeatable)')
    text.add_argument("--tokenizer", default=None,
                      help="tiktoken file ('' = the built-in one); default: the run's or the HF folder's")
    text.add_argument("--no-bos", action="store_true", help="no BOS (nor the HF tokenizer's other added special tokens) before text prompts")
    gen = parser.add_argument_group("generation")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0: greedy")
    gen.add_argument("--top-k", type=int, default=0, help="0: no top-k filter")
    gen.add_argument("--top-p", type=float, default=1.0, help="1: no nucleus filter")
    gen.add_argument("--no-cache", action="store_true", help="recompute the whole sequence each step")
    gen.add_argument("--ignore-eos", action="store_true", help="always generate max-new-tokens tokens")
    gen.add_argument("--seed", type=int, default=0, help="seeds sampling and a fresh model's init")
    gen.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    gen.add_argument("--dtype", default="", choices=["", *DTYPES], help="empty: bfloat16 on GPU, float32 on CPU")
    args = parser.parse_args(argv)
    if sum(map(bool, (args.hf, args.checkpoint, args.model))) != 1:
        parser.error("give exactly one of --hf FOLDER, --run RUN_OR_CHECKPOINT and --model NAME")
    if not args.prompt and not args.prompt_ids:
        parser.error("give at least one --prompt or --prompt-ids")
    if args.prompt and args.prompt_ids:
        parser.error("give either text prompts or id prompts, not both")
    return args


def build_model(args: argparse.Namespace, device: torch.device, dtype: torch.dtype, max_len: int) -> nn.Module:
    if args.hf:
        return load_hf_model(args.hf, device=device, dtype=dtype, max_seq_len=max_len).eval()
    if args.checkpoint:
        return load_checkpoint_model(find_checkpoint(args.checkpoint).step_folder, device=device, dtype=dtype,
                                     max_seq_len=max_len)
    return build_kenotron_model(
        args.model, args.flavor, device=device, dtype=dtype, max_seq_len=max_len, vocab_size=args.vocab_size,
        seed=args.seed,
    )


def build_codec(args: argparse.Namespace) -> TextCodec | None:
    if args.prompt_ids:
        return None
    if args.tokenizer is not None:
        return build_tokenizer(args.tokenizer)
    if args.hf:
        folder = Path(args.hf)
        if (folder / "tokenizer.json").is_file():
            eos = read_hf_config(folder).get("eos_token_id")
            return HFTokenizerFile(folder / "tokenizer.json", eos[0] if isinstance(eos, list) else eos, not args.no_bos)
        if (folder / "tokenizer.model").is_file():
            return build_tokenizer(str(folder / "tokenizer.model"))
        raise FileNotFoundError(
            f"{folder} has no tokenizer.json or tokenizer.model; pass --tokenizer FILE "
            f"(a tiktoken file, or '' for kenotron's built-in one), or token ids with --prompt-ids"
        )
    if args.checkpoint:
        path = find_checkpoint(args.checkpoint).tokenizer_path()
        if path is not None:
            return build_tokenizer(path)
    return build_tokenizer("")


def trained_length(args: argparse.Namespace) -> int | None:
    """The sequence length the model trained with: the run's training.seq_len, or an HF
    config's max_position_embeddings; None when unknown (--model, a step folder outside a run)."""
    if args.checkpoint:
        located = find_checkpoint(args.checkpoint)
        if located.run_folder is None:
            return None
        seq_len = located.run_config().get("training", {}).get("seq_len")
        return int(seq_len) if seq_len else None
    if args.hf:
        length = read_hf_config(args.hf).get("max_position_embeddings")
        return int(length) if length else None
    return None


class TokenPrinter:
    """Shows one prompt's new tokens as they are sampled (its text, or ids), and keeps every
    prompt's tokens so that an interrupted run still returns what it made."""

    def __init__(self, codec: TextCodec | None, batch: int, stream: bool, eos_id: int | None) -> None:
        self.codec, self.stream, self.eos_id = codec, stream, eos_id
        self.tokens: list[list[int]] = [[] for _ in range(batch)]
        self.done = [False] * batch
        self._shown = 0  # tokens of the first prompt whose text is on the screen

    def __call__(self, step: list[int]) -> None:
        for row, token in enumerate(step):
            if self.done[row]:
                continue
            if token == self.eos_id:
                self.done[row] = True
                continue
            self.tokens[row].append(token)
            if self.stream and row == 0:
                self._show()

    def _show(self) -> None:
        tokens = self.tokens[0]
        if self.codec is None:
            sys.stdout.write(f"{tokens[-1]} ")
        else:
            # Decode from one token before the new ones, so that a tokenizer that drops a leading
            # space at the start of a sequence still shows it; wait while a character is incomplete.
            context = max(self._shown - 1, 0)
            before = self.codec.decode(tokens[context:self._shown])
            text = self.codec.decode(tokens[context:])
            if text.endswith("\ufffd"):
                return
            sys.stdout.write(text.removeprefix(before))
            self._shown = len(tokens)
        sys.stdout.flush()


def main(argv: list[str] | None = None, prog: str = "kenotron generate") -> list[list[int]]:
    args = parse_args(argv, prog)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    codec = build_codec(args)
    if codec is None:
        prompts = [[int(t) for t in ids.split()] for ids in args.prompt_ids]
    else:
        bos = [codec.bos_id] if codec.bos_id is not None and not args.no_bos else []
        prompts = [bos + codec.encode(text) for text in args.prompt]
    max_len = max(len(p) for p in prompts) + args.max_new_tokens
    trained = trained_length(args)
    if trained is not None and max_len > trained:
        print(f"{prog}: warning: the longest prompt ({max(len(p) for p in prompts):,} tokens) and "
              f"{args.max_new_tokens:,} new tokens make {max_len:,}, past the {trained:,}-token sequences this "
              f"model trained on: what comes after token {trained:,} is unreliable", file=sys.stderr)
    model = build_model(args, device, dtype, max_len)

    sampling = SamplingConfig(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
    eos_id = None if args.ignore_eos or codec is None else codec.eos_id
    generator = torch.Generator(device=device).manual_seed(args.seed)
    prefixes = [" ".join(map(str, p)) if codec is None else args.prompt[i] for i, p in enumerate(prompts)]
    # One prompt streams its tokens as they come; a batch prints each prompt's text at the end.
    stream = len(prompts) == 1
    printer = TokenPrinter(codec, len(prompts), stream, eos_id)
    if stream:
        print(f"--- [0] {prefixes[0]!r}", flush=True)
    start = time.perf_counter()
    interrupted = False
    try:
        outputs = generate(
            model, prompts, max_new_tokens=args.max_new_tokens, sampling=sampling, eos_id=eos_id,
            use_cache=not args.no_cache, generator=generator, on_tokens=printer,
        )
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM (run()): keep what was made
        interrupted, outputs = True, printer.tokens
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    if stream:
        print(flush=True)
    else:
        for i, new in enumerate(outputs):
            shown = " ".join(map(str, new)) if codec is None else codec.decode(new)
            print(f"--- [{i}] {prefixes[i]!r}\n{shown}", flush=True)
    if interrupted:
        print(f"{prog}: interrupted after {max(map(len, outputs), default=0)} new tokens; the text above is what "
              "was made", file=sys.stderr)
        raise KeyboardInterrupt
    n_new = sum(len(o) for o in outputs)
    print(f"{n_new} tokens in {elapsed:.2f} s ({n_new / elapsed:.1f} tokens/s, batch {len(prompts)}, {device}, "
          f"{'no cache' if args.no_cache else cache_description(model)})", file=sys.stderr)
    return outputs




def run(argv: list[str] | None = None, prog: str = "kenotron generate") -> int:
    """`main` for a console: a missing file or a bad checkpoint is one line and exit code 2."""
    signals: list[int] = []

    def stop(signum: int, _frame) -> None:  # SIGTERM ends the generation as Ctrl-C does
        signals.append(signum)
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        main(argv, prog)
    except (CheckpointError, FileNotFoundError, ValueError) as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 128 + (signals[0] if signals else signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
