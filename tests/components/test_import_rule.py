"""The folder contract (DESIGN.md §2): a component imports only `_shared` and itself, never another component, and
`_shared` imports no component. Checked on the source with `ast` (as kubeflow/pipelines-components'
.github/scripts/check_imports/check_imports.py does), so imports inside functions — component bodies — count too.

Run alone with `python -m pytest tests/components/test_import_rule.py` (`make lint` does).
"""

from __future__ import annotations

import ast
from pathlib import Path

COMPONENTS = Path(__file__).resolve().parents[2] / "components"
PACKAGE = "kfp_finetune.components"
SHARED = "_shared"


def imported_modules(path: Path, root: Path = COMPONENTS) -> list[tuple[int, str]]:
    """(line, absolute module) for every import in the file; relative imports resolved against its package."""
    package = [*PACKAGE.split("."), *path.relative_to(root).parts[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package[: len(package) - node.level + 1], *([base] if base else [])])
            if node.module is None or (node.level and base == PACKAGE):
                # `from . import x` / `from kfp_finetune.components import evaluate`: each name is a module.
                found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, base))
    return sorted(found)


def violations(root: Path = COMPONENTS) -> list[str]:
    """'file:line: imports module (why)' for every import that breaks the rule."""
    found = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if len(parts) < 2:
            continue  # components/__init__.py
        room = parts[0]
        for line, module in imported_modules(path, root):
            if module == "components" or module.startswith("components."):
                module = f"kfp_finetune.{module}"
            if not module.startswith(PACKAGE + "."):
                continue
            target = module.split(".")[2]
            if target == SHARED or (target == room and room != SHARED):
                continue
            where = path.relative_to(root).as_posix()
            why = (
                "_shared imports no component"
                if room == SHARED
                else f"{room} may import only _shared and itself"
            )
            found.append(f"components/{where}:{line}: imports {module} ({why})")
    return found


def test_components_import_only_shared_and_themselves():
    found = violations()
    assert not found, "the import rule is broken (DESIGN.md §2):\n" + "\n".join(found)


def test_the_check_sees_a_forbidden_import(tmp_path):
    """The walk finds imports at any depth, relative ones, and the `_shared` direction."""
    (tmp_path / "alpha").mkdir()
    (tmp_path / "_shared").mkdir()
    (tmp_path / "alpha" / "a.py").write_text(
        "import os\n"
        "from kfp_finetune.components._shared import errors\n"
        "from kfp_finetune.components.alpha import b\n"
        "def body():\n"
        "    from kfp_finetune.components.beta.x import y\n"
        "from ..beta import z\n"
    )
    (tmp_path / "_shared" / "s.py").write_text("import kfp_finetune.components.alpha.a\n")
    found = violations(tmp_path)
    assert found == [
        "components/_shared/s.py:1: imports kfp_finetune.components.alpha.a (_shared imports no component)",
        "components/alpha/a.py:5: imports kfp_finetune.components.beta.x (alpha may import only _shared and itself)",
        "components/alpha/a.py:6: imports kfp_finetune.components.beta (alpha may import only _shared and itself)",
    ]
