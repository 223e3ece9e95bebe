"""The rooms of kenotron and which way imports run between them (docs/design.md).

Every module imports, and the imports between rooms (the sub-packages and the top-level leaf
modules of kenotron) follow the allowed directions, function-level (lazy) imports included:
a lazy import still ties one room to another (but the imports against the rooms listed with
their reason in tests/architecture_rules.py's UPWARD_ON_PURPOSE). Neither the room graph nor the
module graph has a cycle, and docs/design.md's room list names what kenotron/ holds.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from pathlib import Path

import kenotron
from tests.architecture_rules import LAZY_ON_PURPOSE, OPTIONAL_PACKAGES, UPWARD_ON_PURPOSE
from tests.fork_server import fork_server

PACKAGE = Path(kenotron.__file__).parent

# Top-level modules every room may use; they import nothing of kenotron but each other.
LEAVES = {"errors", "dtensor", "degrees"}

# Rooms a room may not import (leaves always allowed). Every other direction is allowed as long
# as the room graph stays acyclic (test_rooms_form_no_import_cycle).
FORBIDDEN: dict[str, set[str] | str] = {
    "config": "all",  # the config is plain data: it imports no other room
    "kernels": "all",  # the kernels: torch and triton only, so every room may use them
    # Which kernels run: reads the config, the model, the mesh degrees (kernel_choice/__init__.py).
    "kernel_choice": {"train", "estimate", "planner", "checkpoint", "tools", "generate", "launch", "runs", "runtime"},
    "models": {"data", "parallel", "checkpoint", "estimate", "planner", "train", "tools", "generate", "kernel_choice",
               "runtime", "launch"},
    "data": {"models", "parallel", "train", "kernel_choice", "runtime", "launch"},
    "parallel": {"train", "estimate", "planner", "checkpoint", "tools", "kernel_choice", "runtime", "launch"},
    "checkpoint": {"train", "estimate", "planner", "tools", "kernel_choice", "runtime", "launch"},
    # A process's life around the step: it is handed the trainer's function, never imports it.
    "runtime": {"train", "launch", "estimate", "planner", "tools", "generate"},
    # The launcher starts processes; only the command line starts a launcher.
    "train": {"launch", "estimate", "planner", "tools"},
    "estimate": {"planner", "launch", "runtime"},  # the fake-tensor estimator is the authority the planner checks against
    "generate": {"launch"},
    # Fault tolerance is a training feature built on train/ (JobExtension); the launcher's rank
    # program hands it to the Trainer, so train/ never imports it.
    "fault_tolerance": {"launch", "estimate", "planner", "tools", "runtime"},
    "tools": {"launch"},
}

# Modules of one room that another may not import, whatever the rooms above allow.
FORBIDDEN_MODULES: dict[str, set[str]] = {
    # The estimator builds and steps the job through the same functions as the trainer, never
    # through the trainer object or the command line.
    "estimate": {"kenotron.train.trainer", "kenotron.train.__main__"},
    "planner": {"kenotron.train.trainer", "kenotron.train.__main__"},
}

# Rooms whose modules import one another without a cycle, function-level imports included.

# Edges known to break the rules above, being removed by the rewrite of the trainer's build and
# step (issue 21). Empty this list as they go: the test fails on an entry that no longer exists.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _import_lines(name: str, path: Path, modules: dict[str, Path]) -> dict[str, int]:
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


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The kenotron modules `name` imports anywhere in its body."""
    return set(_import_lines(name, path, modules))


def _room(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _import_edges() -> list[tuple[str, str]]:
    """Every import between kenotron modules but those kept against the rooms on purpose."""
    modules = _all_modules()
    return sorted((name, target) for name, path in modules.items() for target in _imports(name, path, modules)
                  if (name, target) not in UPWARD_ON_PURPOSE)


def _violations() -> set[tuple[str, str]]:
    rooms = {_room(m) for m in _all_modules()} - {""}
    bad = set()
    for source, target in _import_edges():
        here, there = _room(source), _room(target)
        if here == there:
            continue
        if here in LEAVES:
            if there not in LEAVES:
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
    lazy = set(UPWARD_ON_PURPOSE) - set(LAZY_ON_PURPOSE)
    assert not lazy, f"imports against the rooms stand inside a function, listed in LAZY_ON_PURPOSE too: {sorted(lazy)}"


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


def _module_cycles() -> list[str]:
    """Each group of kenotron modules that import one another in a circle (a strongly connected
    component of the module import graph), as one line: a shortest cycle through it, then every
    import inside the group with its file and line, the imports to cut from."""
    modules = _all_modules()
    graph: dict[str, dict[str, int]] = {
        name: {t: line for t, line in _import_lines(name, path, modules).items() if t != name and t in modules}
        for name, path in modules.items()
    }
    # Tarjan's algorithm, iterative: index and lowlink per module, components as they close.
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            nxt = next(targets, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(sorted(group))
    lines = []
    for group in sorted(groups):
        members = set(group)
        # Breadth-first from the group's first module back to itself: a shortest cycle.
        start, parent = group[0], {}
        frontier = [start]
        while frontier and start not in parent:
            following = []
            for node in frontier:
                for nxt in sorted(graph[node]):
                    if nxt in members and nxt not in parent:
                        parent[nxt] = node
                        following.append(nxt)
            frontier = following
        cycle, node = [start], parent[start]
        while node != start:
            cycle.append(node)
            node = parent[node]
        cycle.append(start)
        edges = [f"{modules[s].relative_to(PACKAGE.parent)}:{graph[s][t]} -> {t}"
                 for s in group for t in sorted(graph[s]) if t in members]
        lines.append(" -> ".join(reversed(cycle)) + "\n      " + "\n      ".join(edges))
    return lines


def test_modules_form_no_import_cycle():
    """No two kenotron modules import each other, directly or around a circle. Every import of a
    kenotron module counts, wherever it stands (top level, inside a function, under
    TYPE_CHECKING): an import moved into a function or under TYPE_CHECKING hides a circle
    without removing it. Imports of optional third-party packages (triton, torchao, flash-attn)
    are not edges of this graph, which holds kenotron's modules only."""
    cycles = _module_cycles()
    assert not cycles, f"{len(cycles)} import cycles between modules (cut one import of each):\n  " + "\n  ".join(cycles)


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
    modules = _all_modules()
    bad, allowed = [], set()
    for name, path in modules.items():
        if rooms is not None and _room(name) not in rooms:
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
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _lazy_imports_of_required_modules(("kernels",)) == (["kenotron.kernels.op:4 -> torch"], set())


def test_the_module_cycle_checker_finds_a_cycle_hidden_in_a_function(tmp_path, monkeypatch):
    """plan imports tensor at the top; tensor imports plan inside a function: a cycle, named
    with both files and lines."""
    fake = tmp_path / "kenotron"
    (fake / "parallel").mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    (fake / "parallel" / "__init__.py").write_text("")
    (fake / "parallel" / "plan.py").write_text("from kenotron.parallel.tensor import apply\n")
    (fake / "parallel" / "tensor.py").write_text("def apply():\n    from kenotron.parallel import plan\n")
    (fake / "parallel" / "dims.py").write_text("from kenotron.parallel import plan\n")  # into the cycle, not in it
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert _module_cycles() == [
        (
            "kenotron.parallel.plan -> kenotron.parallel.tensor -> kenotron.parallel.plan\n"
            "      kenotron/parallel/plan.py:1 -> kenotron.parallel.tensor\n"
            "      kenotron/parallel/tensor.py:2 -> kenotron.parallel.plan"
        )
    ]


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
    found = [hit for path in sorted((PACKAGE / "train").glob("*.py")) for hit in _nested_kenotron_imports(path)
             if hit.split(":")[0] + " " + hit.split(" ", 1)[1] not in upward]
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
    code, out, err = fork_server(("torch",)).run(["-c", script], timeout=300)  # a fresh process, torch imported
    assert code == 0, out + err[-3000:]


def test_package_faces_export_what_they_list():
    """In a fresh interpreter, every name of `kenotron.parallel.__all__` and `kenotron.train.__all__`
    resolves, `from kenotron.parallel import Plan` style; parallel's face is plain imports of its
    own modules' names (no module `__getattr__` that loads them on demand)."""
    script = """
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
    code, out, err = fork_server(("torch",)).run(["-c", script], timeout=300)
    assert code == 0 and out.strip().endswith("ok"), out + err[-3000:]


def _rooms_in_design_doc(text: str) -> set[str]:
    """The names docs/design.md's room list gives (`config/`, `errors.py`): the entries at two
    spaces' indent of the first code block under "## Rooms"."""
    section = text.split("## Rooms", 1)[1]
    block = section.split("```", 2)[1]
    return set(re.findall(r"^  ([A-Za-z_][\w.]*/?)(?=\s|$)", block, flags=re.MULTILINE))


def _rooms_in_package() -> set[str]:
    packages = {f"{d.name}/" for d in PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    return packages | {f.name for f in PACKAGE.glob("*.py") if f.name != "__init__.py"}


def test_the_design_doc_names_every_room_and_nothing_else():
    """docs/design.md's room list names each sub-package and top-level module of kenotron/, and
    nothing that does not exist."""
    listed = _rooms_in_design_doc((PACKAGE.parent / "docs" / "design.md").read_text())
    present = _rooms_in_package()
    assert listed == present, (f"docs/design.md's room list lacks {sorted(present - listed)} and names "
                               f"{sorted(listed - present)}, which kenotron/ does not have; update its Rooms block")


def test_the_design_doc_room_reader_takes_entries_not_continuations_or_other_blocks():
    text = ("# x\n\n## Rooms\n\n```\nkenotron/\n  errors.py   errors\n  config/     the config\n"
            "                 continued line\n  gone/       a room\n```\n\n```\n  other/ block\n```\n")
    assert _rooms_in_design_doc(text) == {"errors.py", "config/", "gone/"}
