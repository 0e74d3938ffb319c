"""The walls between the project's packages: who may import whom (issue 32).

Every module's imports are read with `ast`, never run: `import` and `from ... import` statements anywhere
(inside functions too) and `importlib.import_module` / `__import__` calls with a literal name.

    kernels   a leaf: torch, triton, the standard library and kernels only
    backend   (the engine) never server, client, loadtest, benchmarks, tritonclient, triton_python_backend_utils
    client    the wire protocol only: never backend, kernels, server, loadtest, benchmarks
    loadtest  a black-box client: never backend, kernels, benchmarks (it may start a server through server/)
    server    (the launcher) never kernels, client, loadtest, benchmarks

and no import cycle between the packages (e.g. kernels -> backend -> kernels). A violation names its
file, line and import. A package's modules are the .py files of its folder and of its sub-packages
(folders with an __init__.py): kernels/testdata/ holds data and the script that made it, no modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PACKAGES = ("kernels", "backend", "server", "client", "loadtest", "benchmarks")
STDLIB = frozenset(sys.stdlib_module_names)

# package -> (allowed top-level names or None: any but the forbidden, forbidden top-level names)
RULES: dict[str, tuple[frozenset | None, frozenset]] = {
    "kernels": (frozenset({"torch", "triton", "kernels"}) | STDLIB, frozenset()),
    "backend": (None, frozenset({"server", "client", "loadtest", "benchmarks", "tritonclient",
                                 "triton_python_backend_utils"})),
    "client": (None, frozenset({"backend", "kernels", "server", "loadtest", "benchmarks"})),
    "loadtest": (None, frozenset({"backend", "kernels", "benchmarks"})),
    "server": (None, frozenset({"kernels", "client", "loadtest", "benchmarks"})),
}


def modules(package: str, root: Path = ROOT) -> list[Path]:
    """The .py files of `package`'s folder and of its sub-packages, sorted."""
    base = root / package
    return [path for path in sorted(base.rglob("*.py"))
            if all((base / Path(*path.parent.relative_to(base).parts[:i + 1]) / "__init__.py").is_file()
                   for i in range(len(path.parent.relative_to(base).parts)))]


def _package_of(path: Path) -> str:
    """The dotted package that holds `path`: its folder and the enclosing folders with an __init__.py."""
    parts, folder = [], path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str, str]]:
    """(line, absolute module name, the import as written) of every import in the file; relative imports
    resolve within the file's own package."""
    own = _package_of(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                found.append((node.lineno, alias.name, f"import {alias.name}"))
        elif isinstance(node, ast.ImportFrom):
            names = ", ".join(a.name for a in node.names)
            written = f"from {'.' * node.level}{node.module or ''} import {names}"
            if node.level:  # relative: within the file's package
                parts = own.split(".") if own else []
                base = parts[: len(parts) - (node.level - 1)] if node.level > 1 else parts
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module
            found.append((node.lineno, module, written))
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name in ("import_module", "__import__"):
                found.append((node.lineno, node.args[0].value, f"{name}({node.args[0].value!r})"))
    return sorted(found)


def violations(package: str, root: Path = ROOT) -> list[str]:
    allowed, forbidden = RULES[package]
    out = []
    for path in modules(package, root):
        for line, module, written in imports(path):
            top = module.split(".")[0]
            if top in forbidden or (allowed is not None and top not in allowed):
                out.append(f"{path.relative_to(root)}:{line}: {written}")
    return out


def package_edges(root: Path = ROOT) -> dict[tuple[str, str], str]:
    """(importer, imported) between two of PACKAGES -> the first import that makes the edge (file:line)."""
    edges = {}
    for package in PACKAGES:
        for path in modules(package, root):
            for line, module, written in imports(path):
                top = module.split(".")[0]
                if top in PACKAGES and top != package:
                    edges.setdefault((package, top), f"{path.relative_to(root)}:{line}: {written}")
    return edges


def find_cycle(edges) -> list[str] | None:
    """A cycle [a, b, ..., a] in the graph of `edges`, or None."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


@pytest.mark.parametrize("package", sorted(RULES))
def test_wall(package):
    assert modules(package), f"{package}/ has no modules: the rule checks nothing"
    allowed, forbidden = RULES[package]
    rule = (f"{package} imports only {', '.join(sorted(allowed - STDLIB))} and the standard library"
            if allowed is not None else f"{package} never imports {', '.join(sorted(forbidden))}")
    found = violations(package)
    if found:
        pytest.fail(f"{rule}; broken by:\n  " + "\n  ".join(found), pytrace=False)


def test_no_import_cycle_between_packages():
    edges = package_edges()
    assert ("backend", "kernels") in edges  # the graph is read at all
    cycle = find_cycle(edges)
    if cycle:
        pytest.fail("import cycle between packages " + " -> ".join(cycle) + ":\n  " + "\n  ".join(
            edges[(a, b)] for a, b in zip(cycle, cycle[1:])), pytrace=False)


def test_reader_sees_every_kind_of_import(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "m.py").write_text(
        "import os, a.b\nfrom c.d import e\n\ndef f():\n    from g import h\n    import importlib\n"
        "    importlib.import_module('i.j')\n    return __import__('k')\nfrom . import x\nfrom ..y import z\n")
    got = [(line, module) for line, module, _ in imports(pkg / "sub" / "m.py")]
    assert got == [(1, "a.b"), (1, "os"), (2, "c.d"), (5, "g"), (6, "importlib"), (7, "i.j"), (8, "k"),
                   (9, "pkg.sub"), (10, "pkg.y")]
    assert find_cycle({("a", "b"): "", ("b", "c"): "", ("c", "a"): ""}) == ["a", "b", "c", "a"]
    assert find_cycle({("a", "b"): "", ("a", "c"): "", ("b", "c"): ""}) is None


def test_a_violation_names_file_line_and_import(tmp_path):
    (tmp_path / "kernels" / "data").mkdir(parents=True)
    (tmp_path / "kernels" / "__init__.py").write_text("")
    (tmp_path / "kernels" / "k.py").write_text("import torch\n\n\ndef f():\n    from backend.kv_formats import gauss_codebook\n")
    (tmp_path / "kernels" / "data" / "make.py").write_text("import transformers\n")  # not a package: not a module
    (tmp_path / "backend").mkdir()
    (tmp_path / "backend" / "m.py").write_text("import kernels.k\n")
    assert violations("kernels", tmp_path) == ["kernels/k.py:5: from backend.kv_formats import gauss_codebook"]
    edges = package_edges(tmp_path)
    assert find_cycle(edges) == ["backend", "kernels", "backend"]
    assert edges[("kernels", "backend")] == "kernels/k.py:5: from backend.kv_formats import gauss_codebook"
