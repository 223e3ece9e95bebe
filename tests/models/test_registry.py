"""The model registry imports a family when its spec is asked for: a run loads its own family only."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from kenotron.models import MODEL_SPECS
from kenotron.models.registry import FAMILIES, ModelRegistry
from tests.ahead import Lane
from tests.fork_server import fork_server


def _fresh_interpreter(script: str) -> str:
    """Run `script` in a new Python (so that nothing another test imported counts: a process
    forked from one that imported torch alone, tests/fork_server.py); its stdout."""
    code, out, err = fork_server(("torch",)).run(["-c", script], timeout=300)
    assert code == 0, out + err[-3000:]
    return out


def in_a_fresh_interpreter(script: str) -> Callable[[Path, Lane], str]:
    """`script` in a new Python as a `run_ahead` job (tests/ahead.py): seconds of imports, run ahead
    of its test; gives its stdout."""
    def job(folder: Path, lane: Lane) -> str:
        return _fresh_interpreter(script)
    job.__name__ = "fresh_interpreter"
    return job


BUILDS_THE_DEBUG_JOB = """
import sys
import torch
from kenotron.config import load_config
from kenotron.kernel_choice.target import Target
from kenotron.train.job import build_job, build_meshes
from kenotron.train.resolve import resolve_run
run = resolve_run(load_config("debug", []), 1, Target.of(torch.device("cpu")))
job = build_job(run, torch.device("cpu"), build_meshes(run, "cpu"))
assert run.spec.name == "llama3", run.spec.name
print("\\n".join(sorted(m for m in sys.modules if m.startswith("kenotron."))))
"""


LISTS_AND_READS_ONE_FAMILY = """
import sys
from kenotron.models import MODEL_SPECS, get_model_spec
names = list(MODEL_SPECS)
assert "qwen3" in MODEL_SPECS and "gpt2" not in MODEL_SPECS
before = {m for m in sys.modules if m.startswith("kenotron.models.")}
spec = get_model_spec("qwen3")
after = {m for m in sys.modules if m.startswith("kenotron.models.")}
print(" ".join(names))
print(" ".join(sorted({m.split(".")[2] for m in before})))
print(" ".join(sorted({m.split(".")[2] for m in after - before})))
"""


RUNS_THE_MAMBA_OP = """
import torch
from kenotron.models import get_model_spec
from kenotron.models.common.mamba import use_scan_kernel
from kenotron.parallel.activation_checkpoint import _ops_to_save
spec = get_model_spec("mamba2")
with torch.device("meta"):
    model = spec.build(spec.model_args("debug"))
assert not hasattr(torch.ops.kenotron, "mamba_mixer")  # nothing loaded the Mamba kernels yet
use_scan_kernel(model, "triton")
print(torch.ops.kenotron.mamba_mixer.default in _ops_to_save())
"""


@pytest.mark.run_ahead(job=in_a_fresh_interpreter(BUILDS_THE_DEBUG_JOB))
def test_building_the_debug_llama3_job_imports_no_other_family_nor_the_mamba_kernels(ran_ahead):
    loaded = set(ran_ahead.split())
    families = {m.split(".")[2] for m in loaded if m.split(".")[2:3] and m.split(".")[2] in FAMILIES
                and m.startswith("kenotron.models.")}
    assert families == {"llama3"}
    kernels = {"kenotron.kernels.mamba_mixer_op", "kenotron.kernels.ssd_op", "kenotron.kernels.ssd",
               "kenotron.kernels.ssd_backward"}
    assert not loaded & kernels, sorted(loaded & kernels)


@pytest.mark.run_ahead(job=in_a_fresh_interpreter(LISTS_AND_READS_ONE_FAMILY))
def test_listing_the_families_imports_none_and_reading_one_imports_only_it(ran_ahead):
    names, before, new = (line.split() for line in ran_ahead.splitlines())
    assert names == list(FAMILIES)
    assert not set(before) & set(FAMILIES)
    assert "qwen3" in new and not set(new) & (set(FAMILIES) - {"qwen3", "llama3"})  # qwen3 reuses llama3's pieces


def test_every_registered_family_loads_under_its_own_name():
    assert [spec.name for spec in MODEL_SPECS.values()] == list(FAMILIES)


def test_a_family_registered_under_another_name_is_refused_naming_both():
    registry = ModelRegistry({"llama": FAMILIES["llama3"]})
    with pytest.raises(AssertionError, match="named 'llama3', registered as 'llama'"):
        registry["llama"]


@pytest.mark.run_ahead(job=in_a_fresh_interpreter(RUNS_THE_MAMBA_OP))
def test_the_mamba_op_is_registered_when_a_model_runs_it_so_selective_ac_keeps_its_outputs(ran_ahead):
    assert ran_ahead.strip() == "True"
