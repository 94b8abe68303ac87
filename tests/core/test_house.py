"""The house rules that keep the tree readable: no import circles and no file over 400 lines.

Imports are read from the AST of every module under core/ and tools/, function-local imports and
`if TYPE_CHECKING:` imports included: a circle closed at run time, or only for the type checker, is
still two modules that cannot be read or changed apart (a Protocol in the lower module breaks a
type-only one). Run as a script to list the violations under some folders:
    python tests/core/test_house.py tools/kv
"""
from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGES = {"core": "mlsyskit.core", "tools": "mlsyskit.tools"}  # folder -> import name (pyproject)
SIZED_FOLDERS = ("core", "tools", "scripts", "tests")
MAX_LINES = 400


def module_name(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = list(rel.parts)
    parts[0] = PACKAGES[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def product_modules() -> dict[str, Path]:
    return {module_name(p): p for top in PACKAGES for p in sorted((REPO / top).rglob("*.py"))}


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports: `from pkg import mod` names the module, else the package."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")
            anchor = anchor[: len(anchor) - (node.level - 1)]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    modules = product_modules()
    known = set(modules)
    return {name: imported_modules(name, path, known) for name, path in modules.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def oversized(folders: Iterable[str] = SIZED_FOLDERS) -> list[tuple[str, int]]:
    big = []
    for folder in folders:
        for path in sorted((REPO / folder).rglob("*.py")):
            if ".venv" in path.parts:
                continue
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                big.append((str(path.relative_to(REPO)), lines))
    return big


def test_no_import_circles() -> None:
    found = circles(import_graph())
    assert not found, "import circles (break them; function-local imports count):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_no_file_over_400_lines() -> None:
    big = oversized()
    assert not big, f"files over {MAX_LINES} lines (split them):\n" + "\n".join(f"{p}: {n}" for p, n in big)


def test_the_circle_finder_finds_a_function_local_circle(tmp_path: Path) -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    source = tmp_path / "m.py"
    source.write_text("import x\ndef f():\n    from y import z\nif TYPE_CHECKING:\n    import t\n")
    assert imported_modules("m", source, {"x", "y", "y.z", "t"}) == {"x", "y.z", "t"}


if __name__ == "__main__":
    folders = [f.rstrip("/") for f in sys.argv[1:]] or list(SIZED_FOLDERS)
    prefixes = tuple(module_name(REPO / f / "__init__.py") for f in folders if f.split("/")[0] in PACKAGES)
    for circle in circles(import_graph()):
        if not prefixes or any(m.startswith(prefixes) for m in circle):
            print("circle:", " <-> ".join(circle))
    for path, lines in oversized([f for f in folders]):
        print(f"too long: {path}: {lines} lines")
