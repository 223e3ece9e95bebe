"""estimation.py: the 8B model on 64 GPUs within the time and memory the issue sets, JSON
output, and config errors reported as the trainer reports them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kenotron.planner.cli import main
from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]

# Runs estimation.py's main in a fresh interpreter and prints its own peak RSS (KiB on Linux)
# last, so that the figure is the estimator's and not another test's child process.
_RUN_AND_MEASURE = (
    "import resource, runpy, sys\n"
    "sys.argv = ['estimation.py'] + sys.argv[1:]\n"
    "try:\n"
    "    runpy.run_path('estimation.py', run_name='__main__')\n"
    "except SystemExit as e:\n"
    "    code = e.code\n"
    "print('MAXRSS_KIB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n"
    "sys.exit(code)\n"
)


def estimate_8b_on_64_gpus(tmp_path: Path, lane: Lane) -> tuple[subprocess.CompletedProcess, float, dict | None]:
    """estimation.py in a fresh interpreter (its own peak RSS), run ahead of its test (tests/ahead.py)."""
    out = tmp_path / "report.json"
    start = time.perf_counter()
    proc = lane.run([sys.executable, "-c", _RUN_AND_MEASURE, "--config", "llama3_8b", "--ngpu", "64",
                     "--json", str(out)], cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    elapsed = time.perf_counter() - start
    return proc, elapsed, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.run_ahead(job=estimate_8b_on_64_gpus)
def test_8b_on_64_gpus_in_under_a_minute_and_2_gib(ran_ahead):
    proc, elapsed, report = ran_ahead
    assert proc.returncode == 0, proc.stderr[-2000:]
    rss_gib = int(proc.stdout.rsplit("MAXRSS_KIB", 1)[1]) / 2**20
    assert elapsed < 60, f"took {elapsed:.1f} s"
    assert rss_gib < 2, f"peak RSS {rss_gib:.2f} GiB"
    assert "all 64 ranks" in proc.stdout and "verdict:" in proc.stdout
    rank = report["ranks"][0]
    assert report["ngpu"] == 64 and report["layout"]["dp_shard"] == 64
    assert sum(rank["breakdown_bytes"].values()) == rank["peak_bytes"]
    assert report["verdict"] in ("fits", "tight", "does not fit")
    assert rank["activations_by_module"][0]["bytes"] > 0


def test_config_errors_are_reported_as_the_trainer_does(capsys):
    code = main(["--config", "debug", "--ngpu", "6", "--parallelism.tp", "3"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("kenotron: config error: tp=3 does not divide n_heads=8")


def test_unknown_keys_get_the_loaders_suggestion(capsys):
    code = main(["--config", "debug", "--ngpu", "4", "--training.local_batch", "2"])
    assert code == 2
    assert "did you mean 'training.local_batch_size'" in capsys.readouterr().err


def test_the_gpu_accuracy_script_covers_the_issues_matrix(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("estimate_vs_measured", ROOT / "scripts/estimate_vs_measured.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    cases = script.CASES.values()
    flat = [" ".join(overrides) for _, overrides in cases]
    assert len(script.CASES) >= 6
    assert {n for n, _ in cases} >= {1, 2, 4}
    for needed in ("--config llama3_1b", "--model.n_layers 8", "mode none", "mode selective-op", "mode full",
                   "--parallelism.tp", "--parallelism.cp"):
        assert any(needed in f for f in flat), needed
    assert script.main(["--list"]) == 0 and "8B-width" in capsys.readouterr().out


def test_estimation_help_names_config_and_explains_the_search_columns(capsys):
    from kenotron.planner.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "--config PRESET|FILE.toml" in out
    for column in ("layout =", "AC =", "batch =", "accum =", "analytic GiB =", "fake GiB =", "tok/s/GPU ="):
        assert column in out


def _predicted(text: str) -> float:
    return float(text.split("not measured: ")[1].split(" tokens/s")[0].replace(",", ""))


def test_the_estimate_ends_with_the_predicted_tokens_per_s_on_the_stated_network(capsys):
    args = ["--config", "debug", "--ngpu", "16", "--gpus-per-node", "8", "--node-gb-s", "200",
            "--network-gb-s", "25"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Predicted by the throughput model, not measured:" in out
    assert "16 H200 GPUs, 8 per node (2 nodes), 200 GB/s bus bandwidth inside a node, 25 GB/s per GPU between nodes" in out
    # A slower network between the nodes predicts fewer tokens/s for the same layout.
    assert main([*args[:-1], "5"]) == 0
    slow = capsys.readouterr().out
    assert _predicted(slow) < _predicted(out)


def test_the_prediction_names_the_gpu_and_an_h100_predicts_less_than_an_h200(capsys):
    # Same peak FLOP/s, 30% less memory bandwidth: the streaming kernels (norms, optimizer) take longer.
    args = ["--config", "debug", "--ngpu", "2"]
    assert main([*args, "--gpu", "h100"]) == 0
    h100 = capsys.readouterr().out
    assert main([*args, "--gpu", "h200"]) == 0
    h200 = capsys.readouterr().out
    assert "on 2 H100 GPUs in one node" in h100 and "on 2 H200 GPUs in one node" in h200
    assert _predicted(h100) < _predicted(h200)


def test_a_named_gpu_sets_the_verdicts_memory_unless_one_is_given(capsys):
    args = ["--config", "debug", "--ngpu", "1"]
    for gpu, memory in (("h200", "139.8 GiB"), ("h100", "79.1 GiB")):
        assert main([*args, "--gpu", gpu]) == 0
        assert f"of {memory}" in capsys.readouterr().out
    assert main([*args, "--gpu", "h200", "--gpu-memory-gib", "40"]) == 0
    assert "of 40 GiB" in capsys.readouterr().out


def test_gpu_kinds_are_read_from_cuda_device_names_and_unknown_ones_are_refused():
    from kenotron.planner.hardware import for_gpu, gpu_kind

    assert gpu_kind("NVIDIA H100 80GB HBM3") == "h100"
    assert gpu_kind("NVIDIA H200") == "h200"
    assert gpu_kind("NVIDIA A100-SXM4-80GB") is None
    assert for_gpu("h100").memory_bytes_per_s == pytest.approx(for_gpu("h200").memory_bytes_per_s * 3.35 / 4.8)
    with pytest.raises(ValueError, match="unknown GPU kind 'a100'; use one of h100, h200"):
        for_gpu("a100")


@pytest.mark.parametrize("flag", ["--gpus-per-node", "--node-gb-s", "--network-gb-s"])
def test_a_network_figure_that_is_not_positive_stops_in_one_line(flag, capsys):
    assert main(["--config", "debug", "--ngpu", "2", flag, "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kenotron: {flag} 0{'' if flag == '--gpus-per-node' else '.0'} must be > 0"]


def test_a_document_length_below_one_token_stops_in_one_line(capsys):
    assert main(["--config", "debug", "--ngpu", "2", "--document-tokens", "0.5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["kenotron: --document-tokens 0.5 is not a mean document length; use a value >= 1 (tokens)"]
