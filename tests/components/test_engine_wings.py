"""The engine-wings rule (issue 28): each engine's knowledge lives in its wing, `components/_shared/<engine>/`,
and the steps above reach it only through the wing's face (`_shared/engines.py`). Checked on the source with
`ast`, like the import rule (test_import_rule.py), so imports inside functions count too:

- an engine's packages (the face's PACKAGES, e.g. torchtune and torchao) are imported only in its wing;
- no module outside the wings compares a value with an engine's name (choosing by engine is the registry's job);
- the later steps (evaluate, export, sweep, quality-gate) read a run folder only through the face: they import
  none of a wing's run-folder modules.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

from kfp_finetune.components._shared import engines
from tests.components.test_import_rule import COMPONENTS, PACKAGE, imported_modules

LATER_STEPS = ("evaluate", "export", "sweep", "quality_gate")
# Every wing, registered or still being built: a folder of _shared/ with a face module.
WINGS = tuple(sorted(path.parent.name for path in (COMPONENTS / "_shared").glob("*/face.py")))
RUN_FOLDER_MODULES = ("run_layout", "merge", "lora_model", "evaluation")


def wing_of(path: Path, root: Path) -> str | None:
    parts = path.relative_to(root).parts
    return parts[1] if len(parts) > 2 and parts[0] == "_shared" and parts[1] in WINGS else None


def _face_module(wing: str):
    return importlib.import_module(f"{PACKAGE}._shared.{wing}.face")


def package_violations(
    root: Path = COMPONENTS, packages: dict[str, tuple[str, ...]] | None = None
) -> list[str]:
    packages = packages or {name: _face_module(name).PACKAGES for name in WINGS}
    found = []
    for path in sorted(root.rglob("*.py")):
        wing = wing_of(path, root)
        for line, module in imported_modules(path, root):
            top = module.split(".")[0]
            for engine, names in packages.items():
                if top in names and wing != engine:
                    found.append(
                        f"{path.relative_to(root).as_posix()}:{line}: imports {module} ({engine}'s wing only)"
                    )
    return found


def engine_name_comparisons(root: Path = COMPONENTS, names: tuple[str, ...] = WINGS) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if wing_of(path, root) or path.relative_to(root).as_posix() == "_shared/engines.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                values = [
                    elt
                    for o in operands
                    for elt in (o.elts if isinstance(o, ast.Tuple | ast.List | ast.Set) else [o])
                ]
            elif isinstance(node, ast.match_case) and isinstance(node.pattern, ast.MatchValue):
                values, node = [node.pattern.value], node.pattern
            else:
                continue
            for value in values:
                if isinstance(value, ast.Constant) and value.value in names:
                    found.append(
                        f"{path.relative_to(root).as_posix()}:{node.lineno}: compares with {value.value!r}"
                    )
    return found


def run_folder_reads(root: Path = COMPONENTS) -> list[str]:
    wings = {f"{PACKAGE}._shared.{name}" for name in WINGS}
    found = []
    for step in LATER_STEPS:
        for path in sorted((root / step).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module in wings:
                    modules = [f"{node.module}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    modules = [node.module or ""]
                else:
                    continue
                for module in modules:
                    wing, _, rest = module.rpartition(".")
                    while wing and wing not in wings:
                        wing, _, rest = wing.rpartition(".")
                    if wing and rest in RUN_FOLDER_MODULES:
                        where = path.relative_to(root).as_posix()
                        found.append(
                            f"{where}:{node.lineno}: imports {module} (read a run through engines.face)"
                        )
    return found


def test_engine_packages_are_imported_only_in_their_wing():
    found = package_violations()
    assert not found, "an engine's package imported outside its wing:\n" + "\n".join(found)


def test_nothing_outside_the_wings_branches_on_an_engine_name():
    found = engine_name_comparisons()
    assert not found, "choose by engine through _shared/engines.py:\n" + "\n".join(found)


def test_later_steps_read_a_run_only_through_the_face():
    found = run_folder_reads()
    assert not found, "\n".join(found)


def test_the_rules_cover_every_wing_and_each_wing_names_itself():
    assert {"torchtune", "transformers"} <= set(WINGS)
    assert set(engines.WINGS) <= set(WINGS)
    for wing in WINGS:
        assert wing == _face_module(wing).NAME


def test_every_registered_wing_has_the_whole_face_and_lives_in_its_folder():
    for name, module in engines.WINGS.items():
        face = engines.face(name)
        assert name == face.NAME
        assert [attr for attr in engines.FACE if not hasattr(face, attr)] == []
        assert Path(face.__file__).parent == COMPONENTS / "_shared" / name
        assert importlib.import_module(module) is face


def test_the_default_engine_answers_for_models_recorded_without_one():
    assert engines.face("") is engines.face(engines.DEFAULT_ENGINE)


def test_an_unknown_engine_is_refused_by_name():
    import pytest

    from kfp_finetune.components._shared.errors import ConfigError

    with pytest.raises(ConfigError, match="'megatron'.*known: torchtune"):
        engines.face("megatron")


def test_the_checks_see_what_they_forbid(tmp_path):
    """A package import outside its wing (at any depth), a comparison and a match on an engine name, and a later
    step importing a wing's run-folder module are all found; the same inside the wing are not."""
    (tmp_path / "_shared" / "torchtune").mkdir(parents=True)
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "_shared" / "torchtune" / "ok.py").write_text("import torchtune\nif e == 'torchtune': pass\n")
    (tmp_path / "evaluate" / "bad.py").write_text(
        "def f(engine):\n"
        "    from torchao.dtypes import x\n"
        "    if engine in ('torchtune', 'other'):\n"
        "        pass\n"
        "    match engine:\n"
        "        case 'torchtune':\n"
        "            pass\n"
        "from kfp_finetune.components._shared.torchtune.run_layout import RESOLVED_CONFIG\n"
        "from kfp_finetune.components._shared.torchtune import merge\n"
    )
    assert package_violations(tmp_path, {"torchtune": ("torchtune", "torchao")}) == [
        "evaluate/bad.py:2: imports torchao.dtypes (torchtune's wing only)"
    ]
    assert [v.split(": ", 1)[0] for v in engine_name_comparisons(tmp_path)] == [
        "evaluate/bad.py:3",
        "evaluate/bad.py:6",
    ]
    assert [v.split(": ", 1)[0] for v in run_folder_reads(tmp_path)] == [
        "evaluate/bad.py:8",
        "evaluate/bad.py:9",
    ]
