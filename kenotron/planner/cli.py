"""`kenotron estimate` / `python estimation.py --config X.toml --ngpu N [--section.key value ...]`.

The command prints the fake-tensor estimate (kenotron/estimate) with the planner's closed form
beside it, or with --search the planner's ranking; it lives in the planner because it uses both
and the estimator knows nothing of the planner.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

from kenotron.config import ConfigError, load_config, split_config_arg
from kenotron.estimate.memory import default_gpu_memory_gib, estimate_run
from kenotron.planner.closed_form_column import add_closed_form
from kenotron.planner.cp_scheme_choice import settle_cp_scheme
from kenotron.planner.hardware import GPU_MEMORY_GIB, HBM_BYTES_PER_S, Hardware, for_gpu, gpu_kind
from kenotron.planner.prediction import predict
from kenotron.planner.reshard_choice import settle_reshard_after_forward
from kenotron.planner.search import SEARCH_LEGEND, format_search, search_layouts
from kenotron.train.resolve import resolve_run

CONFIG_ERRORS = (ConfigError, FileNotFoundError)  # PlanError, ParallelConfigError, UnknownModelError are ConfigErrors
"""What a bad config raises; reported as the trainer reports them (`kenotron: config error: ...`)."""


def visible_gpu_kind() -> str:
    """The visible CUDA GPU's kind for the prediction (throughput model's `for_gpu`), else h200."""
    if torch.cuda.is_available():
        return gpu_kind(torch.cuda.get_device_name(0)) or "h200"
    return "h200"


def parser(prog: str = "python estimation.py") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="--search prints one row per layout.\n" + "\n".join(SEARCH_LEGEND),
        description="Per-rank GPU memory of a kenotron job, from a dry run on fake tensors and a fake process "
        "group (no GPU needed). Any other --section.key value overrides the config, as for training.",
    )
    p.add_argument("--config", metavar="PRESET|FILE.toml", help="the training config to estimate: a TOML file or a preset name (llama3_8b); "
                   "the dataclass defaults without it")
    p.add_argument("--ngpu", type=int, required=True, help="world size (number of GPUs)")
    p.add_argument("--gpu-memory-gib", type=float, default=None,
                   help="memory per GPU for the verdict (default: --gpu's, else the visible GPU's, else 80)")
    p.add_argument("--json", type=Path, default=None, help="also write the report (or the search) as JSON here")
    p.add_argument("--search", action="store_true",
                   help="search layouts, AC modes and local batch sizes that fit, ranked by modelled throughput")
    p.add_argument("--full-depth", action="store_true",
                   help="simulate every block instead of extrapolating from two shallow copies (slower)")
    p.add_argument("--document-tokens", type=float, default=None,
                   help="with data.document_masking: the packed documents' mean length in tokens (exponential "
                        "lengths), to price the attention the mask leaves (default: the packed-documents loader's "
                        "data.path, else 4096)")
    p.add_argument("--top-modules", type=int, default=8, help="modules listed by activation memory")
    p.add_argument("--top", type=int, default=10, help="--search: candidates listed")
    p.add_argument("--confirm", type=int, default=3, help="--search: best candidates re-checked on fake tensors")
    defaults = Hardware()
    p.add_argument("--gpu", choices=sorted(HBM_BYTES_PER_S), default=None,
                   help="the GPUs of the predicted tokens/s and of the verdict (their memory bandwidth and size; "
                        "default: the visible GPU's kind, else h200 for the prediction)")
    p.add_argument("--gpus-per-node", type=int, default=defaults.gpus_per_node,
                   help="GPUs joined by NVLink, for the predicted tokens/s (default %(default)s)")
    p.add_argument("--node-gb-s", type=float, default=defaults.nvlink_bytes_per_s / 1e9,
                   help="collective bus bandwidth inside a node, GB/s (scripts/bench_collectives.py measures it; "
                        "default %(default).0f)")
    p.add_argument("--network-gb-s", type=float, default=defaults.network_bytes_per_s / 1e9,
                   help="collective bus bandwidth between nodes, GB/s per GPU (400 Gb/s InfiniBand: about 45; "
                        "default %(default).0f)")
    return p


def main(argv: list[str] | None = None, prog: str = "python estimation.py") -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config_path, rest = split_config_arg(argv)
    except ConfigError as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    args, overrides = parser(prog).parse_known_args(rest)
    if args.ngpu < 1:
        print(f"kenotron: --ngpu {args.ngpu} must be >= 1", file=sys.stderr)
        return 2
    for flag, value in (("--gpus-per-node", args.gpus_per_node), ("--node-gb-s", args.node_gb_s),
                        ("--network-gb-s", args.network_gb_s)):
        if not value > 0:
            print(f"kenotron: {flag} {value} must be > 0", file=sys.stderr)
            return 2
    if args.document_tokens is not None and not args.document_tokens >= 1:
        print(f"kenotron: --document-tokens {args.document_tokens} is not a mean document length; use a value >= 1 "
              "(tokens)", file=sys.stderr)
        return 2
    hw = dataclasses.replace(for_gpu(args.gpu or visible_gpu_kind()), gpus_per_node=args.gpus_per_node,
                             nvlink_bytes_per_s=args.node_gb_s * 1e9, network_bytes_per_s=args.network_gb_s * 1e9)
    if args.gpu_memory_gib is not None:
        budget = args.gpu_memory_gib
    else:  # a named GPU's memory, else the visible one's
        budget = GPU_MEMORY_GIB[args.gpu] if args.gpu else default_gpu_memory_gib()
    try:
        cfg = load_config(config_path, overrides)
        if args.search:
            result = search_layouts(cfg, args.ngpu, budget, top=args.top, confirm=args.confirm, hw=hw,
                                    document_tokens=args.document_tokens)
            print(format_search(result))
            payload = result.to_dict()
        else:
            run = resolve_run(cfg, args.ngpu, check_data=False)
            # As the trainer settles them on such a GPU: the CP scheme first, whose memory the reshard prices.
            scheme = settle_cp_scheme(run, budget)
            reshard = settle_reshard_after_forward(run, budget)
            report = add_closed_form(estimate_run(run, budget, args.full_depth), run)
            print(report.format(top_modules=args.top_modules))
            if run.dims.cp > 1:
                print(scheme)
            print(reshard)
            print(predict(run, hw, args.document_tokens))
            payload = report.to_dict()
    except CONFIG_ERRORS as e:
        print(f"kenotron: config error: {e}", file=sys.stderr)
        return 2
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    return 0
