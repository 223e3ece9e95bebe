"""The import rules' data that tests/test_architecture.py and tests/test_lazy_imports.py check
the tree against: which third-party packages are optional, which function-level imports are kept
on purpose, and which import goes against the rooms' directions on purpose."""

from __future__ import annotations

# Third-party packages kenotron runs without (the extras of pyproject.toml, and packages read for
# one input format): a module imports them inside the function that needs them, or imports a
# kenotron module that imports one at its top (a Triton kernel).
OPTIONAL_PACKAGES = {"triton", "torchao", "flash_attn", "flash_attn_interface", "flash_attn_4", "boto3", "wandb",
                     "matplotlib", "safetensors", "tokenizers", "tiktoken", "datasets", "pyarrow", "datatrove",
                     "transformers", "torchft"}

# Function-level imports of required modules kept on purpose, as (module, imported module); each
# has its reason beside the import too. A pair that is no longer in the tree fails the test.
LAZY_ON_PURPOSE: dict[tuple[str, str], str] = {
    # torch's private CP module keeps the DTensor op handlers present at its import (torch_ring.py).
    ("kenotron.parallel.context.torch_ring", "torch.distributed.tensor.experimental._context_parallel"): "side effect",
    ("kenotron.parallel.context.torch_ring", "torch.distributed.tensor.experimental"): "side effect",
    # The Mamba kernels load only for a model with Mamba blocks (issue 34: loaded on demand).
    ("kenotron.models.common.mamba", "kenotron.kernels.mamba_mixer_op"): "on demand: Mamba kernels",
    ("kenotron.models.common.mamba", "kenotron.kernels.ssd_op"): "on demand: Mamba kernels",
    # Command dispatch: `kenotron train --help` answers without torch; each command loads its own room.
    ("kenotron.cli", "kenotron.launch.launcher"): "command dispatch",
    ("kenotron.cli", "kenotron.planner.cli"): "command dispatch",
    ("kenotron.cli", "kenotron.generate.cli"): "command dispatch",
    ("kenotron.cli", "kenotron.checkpoint.convert_cli"): "command dispatch",
    ("kenotron.cli", "kenotron.runs.cli"): "command dispatch",
    ("kenotron.cli", "kenotron.data.preprocess_cli"): "command dispatch",
    ("kenotron.cli", "difflib"): "an unknown command's suggestion only",
    # The launcher checks the config and the model's shape before it imports torch (errors first,
    # fast): the trainer's checks are imported once those passed.
    ("kenotron.launch.launcher", "kenotron.runtime.info_flags"): "on demand: --help / --list-models",
    ("kenotron.models.spec", "torch"): "the spec stays torch-free: only a family without an args count builds on meta",
    ("kenotron.launch.launcher", "kenotron.launch.run_checks"): "after the model's checks",
    # The kernel choices' checks and their Target run in the launcher before torch (issue 34).
    ("kenotron.kernel_choice.target", "torch"): "Target.planned: the estimator's process, which has torch",
    ("kenotron.kernel_choice.target", "kenotron.models.common.flash_attention"): "Target.of: a rank's device",
    ("kenotron.kernel_choice.tuning", "torch"): "a named tuning.expert_kernel='grouped_mm' only",
    ("kenotron.launch.launcher", "torch.distributed.elastic.multiprocessing.api"): "torchrun, once the config passed",
    ("kenotron.launch.launcher", "torch.distributed.elastic.multiprocessing.errors"): "torchrun, as above",
    ("kenotron.launch.launcher", "torch.distributed.run"): "torchrun, as above",
    ("kenotron.launch.launcher", "kenotron.fault_tolerance.torchft_import"): "fault_tolerance.enable, after the model's checks",
    ("kenotron.runtime.run_lock", "fcntl"): "POSIX only: the lock is taken where it exists",
    ("kenotron.runtime.watchdog", "torch.distributed"): "private distributed_c10d store, inside its guard",
    ("kenotron.train.metrics", "torch.utils.tensorboard"): "only with metrics.tensorboard (slow import)",
    # The benchmark's parent process only starts workers (bench_worker.py) and stays free of torch.
    ("kenotron.tools.bench", "torch"): "a GPU preset's device check only",
    ("kenotron.tools.bench", "kenotron.data.sample_data"): "data cases only (kenotron.data imports torch)",
    ("kenotron.train.trainer", "kenotron.planner.reshard_choice"): "against the rooms: UPWARD_ON_PURPOSE",
    ("kenotron.train.trainer", "kenotron.planner.cp_scheme_choice"): "against the rooms: UPWARD_ON_PURPOSE",
}

# Imports against the rooms' directions kept on purpose, as (module, imported module): reason. Each
# stands inside a function that runs once both rooms are loaded and is listed in LAZY_ON_PURPOSE
# too. The room graph leaves these edges out; the module graph keeps them, so a module cycle
# through one still fails (test_modules_form_no_import_cycle).
UPWARD_ON_PURPOSE: dict[tuple[str, str], str] = {
    # The loop sits above the planner, which never imports it (FORBIDDEN_MODULES): every Trainer,
    # however it is built, settles fsdp_reshard_after_forward by the same closed-form memory model.
    ("kenotron.train.trainer", "kenotron.planner.reshard_choice"): "Trainer(cfg) settles reshard by memory",
    ("kenotron.train.trainer", "kenotron.planner.cp_scheme_choice"): "Trainer(cfg) settles cp_scheme 'auto'",
}
