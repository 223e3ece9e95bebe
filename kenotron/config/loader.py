"""Build a JobConfig from a TOML file and `--section.key value` overrides.

Everything here runs before any process group exists, so a bad config stops the job with
one message that names the key, the bad value and the fix.
"""

from __future__ import annotations

import dataclasses
import difflib
import tomllib
import typing
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kenotron.config.presets import resolve_config_path
from kenotron.config.ranges import field_range, range_problem
from kenotron.config.schema import FieldInfo, all_fields, open_field, section_classes
from kenotron.config.sections import JobConfig
from kenotron.errors import ConfigError


def _suggest(word: str, candidates: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.5)
    return f"; did you mean '{close[0]}'?" if close else ""


MOVED_KEYS = {
    "moe.n_experts": "model.moe.n_experts",
    "moe.top_k": "model.moe.top_k",
}
"""Keys that left the public config: {old key: the key that replaces it}."""


def _unknown_key(key: str) -> ConfigError:
    if key in MOVED_KEYS:
        new = MOVED_KEYS[key]
        return ConfigError(f"{key} moved to {new} (the model's shape is set in one place, under [model]): use "
                           f"--{new} N, or {new.removeprefix('model.')} = N under [model]")
    fields = all_fields(JobConfig)
    section = key.split(".", 1)[0]
    if "." not in key or section not in section_classes(JobConfig):
        # A bare name is a section ([trainig] in a TOML file) more often than a key: sections first.
        hint = _suggest(section, list(section_classes(JobConfig))) or _suggest(key, list(fields))
        what = "section" if "." not in key else "key"
        return ConfigError(f"unknown config {what} '{key}'{hint} (see --help for every key)")
    return ConfigError(f"unknown config key '{key}'{_suggest(key, list(fields))} (see --help for every key)")


def _convert(info: FieldInfo, value: Any, *, from_cli: bool) -> Any:
    """Check or parse `value` against the field's type and range; CLI values arrive as strings."""
    converted = _convert_type(info, value, from_cli=from_cli)
    if isinstance(converted, (int, float)) and (problem := range_problem(info.key, converted, info.range, info.default)):
        raise ConfigError(problem)
    return converted


def _convert_type(info: FieldInfo, value: Any, *, from_cli: bool) -> Any:
    """Check or parse `value` against the field's type; CLI values arrive as strings."""
    typ = info.type
    choices = info.choices
    if choices is not None:
        if value not in choices:
            valid = ", ".join(repr(c) for c in choices)
            raise ConfigError(f"{info.key}={value!r} is not one of {valid}{_suggest(str(value), [str(c) for c in choices])}")
        return value
    origin = typing.get_origin(typ)
    if origin is list and dataclasses.is_dataclass(typing.get_args(typ)[0]):
        (inner,) = typing.get_args(typ)
        items = _inline_toml(info, value) if from_cli and isinstance(value, str) else value
        if not isinstance(items, list):
            raise ConfigError(f"{info.key} expects a list of tables ([[{info.key}]] in TOML), got {value!r}")
        return [_table(info, inner, i, item) for i, item in enumerate(items)]
    if origin is dict:
        _, inner = typing.get_args(typ)
        table = _inline_toml(info, value) if from_cli and isinstance(value, str) else value
        if not isinstance(table, dict):
            raise ConfigError(f"{info.key} expects a table such as {{a = 1.0, b = 2.0}}, got {value!r}")
        sub = FieldInfo(info.section, info.name, inner, None, None, range=info.range)
        return {str(k): _convert(replace(sub, name=f"{info.name}.{k}"), v, from_cli=False) for k, v in table.items()}
    if origin is tuple:  # args fields such as tuple[int, ...] (a hybrid's layers) or tuple[float, float]
        if not isinstance(value, list):
            raise ConfigError(f"{info.key} expects a list such as [1, 2], got {value!r}")
        types_ = typing.get_args(typ)
        if len(types_) == 2 and types_[1] is Ellipsis:
            types_ = (types_[0],) * len(value)
        elif len(types_) != len(value):
            raise ConfigError(f"{info.key} expects a list of {len(types_)} values, got {value!r}")
        return tuple(_convert(FieldInfo(info.section, info.name, t, None, None), v, from_cli=False)
                     for t, v in zip(types_, value, strict=True))
    if origin is list:
        (inner,) = typing.get_args(typ)
        if from_cli and isinstance(value, str):
            text = value.strip().removeprefix("[").removesuffix("]")
            items = [v.strip().strip("'\"") for v in text.split(",") if v.strip()]
        elif isinstance(value, list):
            items = value
        else:
            raise ConfigError(f"{info.key} expects a list of {inner.__name__}, got {value!r}")
        sub = FieldInfo(info.section, info.name, inner, None, None, range=info.range)
        return [_convert(sub, v, from_cli=from_cli) for v in items]
    if typ is bool:
        if isinstance(value, bool):
            return value
        if from_cli and isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{info.key} expects true or false, got {value!r}")
    if typ is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if from_cli and isinstance(value, str):
            try:
                return int(value.replace("_", ""))
            except ValueError:
                pass
        raise ConfigError(f"{info.key} expects an integer, got {value!r}")
    if typ is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if from_cli and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{info.key} expects a number, got {value!r}")
    if typ is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{info.key} expects a string, got {value!r} (quote it in TOML)")
    raise TypeError(f"config field {info.key} has an unsupported type {typ!r}")


def convert_value(key: str, typ: Any, value: Any) -> Any:
    """Check a TOML-typed `value` against `typ` (bool, int, float, str, a Literal or a list of
    them) as the config's own fields are checked; errors name `key` ("model.dim")."""
    section, _, name = key.partition(".")
    return _convert(FieldInfo(section, name, typ, None, None), value, from_cli=False)


def _cli_value(text: str) -> Any:
    """A command-line value for a catch-all key, read as a TOML value (512, 1e-5, true,
    {factor = 8.0}); anything else stays a string (none, debug)."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def _merged(table: dict[str, Any], path: list[str], value: Any) -> dict[str, Any]:
    """`table` with `value` set at the dotted `path`, nested tables merged rather than replaced."""
    out = dict(table)
    head, rest = path[0], path[1:]
    if rest:
        inner = out.get(head)
        out[head] = _merged(inner if isinstance(inner, dict) else {}, rest, value)
    elif isinstance(value, dict) and isinstance(out.get(head), dict):
        for k, v in value.items():
            out[head] = _merged(out[head], [k], v)
    else:
        out[head] = value
    return out


def _open_key(key: str) -> FieldInfo | None:
    """The catch-all field that takes `key` ("model.dim"), or None when no section collects it."""
    section = key.split(".", 1)[0]
    return open_field(JobConfig, section) if "." in key else None


def _inline_toml(info: FieldInfo, text: str) -> Any:
    """A command-line value written as a TOML inline value: `[{a = 1}, {a = 2}]`, `{x = 0.5}`."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--{info.key} expects a TOML inline value such as [{{name = \"a\"}}], got {text!r} ({e})") from None


def _table(info: FieldInfo, cls: type, index: int, item: Any) -> Any:
    """One `[[section.key]]` table as its dataclass, each value checked like a top-level field."""
    where = f"{info.key}[{index}]"
    if not isinstance(item, dict):
        raise ConfigError(f"{where} must be a table of key = value pairs, got {item!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    values = {}
    for key, value in item.items():
        if key not in names:
            raise ConfigError(f"unknown key '{key}' in {where}{_suggest(key, names)} (keys: {', '.join(names)})")
        sub = FieldInfo(info.section, f"{info.name}[{index}].{key}", hints[key], None, None, range=field_range(cls, key))
        values[key] = _convert(sub, value, from_cli=False)
    return cls(**values)


def split_config_arg(argv: Sequence[str]) -> tuple[str | None, list[str]]:
    """Take `--config X` / `--config=X` out of argv: (X, a path or a preset name, or None; the other arguments)."""
    path, rest, i = None, [], 0
    while i < len(argv):
        if argv[i] == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a TOML file's path or a preset name (--config debug)")
            path, i = argv[i + 1], i + 2
            continue
        if argv[i].startswith("--config="):
            path = argv[i].split("=", 1)[1]
        else:
            rest.append(argv[i])
        i += 1
    return path, rest


def parse_overrides(args: Sequence[str]) -> dict[str, str]:
    """`["--training.steps", "20", "--metrics.tensorboard"]` -> {"training.steps": "20", ...}.

    Accepts `--key value` and `--key=value`; a boolean key given alone means true.
    """
    fields = all_fields(JobConfig)
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        if not arg.startswith("--"):
            raise ConfigError(f"unexpected argument {arg!r}; overrides look like --section.key value")
        key, eq, value = arg[2:].partition("=")
        if key not in fields and _open_key(key) is None:
            raise _unknown_key(key)
        if not eq:
            nxt = args[i + 1] if i + 1 < len(args) else None
            if key in fields and fields[key].type is bool and (nxt is None or nxt.startswith("--")):
                value = "true"
            elif nxt is None:
                raise ConfigError(f"--{key} needs a value")
            else:
                value = nxt
                i += 1
        out[key] = value
        i += 1
    return out


def _apply(cfg: JobConfig, key: str, value: Any, *, from_cli: bool) -> JobConfig:
    fields = all_fields(JobConfig)
    if key not in fields:
        catch_all = _open_key(key)
        if catch_all is None:
            raise _unknown_key(key)
        # Kept as written (TOML types); whoever owns the catch-all checks the names and types.
        table = getattr(getattr(cfg, catch_all.section), catch_all.name)
        raw = _cli_value(value) if from_cli and isinstance(value, str) else value
        section = replace(getattr(cfg, catch_all.section),
                          **{catch_all.name: _merged(table, key.split(".")[1:], raw)})
        return replace(cfg, **{catch_all.section: section})
    info = fields[key]
    converted = _convert(info, value, from_cli=from_cli)
    section = replace(getattr(cfg, info.section), **{info.name: converted})
    return replace(cfg, **{info.section: section})


def config_from_dict(data: dict[str, Any], cfg: JobConfig | None = None) -> JobConfig:
    """Apply a TOML-shaped dict ({section: {key: value}}) on top of `cfg` (default: defaults)."""
    cfg = cfg if cfg is not None else JobConfig()
    for section, values in data.items():
        if section not in section_classes(JobConfig):
            raise _unknown_key(section)
        if not isinstance(values, dict):
            raise ConfigError(f"[{section}] must be a table of key = value lines, got {values!r}")
        for key, value in values.items():
            cfg = _apply(cfg, f"{section}.{key}", value, from_cli=False)
    return cfg


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> JobConfig:
    """Defaults <- TOML file <- command-line overrides, each value type-checked. `path` is a
    TOML file or a shipped preset's name (`"debug"`, `"llama3_8b"`: kenotron/presets/)."""
    cfg = JobConfig()
    if path:
        p = resolve_config_path(path)
        try:
            data = tomllib.loads(p.read_text())
        except tomllib.TOMLDecodeError as e:
            raise ConfigError(f"config file {str(p)!r} is not valid TOML: {e}") from None
        cfg = config_from_dict(data, cfg)
    parsed = parse_overrides(list(overrides))
    described = _data_choice(cfg)
    for key, value in parsed.items():
        cfg = _apply(cfg, key, value, from_cli=True)
    if described != _data_choice(cfg) and "job.description" not in parsed:
        cfg.job.description = ""  # it described the file's data, which the command line replaced
    return cfg


DATA_CHOICE_KEYS = ("dataset", "path", "sources", "stages", "weights_from", "loader")
"""The `[data]` fields that say which data a run trains on: a command line that changes one of
them drops the file's job.description (it would describe other data in the start banner)."""


def _data_choice(cfg: JobConfig) -> tuple[Any, ...]:
    return tuple(repr(getattr(cfg.data, name)) for name in DATA_CHOICE_KEYS)


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        escaped = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        return f'"{escaped}"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_toml_key(str(k))} = {toml_value(v)}" for k, v in value.items()) + "}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return toml_value({f.name: getattr(value, f.name) for f in dataclasses.fields(value)})
    raise TypeError(f"cannot write {value!r} as TOML")


def _toml_key(key: str) -> str:
    return key if key.replace("_", "").replace("-", "").isalnum() else toml_value(key)


def config_to_toml(cfg: JobConfig) -> str:
    """The resolved config as TOML, readable back by load_config."""
    lines: list[str] = []
    for section in section_classes(JobConfig):
        lines.append(f"[{section}]")
        obj = getattr(cfg, section)
        for info in all_fields(JobConfig).values():
            if info.section == section and info.open:
                lines += [f"{_toml_key(k)} = {toml_value(v)}" for k, v in getattr(obj, info.name).items()]
            elif info.section == section:
                lines.append(f"{info.name} = {toml_value(getattr(obj, info.name))}")
        lines.append("")
    return "\n".join(lines)


def config_reference_markdown() -> str:
    """docs/config_reference.md: one table per section (key, type, default, meaning)."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the section dataclasses in `kenotron/config/` (sections.py gathers them) by",
        "`python scripts/gen_config_reference.py`; a test fails when this file is stale.",
        "Set a value in a TOML file (`[section]` then `key = value`) or on the command line",
        "(`--section.key value`); the command line wins. A number must lie in the range beside its",
        "type (and a float be finite); any other value stops the job, before it starts, with one line.",
    ]
    section = None
    for info in all_fields(JobConfig).values():
        if info.section != section:
            section = info.section
            out += ["", f"## [{section}]", "", "| key | type | default | meaning |", "|---|---|---|---|"]
        doc = info.doc.replace("|", "\\|")
        kind = info.type_name().replace("|", "\\|") + (f", {info.range.short()}" if info.range else "")
        out.append(f"| `{info.key}` | {kind} | `{toml_value(info.default)}` | {doc} |")
    return "\n".join(out) + "\n"

