"""`python -m kenotron.train --config X.toml [--section.key value ...]` (run_train.sh calls this)."""

from __future__ import annotations

import dataclasses
import sys

from kenotron.config import ConfigError, config_help, load_config, split_config_arg
from kenotron.models import MODEL_SPECS
from kenotron.models.args import SET_BY_THE_TRAINER


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(config_help())
        return 0
    if "--list-models" in argv:
        for name, spec in MODEL_SPECS.items():
            fields = [f.name for f in dataclasses.fields(next(iter(spec.flavors.values())))
                      if f.name not in SET_BY_THE_TRAINER]
            print(f"{name}: {', '.join(spec.flavors)}\n  model.<field>: {', '.join(fields)}")
        return 0
    try:
        path, overrides = split_config_arg(argv)
        cfg = load_config(path, overrides)
        # Imported here so --help stays fast and config errors come before torch's start-up.
        from kenotron.train.guards import NonFiniteLossError
        from kenotron.train.trainer import run_training
    except (ConfigError, FileNotFoundError) as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    from kenotron.checkpoint import CheckpointError
    from kenotron.checkpoint.diagnose import explain_os_error

    try:
        run_training(cfg)
    except (ConfigError, FileNotFoundError) as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLossError as e:
        print(f"kenotron: stopped: {e}", file=sys.stderr)
        return 1
    except CheckpointError as e:  # a damaged, foreign or mismatching checkpoint, a failed save
        print(f"kenotron: checkpoint error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # a folder that cannot be created or written, a file that cannot be read
        print(f"kenotron: error: {explain_os_error(e)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
