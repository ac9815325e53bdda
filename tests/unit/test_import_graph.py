"""No import circle inside megatron/: the graph is drawn from every import statement the files hold
(module level, inside functions, under `if TYPE_CHECKING:`), so a circle hidden in a function-local
import fails too. Importing `a.b.c` also runs the packages `a.b` and `a` (their __init__), except
the packages the importing module itself lives in, which are already being imported (a folder
without an __init__.py runs nothing)."""
import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

def _modules(root: str, package: str) -> dict[str, str]:
    """{dotted module name: file} of every .py file under root/package (a package is its __init__)."""
    found = {}
    for folder, _, files in os.walk(os.path.join(root, package)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, root)[:-3].replace(os.sep, ".")
                found[dotted.removesuffix(".__init__")] = path
    return found


def _ancestors(module: str) -> list[str]:
    parts = module.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph(root: str, package: str) -> dict[str, set[str]]:
    """{module: modules of `package` that importing it runs} (see the module docstring)."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.endswith("__init__.py")
        here = module if is_package else module.rpartition(".")[0]
        targets = set()
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: level 1 is this module's package
                    parts = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                # `from pkg import sub` imports the submodule; `from mod import name` the module
                targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                               for alias in node.names)
        own_packages = set(_ancestors(module)) | ({module} if is_package else set())
        edges = set()
        for target in targets:
            while target and target not in modules:  # `import a.b.name`: the module a.b
                target = target.rpartition(".")[0]
            if target:
                edges.update(m for m in [target, *_ancestors(target)] if m in modules and m not in own_packages)
        graph[module] = edges - {module}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_megatron_has_no_import_cycle():
    graph = import_graph(ROOT, "megatron")
    assert len(graph) > 50 and "megatron.model.partition" in graph["megatron.model.analytic"]
    found = cycles(graph)
    assert not found, f"import circles in megatron/ (function-local imports included): {found}"


def test_the_graph_sees_hidden_circles(tmp_path):
    """A circle through a function-local import, one through a TYPE_CHECKING import and one through
    a package __init__ are found; a package importing its own submodules is not a circle."""
    files = {
        "pkg/__init__.py": "from .a import f\n",
        "pkg/a.py": "def f():\n    from pkg.b import g\n    return g\n",
        "pkg/b.py": "from . import a\n",
        "pkg/c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .d import D\n",
        "pkg/d.py": "from pkg.c import *\n",
        "pkg/sub/__init__.py": "from .inner import x\n",
        "pkg/sub/inner.py": "from ..e import y\nx = 1\n",
        "pkg/e.py": "import pkg.sub.other\ny = 2\n",
        "pkg/sub/other.py": "z = 3\n",
        "pkg/lone.py": "from pkg.sub import inner\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = cycles(import_graph(str(tmp_path), "pkg"))
    assert sorted(found) == [["pkg.a", "pkg.b"], ["pkg.c", "pkg.d"],
                             ["pkg.e", "pkg.sub", "pkg.sub.inner"]]


def test_no_test_module_imports_another():
    """Shared fixtures live in tests/conftest.py and shared helpers in tests/support/, so each test
    module is collected once and runs on its own."""
    tests = os.path.join(ROOT, "tests")
    found = []
    for folder, _, files in os.walk(tests):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    tree = ast.parse(f.read(), name)
                for node in ast.walk(tree):
                    imported = ([alias.name for alias in node.names] if isinstance(node, ast.Import)
                                else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                    found += [f"{name}: {module}" for module in imported
                              if module.split(".")[-1].startswith("test_")]
    assert not found, found


def test_tests_are_sorted_by_kind():
    """Test modules live in tests/unit/ (in-process) or tests/integration/ (launches), helpers in
    tests/support/: nothing at the top of tests/ but conftest.py."""
    top = sorted(n for n in os.listdir(os.path.join(ROOT, "tests")) if n.endswith(".py"))
    assert top == ["__init__.py", "conftest.py"]
    support = os.listdir(os.path.join(ROOT, "tests", "support"))
    assert [n for n in support if n.startswith("test_")] == []


# The floors of megatron/'s packages (docs/design.md): a package imports only packages on lower
# floors. megatron/utils.py, the home of the parameter count, is a floor of its own.
FLOORS = {"runtime": 0, "mpu": 1, "data": 1, "tokenizer": 1, "schedules": 1, "model": 2, "utils": 3,
          "metrics": 4, "checkpoint": 5, "config": 6, "training": 7}


def upward_arrows(graph: dict[str, set[str]], floors: dict[str, int]) -> list[str]:
    """'a.x -> b.y' for every import from a package into one on the same or a higher floor; a
    package missing from `floors` is reported too."""
    def package(module: str) -> str | None:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else None  # the root package re-exports only
    found = []
    for module, targets in sorted(graph.items()):
        source = package(module)
        for target in sorted(targets):
            dest = package(target)
            if source is None or dest is None or dest == source:
                continue
            if source not in floors or dest not in floors or floors[dest] >= floors[source]:
                found.append(f"{module} -> {target}")
    return found


def test_megatron_packages_keep_their_floors():
    graph = import_graph(ROOT, "megatron")
    packages = {m.split(".")[1] for m in graph if m.count(".") >= 1}
    assert packages == set(FLOORS), "place a new package of megatron/ on a floor (FLOORS)"
    assert upward_arrows(graph, FLOORS) == []


def test_the_floors_check_sees_an_arrow_up(tmp_path):
    files = {"pkg/__init__.py": "", "pkg/low/__init__.py": "", "pkg/low/a.py": "from pkg.high import b\n",
             "pkg/high/__init__.py": "", "pkg/high/b.py": "x = 1\n", "pkg/high/c.py": "from pkg.low import a\n"}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    graph = import_graph(str(tmp_path), "pkg")
    assert upward_arrows(graph, {"low": 0, "high": 1}) == ["pkg.low.a -> pkg.high", "pkg.low.a -> pkg.high.b"]
    assert upward_arrows(graph, {"low": 0}) == ["pkg.high.c -> pkg.low", "pkg.high.c -> pkg.low.a",
                                                "pkg.low.a -> pkg.high", "pkg.low.a -> pkg.high.b"]
