"""The house's layout rules (issues 37 and 56), as tests: no import circle among the project's
modules (imports inside functions included), no module over 450 lines, no folder over 12 modules,
``seeds`` (the bottom layer) importing none of the packages above it, and no package importing
another's ``_private`` module or name: a package's ``__init__`` is its public face."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("evaluator", "evolve", "mutations", "seeds", "archive", "mlflow_runs")
MAX_LINES = 450


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _absolute(package: str, node: ast.ImportFrom) -> str:
    """The module a ``from ... import`` names, a relative one resolved against ``package``."""
    base = node.module or ""
    if not node.level:
        return base
    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
    return ".".join(anchor + ([base] if base else []))


def _face(path: Path, package: str) -> dict[str, str]:
    """What a package's ``__init__`` exports, name -> the module that defines it: its ``from X import
    name`` lines and a lazy ``_EXPORTS = {name: module}`` table (evaluator's)."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom):
            base = _absolute(package, node)
            out.update({alias.asname or alias.name: base for alias in node.names})
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_EXPORTS" for t in node.targets):
            out.update(ast.literal_eval(node.value))
    return out


def _import_nodes(path: Path):
    """Every import statement of the file, at module level or inside a function (a lazy import is
    an edge too: it runs as soon as the function does)."""
    return [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, (ast.Import, ast.ImportFrom))]


def _targets(name: str, path: Path, node) -> list[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _absolute(package, node)
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports, anywhere in the file (a ``from X import y`` of a
    submodule y counts as importing X.y; a name from a package's face, as importing the module
    that defines it)."""
    out = set()
    for node in _import_nodes(path):
        targets = _targets(name, path, node)
        if isinstance(node, ast.ImportFrom) and targets[0] in modules and modules[targets[0]].name == "__init__.py" \
                and targets[0] != name:
            face = _face(modules[targets[0]], targets[0])
            targets += [face[alias.name] for alias in node.names if alias.name in face]
        out |= {t for t in targets if t in modules and t != name}
    return out


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circle_among_the_projects_modules():
    modules = _modules()
    graph = {}
    for name, path in modules.items():
        # A package's own __init__ importing its children is how a package is made, not a circle.
        graph[name] = {m for m in _imports(name, path, modules)
                       if not (path.name == "__init__.py" and m.startswith(name + "."))}
    assert _circles(graph) == []


def test_no_module_over_the_line_limit():
    over = {str(p.relative_to(ROOT)): n for p in _modules().values()
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert over == {}


MAX_MODULES = 12


def test_no_folder_over_the_module_limit():
    over = {}
    for package in PACKAGES:
        for folder in [ROOT / package, *(p for p in (ROOT / package).rglob("*") if p.is_dir())]:
            n = len([p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")])
            if n > MAX_MODULES:
                over[str(folder.relative_to(ROOT))] = n
    assert over == {}


def _cross_package(modules):
    """(importer, imported module, names) for every import of another project package."""
    for name, path in modules.items():
        for node in _import_nodes(path):
            for target in _targets(name, path, node)[:1] if isinstance(node, ast.ImportFrom) else \
                    _targets(name, path, node):
                if target.split(".")[0] in PACKAGES and target.split(".")[0] != name.split(".")[0]:
                    yield name, target, [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else []


def test_seeds_imports_none_of_the_packages_above_it():
    up = sorted({(name, target) for name, target, _ in _cross_package(_modules())
                 if name.split(".")[0] == "seeds" and target.split(".")[0] in ("evaluator", "evolve", "mutations")})
    assert up == []


def test_no_package_reaches_into_another_packages_private_parts():
    private = sorted({(name, target, ", ".join(names)) for name, target, names in _cross_package(_modules())
                      if any(part.startswith("_") for part in target.split("."))
                      or any(n.startswith("_") for n in names)})
    assert private == []


def test_the_import_rules_see_a_lazy_import(tmp_path):
    """The checks read an import inside a function, and a name taken from a package's face counts
    as the module that defines it (so a circle through a face, or a private reach, is still seen)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "__init__.py").write_text("from a._impl import thing\n")
    (tmp_path / "a" / "_impl.py").write_text("def thing():\n    from b import other\n    return other\n")
    (tmp_path / "b.py").write_text("def other():\n    from a import thing\n    from a._impl import thing as t\n")
    modules = {"a": tmp_path / "a" / "__init__.py", "a._impl": tmp_path / "a" / "_impl.py", "b": tmp_path / "b.py"}
    graph = {n: {m for m in _imports(n, p, modules) if not (p.name == "__init__.py" and m.startswith(n + "."))}
             for n, p in modules.items()}
    assert _circles(graph) == [["a._impl", "b"]]
