"""Every message a step shows names each setting as a pipeline user sets it: a parameter of the one table
(`tune_learning_rate`, `data_column_map`), never the component argument it feeds (`learning_rate`, `column_map`),
and never a name no pipeline has. The walk reads the literal text of every raise, warning and error log call in
components/ (issue 23 item 5); a torchtune config key in `backquotes` or dotted (`tokenizer.max_seq_len`) is not a
setting."""

import ast
import re
from pathlib import Path

import pytest

from kfp_finetune.pipelines.parameters import PARAMETERS, TABLE

COMPONENTS = Path(__file__).parents[2] / "components"
FILES = sorted(p for p in COMPONENTS.rglob("*.py") if p.name != "__init__.py" or p.stat().st_size)
# A word with a stage prefix, not in `backquotes` (a field of a file format, such as a dataset card's `data_files`).
PARAMETER_WORD = re.compile(r"(?<![\w.`])((?:data|tune|eval|export|model|sweep)_[a-z_]*[a-z])(?![\w])")


def argument_names(component: str | None) -> dict[str, str]:
    """Component argument -> the pipeline parameter feeding it, where the names differ. For _shared modules (no
    component of their own): the arguments that feed one pipeline parameter only, whichever component has them."""
    feeds = [
        (target.partition(".")[0], target.partition(".")[2], p.name)
        for p in TABLE
        for target in p.feeds
        if target.partition(".")[2] != p.name
    ]
    if component:
        return {argument: name for owner, argument, name in feeds if owner == component}
    fed: dict[str, set[str]] = {}
    for _, argument, name in feeds:
        fed.setdefault(argument, set()).add(name)
    return {argument: names.pop() for argument, names in fed.items() if len(names) == 1}


def named_as_setting(argument: str, text: str) -> bool:
    """`learning_rate must be > 0` or `set method=full`, not `the model's config` or `tokenizer.max_seq_len`."""
    if "_" in argument:
        return re.search(rf"(?<![\w.`/-]){argument}(?![\w.(`])", text) is not None
    return (
        re.search(rf"(?<![\w.`/-]){argument}(=|\s+must\b|\s+is not one of\b)|\bset {argument}\b", text)
        is not None
    )


def messages(path: Path) -> list[tuple[int, str]]:
    """(line, text) of what reaches the user: the literal text of each raise, warning and error log call, and
    the setting names given to components/_shared/unset.py (its errors name them)."""
    tree = ast.parse(path.read_text())
    # Strings inside {placeholders} (a subscript such as p['eval_fraction']) are code, not text; so is the setting
    # a SettingError / one_of names, which pre-flight shows as its pipeline parameter (errors.SettingError.named).
    code = {id(c) for f in ast.walk(tree) if isinstance(f, ast.FormattedValue) for c in ast.walk(f.value)}
    code |= {
        id(call.args[0])
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and getattr(call.func, "id", "") in ("SettingError", "one_of")
        and call.args
    }
    found = []
    for node in ast.walk(tree):
        called = node.func.attr if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) else ""
        if isinstance(node, ast.Raise) or called in ("warning", "error"):
            parts = [
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and id(c) not in code
            ]
            found.append((node.lineno, " ".join(parts)))
        elif called in ("switch", "value") and node.args and isinstance(node.args[0], ast.Constant):
            found.append((node.lineno, str(node.args[0].value)))
    return sorted(found)


def owner(path: Path) -> str | None:
    folder = path.relative_to(COMPONENTS).parts[0]
    return None if folder == "_shared" else folder


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(COMPONENTS)))
def test_messages_name_pipeline_parameters_not_component_arguments(path):
    arguments = argument_names(owner(path))
    shown = messages(path)
    wrong = [
        f"{path.name}:{line}: {argument} (the pipeline parameter is {arguments[argument]}): {text[:120]!r}"
        for line, text in shown
        for argument in arguments
        if named_as_setting(argument, text)
    ]
    assert not wrong, "\n".join(wrong)
    unknown = [
        f"{path.name}:{line}: {word}" for line, text in shown for word in PARAMETER_WORD.findall(text)
        if word not in PARAMETERS
    ]  # fmt: skip
    assert not unknown, "messages name parameters no pipeline has:\n" + "\n".join(unknown)


def test_the_walk_finds_component_arguments_and_unknown_names(tmp_path):
    source = tmp_path / "step.py"
    source.write_text(
        'raise ValueError("map them with column_map")\nlog.warning("set data_fromat")\n'
        'raise ConfigError("method=lorra is not a method")\nraise ConfigError("tokenizer.max_seq_len is 8")\n'
    )
    shown = messages(source)
    assert [line for line, _ in shown] == [1, 2, 3, 4]
    arguments = argument_names("torchtune_finetune") | argument_names("dataset_initialize")
    assert named_as_setting("column_map", shown[0][1]) and arguments["column_map"] == "data_column_map"
    assert "data_fromat" in PARAMETER_WORD.findall(shown[1][1]) and "data_fromat" not in PARAMETERS
    assert named_as_setting("method", shown[2][1]) and arguments["method"] == "tune_method"
    assert not named_as_setting("max_seq_len", shown[3][1])
    assert not named_as_setting("config", "config.json lacks head_dim")
