"""dataset-initialize's messages name each setting as a pipeline user sets it: a parameter of the one table
(`data_column_map`), never the component argument it feeds (`column_map`)."""

import ast
import re
from pathlib import Path

import pytest

from kfp_finetune.pipelines.parameters import PARAMETERS, TABLE

FOLDER = Path(__file__).parents[3] / "components" / "dataset_initialize"
# The component argument -> the pipeline parameter that feeds it, where the two names differ.
ARGUMENT_NAMES = {
    target.partition(".")[2]: p.name
    for p in TABLE
    for target in p.feeds
    if target.startswith("dataset_initialize.") and target.partition(".")[2] != p.name
}
# A word with a stage prefix, not in `backquotes` (a field of a file format, such as a dataset card's `data_files`).
PARAMETER_WORD = re.compile(r"(?<![\w.`])((?:data|tune|eval|export|model|sweep)_[a-z_]*[a-z])(?![\w])")


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what reaches the user: the literal text of each raise, warning and error log call, and
    the setting names given to components/_shared/unset.py (its errors name them)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else ""
        if isinstance(node, ast.Raise) or called in ("warning", "error"):
            parts = [
                c.value for c in ast.walk(node) if isinstance(c, ast.Constant) and isinstance(c.value, str)
            ]
            found.append((node.lineno, " ".join(parts)))
        elif called in ("switch", "value") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return found


@pytest.mark.parametrize("name", ["sources.py", "formats.py", "cards.py", "component.py"])
def test_messages_name_pipeline_parameters_not_component_arguments(name):
    shown = messages(FOLDER / name)
    assert shown
    wrong = [
        f"{name}:{line}: {argument} (the pipeline parameter is {ARGUMENT_NAMES[argument]}): {text[:120]!r}"
        for line, text in shown
        for argument in ARGUMENT_NAMES
        if re.search(rf"(?<![\w.]){argument}(?!\w)", text)
    ]
    assert not wrong, "\n".join(wrong)
    unknown = [
        f"{name}:{line}: {word}" for line, text in shown for word in PARAMETER_WORD.findall(text)
        if word not in PARAMETERS
    ]  # fmt: skip
    assert not unknown, "messages name parameters no pipeline has:\n" + "\n".join(unknown)


def test_the_walk_finds_a_component_argument_in_a_message(tmp_path):
    source = tmp_path / "step.py"
    source.write_text('raise ValueError("map them with column_map")\nlog.warning("set data_fromat")\n')
    assert messages(source) == [(1, "map them with column_map"), (2, "set data_fromat")]
    assert "column_map" in ARGUMENT_NAMES and "data_fromat" not in PARAMETERS
