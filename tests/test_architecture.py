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
    "models": {"data", "parallel", "checkpoint", "estimate", "planner", "train", "tools", "generate"},  # config, kernels
    "data": {"models", "parallel", "train"},
    "parallel": {"train", "estimate", "planner", "checkpoint", "tools"},
    "checkpoint": {"train", "estimate", "planner", "tools"},
    "estimate": {"planner"},  # the fake-tensor estimator is the authority the planner checks against
}

# Modules of one room that another may not import, whatever the rooms above allow.
FORBIDDEN_MODULES: dict[str, set[str]] = {
    # The estimator builds and steps the job through the same functions as the trainer, never
    # through the trainer object or the command line.
    "estimate": {"kenotron.train.trainer", "kenotron.train.__main__"},
    "planner": {"kenotron.train.trainer", "kenotron.train.__main__"},
}

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


# Rooms whose modules import each other without a circle (lazy and TYPE_CHECKING imports count:
# a circle held apart by an import inside a function is still a circle). Extend to every room as
# their circles go.
ROOMS_WITHOUT_MODULE_CIRCLES = {"estimate", "planner", "data", "models"}


def _module_circles(edges: list[tuple[str, str]]) -> list[list[str]]:
    """The import circles among `edges`' modules: strongly connected groups of more than one."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target in edges:
        graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_modules_of_a_room_import_each_other_without_a_circle():
    edges = [(s, t) for s, t in _import_edges()
             if _room(s) == _room(t) and _room(s) in ROOMS_WITHOUT_MODULE_CIRCLES and s != t]
    circles = _module_circles(edges)
    assert not circles, "import circles inside rooms:\n" + "\n".join("  " + " <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle_held_apart_by_a_lazy_import():
    edges = [("kenotron.data.a", "kenotron.data.b"), ("kenotron.data.b", "kenotron.data.c"),
             ("kenotron.data.c", "kenotron.data.a"), ("kenotron.data.c", "kenotron.data.d")]
    assert _module_circles(edges) == [["kenotron.data.a", "kenotron.data.b", "kenotron.data.c"]]


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
    """`import kenotron.parallel` / `kenotron.train` loads none of their modules (no cost, no
    cycle); each name of their __all__ then resolves, `from kenotron.parallel import Plan` style."""
    script = """
import sys
import kenotron.parallel, kenotron.train
loaded = [m for m in sys.modules if m.startswith(("kenotron.parallel.", "kenotron.train.")) or m == "torch"]
assert not loaded, loaded
for face in (kenotron.parallel, kenotron.train):
    assert sorted(face.__all__) == sorted(face._EXPORTS), face.__name__
    for name in face.__all__:
        value = getattr(face, name)
        assert value.__module__.startswith(face.__name__ + "."), (name, value.__module__)
from kenotron.parallel import Plan, plan_for
from kenotron.train import Trainer
assert Plan.__name__ == "Plan" and callable(plan_for) and Trainer.__name__ == "Trainer"
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True, text=True,
                          timeout=300, cwd=PACKAGE.parent)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr[-3000:]
