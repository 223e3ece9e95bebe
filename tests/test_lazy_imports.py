"""Where kenotron imports: at the top of each module, but optional packages and the on-demand
loads listed with their reason in tests/architecture_rules.py's LAZY_ON_PURPOSE; every module
imports in a fresh interpreter; the package faces export what they list."""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import architecture_reader as reader
from tests.ahead import Lane
from tests.architecture_reader import all_modules, room_of
from tests.architecture_rules import LAZY_ON_PURPOSE, OPTIONAL_PACKAGES, UPWARD_ON_PURPOSE
from tests.fork_server import fork_server


def _top_level_packages(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module.split(".")[0])
    return found


def _function_level_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, imported module) of each import inside a function of `name`; relative imports
    resolved, and `from pkg import sub` of a submodule read as pkg.sub."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for inner in ast.walk(node):
            if isinstance(inner, ast.Import):
                found.update((inner.lineno, alias.name) for alias in inner.names)
            elif isinstance(inner, ast.ImportFrom):
                base = inner.module or ""
                if inner.level:
                    parts = package.split(".")[: len(package.split(".")) - inner.level + 1]
                    base = ".".join(parts + ([inner.module] if inner.module else []))
                subs = [f"{base}.{alias.name}" for alias in inner.names if f"{base}.{alias.name}" in modules]
                found.update((inner.lineno, target) for target in subs + ([base] if len(subs) < len(inner.names) else []))
    return sorted(found)


def _lazy_imports_of_required_modules(rooms: tuple[str, ...] | None = None) -> tuple[list[str], set[tuple[str, str]]]:
    """Imports inside functions (in `rooms`, or everywhere) of anything but an optional package or a
    kenotron module importing one at its top, as "module:line -> target", with the allowlisted
    pairs met on the way. An allowlisted pair is not reported."""
    modules = all_modules()
    bad, allowed = [], set()
    for name, path in modules.items():
        if rooms is not None and room_of(name) not in rooms:
            continue
        for line, target in _function_level_imports(name, path, modules):
            optional = target.split(".")[0] in OPTIONAL_PACKAGES or (
                target in modules and _top_level_packages(modules[target]) & OPTIONAL_PACKAGES)
            if optional:
                continue
            if (name, target) in LAZY_ON_PURPOSE:
                allowed.add((name, target))
            else:
                bad.append(f"{name}:{line} -> {target}")
    return sorted(bad), allowed


def test_every_module_imports_at_the_top_but_optional_packages_and_listed_on_demand_loads():
    """Across kenotron/, an import inside a function is of an optional package (or a kenotron
    module importing one at its top, a Triton kernel), or a pair of LAZY_ON_PURPOSE, whose
    reason is given there (command dispatch, the Mamba kernels on demand, a launcher that must
    not import torch). Anything else is a required module: it goes to the top of its module."""
    bad, allowed = _lazy_imports_of_required_modules()
    assert not bad, ("imports inside functions of modules every run has; move them to the top, or, when the "
                     "laziness is deliberate, add the pair to LAZY_ON_PURPOSE with its reason:\n  " + "\n  ".join(bad))
    stale = sorted(set(LAZY_ON_PURPOSE) - allowed)
    assert not stale, f"no longer imported inside a function, remove from LAZY_ON_PURPOSE: {stale}"


def test_the_lazy_import_reader_tells_a_triton_kernel_from_a_required_module(tmp_path, monkeypatch):
    fake = tmp_path / "kenotron"
    (fake / "kernels").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "kernels" / "__init__.py").write_text("")
    (fake / "kernels" / "kernel.py").write_text("import triton\n")
    (fake / "kernels" / "op.py").write_text(
        "def run():\n    from kenotron.kernels.kernel import k\n    import triton\n    import torch\n"
    )
    monkeypatch.setattr(reader, "PACKAGE", fake)
    assert _lazy_imports_of_required_modules(("kernels",)) == (["kenotron.kernels.op:4 -> torch"], set())


OPTIONAL = ("kenotron.kernels.adamw", "kenotron.kernels.loss")
"""kenotron modules that import an optional dependency (triton): imported where they run."""


def _nested_kenotron_imports(path: Path) -> list[str]:
    """`file:line module` of every kenotron import inside a function, a class or an `if` (an
    `if TYPE_CHECKING:` import hides a cycle as a function-level one does), optional ones aside."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If)):
            for inner in ast.walk(node):
                names = ([a.name for a in inner.names] if isinstance(inner, ast.Import)
                         else [inner.module or ""] if isinstance(inner, ast.ImportFrom) else [])
                found.update(f"{path.name}:{inner.lineno} {n}" for n in names
                             if n.startswith("kenotron") and n not in OPTIONAL)
    return sorted(found)


def test_train_imports_kenotron_at_the_top_of_its_modules():
    upward = {f"{module.rpartition('.')[2]}.py {target}" for module, target in UPWARD_ON_PURPOSE}
    found = [hit for path in sorted((reader.PACKAGE / "train").glob("*.py")) for hit in _nested_kenotron_imports(path)
             if hit.split(":")[0] + " " + hit.split(" ", 1)[1] not in upward]
    assert not found, f"kenotron imports inside functions or under `if` in train/: {found}"


def fresh_process(script: str) -> Callable[[Path, Lane], tuple[int, str, str]]:
    """The `run_ahead` job (tests/ahead.py) that runs `script` in a fresh process forked from one
    that imported torch alone (tests/fork_server.py): seconds of kenotron's imports, run ahead of
    its test; gives its exit code, stdout and stderr."""
    def job(folder: Path, lane: Lane) -> tuple[int, str, str]:
        return fork_server(("torch",)).run(["-c", script], timeout=300)
    job.__name__ = "fresh_process"
    return job


EVERY_MODULE_IMPORTS = """
import importlib, pkgutil, sys
import kenotron
failed = []
for info in pkgutil.walk_packages(kenotron.__path__, "kenotron."):
    try:
        importlib.import_module(info.name)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.split(".")[0] == "kenotron":
            failed.append(f"{info.name}: {exc!r}")
        else:
            print(f"skipped {info.name}: needs {exc.name}")
    except Exception as exc:
        failed.append(f"{info.name}: {exc!r}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


@pytest.mark.run_ahead(job=fresh_process(EVERY_MODULE_IMPORTS))
def test_every_module_of_kenotron_imports(ran_ahead):
    """In a fresh interpreter (so import order and cycles are those of a first import), every
    module imports; one whose optional third-party package is missing is reported and skipped."""
    code, out, err = ran_ahead
    assert code == 0, out + err[-3000:]


PACKAGE_FACES_EXPORT = """
import kenotron.parallel, kenotron.train
assert "__getattr__" not in vars(kenotron.parallel), "kenotron.parallel has a lazy __getattr__"
for face in (kenotron.parallel, kenotron.train):
    for name in face.__all__:
        value = getattr(face, name)
        if face is kenotron.parallel:
            assert value.__module__.startswith(("kenotron.parallel.", "kenotron.degrees")), (name, value.__module__)
from tests.architecture_rules import LAZY_ON_PURPOSE, OPTIONAL_PACKAGES
from kenotron.parallel import Plan, plan_for
from kenotron.train import Trainer, build_job, train_step
assert Plan.__name__ == "Plan" and callable(plan_for) and Trainer.__name__ == "Trainer"
assert callable(build_job) and callable(train_step)
print("ok")
"""


@pytest.mark.run_ahead(job=fresh_process(PACKAGE_FACES_EXPORT))
def test_package_faces_export_what_they_list(ran_ahead):
    """In a fresh interpreter, every name of `kenotron.parallel.__all__` and `kenotron.train.__all__`
    resolves, `from kenotron.parallel import Plan` style; parallel's face is plain imports of its
    own modules' names (no module `__getattr__` that loads them on demand)."""
    code, out, err = ran_ahead
    assert code == 0 and out.strip().endswith("ok"), out + err[-3000:]
