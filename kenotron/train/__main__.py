"""`python -m kenotron.train --config X.toml [--section.key value ...]` (run_train.sh calls this)."""

from __future__ import annotations

import sys

from kenotron.config import ConfigError, config_help, load_config
from kenotron.models import MODEL_SPECS, UnknownModelError
from kenotron.parallel.dims import ParallelConfigError


def split_config_arg(argv: list[str]) -> tuple[str | None, list[str]]:
    """Take `--config PATH` / `--config=PATH` out of argv."""
    path, rest, i = None, [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a TOML file path")
            path, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--config="):
            path = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return path, rest


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print(config_help())
        return 0
    if "--list-models" in argv:
        for name, spec in MODEL_SPECS.items():
            print(f"{name}: {', '.join(spec.flavors)}")
        return 0
    try:
        path, overrides = split_config_arg(argv)
        cfg = load_config(path, overrides)
        # Imported here so --help stays fast and config errors come before torch's start-up.
        from kenotron.train.guards import NonFiniteLossError
        from kenotron.train.trainer import run_training
    except (ConfigError, ParallelConfigError, UnknownModelError, FileNotFoundError) as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    try:
        run_training(cfg)
    except (ConfigError, ParallelConfigError, UnknownModelError, FileNotFoundError) as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    except NonFiniteLossError as e:
        print(f"kenotron: stopped: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
