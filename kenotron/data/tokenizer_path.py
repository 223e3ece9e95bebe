"""`build_tokenizer`: the tokenizer that `tokenizer.path` names, one of

- "" : kenotron's built-in 4k byte-level BPE (a tiktoken rank file shipped in data/assets);
- a tiktoken BPE rank file (Llama 3's `original/tokenizer.model` format), read by
  kenotron.data.tiktoken_bpe with the split pattern it was built with;
- a Hugging Face tokenizer: a folder holding `tokenizer.json` (+ `tokenizer_config.json` for
  BOS/EOS), as on the hub, or the `tokenizer.json` file itself, read by the `tokenizers`
  library (kenotron.data.hf_tokenizer);
- a model folder without `tokenizer.json` but with `tokenizer.model` or
  `original/tokenizer.model`: that rank file.
"""

from __future__ import annotations

from pathlib import Path

from kenotron.data.hf_tokenizer import HFTokenizer
from kenotron.data.tiktoken_bpe import TiktokenTokenizer
from kenotron.data.tokenizer import BUILTIN_TOKENIZER_FILE, BUILTIN_TOKENIZER_NAME, Tokenizer


def _hf_file_of(candidate: Path) -> Path | None:
    if candidate.is_file() and candidate.suffix == ".json":
        return candidate
    if candidate.is_dir() and (candidate / "tokenizer.json").is_file():
        return candidate / "tokenizer.json"
    return None


def _rank_file_of(path: str, candidate: Path) -> Path:
    """The tiktoken rank file named by `path`: a file, or a model folder holding tokenizer.model."""
    if candidate.is_dir():
        # HF Llama 3 repositories keep the tiktoken file under original/.
        for inside in ("tokenizer.model", "original/tokenizer.model"):
            if (candidate / inside).is_file():
                return candidate / inside
        raise FileNotFoundError(
            f"tokenizer.path={path!r} is a folder without tokenizer.json, tokenizer.model or "
            "original/tokenizer.model; give a Hugging Face tokenizer folder, a tiktoken BPE file, "
            "or '' for the built-in tokenizer"
        )
    if not candidate.is_file():
        raise FileNotFoundError(
            f"tokenizer.path={path!r} does not exist; give a Hugging Face tokenizer folder (tokenizer.json), a "
            "tiktoken BPE rank file (e.g. Llama 3's original/tokenizer.model) or '' for the built-in 4k tokenizer"
        )
    return candidate


def build_tokenizer(path: str) -> Tokenizer:
    """The tokenizer of `tokenizer.path` (see the module docstring for what it may name)."""
    if path == "":
        if not BUILTIN_TOKENIZER_FILE.is_file():
            raise FileNotFoundError(
                f"the built-in tokenizer file {str(BUILTIN_TOKENIZER_FILE)!r} is missing; "
                "reinstall kenotron or run scripts/train_tokenizer.py to rebuild it"
            )
        return TiktokenTokenizer(BUILTIN_TOKENIZER_FILE, name=BUILTIN_TOKENIZER_NAME)
    candidate = Path(path).expanduser()
    hf_file = _hf_file_of(candidate)
    if hf_file is not None:
        return HFTokenizer(hf_file)
    return TiktokenTokenizer(_rank_file_of(path, candidate))
