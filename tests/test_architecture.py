"""The rooms of kenotron and which way imports run between them (docs/design.md).

The imports between rooms (the sub-packages and the top-level leaf modules of kenotron) follow
the allowed directions, function-level (lazy) imports included:
a lazy import still ties one room to another (but the imports against the rooms listed with
their reason in tests/architecture_rules.py's UPWARD_ON_PURPOSE). Neither the room graph nor the
module graph has a cycle, and docs/design.md's room list names what kenotron/ holds. Where
modules import (top level or lazily) is tests/test_lazy_imports.py's.
"""

from __future__ import annotations

import re
from collections import defaultdict

from tests import architecture_reader as reader
from tests.architecture_reader import all_modules, import_lines, imported_modules, room_of
from tests.architecture_rules import LAZY_ON_PURPOSE, UPWARD_ON_PURPOSE

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


def _import_edges() -> list[tuple[str, str]]:
    """Every import between kenotron modules but those kept against the rooms on purpose."""
    modules = all_modules()
    return sorted((name, target) for name, path in modules.items() for target in imported_modules(name, path, modules)
                  if (name, target) not in UPWARD_ON_PURPOSE)


def _violations() -> set[tuple[str, str]]:
    rooms = {room_of(m) for m in all_modules()} - {""}
    bad = set()
    for source, target in _import_edges():
        here, there = room_of(source), room_of(target)
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
        if room_of(source) != room_of(target) and room_of(target):
            graph[room_of(source)].add(room_of(target))
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
    modules = all_modules()
    graph: dict[str, dict[str, int]] = {
        name: {t: line for t, line in import_lines(name, path, modules).items() if t != name and t in modules}
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
        edges = [f"{modules[s].relative_to(reader.PACKAGE.parent)}:{graph[s][t]} -> {t}"
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


def _rooms_in_design_doc(text: str) -> set[str]:
    """The names docs/design.md's room list gives (`config/`, `errors.py`): the entries at two
    spaces' indent of the first code block under "## Rooms"."""
    section = text.split("## Rooms", 1)[1]
    block = section.split("```", 2)[1]
    return set(re.findall(r"^  ([A-Za-z_][\w.]*/?)(?=\s|$)", block, flags=re.MULTILINE))


def _rooms_in_package() -> set[str]:
    packages = {f"{d.name}/" for d in reader.PACKAGE.iterdir() if (d / "__init__.py").is_file()}
    return packages | {f.name for f in reader.PACKAGE.glob("*.py") if f.name != "__init__.py"}


def test_the_design_doc_names_every_room_and_nothing_else():
    """docs/design.md's room list names each sub-package and top-level module of kenotron/, and
    nothing that does not exist."""
    listed = _rooms_in_design_doc((reader.PACKAGE.parent / "docs" / "design.md").read_text())
    present = _rooms_in_package()
    assert listed == present, (f"docs/design.md's room list lacks {sorted(present - listed)} and names "
                               f"{sorted(listed - present)}, which kenotron/ does not have; update its Rooms block")


def test_the_design_doc_room_reader_takes_entries_not_continuations_or_other_blocks():
    text = ("# x\n\n## Rooms\n\n```\nkenotron/\n  errors.py   errors\n  config/     the config\n"
            "                 continued line\n  gone/       a room\n```\n\n```\n  other/ block\n```\n")
    assert _rooms_in_design_doc(text) == {"errors.py", "config/", "gone/"}


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
    monkeypatch.setattr(reader, "PACKAGE", fake)
    assert _module_cycles() == [
        (
            "kenotron.parallel.plan -> kenotron.parallel.tensor -> kenotron.parallel.plan\n"
            "      kenotron/parallel/plan.py:1 -> kenotron.parallel.tensor\n"
            "      kenotron/parallel/tensor.py:2 -> kenotron.parallel.plan"
        )
    ]


def test_the_rule_checker_sees_a_forbidden_lazy_import(tmp_path, monkeypatch):
    """The checks read imports inside functions too: a lazy import of train from parallel is caught."""
    fake = tmp_path / "kenotron"
    (fake / "parallel").mkdir(parents=True)
    (fake / "train").mkdir()
    for init in (fake / "__init__.py", fake / "parallel" / "__init__.py", fake / "train" / "__init__.py"):
        init.write_text("")
    (fake / "train" / "loop.py").write_text("from kenotron.parallel import plan\n")
    (fake / "parallel" / "plan.py").write_text("def f():\n    from kenotron.train.loop import g\n")
    monkeypatch.setattr(reader, "PACKAGE", fake)
    assert _violations() == {("kenotron.parallel.plan", "kenotron.train.loop")}
    try:
        test_rooms_form_no_import_cycle()
    except AssertionError as exc:
        assert "parallel -> train -> parallel" in str(exc)
    else:
        raise AssertionError("the cycle parallel <-> train was not found")
