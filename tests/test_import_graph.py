"""The modules of jupyter_ckpt and jupyter_ckpt_server import each other in one direction:
no module reaches, through its imports, back to itself.

The graph is read from the source with :mod:`ast`, without importing anything, and counts
every import statement: at module level, under ``if TYPE_CHECKING:`` (a loop that only
the type checker sees is still two modules that each need the other to be understood)
and inside functions (a deferred import is a call back up just the same). ``from package
import name`` depends on the submodule ``package.name`` where there is one, else on the
package; a submodule's own dependence on its parent package (which Python imports first)
is not an edge.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {
    "jupyter_ckpt": ROOT / "jupyter_ckpt",
    "jupyter_ckpt_server": ROOT / "server_extension" / "jupyter_ckpt_server",
}

Graph = dict[str, set[str]]


def modules(packages: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of the packages."""
    found = {}
    for name, root in packages.items():
        for path in sorted(root.rglob("*.py")):
            parts = [name, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(module: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that ``module`` (source at ``path``) imports."""
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                names.add(submodule if submodule in known else source)
    return {name for name in names if name in known and name != module}


def import_graph(packages: dict[str, Path]) -> Graph:
    found = modules(packages)
    return {m: imported(m, path, set(found)) for m, path in found.items()}


def loops(graph: Graph) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm,
    iterative), each sorted; a module in none of them is on no loop."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []
    work: list[tuple[str, Iterator[str]]] = []  # the depth-first path, with edges left

    def enter(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        work.append((node, iter(sorted(graph[node]))))

    for start in sorted(graph):
        if start in index:
            continue
        enter(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    enter(target)
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
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
    return groups


def describe(graph: Graph, group: list[str]) -> str:
    members = set(group)
    return "\n".join(f"  {m} imports {', '.join(sorted(graph[m] & members))}" for m in group)


def test_no_import_loops() -> None:
    graph = import_graph(PACKAGES)
    assert "jupyter_ckpt.store.imagestore" in graph and "jupyter_ckpt_server.manager" in graph
    found = loops(graph)
    assert not found, "modules that import each other:\n" + "\n\n".join(
        describe(graph, group) for group in found
    )


def test_a_planted_loop_is_found(tmp_path: Path) -> None:
    """The check sees a loop through a relative import, a TYPE_CHECKING block and a
    function's import, and no loop in a package whose modules import their parent."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .a import A\n",
        "a.py": "from .sub import b\nA = 1\n",
        "sub/__init__.py": "",
        "sub/b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .. import c\n",
        "c.py": "def f():\n    from pkg import a\n",
        "d.py": "import pkg\nfrom pkg import A\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    graph = import_graph({"pkg": package})
    assert loops(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (package / "c.py").write_text("def f():\n    return 1\n")
    assert loops(import_graph({"pkg": package})) == []
