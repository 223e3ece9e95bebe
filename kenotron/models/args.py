"""A family's args from a flavor and the config's `model.<field>` values, checked.

`[model]` keys other than the section's own (name, flavor, parametrization, ...) are fields of
the family's args dataclass (`dim`, `n_heads`, `ffn_dim`, `rope_scaling.factor`, ...). They
arrive as written in TOML (the command line's are read as TOML values too) and are checked
here against the dataclass's types, so every family gets the mechanism without a config
field of its own; `check_decoder_args` then checks the shape as a whole.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

from kenotron.config import convert_value
from kenotron.errors import ConfigError
from kenotron.models.common.moe_args import SCORE_FUNCS
from kenotron.models.common.rope_scaling import RopeScaling

SET_BY_THE_TRAINER = {"max_seq_len": "training.seq_len"}
"""Args fields that follow another config key."""


def _field_names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _unknown(key: str, name: str, cls: type, family: str) -> ConfigError:
    names = _field_names(cls)
    close = difflib.get_close_matches(name, names, n=1, cutoff=0.5)
    hint = f"; did you mean '{key.rsplit('.', 1)[0]}.{close[0]}'?" if close else ""
    owner = f"{family}'s" if key.count(".") == 1 else f"{key.rsplit('.', 1)[0]}'s"
    return ConfigError(f"unknown config key '{key}'{hint} ({owner} fields: {', '.join(names)})")


def _optional_inner(typ: Any) -> Any | None:
    """X for `X | None`, else None."""
    if typing.get_origin(typ) in (typing.Union, types.UnionType):
        inner = [t for t in typing.get_args(typ) if t is not type(None)]
        if len(inner) == 1 and len(typing.get_args(typ)) == 2:
            return inner[0]
    return None


def _value(key: str, typ: Any, value: Any, current: Any, family: str) -> Any:
    """`value` (TOML-typed) as a value of `typ`; a table updates a dataclass field in place."""
    inner = _optional_inner(typ)
    if inner is not None:
        if value is None or (isinstance(value, str) and value.lower() == "none"):
            return None
        typ = inner
    if dataclasses.is_dataclass(typ) and isinstance(value, typ):  # from Python, already built
        return value
    if dataclasses.is_dataclass(typ):
        if not isinstance(value, dict):
            none = " or none" if inner is not None else ""
            raise ConfigError(f"{key} expects a table of its fields such as {{{_field_names(typ)[0]} = ...}}{none}, "
                              f"got {value!r}")
        return _updated(key, current if current is not None else typ(), value, family)
    return convert_value(key, typ, value)


def _updated(prefix: str, obj: Any, values: Mapping[str, Any], family: str) -> Any:
    cls = type(obj)
    hints = typing.get_type_hints(cls)
    changes = {}
    for name, value in values.items():
        key = f"{prefix}.{name}"
        if name not in hints or name not in _field_names(cls):
            raise _unknown(key, name, cls, family)
        changes[name] = _value(key, hints[name], value, getattr(obj, name), family)
    return dataclasses.replace(obj, **changes)


def args_with_overrides(args: Any, overrides: Mapping[str, Any], family: str) -> Any:
    """`args` (a flavor) with the config's `model.<field>` values applied; ConfigError names the
    key for an unknown field, a value of the wrong type or a field another key sets."""
    for name, other in SET_BY_THE_TRAINER.items():
        if name in overrides:
            raise ConfigError(f"model.{name} follows {other}; set {other} instead")
    return _updated("model", args, overrides, family)


def _positive(args: Any, names: tuple[str, ...], prefix: str = "model") -> None:
    for name in names:
        value = getattr(args, name, None)
        if value is not None and not value > 0:
            raise ConfigError(f"{prefix}.{name}={value} must be positive")


def _divisors(n: int, even_quotient: bool = False) -> str:
    ds = [d for d in range(1, n + 1) if n % d == 0 and not (even_quotient and (n // d) % 2)]
    return ", ".join(map(str, ds[:-1])) + f" or {ds[-1]}" if len(ds) > 1 else str(n)


def check_decoder_args(args: Any) -> None:
    """The checks every decoder family's args need (fields a family lacks are skipped)."""
    _positive(args, ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "norm_eps",
                     "rope_theta", "max_seq_len", "sliding_window"))
    field_names = _field_names(type(args))
    if "head_dim" in field_names:
        _positive(args, ("head_dim",))
    elif args.dim % args.n_heads:
        raise ConfigError(f"model.dim={args.dim} is not a multiple of model.n_heads={args.n_heads} (each head is "
                          f"dim / n_heads wide); use a dim that is, or n_heads among {_divisors(args.dim, even_quotient=True)}")
    if args.n_heads % args.n_kv_heads:
        raise ConfigError(f"model.n_kv_heads={args.n_kv_heads} does not divide model.n_heads={args.n_heads} (each "
                          f"key/value head serves a group of query heads); use {_divisors(args.n_heads)}")
    if args.head_dim % 2:
        raise ConfigError(f"the head size is {args.head_dim}, odd: RoPE rotates pairs of dimensions; choose "
                          f"model.dim and model.n_heads (or model.head_dim) for an even head size")
    moe = getattr(args, "moe", None)
    if moe is not None:
        check_moe_args(moe)
    scaling = getattr(args, "rope_scaling", None)
    if isinstance(scaling, RopeScaling):
        for f in dataclasses.fields(scaling):
            if not getattr(scaling, f.name) > 0:
                raise ConfigError(f"model.rope_scaling.{f.name}={getattr(scaling, f.name)} must be positive")
        if scaling.high_freq_factor <= scaling.low_freq_factor:
            raise ConfigError(f"model.rope_scaling.high_freq_factor={scaling.high_freq_factor} must exceed "
                              f"low_freq_factor={scaling.low_freq_factor}")


def check_moe_args(moe: Any) -> None:
    """An MoE family's expert shape and routing (model.moe.*), before anything is built."""
    _positive(moe, ("n_experts", "top_k", "ffn_dim"), prefix="model.moe")
    if moe.top_k > moe.n_experts:
        raise ConfigError(f"model.moe.top_k={moe.top_k} must lie in [1, n_experts={moe.n_experts}] (each token picks "
                          f"top_k distinct experts); use at most {moe.n_experts} or set model.moe.n_experts")
    if moe.score_func not in SCORE_FUNCS:
        raise ConfigError(f"model.moe.score_func={moe.score_func!r} is not one of {', '.join(SCORE_FUNCS)}")
    if not (moe.route_scale > 0 and math.isfinite(moe.route_scale)):
        raise ConfigError(f"model.moe.route_scale={moe.route_scale} must be > 0 and finite (the routing weights' factor; "
                          "1 leaves them as the router gives them)")
    groups, topk_groups = getattr(moe, "n_groups", 1), getattr(moe, "topk_groups", 1)
    if groups < 1 or moe.n_experts % groups:
        raise ConfigError(f"model.moe.n_groups={groups} must divide model.moe.n_experts={moe.n_experts} (the "
                          f"experts form equal groups); use one of {_divisors(moe.n_experts)}")
    if not 1 <= topk_groups <= groups:
        raise ConfigError(f"model.moe.topk_groups={topk_groups} must lie in [1, model.moe.n_groups={groups}]")
    if moe.top_k > topk_groups * (moe.n_experts // groups):
        raise ConfigError(f"model.moe.top_k={moe.top_k} exceeds the {topk_groups * (moe.n_experts // groups)} experts "
                          f"of model.moe.topk_groups={topk_groups} groups; raise topk_groups or lower top_k")
    if getattr(moe, "shared_ffn_dim", 0) < 0:
        raise ConfigError(f"model.moe.shared_ffn_dim={moe.shared_ffn_dim} must be >= 0 (0: no shared expert)")
