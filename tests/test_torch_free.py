"""The modules the launcher imports to check a config before torchrun import no torch.

`kenotron train` prints every config error, the model's shape and the kernel choices included,
before any process starts and in under 2 s on two cores (issue 34); importing torch alone takes
most of that. So the config, the degree checks, runtime/preflight.py, the kernel choices' checks
and their Target (kernel_choice/) and, of every model family, its package,
args, flavors and parallel hints stay free of torch: the model class and the HF adapter are
named by import paths in the family's ModelSpec and imported on first use (docs/design.md).
"""

from __future__ import annotations

import ast
import fnmatch
import sys
from pathlib import Path

import kenotron

PACKAGE = Path(kenotron.__file__).parent

TORCH_FREE = (
    "kenotron", "kenotron.errors", "kenotron.degrees", "kenotron.config", "kenotron.config.*",
    "kenotron.runtime.degrees", "kenotron.runtime.preflight", "kenotron.launch.launcher",
    # the kernel choices' checks and the machine they are made for
    "kenotron.kernel_choice", "kenotron.kernel_choice.target", "kenotron.kernel_choice.tuning",
    "kenotron.kernel_choice.config_checks",
    "kenotron.models", "kenotron.models.registry", "kenotron.models.spec", "kenotron.models.args",
    "kenotron.models.common.rope_scaling", "kenotron.models.common.moe_args",
    # every family: a package of models/ with flavors
    "kenotron.models.*.args", "kenotron.models.*.flavors", "kenotron.models.*.parallel_hints",
)
"""Module name patterns (fnmatch) of the modules that must import no torch, their imports' imports included."""

HEAVY = {"torch", "triton"}
"""Packages whose import the launcher's checks cannot afford."""


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _torch_free_modules() -> dict[str, Path]:
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    families = {f"kenotron.models.{p.parent.name}" for p in (PACKAGE / "models").glob("*/flavors.py")}
    return {name: path for name, path in modules.items()
            if name in families or any(fnmatch.fnmatchcase(name, pattern) for pattern in TORCH_FREE)}


def _top_level_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of each import run when `name` is imported: statements of the module body
    (not in functions nor under `if TYPE_CHECKING:`); `from pkg import sub` of a submodule is pkg.sub."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.parse(path.read_text(), str(path)).body:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: the package `level - 1` steps up, then the module named
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found += [(node.lineno, f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base) for a in node.names]
    return found


def _heavy_import_chains() -> list[str]:
    """For each torch-free module reaching a HEAVY package through imports run at its import
    (parent packages' __init__ included), one chain `module -> ... -> torch` with files and lines."""
    modules = {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    imports: dict[str, list[tuple[int, str]]] = {}  # each module parsed once
    chains = []
    for root in _torch_free_modules():
        came_from: dict[str, tuple[str, str] | None] = {root: None}
        packages = [p for p in (root.rsplit(".", i)[0] for i in range(root.count("."), 0, -1)) if p in modules]
        came_from.update((package, (root, "its package")) for package in packages)  # run before root
        queue = [*packages, root]
        while queue:
            name = queue.pop(0)
            heavy = None
            if name not in imports:
                imports[name] = _top_level_imports(name, modules[name], modules)
            for line, target in imports[name]:
                where = f"{modules[name].relative_to(PACKAGE.parent)}:{line}"
                if target.split(".")[0] in HEAVY:
                    heavy = (target, where)
                    break
                parts = target.split(".")
                for inner in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):  # packages run first
                    if inner in modules and inner not in came_from:
                        came_from[inner] = (name, where)
                        queue.append(inner)
            if heavy:
                steps, at = [f"{heavy[1]} -> {heavy[0]}"], name
                while came_from[at] is not None:
                    parent, where = came_from[at]
                    steps.append(f"{where} -> {at}")
                    at = parent
                chains.append(f"{root}:\n      " + "\n      ".join(reversed(steps)))
                break
    return chains


def test_the_launchers_config_and_model_shape_checks_import_no_torch():
    chains = _heavy_import_chains()
    assert not chains, ("modules the launcher checks a config with import torch (issue 34: config errors in under "
                        "2 s); import it where the model is built, or name the object by an import path as "
                        "ModelSpec does:\n  " + "\n  ".join(chains))


def test_the_torch_free_list_covers_every_family_and_the_checker_follows_parent_packages(tmp_path, monkeypatch):
    """A family's args import nothing heavy themselves, but its package's __init__ imports the model,
    which imports torch: the chain goes through the package."""
    fake = tmp_path / "kenotron"
    (fake / "models" / "toy").mkdir(parents=True)
    for init in (fake / "__init__.py", fake / "models" / "__init__.py"):
        init.write_text("")
    (fake / "models" / "toy" / "__init__.py").write_text("from kenotron.models.toy.model import Toy\n")
    (fake / "models" / "toy" / "model.py").write_text('"""A model."""\n\nfrom torch import nn\n')
    (fake / "models" / "toy" / "args.py").write_text("import dataclasses\n")
    (fake / "models" / "toy" / "flavors.py").write_text("from kenotron.models.toy.args import dataclasses\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert "kenotron.models.toy" in _torch_free_modules()
    assert _heavy_import_chains()[0] == (
        "kenotron.models.toy:\n"
        "      kenotron/models/toy/__init__.py:1 -> kenotron.models.toy.model\n"
        "      kenotron/models/toy/model.py:3 -> torch"
    )
