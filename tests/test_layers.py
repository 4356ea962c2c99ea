"""The house rules of docs/architecture.md, read from the source with ``ast`` (no import runs):
the floors' order, no upward import, no torch below ``nn``, no import circles, and
function-level imports only where they keep torch out, each with its reason."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "shardlab"
TORCH_FREE = ("config", "data", "estimate", "schedules", "plan", "report")
"""Floors that never import torch, not even inside a function."""
LAZY_ALLOWED = ("cli", *TORCH_FREE)
"""Where a function-level import may keep torch (or matplotlib, playwright) out."""
LAZY_PACKAGES = ("torchao",)
"""Third-party packages one option alone needs and whose import costs seconds (torchao:
``train --dtype fp8``), which any floor may import where that option is set up."""


def floors() -> dict[str, int]:
    """Package (or top-level module) -> floor, from the ```layers block of the doc."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```layers\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```layers block"
    out = {}
    for line in block.group(1).splitlines():
        number, *names = line.split()
        for name in names:
            out[name] = int(number)
    return out


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. shardlab.plan.search
    target: str  # what it imports, e.g. shardlab.config.model or torch.nn
    line: int
    in_function: bool
    type_only: bool  # under `if TYPE_CHECKING:`
    commented: bool  # a comment on the line or on the lines right above it


def module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(module: str) -> str:
    """shardlab.plan.search -> plan; shardlab.errors -> errors; shardlab -> shardlab; an
    entry point (shardlab.__main__, shardlab.train.__main__) -> __main__, the top floor,
    since nothing imports it."""
    parts = module.split(".")
    if parts[-1] == "__main__":
        return "__main__"
    return parts[1] if len(parts) > 1 else parts[0]


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        here = module.split(".") if is_package else module.split(".")[:-1]
        base = ".".join(here[: len(here) - node.level + 1] + ([node.module] if node.module
                                                             else []))
    # `from shardlab.distributed import checkpoint` imports a module, not a name.
    return [f"{base}.{a.name}" if is_module(f"{base}.{a.name}") else base for a in node.names]


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` (shardlab.x.y) is a module or package under src/."""
    path = SRC.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or path.is_dir()


def imports_of(path: Path, module: str | None = None) -> list[Import]:
    """Every import in the file at ``path`` (``module``: its dotted name, by default from
    where it lies under src/)."""
    module = module or module_name(path)
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    tree = ast.parse(source)
    inside: set[int] = set()
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            inside.update(id(n) for n in ast.walk(node) if n is not node)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(n) for n in ast.walk(node))

    def commented(lineno: int) -> bool:
        # On the line, or in the comment lines right above it (through earlier imports
        # of the same block).
        if "#" in lines[lineno - 1]:
            return True
        i = lineno - 2
        while i >= 0:
            text = lines[i].strip()
            if text.startswith("#"):
                return True
            if not (text.startswith(("import ", "from ")) or text in (")", "") or
                    text.endswith((",", "("))):
                return False
            i -= 1
        return False

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.module == "__future__":
                continue
            targets = _resolve(module, path.name == "__init__.py", node)
        else:
            continue
        for target in targets:
            out.append(Import(module, target, node.lineno, id(node) in inside,
                              id(node) in typing_only, commented(node.lineno)))
    return out


ALL = [imp for path in sorted(SRC.rglob("*.py")) for imp in imports_of(path)]
INTERNAL = [i for i in ALL if i.target.split(".")[0] == "shardlab"]


def test_every_package_has_a_floor() -> None:
    known = floors()
    packages = {package_of(module_name(p)) for p in SRC.rglob("*.py")} - {"shardlab"}
    assert packages - set(known) == set(), "add them to docs/architecture.md's layers"
    assert set(known) - packages == set(), "the doc names packages that do not exist"


def test_the_doc_lists_every_package_s_imports() -> None:
    """docs/architecture.md's ```imports block equals the imports in the code, package by
    package (`train/__main__.py`, an entry point, counts as __main__)."""
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    block = re.search(r"```imports\n(.*?)```", text, re.S)
    assert block, "docs/architecture.md has no ```imports block"
    documented = {name: set(rest.split()) for name, _, rest in
                  (line.partition(":") for line in block.group(1).splitlines())}
    actual: dict[str, set[str]] = {name: set() for name in floors()}
    for i in INTERNAL:
        source, target = package_of(i.module), package_of(i.target)
        if source not in ("shardlab", target) and target != "shardlab":
            actual.setdefault(source, set()).add(target)
    assert documented == actual


def test_no_upward_import() -> None:
    known = floors()
    upward = [f"{i.module}:{i.line} imports {i.target} (floor {known[package_of(i.target)]} "
              f"> {known[package_of(i.module)]})" for i in INTERNAL
              if package_of(i.target) != "shardlab" and package_of(i.module) != "shardlab"
              and known[package_of(i.target)] > known[package_of(i.module)]]
    assert upward == []


def test_packages_on_one_floor_do_not_import_each_other() -> None:
    known = floors()
    across = [f"{i.module} imports {i.target}" for i in INTERNAL
              if package_of(i.target) not in ("shardlab", package_of(i.module))
              and known.get(package_of(i.target)) == known.get(package_of(i.module))]
    assert across == []


@pytest.mark.parametrize("package", TORCH_FREE)
def test_torch_free_floors_never_import_torch(package: str) -> None:
    found = [f"{i.module}:{i.line} imports {i.target}" for i in ALL
             if package_of(i.module) == package and i.target.split(".")[0] == "torch"]
    assert found == []


def test_no_import_circles() -> None:
    """Module-level imports (what runs when a module loads) form no cycle."""
    graph: dict[str, set[str]] = {}
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    for i in INTERNAL:
        if i.in_function or i.type_only:
            continue
        target = i.target
        while target not in modules and "." in target:
            target = target.rsplit(".", 1)[0]  # a name imported from a module
        if target != i.module:
            graph.setdefault(i.module, set()).add(target)
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                cycles.append([*stack[stack.index(n):], n])
            elif n not in state:
                visit(n)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert cycles == []


def test_function_level_imports_only_keep_torch_out_and_say_so() -> None:
    misplaced = [f"{i.module}:{i.line} ({i.target})" for i in ALL if i.in_function
                 and package_of(i.module) not in LAZY_ALLOWED
                 and i.target.split(".")[0] not in LAZY_PACKAGES]
    assert misplaced == [], "import these at the top of their modules"
    silent = [f"{i.module}:{i.line} ({i.target})" for i in ALL if i.in_function
              and not i.commented]
    assert silent == [], "say in a one-line comment why the import is inside the function"


def test_the_rules_catch_what_they_are_for(tmp_path: Path) -> None:
    """The checker itself: an upward import, torch in the vocabulary and a silent
    function-level import are all seen."""
    bad = tmp_path / "probe.py"
    bad.write_text("import torch\n\nfrom shardlab.plan.search import plan\n\n\n"
                   "def f():\n    import numpy\n    # keeps numpy out\n    import json\n"
                   "    return numpy, json\n")
    by_target = {i.target: i for i in imports_of(bad, "shardlab.config.probe")}
    assert by_target["torch"].module == "shardlab.config.probe"
    assert package_of(by_target["shardlab.plan.search"].target) == "plan"
    assert by_target["numpy"].in_function and not by_target["numpy"].commented
    assert by_target["json"].in_function and by_target["json"].commented
    assert floors()["config"] < floors()["plan"]
