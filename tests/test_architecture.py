"""The rooms of kenotron and which way imports run between them (docs/design.md).

Every module imports, and the imports between rooms (the sub-packages and the top-level leaf
modules of kenotron) follow the allowed directions, function-level (lazy) imports included:
a lazy import still ties one room to another. The room graph has no cycle.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import kenotron

PACKAGE = Path(kenotron.__file__).parent

# Top-level modules every room may use; they import nothing else of kenotron.
LEAVES = {"errors", "dtensor"}

# Rooms a room may not import (leaves always allowed). Every other direction is allowed as long
# as the room graph stays acyclic (test_rooms_form_no_import_cycle).
FORBIDDEN: dict[str, set[str] | str] = {
    "config": "all",  # the config is plain data: it imports no other room
    "kernels": "all",  # kernels and their choice: torch and triton only, so every room may use them
    "models": {"data", "parallel", "checkpoint", "estimate", "train", "tools", "generate", "runtime", "launch"},
    "data": {"models", "parallel", "train", "runtime", "launch"},
    "parallel": {"train", "estimate", "checkpoint", "tools", "runtime", "launch"},
    "checkpoint": {"train", "estimate", "tools", "runtime", "launch"},
    # A process's life around the step: it is handed the trainer's function, never imports it.
    "runtime": {"train", "launch", "estimate", "tools", "generate"},
    # The launcher starts processes; only the command line starts a launcher.
    "train": {"launch", "estimate", "tools"},
    "estimate": {"launch", "runtime"},
    "generate": {"launch"},
    "tools": {"launch"},
}

# Modules of one room that another may not import, whatever the rooms above allow.
FORBIDDEN_MODULES: dict[str, set[str]] = {
    # The estimator builds and steps the job through the same functions as the trainer, never
    # through the trainer object or the command line.
    "estimate": {"kenotron.train.trainer", "kenotron.train.__main__"},
}

# Rooms whose modules import one another without a cycle, function-level imports included.
ACYCLIC_ROOMS = ("train", "runtime", "launch")

# Edges known to break the rules above, being removed by the rewrite of the trainer's build and
# step (issue 21). Empty this list as they go: the test fails on an entry that no longer exists.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kenotron modules `name` imports anywhere in its body (`from pkg import sub` counts as sub)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            found.add(target)
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in modules)
    return {m for m in found if m == "kenotron" or m.startswith("kenotron.")}


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _import_edges() -> list[tuple[str, str]]:
    modules = _all_modules()
    return sorted((name, target) for name, path in modules.items() for target in _imports(name, path, modules))


def _violations() -> set[tuple[str, str]]:
    rooms = {_room(m) for m in _all_modules()} - {""}
    bad = set()
    for source, target in _import_edges():
        here, there = _room(source), _room(target)
        if here == there:
            continue
        if here in LEAVES:
            bad.add((source, target))
            continue
        if there in LEAVES:
            continue
        forbidden = FORBIDDEN.get(here, set())
        if forbidden == "all":
            forbidden = rooms
        if there in forbidden or target in FORBIDDEN_MODULES.get(here, set()):
            bad.add((source, target))
    return bad


def test_room_imports_follow_the_allowed_directions():
    bad = _violations()
    assert not bad - KNOWN_VIOLATIONS, "imports against the rooms' directions:\n" + "\n".join(
        f"  {s} -> {t}" for s, t in sorted(bad - KNOWN_VIOLATIONS)
    )
    assert not KNOWN_VIOLATIONS - bad, f"gone, remove from KNOWN_VIOLATIONS: {sorted(KNOWN_VIOLATIONS - bad)}"


def test_rooms_form_no_import_cycle():
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in _import_edges():
        if _room(source) != _room(target) and _room(target):
            graph[_room(source)].add(_room(target))
    # Depth-first search; a room met again on the current path closes a cycle.
    state: dict[str, str] = {}

    def visit(room: str, path: list[str]) -> None:
        state[room] = "open"
        for nxt in sorted(graph[room]):
            if state.get(nxt) == "open":
                cycle = path[path.index(nxt):] + [nxt] if nxt in path else [room, nxt]
                raise AssertionError("import cycle between rooms: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt, path + [nxt])
        state[room] = "done"

    for room in sorted(graph):
        if room not in state:
            visit(room, [room])


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its nodes in order, the first again at the end), or None."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt, path + [nxt])):
                return found
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node, [node])):
            return found
    return None


def _module_graph(room: str) -> dict[str, set[str]]:
    """Imports between the modules of `room` (a package's own __init__ left out: it re-exports)."""
    graph: dict[str, set[str]] = defaultdict(set)
    face = f"kenotron.{room}"
    for source, target in _import_edges():
        if _room(source) == room == _room(target) and source != target and face not in (source, target):
            graph[source].add(target)
    return graph


def test_the_modules_of_train_runtime_and_launch_form_no_import_cycle():
    for room in ACYCLIC_ROOMS:
        cycle = _cycle(_module_graph(room))
        assert cycle is None, f"import cycle inside {room}/: " + " -> ".join(cycle or [])


def test_the_cycle_finder_finds_a_cycle_of_three_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycle(graph) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


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
    found = [hit for path in sorted((PACKAGE / "train").glob("*.py")) for hit in _nested_kenotron_imports(path)]
    assert not found, f"kenotron imports inside functions or under `if` in train/: {found}"


def test_the_rule_checker_sees_a_forbidden_lazy_import(tmp_path, monkeypatch):
    """The checks read imports inside functions too: a lazy import of train from parallel is caught."""
    fake = tmp_path / "kenotron"
    (fake / "parallel").mkdir(parents=True)
    (fake / "train").mkdir()
    for init in (fake / "__init__.py", fake / "parallel" / "__init__.py", fake / "train" / "__init__.py"):
        init.write_text("")
    (fake / "train" / "loop.py").write_text("from kenotron.parallel import plan\n")
    (fake / "parallel" / "plan.py").write_text("def f():\n    from kenotron.train.loop import g\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _violations() == {("kenotron.parallel.plan", "kenotron.train.loop")}
    try:
        test_rooms_form_no_import_cycle()
    except AssertionError as exc:
        assert "parallel -> train -> parallel" in str(exc)
    else:
        raise AssertionError("the cycle parallel <-> train was not found")


def test_every_module_of_kenotron_imports():
    """In a fresh interpreter (so import order and cycles are those of a first import), every
    module imports; one whose optional third-party package is missing is reported and skipped."""
    script = """
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
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]


def test_package_faces_load_nothing_until_used_and_export_what_they_list():
    """`import kenotron.parallel` loads none of its modules (no cost, no cycle); each name of its
    __all__ then resolves, `from kenotron.parallel import Plan` style. `kenotron.train` imports
    its names plainly, and each is defined in one of its modules (or the divergence guard's)."""
    script = """
import sys
import kenotron.parallel
loaded = [m for m in sys.modules if m.startswith("kenotron.parallel.") or m == "torch"]
assert not loaded, loaded
face = kenotron.parallel
assert sorted(face.__all__) == sorted(face._EXPORTS), face.__name__
for name in face.__all__:
    value = getattr(face, name)
    assert value.__module__.startswith(face.__name__ + "."), (name, value.__module__)
import kenotron.train
for name in kenotron.train.__all__:
    value = getattr(kenotron.train, name)
    assert value.__module__.startswith(("kenotron.train.", "kenotron.runtime.")), (name, value.__module__)
from kenotron.parallel import Plan, plan_for
from kenotron.train import Trainer, build_job, train_step
assert Plan.__name__ == "Plan" and callable(plan_for) and Trainer.__name__ == "Trainer"
assert callable(build_job) and callable(train_step)
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]
