"""DoReMi's config checks (train/doremi.py): everything a proxy run needs that no process group
does, run by resolve_run when doremi.reference is set."""

from __future__ import annotations

import json
import math
from typing import Any

from kenotron.checkpoint.folders import check_checkpoint
from kenotron.checkpoint.model_info import describe_model
from kenotron.config import ConfigError, JobConfig
from kenotron.data.build import data_stages, source_specs


def check_doremi(cfg: JobConfig, spec: Any, args: Any) -> None:
    """Every DoReMi check that needs no process group (resolve_run calls it when doremi.reference
    is set): ConfigError naming the fix."""
    d, p = cfg.doremi, cfg.parallelism
    if not math.isfinite(d.step_size) or d.step_size <= 0:
        raise ConfigError(f"doremi.step_size={d.step_size} must be > 0 (Xie et al. use 1)")
    if not 0 <= d.smoothing <= 1:
        raise ConfigError(f"doremi.smoothing={d.smoothing} must lie in [0, 1] (Xie et al. use 1e-3)")
    if cfg.data.loader:
        raise ConfigError("doremi.reference trains a proxy on kenotron's blend of data.sources, which a custom "
                          "data.loader replaces; drop data.loader")
    if len(cfg.data.sources) < 2:
        raise ConfigError("doremi.reference learns the weights of several domains, but the data has one source; "
                          "list the domains as [[data.sources]] tables")
    stages = data_stages(cfg, source_specs(cfg))
    if len(stages) > 1 or len(set(stages[0].weights)) > 1 or cfg.data.weights_from:
        raise ConfigError("a DoReMi proxy samples every domain equally (Xie et al., Algorithm 1): give the "
                          "data.sources equal weights (the default), no data.stages and no data.weights_from; the "
                          "reference run is the one trained on the given weights")
    for name, degree in (("tp", p.tp), ("pp", p.pp), ("cp", p.cp)):
        if degree > 1:
            raise ConfigError(f"a DoReMi proxy runs with data parallelism only (parallelism.{name}={degree}); "
                              f"set parallelism.{name}=1: the proxy is a small model")
    if cfg.tuning.loss == "fused":
        raise ConfigError("tuning.loss='fused' does not combine with DoReMi (it needs per-token losses); use "
                          "'auto' or 'plain'")
    try:
        marker, _ = check_checkpoint(d.reference, verify_checksums=False)
    except Exception as err:  # noqa: BLE001 - a missing, incomplete or foreign folder: one line
        raise ConfigError(f"doremi.reference={d.reference!r} is not a loadable checkpoint ({err}); give a step "
                          "folder of the reference run, e.g. outputs/reference/checkpoints/step-000200") from None
    saved = marker.get("model")
    mine = json.loads(json.dumps(describe_model(spec, args, cfg.model.flavor)))  # as the marker stores it
    if saved is not None and (saved.get("name"), saved.get("hf_config")) != (mine["name"], mine.get("hf_config")):
        raise ConfigError(f"doremi.reference={d.reference!r} holds a model of another shape than this proxy "
                          f"({saved.get('name')} {saved.get('flavor')}); train the reference with this run's "
                          "[model] settings (the proxy has the reference's shape)")
