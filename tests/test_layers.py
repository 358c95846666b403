"""The package's layers import only the layers below them (README, "How it works"), functions' own
imports included: an import upward is a cycle waiting to happen and a seam that stopped being one."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "playground"
# lowest first; a module sits in the layer of its first path part under playground/
# (app_process.py, the app in a subprocess for tests and benchmarks, and the CLI's options.py, terminal.py
# and healthcheck.py are beside the layers the README names)
LAYERS = [("errors", "settings", "local_server", "app_process", "malloc_arenas"), ("model",), ("engines",), ("prompts",), ("plots",),
          ("evaluation",), ("studies",), ("training",), ("ui",), ("cli", "__main__", "options", "terminal", "healthcheck")]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        assert not (isinstance(node, ast.ImportFrom) and node.level), f"{path}: a relative import"
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("playground."):
            found.add(node.module)
        elif isinstance(node, ast.ImportFrom) and node.module == "playground":
            found |= {f"playground.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("playground.")}
    return found


def test_every_module_of_the_package_sits_in_a_layer():
    parts = {(p.relative_to(PACKAGE).parts[0]).removesuffix(".py") for p in PACKAGE.rglob("*.py")}
    assert parts - {"__init__"} <= set(RANK), f"not in LAYERS: {parts - {'__init__'} - set(RANK)}"


def upward(package: Path) -> list[str]:
    found = []
    for path in package.rglob("*.py"):
        own = path.relative_to(package).parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        found += [f"{path.relative_to(package.parent)} imports {module}" for module in sorted(imports(path))
                  if RANK[layer(module)] > RANK[own]]
    return found


def test_no_module_imports_a_layer_above_its_own():
    assert not upward(PACKAGE), "\n".join(upward(PACKAGE))


def test_the_check_finds_an_import_upward(tmp_path):
    """Function-level imports and both import forms are read, and one layer importing a higher one is found."""
    package = tmp_path / "playground"
    (package / "engines").mkdir(parents=True)
    (package / "engines" / "m.py").write_text("def f():\n    from playground.ui import app\n"
                                              "    import playground.cli.bench\nfrom playground import plots\n"
                                              "from playground.model import target\n")
    assert imports(package / "engines" / "m.py") == {"playground.ui", "playground.cli.bench", "playground.plots",
                                                     "playground.model"}
    assert upward(package) == [f"playground/engines/m.py imports playground.{m}" for m in ("cli.bench", "plots", "ui")]


def module_graph(package: Path) -> dict[str, set[str]]:
    """Each module of the package and the modules it imports (a name imported from a package counts as its
    module where it is one)."""
    def name(path: Path) -> str:
        parts = path.relative_to(package.parent).with_suffix("").parts
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    modules = {name(path): path for path in package.rglob("*.py")}
    graph = {}
    for module, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == package.name:
                found |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else node.module
                          for a in node.names}
            elif isinstance(node, ast.Import):
                found |= {a.name for a in node.names}
        graph[module] = {m for m in found if m in modules and m != module}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import one another, directly or around a circle (strongly connected
    components of more than one module), functions' own imports included."""
    order, low, stack, found = {}, {}, [], []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for other in graph[module]:
            if other not in order:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], order[other])
        if low[module] == order[module]:
            group = stack[stack.index(module):]
            del stack[stack.index(module):]
            if len(group) > 1:
                found.append(sorted(group))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_no_two_modules_import_each_other():
    assert not circles(module_graph(PACKAGE))


def test_the_circle_check_finds_a_circle_through_a_function_level_import(tmp_path):
    package = tmp_path / "playground"
    (package / "model").mkdir(parents=True)
    (package / "model" / "__init__.py").write_text("")
    (package / "model" / "a.py").write_text("from playground.model import b\n")
    (package / "model" / "b.py").write_text("import playground.model.c\n")
    (package / "model" / "c.py").write_text("def f():\n    from playground.model.a import g\n")
    (package / "model" / "d.py").write_text("from playground.model import a\n")
    assert circles(module_graph(package)) == [["playground.model.a", "playground.model.b", "playground.model.c"]]


def test_the_page_is_imported_by_app_py_alone():
    outside = [path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] != "ui"
               and any(layer(module) == "ui" for module in imports(path))]
    assert not outside and any(layer(m) == "ui" for m in imports(PACKAGE.parent / "app.py"))
