"""docs/multi-node.md's rehearsal: two "nodes" on one machine, each `./run_train.sh` with NNODES=2
and the same RDZV_ENDPOINT, train one tiny run together (torchrun's c10d rendezvous)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.ahead import Lane

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--model.n_layers", "2", "--training.seq_len", "16", "--training.local_batch_size", "2",
        "--training.steps", "3", "--metrics.log_freq", "1", "--metrics.tensorboard", "false"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(tmp_path: Path, lane: Lane) -> tuple[Path, list[int], list[str]]:
    """Both "nodes" side by side into `tmp_path`/run: seconds of start and rendezvous, run ahead of
    the test (tests/ahead.py). Returns the run folder, the nodes' exit codes and outputs."""
    env = dict(os.environ, NNODES="2", NPROC="1", RDZV_ENDPOINT=f"127.0.0.1:{_free_port()}",
               RDZV_ID="rehearsal", OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    command = [ROOT / "run_train.sh", *TINY, "--job.dump_folder", tmp_path / "run"]
    nodes = [lane.start(command, cwd=ROOT, env=env, stderr=subprocess.STDOUT) for _ in range(2)]
    try:
        outputs = [lane.wait(node, timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    return tmp_path / "run", [node.returncode for node in nodes], outputs


@pytest.mark.run_ahead(job=two_nodes)
def test_two_nodes_on_one_machine_train_one_run_together(ran_ahead):
    run, codes, outputs = ran_ahead
    assert codes == [0, 0], "\n".join(outputs)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3]
    assert "ParallelDims(world 2" in "".join(outputs)  # one job of two ranks, one per "node"
