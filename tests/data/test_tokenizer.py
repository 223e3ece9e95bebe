import base64
import itertools
import platform
import time
from pathlib import Path

import pytest

from kenotron.data.bpe_training import count_pieces, train_bpe, write_rank_file
from kenotron.data.corpus import builtin_documents
from kenotron.data.hf_tokenizer import HFTokenizer
from kenotron.data.tiktoken_bpe import (
    TiktokenTokenizer,
    llama3_special_tokens,
    read_rank_file,
    sidecar_path,
    write_sidecar,
)
from kenotron.data.tokenizer import (
    BUILTIN_TOKENIZER_FILE,
    LLAMA3_SPLIT_PATTERN,
)
from kenotron.data.tokenizer_path import build_tokenizer
from tests.data.hf_files import write_hf_tokenizer

ROUND_TRIP_TEXTS = [
    "",
    "Hello, world!",
    "emoji 🤗🚀👩‍👩‍👧‍👦 flags 🇫🇷🇯🇵 skin 👋🏽",
    "中文字符和日本語のテキスト、한국어 텍스트",
    "Ελληνικά, кириллица, עברית, العربية, हिन्दी",
    "def f(x: int) -> int:\n\treturn x ** 2  # comment\n\n\n",
    "   leading and trailing   \n\n\r\n\t \u00a0\u2003\u3000 ",
    "e\u0301 combining, \u200b zero width, \x00 nul, \ufeff bom, \U0010ffff last code point",
    "numbers 1234567890 3.14159 1e-10 0xdeadbeef",
    "<|begin_of_text|> <|end_of_text|> <|eot_id|> are text here",
    "a" * 30_000 + " " * 30_000 + "b",
]


@pytest.fixture(scope="module")
def builtin():
    return build_tokenizer("")


def tiny_rank_file(path: Path) -> Path:
    """256 single bytes and a few merges, in the tiktoken format."""
    tokens = [bytes([b]) for b in range(256)] + [b"he", b"ll", b"hell", b"hello", b" w", b"or"]
    write_rank_file({t: i for i, t in enumerate(tokens)}, path)
    return path


def test_builtin_tokenizer_sizes(builtin):
    assert builtin.name == "kenotron_bpe_4k"
    assert builtin.vocab_size == 4096
    assert builtin.num_ranks == 4080
    assert (builtin.bos_id, builtin.eos_id) == (4080, 4081)
    assert builtin.special_tokens["<|eot_id|>"] == 4080 + 9
    assert BUILTIN_TOKENIZER_FILE.stat().st_size < 100 * 1024


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS, ids=range(len(ROUND_TRIP_TEXTS)))
def test_builtin_round_trip(builtin, text):
    ids = builtin.encode(text)
    assert all(0 <= i < builtin.num_ranks for i in ids)
    assert builtin.decode(ids) == text


def test_batch_encoding_matches_single(builtin):
    assert builtin.encode_batch(ROUND_TRIP_TEXTS) == [builtin.encode(t) for t in ROUND_TRIP_TEXTS]


def test_builtin_compresses_english(builtin):
    # Docstring English is what it was trained on: ~4 characters per token.
    text = "Return a new list containing all items from the iterable in ascending order."
    assert len(builtin.encode(text)) < len(text) / 4


def test_special_token_text_is_ordinary_text(builtin):
    ids = builtin.encode("<|begin_of_text|>hi<|end_of_text|>")
    assert builtin.bos_id not in ids and builtin.eos_id not in ids
    assert builtin.decode([builtin.bos_id]) == "<|begin_of_text|>"


def test_long_runs_are_fast_and_round_trip(builtin):
    text = "x" * 200_000 + "\n" * 100_000
    start = time.perf_counter()
    assert builtin.decode(builtin.encode(text)) == text
    assert time.perf_counter() - start < 5


def test_tiny_rank_file(tmp_path):
    tokenizer = build_tokenizer(str(tiny_rank_file(tmp_path / "tiny.tiktoken")))
    assert tokenizer.vocab_size == 262 + 16
    assert (tokenizer.bos_id, tokenizer.eos_id) == (262, 263)
    assert tokenizer.encode("hello") == [259]
    for text in ROUND_TRIP_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_llama3_sized_file_gets_llama3_special_tokens(tmp_path):
    # 256 single bytes, then made-up 2- and 3-byte tokens up to Llama 3's 128000 ranks.
    multi_byte = (bytes(t) for n in (2, 3) for t in itertools.product(range(256), repeat=n))
    tokens = [bytes([b]) for b in range(256)] + list(itertools.islice(multi_byte, 128_000 - 256))
    path = tmp_path / "tokenizer.model"
    with open(path, "w") as f:
        f.writelines(f"{base64.b64encode(t).decode()} {i}\n" for i, t in enumerate(tokens))

    start = time.perf_counter()
    tokenizer = build_tokenizer(str(path))
    assert time.perf_counter() - start < 5

    assert tokenizer.vocab_size == 128_256
    assert (tokenizer.bos_id, tokenizer.eos_id) == (128_000, 128_001)
    expected = {
        "<|reserved_special_token_0|>": 128_002,
        "<|finetune_right_pad_id|>": 128_004,
        "<|start_header_id|>": 128_006,
        "<|end_header_id|>": 128_007,
        "<|eom_id|>": 128_008,
        "<|eot_id|>": 128_009,
        "<|python_tag|>": 128_010,
        "<|reserved_special_token_2|>": 128_011,
        "<|reserved_special_token_246|>": 128_255,
    }
    assert {k: tokenizer.special_tokens[k] for k in expected} == expected
    assert len(tokenizer.special_tokens) == 256
    assert tokenizer.decode([128_009]) == "<|eot_id|>"
    text = "Llama-sized 🦙 text"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_small_vocab_specials_are_a_prefix_of_llama3():
    assert llama3_special_tokens(16) == llama3_special_tokens()[:16]
    assert len(set(llama3_special_tokens())) == 256


def test_model_folder_resolves_original_tokenizer_model(tmp_path):
    tiny_rank_file(tmp_path / "original" / "tokenizer.model")
    assert build_tokenizer(str(tmp_path)).vocab_size == 278


def test_missing_tokenizer_file(tmp_path):
    missing = str(tmp_path / "nope.model")
    with pytest.raises(FileNotFoundError, match="tokenizer.path=.*nope.model.* does not exist"):
        build_tokenizer(missing)


def test_not_a_rank_file(tmp_path):
    path = tmp_path / "tokenizer.model"
    path.write_text('{"model": {"type": "BPE"}}\n')
    with pytest.raises(ValueError, match="not '<base64 token> <rank>'"):
        build_tokenizer(str(path))


def test_rank_file_without_a_known_split_pattern(tmp_path):
    path = tiny_rank_file(tmp_path / "tiny.tiktoken")
    sidecar_path(path).unlink()
    with pytest.raises(ValueError, match=r"does not say which split pattern.*tiny.tiktoken.json"):
        build_tokenizer(str(path))


def test_rank_file_uses_the_split_pattern_it_was_built_with(tmp_path):
    path = tiny_rank_file(tmp_path / "tiny.tiktoken")
    assert build_tokenizer(str(path)).encode(" world") == [260, 261, 108, 100]  # " w", "or", "l", "d"
    # A pattern that isolates spaces: " w" can no longer be merged.
    write_sidecar(path, r"\p{L}+| ")
    split = build_tokenizer(str(path))
    assert split.split_pattern == r"\p{L}+| "
    assert split.encode(" world") == [32, 119, 261, 108, 100]


def test_rank_file_under_a_hub_folder_takes_the_pattern_of_its_tokenizer_json(tmp_path):
    path = tiny_rank_file(tmp_path / "original" / "tokenizer.model")
    sidecar_path(path).unlink()
    write_hf_tokenizer(tmp_path / "hub", pattern=r"\p{L}+| ")
    (tmp_path / "hub" / "tokenizer.json").rename(tmp_path / "tokenizer.json")
    assert TiktokenTokenizer(path).split_pattern == r"\p{L}+| "


def test_rank_file_without_all_bytes(tmp_path):
    write_rank_file({b"a": 0, b"b": 1}, tmp_path / "two.tiktoken")
    with pytest.raises(ValueError, match="lacks 254 single-byte tokens"):
        read_rank_file(tmp_path / "two.tiktoken")


@pytest.fixture(scope="module")
def corpus_slice():
    # The first documents of the built-in corpus (help topics), without building all of it.
    from pydoc_data.topics import topics

    return [topics[name] for name in sorted(topics)[:12]]


def test_bpe_training_is_deterministic(tmp_path, corpus_slice):
    first = train_bpe(corpus_slice, 700)
    second = train_bpe(list(reversed(corpus_slice)), 700)
    assert first == second
    assert sorted(first.values()) == list(range(700))
    write_rank_file(first, tmp_path / "a.tiktoken")
    write_rank_file(second, tmp_path / "b.tiktoken")
    assert (tmp_path / "a.tiktoken").read_bytes() == (tmp_path / "b.tiktoken").read_bytes()

    tokenizer = TiktokenTokenizer(tmp_path / "a.tiktoken")
    assert tokenizer.vocab_size == 716
    for text in ROUND_TRIP_TEXTS:
        assert tokenizer.decode(tokenizer.encode(text)) == text


def test_bpe_merges_frequent_pieces_first(corpus_slice):
    ranks = train_bpe(corpus_slice, 300)
    counts = count_pieces(corpus_slice, LLAMA3_SPLIT_PATTERN)
    # The most frequent multi-byte piece of English prose is a learned token early on.
    top_piece = max((p for p in counts if len(p) == 2), key=counts.__getitem__)
    assert top_piece in ranks


@pytest.mark.slow
@pytest.mark.skipif(
    platform.python_version() != "3.11.7",
    reason="the shipped vocabulary was trained on CPython 3.11.7's help topics and docstrings",
)
def test_training_script_reproduces_the_shipped_file(tmp_path):
    shipped = read_rank_file(BUILTIN_TOKENIZER_FILE)
    trained = train_bpe(builtin_documents(), len(shipped))
    write_rank_file(trained, tmp_path / "retrained.tiktoken")
    assert (tmp_path / "retrained.tiktoken").read_bytes() == BUILTIN_TOKENIZER_FILE.read_bytes()


# -- Hugging Face tokenizer.json ------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_builtin(tmp_path_factory):
    """The built-in vocabulary written as a hub folder, read back through `tokenizers`."""
    return build_tokenizer(str(write_hf_tokenizer(tmp_path_factory.mktemp("hub"))))


def test_hub_folder_is_read_by_the_tokenizers_library(hf_builtin, builtin):
    assert isinstance(hf_builtin, HFTokenizer)
    assert (hf_builtin.vocab_size, hf_builtin.bos_id, hf_builtin.eos_id) == (
        builtin.vocab_size, builtin.bos_id, builtin.eos_id,
    )


def test_hub_tokenizer_gives_the_ids_of_the_same_vocabulary_in_tiktoken(hf_builtin, builtin):
    # tiktoken cuts runs over 25k characters first, so the last text is left out.
    texts = ROUND_TRIP_TEXTS[:-1] + builtin_documents()[:200]
    assert hf_builtin.encode_batch(texts) == builtin.encode_batch(texts)
    for text in ROUND_TRIP_TEXTS:
        assert hf_builtin.decode(hf_builtin.encode(text)) == text


def test_hub_tokenizer_encodes_special_token_text_as_text(hf_builtin):
    ids = hf_builtin.encode("<|end_of_text|>")
    assert hf_builtin.eos_id not in ids and len(ids) > 1
    assert hf_builtin.decode([hf_builtin.eos_id]) == "<|end_of_text|>"


def test_tokenizer_json_file_itself_and_no_bos(tmp_path):
    folder = write_hf_tokenizer(tmp_path / "qwen-like", bos=None, eos="<|eot_id|>")
    tokenizer = build_tokenizer(str(folder / "tokenizer.json"))
    assert tokenizer.bos_id is None and tokenizer.eos_id == 4080 + 9


def test_hub_folder_without_config_finds_a_usual_eos_name(tmp_path):
    folder = write_hf_tokenizer(tmp_path / "bare")
    (folder / "tokenizer_config.json").unlink()
    tokenizer = build_tokenizer(str(folder))
    assert (tokenizer.bos_id, tokenizer.eos_id) == (None, 4081)


def test_hub_config_naming_a_missing_token(tmp_path):
    folder = write_hf_tokenizer(tmp_path / "mixed", eos="</s>")
    with pytest.raises(ValueError, match="eos_token='</s>' is not a token of tokenizer.json"):
        build_tokenizer(str(folder))


def test_unreadable_tokenizer_json(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(ValueError, match="is not a Hugging Face tokenizer.json"):
        build_tokenizer(str(tmp_path))
