"""The tests mirror the source tree: a component's tests sit in tests/components/<name>/, beside its contract."""

from pathlib import Path

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
# Folders of tests that are not about one source folder of the same name.
OWN_FOLDERS = {"components", "pipelines", "cli", "deploy", "support", "benchmarks", "tools", "__pycache__"}


def test_no_test_file_outside_the_mirrored_folders():
    assert sorted(p.name for p in TESTS.glob("test_*.py")) == ["test_layout.py"]
    assert {p.name for p in TESTS.iterdir() if p.is_dir()} <= OWN_FOLDERS


def test_each_component_test_folder_names_a_component():
    for folder in (TESTS / "components").iterdir():
        if folder.is_dir() and folder.name != "__pycache__":
            assert (REPO / "components" / folder.name / "__init__.py").is_file(), folder.name


def test_the_files_dispatched_first_exist():
    """A renamed file would silently fall back to the end of the queue (tests/conftest.py's LONGEST_FILES)."""
    from tests.conftest import LONGEST_FILES

    assert [name for name in LONGEST_FILES if not (REPO / name).is_file()] == []
