"""What a training command answers without starting anything: --help and --list-models."""

from __future__ import annotations

import dataclasses

from kenotron.config.help import help_for_argv
from kenotron.models import MODEL_SPECS
from kenotron.models.args import SET_BY_THE_TRAINER


def wants_help(argv: list[str]) -> bool:
    return "-h" in argv or "--help" in argv


def print_help(argv: list[str], prog: str) -> None:
    """The config's keys (this --config's values, the defaults, the docs); ConfigError on a bad config."""
    print(help_for_argv([a for a in argv if a not in ("-h", "--help")], prog=prog))


def parameters_text(count: int) -> str:
    """5.2M, 1.24B, 405.85B: a parameter count as the start banner writes it."""
    return f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"


def print_model_families() -> None:
    """Each family, its flavors with their parameter counts (from the args: nothing is built),
    and the model.<field> keys it takes."""
    for name, spec in MODEL_SPECS.items():
        flavor = next(iter(spec.flavors.values()))
        # A nested table (an MoE family's moe) with its own fields: `moe.n_experts` and the like.
        fields = [f"{f.name} ({', '.join(g.name for g in dataclasses.fields(value))})"
                  if dataclasses.is_dataclass(value := getattr(flavor, f.name)) else f.name
                  for f in dataclasses.fields(flavor) if f.name not in SET_BY_THE_TRAINER]
        sizes = [f"{flavor_name} ({parameters_text(spec.count_parameters(args))})"
                 for flavor_name, args in spec.flavors.items()]
        print(f"{name}: {', '.join(sizes)}\n  model.<field>: {', '.join(fields)}")


def answer_info_flags(argv: list[str], prog: str = "python -m kenotron.train") -> bool:
    """Print --help or --list-models when asked (True), without starting anything."""
    if wants_help(argv):
        print_help(argv, prog)
        return True
    if "--list-models" in argv:
        print_model_families()
        return True
    return False
