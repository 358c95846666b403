"""The package's layers import only the layers below them (README, "How it works"), functions' own
imports included: an import upward is a cycle waiting to happen and a seam that stopped being one."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "playground"
# lowest first; a module sits in the layer of its first path part under playground/
LAYERS = [("errors", "settings", "local_server", "app_process"), ("model",), ("engines",), ("prompts",), ("plots",),
          ("evaluation",), ("studies",), ("training",), ("terminal", "options", "healthcheck"),
          ("ui",), ("cli", "__main__")]
RANK = {part: rank for rank, parts in enumerate(LAYERS) for part in parts}


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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


def test_no_module_imports_a_layer_above_its_own():
    upward = []
    for path in PACKAGE.rglob("*.py"):
        own = path.relative_to(PACKAGE).parts[0].removesuffix(".py")
        if own == "__init__":
            continue
        for module in imports(path):
            other = layer(module)
            if RANK[other] > RANK[own]:
                upward.append(f"{path.relative_to(PACKAGE.parent)} imports {module}")
    assert not upward, "\n".join(upward)


def test_the_check_finds_an_import_upward(tmp_path):
    """The walk reads function-level imports and both import forms."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from playground.ui import app\n    import playground.cli.bench\n"
                      "from playground import plots\n")
    assert imports(source) == {"playground.ui", "playground.cli.bench", "playground.plots"}
