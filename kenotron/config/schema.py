"""Introspection of the config dataclasses: field types, defaults and docstrings.

Field docs are the string literals written under each field in the dataclass body. Python
drops those at runtime, so they are read back from the source with `ast` once.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import itertools
import textwrap
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from kenotron.config.ranges import RANGE_KEY, Range


@dataclass(frozen=True)
class FieldInfo:
    """One configurable value: `section.name`, its type, default and documentation."""

    section: str
    name: str
    type: Any
    default: Any
    owner: type | None
    """The section's dataclass, whose source holds the field's docstring (None for a nested value)."""
    open: bool = False
    """The section's catch-all: it collects `section.<any other name>` (model.<field>: the family's args)."""
    range: Range | None = None
    """The numbers it accepts (config/ranges.py); None for a field that is not a number."""

    @property
    def doc(self) -> str:
        """The field's docstring, read from its dataclass's source on first use: parsing every
        section's source was nearly all of a config's load time, which every rank pays."""
        return field_docs(self.owner).get(self.name, "") if self.owner is not None else ""

    @property
    def key(self) -> str:
        return f"{self.section}.<field>" if self.open else f"{self.section}.{self.name}"

    @property
    def choices(self) -> tuple[Any, ...] | None:
        if typing.get_origin(self.type) is Literal:
            return typing.get_args(self.type)
        return None

    def type_name(self) -> str:
        choices = self.choices
        if choices is not None:
            return " | ".join(repr(c) for c in choices)
        if self.open:
            return "any"
        origin = typing.get_origin(self.type)
        if origin is list:
            (inner,) = typing.get_args(self.type)
            return f"list[{inner.__name__}]"
        if origin is dict:
            key, value = typing.get_args(self.type)
            return f"dict[{key.__name__}, {value.__name__}]"
        return self.type.__name__


@cache
def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass: {field name: the string literal under it}."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for stmt, nxt in itertools.pairwise(body):
        if (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and isinstance(nxt, ast.Expr)
            and isinstance(nxt.value, ast.Constant)
            and isinstance(nxt.value.value, str)
        ):
            docs[stmt.target.id] = " ".join(nxt.value.value.split())
    return docs


def open_field(root: type, section: str) -> FieldInfo | None:
    """The catch-all field of a section, if it has one."""
    return all_fields(root).get(f"{section}.<field>")


def section_classes(root: type) -> dict[str, type]:
    """{section name: dataclass} for the root config class."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


@cache
def all_fields(root: type) -> dict[str, FieldInfo]:
    """{"section.name": FieldInfo} for every configurable value, in declaration order; a section's
    catch-all field (metadata `open`) is keyed "section.<field>"."""
    out: dict[str, FieldInfo] = {}
    for section, cls in section_classes(root).items():
        hints = typing.get_type_hints(cls, include_extras=False)
        defaults = cls()
        for f in dataclasses.fields(cls):
            info = FieldInfo(section, f.name, hints[f.name], getattr(defaults, f.name), cls,
                             open=bool(f.metadata.get("open")), range=f.metadata.get(RANGE_KEY))
            out[info.key] = info
    return out
