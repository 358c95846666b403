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


def test_the_page_is_imported_by_app_py_alone():
    outside = [path for path in PACKAGE.rglob("*.py") if path.relative_to(PACKAGE).parts[0] != "ui"
               and any(layer(module) == "ui" for module in imports(path))]
    assert not outside and any(layer(m) == "ui" for m in imports(PACKAGE.parent / "app.py"))
