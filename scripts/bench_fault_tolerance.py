"""Fault tolerance on two GPUs (issue 38): its overhead without failures, and how fast a killed
group rejoins.

    python scripts/bench_fault_tolerance.py --config llama3_1b --out /tmp/ft_bench

Phases (`--only overhead` runs 1 and 2, `--only kill` runs 3):

1. baseline: plain data parallel over both GPUs (`parallelism.dp_replicate 2`: DDP), global batch
   2 x training.local_batch_size;
2. fault tolerance without failures: a lighthouse (served by group 0's launcher) and two replica
   groups of one GPU each, the same global batch; overhead = 1 - (the groups' mean tok/s, each
   group's one GPU) / (the baseline's tok/s per GPU), medians over the records after the first
   `--skip` (compilation);
3. a kill: the same two groups for longer; once group 1 has logged step `--kill-at`, its rank is
   killed with SIGKILL (its launcher's torchrun restarts it); the time from the kill to the
   restarted rank's "took the live state of a peer" line, and to its first step after it; and
   `rejoin_breakdown`: the seconds of each phase of the rejoin, read from the timeline lines both
   groups log (kenotron/fault_tolerance/rejoin_timeline.py): the restarted rank's process start
   (torchrun's restart), imports, model built, torchft's manager, its first quorum asked and
   granted, the live state received (bytes, seconds) and loaded, its first step; the survivor's
   failed step (the error, how long its all-reduce waited), its next quorum, the state it sent.

Prints one JSON line with the figures; every run's output stays under --out.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # this clone's kenotron, for the timeline's reader (no torch at import)

from kenotron.fault_tolerance.rejoin_timeline import parse_marks, rejoin_breakdown

GPUS = (os.environ.get("CUDA_VISIBLE_DEVICES") or "0,1").split(",")[:2]
"""The two GPUs of the runs: the first two the caller made visible (0 and 1 by default), so that
the bench can share a host with other work."""

STARTED: list[subprocess.Popen] = []
"""Every launcher this script started: stopped with their ranks when it ends, however it ends."""


def train(args: list[str], gpus: str, log: Path) -> subprocess.Popen:
    # This clone first, then the caller's path (where torchft may be installed, e.g. pip --target).
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpus, "PYTHONPATH": path}
    proc = subprocess.Popen([sys.executable, "-m", "kenotron.cli", "train", *args], cwd=REPO, env=env,
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    STARTED.append(proc)
    return proc


def stop_all() -> None:
    """SIGKILL every launcher still running and every process below it (torchrun may give each
    rank a session of its own, so the launcher's session does not hold them all)."""
    for proc in STARTED:
        if proc.poll() is None:
            below, todo = [], [proc.pid]
            while todo:
                found = children(todo.pop())
                below += found
                todo += found
            for pid in [proc.pid, *below]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait()


def timed_records(folder: Path, skip: int) -> list[dict]:
    """One run's step records after the first `skip` (compilation)."""
    records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    return [r for r in records if "loss" in r][skip:]


def tok_per_s(folder: Path, skip: int) -> float:
    return statistics.median(r["tokens_per_sec"] for r in timed_records(folder, skip))


def quorum_figures(folder: Path, skip: int) -> dict[str, float]:
    """What the groups' records say of their quorums (each group's timed records): the fewest
    groups a step was averaged over (2 unless a group fell out) and the median seconds a quorum took."""
    timed = [r for i in range(2) for r in timed_records(folder / f"replica_{i}", skip)]
    return {"ft_replicas_min": min(r["ft_replicas"] for r in timed),
            "ft_quorum_s_median": round(statistics.median(r["ft_quorum_s"] for r in timed), 4)}


def wait_for(path: Path, pattern: str, timeout: float) -> float:
    """time.time() once `pattern` (a regex) appears in the file `path`."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.exists() and re.search(pattern, path.read_text(errors="replace")):
            return time.time()
        time.sleep(0.05)
    raise SystemExit(f"no {pattern!r} in {path} within {timeout} s")


def children(pid: int) -> list[int]:
    """The processes whose parent is `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
            except (OSError, ValueError, IndexError):
                continue
    return found


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default="llama3_1b")
    p.add_argument("--out", type=Path, default=Path("/tmp/kenotron_ft_bench"))
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip", type=int, default=3, help="records left out of the medians (compilation)")
    p.add_argument("--kill-at", type=int, default=20)
    p.add_argument("--after-kill", type=int, default=80,
                   help="steps the kill run goes on after --kill-at: group 0 must outlast group 1's restart")
    p.add_argument("--port", type=int, default=0, help="the lighthouse's port (0: a free one)")
    p.add_argument("--only", choices=["all", "overhead", "kill"], default="all",
                   help="overhead: phases 1 and 2; kill: phase 3 (each fits a 10-minute slot on its own)")
    p.add_argument("overrides", nargs="*", help="more --section.key value for every run (after --)")
    args = p.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    common = ["--config", args.config, "--metrics.log_freq", "1", "--checkpoint.enable", "false", *args.overrides]

    def groups(name: str, steps: int) -> list[subprocess.Popen]:
        ft = ["--nproc", "1", *common, "--training.steps", str(steps), "--fault_tolerance.enable", "true",
              "--fault_tolerance.replica_groups", "2", "--job.dump_folder", str(out / name)]
        first = train([*ft, "--fault_tolerance.replica_id", "0", "--fault_tolerance.lighthouse", "start",
                       "--fault_tolerance.lighthouse_port", str(args.port)], GPUS[0], out / f"{name}_0.log")
        wait_for(out / f"{name}_0.log", r"lighthouse at \S+:", 300)
        address = re.search(r"lighthouse at (\S+):", (out / f"{name}_0.log").read_text()).group(1)
        second = train([*ft, "--fault_tolerance.replica_id", "1", "--fault_tolerance.lighthouse", address],
                       GPUS[1], out / f"{name}_1.log")
        return [first, second]

    figures: dict[str, object] = {}
    if args.only in ("all", "overhead"):
        ddp = train(["--nproc", "2", *common, "--training.steps", str(args.steps), "--parallelism.dp_replicate",
                     "2", "--job.dump_folder", str(out / "ddp")], ",".join(GPUS), out / "ddp.log")
        if ddp.wait() != 0:
            raise SystemExit(f"the baseline failed: {out / 'ddp.log'}")
        runs = groups("ft", args.steps)
        if [r.wait() for r in runs] != [0, 0]:
            raise SystemExit(f"the fault-tolerant run failed: {out}/ft_*.log")
        # Both per GPU: the baseline's record divides its tokens by its 2 ranks; each group's
        # record is its own GPU's.
        baseline = tok_per_s(out / "ddp", args.skip)
        with_ft = statistics.mean(tok_per_s(out / "ft" / f"replica_{i}", args.skip) for i in range(2))
        figures.update(baseline_ddp_tok_s_per_gpu=round(baseline), fault_tolerant_tok_s_per_gpu=round(with_ft),
                       overhead_pct=round(100 * (1 - with_ft / baseline), 2), **quorum_figures(out / "ft", args.skip))
    if args.only in ("all", "kill"):
        figures.update(kill_and_rejoin(args, groups))
    print(json.dumps(figures))


def kill_and_rejoin(args: argparse.Namespace, groups) -> dict[str, object]:
    """Phase 3 (module docstring): seconds from the SIGKILL to the live state, and to the first step."""
    out = args.out
    runs = groups("kill", args.kill_at + args.after_kill)
    log = out / "kill_1.log"
    wait_for(log, rf"step +{args.kill_at}/", 900)
    text_before = len(log.read_text(errors="replace"))
    ranks = children(runs[1].pid)
    killed_at = time.time()
    for pid in ranks:  # the launcher's torchrun agent runs in the launcher; the rank is its child
        os.kill(pid, signal.SIGKILL)

    def after_kill(pattern: str) -> float:
        deadline = time.time() + 900
        while time.time() < deadline:
            if re.search(pattern, log.read_text(errors="replace")[text_before:]):
                return time.time() - killed_at
            time.sleep(0.05)
        raise SystemExit(f"no {pattern!r} in {log} after the kill")

    rejoined_s = after_kill("took the live state of a peer")
    first_step_s = after_kill(r"\] step +\d+/")
    codes = [r.wait() for r in runs]
    restarted = parse_marks(log.read_text(errors="replace")[text_before:])
    survivor = parse_marks((out / "kill_0.log").read_text(errors="replace"))
    return {"killed_rank_pids": ranks, "kill_to_live_state_s": round(rejoined_s, 1),
            "kill_to_first_step_s": round(first_step_s, 1), "exit_codes_after_kill": codes,
            "rejoin_breakdown": rejoin_breakdown(restarted, survivor, killed_at)}


if __name__ == "__main__":
    try:
        main()
    finally:
        stop_all()
