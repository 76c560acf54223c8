"""The packages form layers that point one way, and no module imports itself round a loop.

``hpo`` → ``trainers`` → ``predictors``: ``predictors`` (the paper's equations, schedules, the
predictor, the lowest-layer I/O helpers) imports neither ``trainers``, ``hpo``, torch nor Ray;
``trainers`` imports neither ``hpo`` nor Ray. Every ``import`` statement counts, including
those inside functions and under ``TYPE_CHECKING``: a lazy import hides a dependency from
the import time, not from the design. The import graph is read with the standard library's
``ast``, so nothing is imported to check it.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The layers, lowest first: a module may import modules of its own layer or a lower one.
LAYERS = ("predictors", "trainers", "hpo")
#: hpo's subpackages, lowest first: inside hpo, too, a subpackage imports only its own or lower
#: ones (README "Repository layout"; trials and tracking, calibration and reporting, are
#: side by side and import neither each other).
HPO_LAYERS = ("common", "data", "decisions", "trials", "tracking", "calibration", "reporting", "monitor",
              "integrations", "service")
#: Third-party packages a layer must never import (top-level names).
FORBIDDEN = {"predictors": {"torch", "ray"}, "trainers": {"ray"}}


@dataclass(frozen=True)
class Arrow:
    """``source`` imports ``target`` (a module of the tree, or a top-level external name)."""

    source: str
    target: str
    where: str  # path:line of the import statement


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def arrows(root: Path, packages: Iterable[str] = LAYERS) -> tuple[set[str], list[Arrow]]:
    """Every module under ``root/<package>`` and every import arrow out of it."""
    files = {module_name(root, p): p for pkg in packages for p in sorted((root / pkg).rglob("*.py"))}
    modules = set(files)
    out: list[Arrow] = []
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            where = f"{path.relative_to(root).as_posix()}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative import: resolve against this module's package
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import sub` names the submodule when there is one, else pkg itself.
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in dict.fromkeys(targets):
                internal = next((m for m in _prefixes(target) if m in modules), None)
                out.append(Arrow(name, internal or target.split(".")[0], where))
    return modules, [a for a in out if a.source != a.target]


def _prefixes(dotted: str) -> list[str]:
    """``a.b.c`` → ``["a.b.c", "a.b", "a"]``: the longest module of the tree wins."""
    parts = dotted.split(".")
    return [".".join(parts[:i]) for i in range(len(parts), 0, -1)]


def cycles(modules: set[str], found: list[Arrow]) -> list[list[Arrow]]:
    """One import loop (as its arrows) per strongly connected group of modules (Tarjan)."""
    graph: dict[str, list[Arrow]] = {m: [] for m in modules}
    for a in found:
        if a.target in modules:
            graph[a.source].append(a)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for a in graph[v]:
            w = a.target
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return [_loop(graph, group) for group in groups]


def _loop(graph: dict[str, list[Arrow]], group: set[str]) -> list[Arrow]:
    """A shortest loop through the group's first module, staying inside the group."""
    start = min(group)
    paths: dict[str, list[Arrow]] = {start: []}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for a in graph[v]:
                if a.target == start:
                    return paths[v] + [a]
                if a.target in group and a.target not in paths:
                    paths[a.target] = paths[v] + [a]
                    nxt.append(a.target)
        frontier = nxt
    raise AssertionError(f"no loop through {start}")  # pragma: no cover - a group always has one


def describe_cycle(loop: list[Arrow]) -> str:
    chain = " -> ".join([loop[0].source] + [a.target for a in loop])
    return f"import cycle {chain} ({', '.join(a.where for a in loop)})"


def back_arrows(found: list[Arrow]) -> list[str]:
    """Every arrow that points up the layers or into a forbidden third-party package."""
    rank = {layer: i for i, layer in enumerate(LAYERS)}
    bad = []
    for a in found:
        src, dst = a.source.split(".")[0], a.target.split(".")[0]
        if dst in rank and rank[dst] > rank[src]:
            bad.append(f"back-arrow {a.source} -> {a.target} ({a.where}): {src} may not import {dst}")
        elif dst in FORBIDDEN.get(src, set()):
            bad.append(f"forbidden import {a.source} -> {a.target} ({a.where}): {src} may not import {dst}")
    return bad


def hpo_back_arrows(found: list[Arrow]) -> list[str]:
    """Every arrow between hpo's subpackages that points up ``HPO_LAYERS``, and every hpo module
    outside a subpackage (the package's face excepted)."""
    rank = {layer: i for i, layer in enumerate(HPO_LAYERS)}
    bad = []
    for a in found:
        src, dst = a.source.split("."), a.target.split(".")
        if src[0] != "hpo" or dst[0] != "hpo" or len(src) < 2 or len(dst) < 2:
            continue
        if src[1] not in rank or dst[1] not in rank:
            bad.append(f"unplaced module {a.source if src[1] not in rank else a.target} ({a.where}): "
                       f"put it in one of hpo's subpackages {HPO_LAYERS}")
        elif rank[dst[1]] > rank[src[1]]:
            bad.append(f"back-arrow {a.source} -> {a.target} ({a.where}): hpo.{src[1]} may not import hpo.{dst[1]}")
    return bad


# ------------------------------------------------------------------------- the house
def test_no_import_cycle_between_modules() -> None:
    modules, found = arrows(REPO)
    loops = [describe_cycle(loop) for loop in cycles(modules, found)]
    assert not loops, "\n".join(loops)


def test_layers_point_one_way() -> None:
    # hpo -> trainers -> predictors, and predictors free of torch and Ray, trainers of Ray.
    _, found = arrows(REPO)
    bad = back_arrows(found)
    assert not bad, "\n".join(bad)


def test_hpo_subpackages_point_one_way() -> None:
    modules, found = arrows(REPO, ["hpo"])
    assert hpo_back_arrows(found) == []
    loose = sorted(m for m in modules if m.count(".") == 1 and m.split(".")[1] not in HPO_LAYERS)
    assert loose == [], f"modules outside hpo's subpackages: {loose}"


def test_a_planted_back_arrow_inside_hpo_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "hpo/__init__.py": "",
        "hpo/decisions/rules.py": "def keep():\n    from hpo.reporting import report\n",
        "hpo/reporting/report.py": "from hpo.decisions.rules import keep\n",
    })
    _, found = arrows(root, ["hpo"])
    assert hpo_back_arrows(found) == [
        "back-arrow hpo.decisions.rules -> hpo.reporting.report (hpo/decisions/rules.py:2): "
        "hpo.decisions may not import hpo.reporting"]


def test_the_graph_sees_the_known_arrows() -> None:
    # The reader finds real arrows of each kind, so an empty answer above means something:
    # a module-level import, `from pkg import submodule`, and an import inside a function.
    _, found = arrows(REPO)
    pairs = {(a.source, a.target) for a in found}
    assert ("trainers.config", "predictors.equations") in pairs
    assert ("predictors.fit", "predictors.equations") in pairs  # from predictors import equations
    assert ("hpo.calibration.calibrate", "hpo.calibration.banking") in pairs  # imported inside calibrate()
    assert ("trainers.train", "torch") in pairs


# ------------------------------------------------------------------ planted faults
def _tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_a_planted_cycle_inside_a_function_is_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "hpo/__init__.py": "",
        "hpo/report.py": "from hpo.plots import draw\n",
        "hpo/plots.py": "def draw():\n    from hpo import report\n    return report\n",
        "hpo/other.py": "from . import plots\n",
    })
    modules, found = arrows(root, ["hpo"])
    loops = cycles(modules, found)
    assert [describe_cycle(loop) for loop in loops] == [
        "import cycle hpo.plots -> hpo.report -> hpo.plots (hpo/plots.py:2, hpo/report.py:1)"]
    assert ("hpo.other", "hpo.plots") in {(a.source, a.target) for a in found}  # relative import read


def test_planted_back_arrows_and_forbidden_imports_are_named(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "predictors/__init__.py": "",
        "predictors/controls.py": "from trainers.schedules import Schedule\n",
        "predictors/fit.py": "def f():\n    import torch\n",
        "trainers/__init__.py": "",
        "trainers/schedules.py": "import numpy\n",
        "trainers/config.py": "import predictors.controls\nfrom hpo import version\n",
        "hpo/__init__.py": "",
        "hpo/cli.py": "import ray\nimport trainers.config\n",
    })
    _, found = arrows(root)
    assert sorted(back_arrows(found)) == [
        "back-arrow predictors.controls -> trainers.schedules (predictors/controls.py:1): predictors may not import trainers",
        "back-arrow trainers.config -> hpo (trainers/config.py:2): trainers may not import hpo",
        "forbidden import predictors.fit -> torch (predictors/fit.py:2): predictors may not import torch",
    ]


@pytest.mark.parametrize("text", ["import hpo.report\n", "from hpo import report\n", "from .report import x\n"])
def test_every_spelling_of_an_import_is_an_arrow(tmp_path: Path, text: str) -> None:
    root = _tree(tmp_path, {"hpo/__init__.py": "", "hpo/report.py": "", "hpo/plots.py": text})
    _, found = arrows(root, ["hpo"])
    assert [(a.source, a.target) for a in found] == [("hpo.plots", "hpo.report")]
