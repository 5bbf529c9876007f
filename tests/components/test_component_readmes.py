"""Every component's README.md is generated from its docstring and signature, and is current."""

from __future__ import annotations

import textwrap

import pytest

from kfp_finetune import component_readme
from kfp_finetune.cli import main


def test_every_component_readme_is_current():
    folders = component_readme.discover()
    assert {"dataset_initialize", "model_initialize"} <= {f.folder.name for f in folders}
    stale = component_readme.stale_readmes()
    assert not stale, f"stale READMEs (run `kfp-finetune component-readmes`): {[str(p) for p in stale]}"


@pytest.mark.parametrize("folder", component_readme.discover(), ids=lambda f: f.folder.name)
def test_readme_documents_every_input_and_output(folder):
    rows = {}
    for line in folder.readme.read_text().splitlines():
        if line.startswith("| `"):
            cells = [cell.strip() for cell in line.strip("|").split(" | ")]
            rows[cells[0].strip("`")] = cells[-1]
    for component in component_readme.components_in(folder.module):
        spec = component.component_spec
        assert spec.description, f"{spec.name}: no docstring"
        for name in [*spec.inputs, *(spec.outputs or {})]:
            assert rows.get(name), f"{spec.name}: `{name}` is not documented in the docstring's Args/Returns"


def test_generator_discovers_new_components_and_check_fails_when_stale(tmp_path, monkeypatch):
    """A component someone adds later is found by its folder; --check reports its missing README."""
    package = tmp_path / "pkg"
    (package / "new_step").mkdir(parents=True)
    (package / "_shared").mkdir()
    (package / "__init__.py").write_text("")
    (package / "new_step" / "__init__.py").write_text("")
    (package / "new_step" / "component.py").write_text(
        textwrap.dedent(
            '''
            from kfp import dsl


            @dsl.component
            def new_step(x: int, label: str = "a|b") -> str:
                """Does a new thing.

                Args:
                    x: How many.
                    label: A label.

                Returns:
                    The result.
                """
                return str(x)
            '''
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    folders = component_readme.discover(package, "pkg")
    assert [f.folder.name for f in folders] == ["new_step"]
    assert component_readme.stale_readmes(package, "pkg") == [package / "new_step" / "README.md"]
    assert component_readme.write_readmes(package, "pkg") == [package / "new_step" / "README.md"]
    assert component_readme.stale_readmes(package, "pkg") == []
    text = (package / "new_step" / "README.md").read_text()
    assert text.startswith(component_readme.GENERATED_NOTE)
    assert "# new-step\n\nDoes a new thing." in text
    assert "| `x` | int | required | How many. |" in text
    assert '| `label` | str | `"a\\|b"` | A label. |' in text
    assert "| `Output` | str | The result. |" in text


def test_cli_check_passes_on_the_repository(capsys):
    assert main(["component-readmes", "--check"]) == 0
