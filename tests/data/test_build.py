"""Data settings in the config: every mistake is one clear error from resolve_run, before any
process group; the blend and stage settings become the loader's stages."""

from __future__ import annotations

import json
import re

import pytest

from kenotron.config import ConfigError, load_config
from kenotron.data.build import data_stages, source_specs
from kenotron.data.sample_data import write_sample_data
from kenotron.train.resolve import resolve_run


@pytest.fixture(scope="module")
def tokenized(tmp_path_factory):
    """The built-in corpus as JSON Lines and tokenized (kenotron.data.sample_data, as the benchmarks use it)."""
    jsonl, folder = write_sample_data(tmp_path_factory.mktemp("sample"), workers=1)
    assert jsonl.is_file() and len(jsonl.read_text().splitlines()) == 1910
    return folder


def blend(tokenized, *extra):
    return load_config(None, [
        "--data.sources", f'[{{name = "web", path = "{tokenized}", weight = 3}}, {{name = "code", path = "{tokenized}"}}]',
        "--training.seq_len", "64", *extra,
    ])


def test_sources_and_stages_become_loader_stages(tokenized):
    cfg = blend(tokenized, "--data.stages", '[{start_step = 0}, {start_step = 100, weights = {code = 1}, seq_len = 32}]')
    stages = data_stages(cfg, source_specs(cfg))
    assert [(s.start_step, s.weights, s.seq_len) for s in stages] == [(0, (0.75, 0.25), 64), (100, (0.0, 1.0), 32)]
    resolve_run(cfg, world_size=1)  # the folders open and check


@pytest.mark.parametrize(("extra", "message"), [
    (["--data.stages", '[{start_step = 0}, {start_step = 50}, {start_step = 20}]'],
     "data stage starting at step 20 comes after the one starting at step 50"),
    (["--data.stages", '[{start_step = 10}]'], "the first data stage starts at step 10; it must start at step 0"),
    (["--data.stages", '[{start_step = 0, weights = {web = -1, code = 1}}]'],
     r"data.stages\[0\].weights.web=-1.0 must be >= 0 and finite"),
    (["--data.stages", '[{start_step = 0, weights = {web = 0, code = 0}}]'], "the weights are all zero"),
    (["--data.stages", '[{start_step = 0, weights = {wbe = 1}}]'], r"names 'wbe', which is not a data source"),
    (["--data.stages", '[{start_step = 0, seq_len = 128}]'], r"seq_len=128 must lie in 1..training.seq_len=64"),
    (["--data.loader", "no_such_package.loaders:build"], "data.loader='no_such_package.loaders:build': cannot import"),
    (["--validation.every", "10", "--validation.path", ""], "validation.every=10 but validation.path is empty"),
])
def test_bad_data_settings_fail_before_training(tokenized, extra, message):
    with pytest.raises(ConfigError, match=message):
        resolve_run(blend(tokenized, *extra), world_size=1)


def test_bad_source_weights_and_names(tokenized):
    with pytest.raises(ConfigError, match=r"data.sources\[0\].weight=-2.0 must be >= 0 and finite"):
        load_config(None, ["--data.sources", f'[{{path = "{tokenized}", weight = -2}}]'])
    cfg = load_config(None, ["--data.sources", f'[{{path = "{tokenized}"}}, {{path = "{tokenized}"}}]'])
    with pytest.raises(ConfigError, match="several sources named 'tokenized'"):
        resolve_run(cfg, world_size=1)


def test_truncated_tokenized_folder_fails_before_training(tokenized, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tokenized, broken)
    token_file = broken / "00000.ds"
    token_file.write_bytes(token_file.read_bytes()[:-3])
    cfg = load_config(None, ["--data.dataset", "tokenized", "--data.path", str(broken)])
    with pytest.raises(ConfigError, match=r"00000.ds. holds \d+ bytes, not a whole number of 2-byte tokens"):
        resolve_run(cfg, world_size=1)


def test_empty_validation_set_fails_before_training(tokenized, tmp_path):
    from kenotron.data import ValidationSet, build_tokenizer

    (tmp_path / "empty.jsonl").write_text("")
    cfg = load_config(None, ["--validation.every", "5", "--validation.dataset", "jsonl", "--validation.path",
                             str(tmp_path / "empty.jsonl")])
    with pytest.raises(ConfigError, match=r"^validation.path='.*empty.jsonl': the file .* is empty"):
        resolve_run(cfg, world_size=1)
    with pytest.raises(ConfigError, match=r"^validation.path='.*empty.jsonl': the file .* is empty"):
        ValidationSet(cfg, build_tokenizer(""), vocab_size=4096, global_batch_size=4)
    cfg = load_config(None, ["--validation.every", "5", "--validation.path", str(tokenized), "--validation.batches",
                             "1000", "--training.seq_len", "256", "--training.local_batch_size", "4"])
    message = r"holds 1559 window\(s\) of .* 257 tokens, fewer than .* 1000 x 4 = 4000; lower validation.batches to 389 "
    with pytest.raises(ConfigError, match=message):
        ValidationSet(cfg, build_tokenizer(""), vocab_size=4096, global_batch_size=4)
    with pytest.raises(ConfigError, match=message):
        resolve_run(cfg, world_size=1)


def test_the_estimator_plans_a_job_whose_data_is_elsewhere(tmp_path):
    from kenotron.estimate.memory import estimate_memory

    cfg = load_config(None, ["--data.dataset", "tokenized", "--data.path", str(tmp_path / "on-the-cluster"),
                             "--training.seq_len", "64", "--training.local_batch_size", "2"])
    with pytest.raises(FileNotFoundError, match="on-the-cluster' does not exist"):
        resolve_run(cfg, world_size=1)
    assert estimate_memory(cfg, ngpu=1).ranks


def test_weights_from_whose_sum_overflows_stops_in_one_line_before_training(tmp_path):
    weights = tmp_path / "doremi_weights.json"
    weights.write_text('{"weights": {"web": 1e308, "code": 1e308}}')
    cfg = load_config(None, ["--data.sources", '[{name = "web", dataset = "builtin"}, {name = "code", dataset = "builtin"}]',
                             "--data.weights_from", str(weights)])
    with pytest.raises(ConfigError, match=r"^data.weights_from='.*doremi_weights.json': the weights add up to more than "
                                          r"the largest float .*only their ratios count$"):
        data_stages(cfg, source_specs(cfg))


def test_validation_data_errors_name_the_validation_keys_and_the_windows_it_holds(tmp_path):
    from kenotron.data import ValidationSet, build_tokenizer

    missing = load_config(None, ["--validation.every", "5", "--validation.dataset", "jsonl", "--validation.path",
                                 str(tmp_path / "nowhere.jsonl")])
    with pytest.raises(FileNotFoundError, match=r"^validation.path='.*nowhere.jsonl' does not exist"):
        resolve_run(missing, world_size=1)
    missing = load_config(None, ["--validation.every", "5", "--validation.path", str(tmp_path / "no-folder")])
    with pytest.raises(FileNotFoundError, match=r"^validation.path='.*no-folder': tokenized data folder .* does not exist"):
        resolve_run(missing, world_size=1)
    # Ten documents of 62 tokens: 620 tokens hold 9 windows of 65; the loader reads ahead past their end.
    texts = [" ".join(f"word{i} number {j}" for j in range(12)) for i in range(10)]
    (tmp_path / "val.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    small = ["--validation.every", "5", "--validation.dataset", "jsonl", "--validation.path", str(tmp_path / "val.jsonl"),
             "--training.seq_len", "64", "--training.local_batch_size", "2"]
    tokenizer = build_tokenizer("")
    ValidationSet(load_config(None, [*small, "--validation.batches", "2"]), tokenizer, vocab_size=4096,
                  global_batch_size=2)  # 4 windows of the 9: fits, though reading ahead went round the data
    with pytest.raises(ConfigError) as too_many:
        ValidationSet(load_config(None, [*small, "--validation.batches", "5"]), tokenizer, vocab_size=4096,
                      global_batch_size=2)
    message = str(too_many.value)
    assert "\n" not in message and message.startswith("validation.path='")
    assert re.search(r"holds \d window\(s\) of training.seq_len \+ 1 = 65 tokens, fewer than validation.batches x "
                     r"global batch = 5 x 2 = 10; lower validation.batches to \d or give more validation data$", message)
