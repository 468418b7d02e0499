"""The package's parts import only downwards, and no two modules import each other (docs/architecture.md).

Every `import` and `from ... import` of a `vlm_grpo` module, at module level or inside a function, is read from the
sources (nothing is imported). Each module belongs to a part (its subpackage, or itself at the package's root), and
each part has a level: a module may import its own part or a part of a lower level, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "vlm_grpo"

LEVELS = {
    "errors": 0, "device": 0, "advantages": 0,
    "dotted": 1, "trl_options": 1, "data": 1,
    "config": 2, "rewards": 2, "models": 2, "runtime": 2,
    "policy": 3,
    "rollout": 4, "planner": 4, "testing": 4,
    "trainer": 5,
    "cli": 6,
    "train": 7,
    "demos": 8, "__main__": 8, "__init__": 8,
}  # fmt: skip
"""Each part's level: the higher imports the lower (the root's `__init__` hands on the public names)."""


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """The `vlm_grpo` modules `path` imports (a name imported from a package counts as its module if it is one)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("vlm_grpo")}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join([*base, *([node.module] if node.module else [])])
            if not target.startswith("vlm_grpo"):
                continue
            for alias in node.names:
                child = f"{target}.{alias.name}"
                is_module = (PACKAGE.parent / Path(*child.split("."))).with_suffix(".py").is_file() or (
                    PACKAGE.parent / Path(*child.split("."))
                ).is_dir()
                found.add(child if is_module else target)
    return found


def part(module: str) -> str:
    pieces = module.split(".")
    return pieces[1] if len(pieces) > 1 else "__init__"


def graph() -> dict[str, set[str]]:
    return {module_name(p): imported(p) - {module_name(p)} for p in PACKAGE.rglob("*.py")}


def test_every_part_has_a_level():
    parts = {part(m) for m in graph()}
    assert parts <= set(LEVELS), sorted(parts - set(LEVELS))


def test_imports_run_down_the_parts():
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph().items()
        for target in targets
        if part(target) != part(module) and LEVELS[part(target)] >= LEVELS[part(module)]
    )
    assert upward == []


def test_no_module_imports_itself_back():
    edges = graph()
    circles = []

    def visit(start: str, module: str, path: list[str]) -> None:
        for target in edges.get(module, ()):
            if target == start:
                circles.append(" -> ".join([*path, target]))
            elif target not in path and target in edges and len(path) < 12:
                visit(start, target, [*path, target])

    for module in edges:
        visit(module, module, [module])
    packages = {m for m in edges if (PACKAGE.parent / Path(*m.split("."))).is_dir()}
    # a package's `__init__` handing on its modules' names is not a circle
    real = [c for c in circles if not any(p in packages for p in c.split(" -> "))]
    assert real == []
