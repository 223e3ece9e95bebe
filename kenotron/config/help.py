"""`--help` of the trainer: every config key by section, the loaded config's value beside the
default, each doc wrapped to the terminal.

    python -m kenotron.train --help                       # the defaults
    python -m kenotron.train --config X.toml --help       # X's values, "(default ...)" where they differ
    python -m kenotron.train --help training              # one section
"""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Sequence

from kenotron.config.loader import (
    ConfigError,
    load_config,
    split_config_arg,
    toml_value,
)
from kenotron.config.schema import all_fields, section_classes
from kenotron.config.sections import JobConfig

USAGE = "[--config PRESET|FILE.toml] [--section.key value ...]"


def terminal_width(default: int = 100) -> int:
    """Columns to wrap to: the terminal's (at most 120), else `default` (e.g. output to a file)."""
    return max(60, min(shutil.get_terminal_size((default, 24)).columns, 120))


def config_help(cfg: JobConfig | None = None, *, prog: str = "python -m kenotron.train", source: str = "",
                sections: Sequence[str] = (), width: int | None = None) -> str:
    """The help text: `cfg`'s values (default: the defaults), grouped by section, wrapped to `width`."""
    width = width or terminal_width()
    cfg = cfg if cfg is not None else JobConfig()
    origin = f"the TOML file ({source})" if source else "the TOML file (--config)"
    intro = (f"Values come from the defaults, then {origin}, then `--section.key value` on the command line. "
             f"Each key shows its value here, with the default beside it where they differ. "
             f"`--help SECTION` shows one section; `--list-models` the model families.")
    usage = textwrap.wrap(f"usage: {prog} {USAGE}", width, subsequent_indent=" " * (len(prog) + 8),
                          break_on_hyphens=False)
    out = [*usage, "", *textwrap.wrap(intro, width), ""]
    doc_indent = " " * 6
    current = None
    for info in all_fields(JobConfig).values():
        if sections and info.section not in sections:
            continue
        if info.section != current:
            current = info.section
            out += ["", f"[{current}]"] if out[-1] else [f"[{current}]"]
        value = getattr(getattr(cfg, info.section), info.name)
        shown = toml_value(value)
        default = "" if value == info.default else f"   (default {toml_value(info.default)})"
        out.append(f"  --{info.key} {shown}{default}")
        kinds = f"one of {info.type_name()}" if info.choices else info.type_name()
        doc = f"{info.doc} [{kinds}]" if info.doc else f"[{kinds}]"
        out += textwrap.wrap(doc, width, initial_indent=doc_indent, subsequent_indent=doc_indent,
                             break_on_hyphens=False, break_long_words=False)
    return "\n".join(out)


def help_for_argv(argv: Sequence[str], *, prog: str = "python -m kenotron.train") -> str:
    """--help for a command line: loads its --config and overrides (a bad one raises ConfigError);
    bare words name the sections to show."""
    words = [a for a in argv if not a.startswith("-") and a in section_classes(JobConfig)]
    rest = [a for a in argv if a not in words]
    path, overrides = split_config_arg(list(rest))
    unknown = [w for w in words if w not in section_classes(JobConfig)]
    if unknown:
        raise ConfigError(f"--help {unknown[0]}: no such section; sections: {', '.join(section_classes(JobConfig))}")
    cfg = load_config(path, overrides)
    return config_help(cfg, prog=prog, source=path or "", sections=words)
