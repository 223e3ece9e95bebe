"""Readers of kenotron's source for the architecture tests (tests/test_architecture.py,
tests/test_lazy_imports.py): its modules, the kenotron modules each imports (anywhere in its
body), and the room each belongs to. `PACKAGE` is read at each call, so a test may point it at a
fake tree (monkeypatch)."""

from __future__ import annotations

import ast
from pathlib import Path

import kenotron

PACKAGE = Path(kenotron.__file__).parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def import_lines(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
    """The kenotron modules `name` imports anywhere in its body (top level, in functions, under
    TYPE_CHECKING), each with the line of its first import. `from pkg import sub` of a submodule
    counts as sub alone: the package's own code is imported for a name that is not a submodule."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: dict[str, int] = {}
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            submodules = [f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules]
            targets = submodules + ([target] if len(submodules) < len(node.names) else [])
        for target in targets:
            if target == "kenotron" or target.startswith("kenotron."):
                found[target] = min(found.get(target, node.lineno), node.lineno)
    return found


def imported_modules(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kenotron modules `name` imports anywhere in its body."""
    return set(import_lines(name, path, modules))


def room_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""
