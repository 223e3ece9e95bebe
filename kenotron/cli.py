"""`kenotron COMMAND ...`: the console entry point pip installs.

    kenotron train    [--nproc N] [--config NAME|X.toml] [--section.key value ...]   # ./run_train.sh
    kenotron estimate --config NAME|X.toml --ngpu 64 [--search]                    # python estimation.py
    kenotron generate --run outputs/debug --prompt "def fib(n):"
    kenotron convert  to-hf outputs/debug hf_out
    kenotron report   outputs/run_a outputs/run_b --out plots/
    kenotron compare  outputs/run_a outputs/run_b --rtol 0.01 --assert
    kenotron preprocess --dataset jsonl --path raw/ --output tokenized/      # python scripts/preprocess.py

`kenotron COMMAND --help` explains each; `kenotron --version` prints the release. `--config`
takes a shipped preset's name (`debug`, `llama3_8b`: kenotron/presets/) or a TOML file's path.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from kenotron import __version__
from kenotron.config import ConfigError
from kenotron.config.help import help_for_argv
from kenotron.config.presets import preset_names
from kenotron.runtime.library_output import library_output_to

COMMANDS = {
    "train": "train a model (torchrun on this node; ./run_train.sh is the shortcut)",
    "estimate": "per-rank memory of a job from a dry run on fake tensors (no GPU needed)",
    "generate": "generate text from a run, a checkpoint or a Hugging Face folder",
    "convert": "convert between kenotron checkpoints and Hugging Face folders",
    "report": "PNG plots of one or more runs' metrics (loss, lr, grad norm, tokens/s, MFU, memory)",
    "compare": "compare two runs' losses step by step within a tolerance",
    "preprocess": "tokenize text once into token files (datatrove's format) that training reads",
}


def launcher_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kenotron train", add_help=False,
                                description="Train with torchrun on this node; other arguments go to the trainer.")
    p.add_argument("--nproc", type=int, default=None, help="processes on this node (default: one per GPU, 1 on CPU)")
    p.add_argument("--nnodes", type=int, default=1, help="nodes in the job (default 1)")
    p.add_argument("--rdzv-endpoint", default="", help="host:port of node 0 (several nodes)")
    p.add_argument("--rdzv-id", default="kenotron", help="job id shared by the nodes (several nodes)")
    p.add_argument("--log-ranks", default="0", help="local ranks shown on the console, e.g. 0,1 (default 0)")
    return p


def train(argv: list[str]) -> int:
    parser = launcher_parser()
    args, rest = parser.parse_known_args(argv)
    if "-h" in rest or "--help" in rest:  # answered here: the launcher's import costs the model registry's
        print(parser.format_help())
        try:
            print(help_for_argv([a for a in rest if a not in ("-h", "--help")], prog="kenotron train"))
        except ConfigError as e:
            print(f"kenotron: config error: {e}", file=sys.stderr)
            return 2
        return 0
    from kenotron.launch.launcher import launch

    return launch(rest, nproc=args.nproc, nnodes=args.nnodes, rdzv_endpoint=args.rdzv_endpoint,
                  rdzv_id=args.rdzv_id, log_ranks=args.log_ranks)


def _estimate(argv: list[str]) -> int:
    from kenotron.planner.cli import main

    with library_output_to(None):  # torch's own warnings stay off the console (no run to log them to)
        return main(argv, prog="kenotron estimate")


def _generate(argv: list[str]) -> int:
    from kenotron.generate.cli import run

    with library_output_to(None):
        return run(argv, prog="kenotron generate")


def _convert(argv: list[str]) -> int:
    from kenotron.checkpoint.convert_cli import main

    with library_output_to(None):
        return main(argv, prog="kenotron convert")


def _report(argv: list[str]) -> int:
    from kenotron.runs.cli import report_main

    return report_main(argv, prog="kenotron report")


def _compare(argv: list[str]) -> int:
    from kenotron.runs.cli import compare_main

    return compare_main(argv, prog="kenotron compare")


def _preprocess(argv: list[str]) -> int:
    from kenotron.data.preprocess_cli import main

    return main(argv, prog="kenotron preprocess")


RUNNERS: dict[str, Callable[[list[str]], int]] = {
    "train": train, "estimate": _estimate, "generate": _generate, "convert": _convert, "report": _report,
    "compare": _compare, "preprocess": _preprocess,
}


def usage() -> str:
    lines = ["usage: kenotron COMMAND [options]   (kenotron --version: the release)", "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in COMMANDS.items()]
    lines += ["", "`kenotron COMMAND --help` explains each. --config takes a TOML file or a preset's name:",
              "  " + ", ".join(preset_names())]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        code = _dispatch(argv)
        sys.stdout.flush()  # a reader gone away shows here, inside the handler, not at the interpreter's exit
        return code
    except BrokenPipeError:
        # `kenotron ... | head`: the reader closed the pipe, which ends the output without a
        # traceback; stdout goes to /dev/null so that the interpreter's last flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _dispatch(argv: list[str] | None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        print(f"kenotron {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command not in RUNNERS:
        import difflib

        close = difflib.get_close_matches(command, list(RUNNERS), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        print(f"kenotron: unknown command {command!r}{hint} (commands: {', '.join(RUNNERS)})", file=sys.stderr)
        return 2
    return RUNNERS[command](rest)


if __name__ == "__main__":
    sys.exit(main())
