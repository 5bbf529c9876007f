"""Local sources follow symlinks only inside their folder: a link out (a model's LICENSE.txt to a private file, a
data file linked from another team's folder, a folder elsewhere) is refused naming the link and its target, and
nothing it points to reaches the workspace. The copy checks each file again as it opens it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kfp_finetune.components._shared import storage
from kfp_finetune.components.dataset_initialize import sources
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import initialize_model
from kfp_finetune.tiny.dataset import build_tiny_dataset
from tests.support.sources import write_fake_model

SECRET = "root:x:0:0:planted-secret-line:/root:/bin/bash\n"


@pytest.fixture
def private_file(tmp_path) -> Path:
    """Stands in for /etc/passwd: a file outside every source folder."""
    path = tmp_path / "private" / "passwd"
    path.parent.mkdir()
    path.write_text(SECRET)
    return path


def _holds_secret(root: Path) -> list[Path]:
    return [
        p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and SECRET in p.read_text("latin-1")
    ]


def test_a_model_whose_license_links_outside_is_refused_at_model_initialize(tmp_path, private_file):
    model = write_fake_model(tmp_path / "model", extra_bin=False)
    (model / "LICENSE.txt").symlink_to(private_file)
    workspace = tmp_path / "ws"

    with pytest.raises(storage.LinkEscape) as refused:
        initialize_model(str(model), str(workspace), name="m")

    message = str(refused.value)
    assert "LICENSE.txt is a symlink to" in message and str(private_file) in message, message
    assert "\n" not in message and "cp -L" in message
    assert not _holds_secret(workspace) if workspace.exists() else True


def test_a_link_to_a_folder_outside_is_refused(tmp_path, private_file):
    model = write_fake_model(tmp_path / "model", extra_bin=False)
    (model / "extra").symlink_to(private_file.parent, target_is_directory=True)

    with pytest.raises(storage.LinkEscape, match=r"extra is a symlink to .*private"):
        initialize_model(str(model), str(tmp_path / "ws"), name="m")
    assert not _holds_secret(tmp_path / "ws") if (tmp_path / "ws").exists() else True


def test_a_data_folder_linking_another_folders_file_is_refused_at_dataset_initialize(tmp_path):
    other_team = build_tiny_dataset(tmp_path / "other-team", train_rows=8, eval_rows=2)["train.jsonl"].parent
    data = build_tiny_dataset(tmp_path / "data", train_rows=8, eval_rows=2)["train.jsonl"].parent
    (data / "train.jsonl").unlink()
    (data / "train.jsonl").symlink_to(other_team / "train.jsonl")
    workspace = tmp_path / "ws"

    with pytest.raises(storage.LinkEscape) as refused:
        initialize_dataset(str(data), str(workspace), name="d")

    assert "train.jsonl is a symlink to" in str(refused.value)
    assert str(other_team / "train.jsonl") in str(refused.value)
    rows = (other_team / "train.jsonl").read_text().splitlines()
    copied = [p for p in workspace.rglob("*") if p.is_file()] if workspace.exists() else []
    assert not any(rows[0] in p.read_text("latin-1") for p in copied)


def test_links_inside_the_folder_are_followed(tmp_path):
    model = write_fake_model(tmp_path / "model", extra_bin=False)
    (model / "licenses").mkdir()
    (model / "licenses" / "LICENSE").write_text("Apache-2.0\n")
    (model / "LICENSE.txt").symlink_to("licenses/LICENSE")
    (model / "same").symlink_to(model / "licenses", target_is_directory=True)

    result = initialize_model(str(model), str(tmp_path / "ws"), name="m")

    copied = result.path
    assert (copied / "LICENSE.txt").read_text() == "Apache-2.0\n" and not (
        copied / "LICENSE.txt"
    ).is_symlink()
    listed = {f.path for f in storage.list_files(str(model)).files}
    assert {"LICENSE.txt", "licenses/LICENSE", "same/LICENSE"} <= listed


def test_a_data_folder_linking_into_its_own_hidden_store_loads(tmp_path):
    """As git-annex and DVC check data out: visible links into a hidden object store inside the folder."""
    built = build_tiny_dataset(tmp_path / "built", train_rows=40, eval_rows=10)
    data = tmp_path / "data"
    (data / ".annex").mkdir(parents=True)
    for name in ("train.jsonl", "eval.jsonl"):
        os.rename(built[name], data / ".annex" / f"object-{name}")
        (data / name).symlink_to(f".annex/object-{name}")

    result = initialize_dataset(str(data), str(tmp_path / "ws"), name="d", eval_split="test")

    assert result.train_metadata["num_rows"] == 40 and result.eval_metadata["num_rows"] == 10


def test_a_link_to_its_own_parent_folder_is_refused(tmp_path):
    model = write_fake_model(tmp_path / "model", extra_bin=False)
    (model / "loop").symlink_to(model, target_is_directory=True)

    with pytest.raises(storage.LinkEscape, match="loop is a symlink to .*holds the link itself"):
        storage.list_files(str(model))


def test_a_link_swapped_in_after_the_listing_is_not_followed(tmp_path, private_file):
    model = write_fake_model(tmp_path / "model", extra_bin=False)
    (model / "LICENSE.txt").write_text("MIT\n")
    listing = storage.list_files(str(model))  # checked: LICENSE.txt is a plain file
    (model / "LICENSE.txt").unlink()
    (model / "LICENSE.txt").symlink_to(private_file)  # then replaced by a link out

    with pytest.raises(storage.LinkEscape, match="LICENSE.txt is a symlink to"):
        storage.download(listing, [f.path for f in listing.files], tmp_path / "copy")
    assert not _holds_secret(tmp_path / "copy")


def test_a_folder_on_the_way_swapped_for_a_link_between_check_and_open_is_not_followed(
    tmp_path, private_file, monkeypatch
):
    """The race a path check alone cannot close: a folder replaced by a link after it was resolved. Opening one
    component at a time without following links refuses it."""
    model = tmp_path / "model"
    (model / "sub").mkdir(parents=True)
    (model / "sub" / "passwd").write_text("harmless\n")
    resolve = storage.LocalRoot.resolve

    def resolve_then_swap(self, path):
        real = resolve(self, path)
        os.rename(model / "sub", tmp_path / "moved")
        (model / "sub").symlink_to(private_file.parent, target_is_directory=True)
        return real

    monkeypatch.setattr(storage.LocalRoot, "resolve", resolve_then_swap)
    with pytest.raises(storage.LinkEscape, match="changed while it was read"):
        storage.LocalRoot(model, str(model)).open(model / "sub" / "passwd")


def test_a_source_named_through_a_link_is_read(tmp_path):
    """The folder (or file) the user names may itself be a link: its target is the root."""
    model = write_fake_model(tmp_path / "real-model", extra_bin=False)
    (tmp_path / "named").symlink_to(model, target_is_directory=True)
    data = build_tiny_dataset(tmp_path / "data", train_rows=8, eval_rows=2)["train.jsonl"]
    (tmp_path / "train.jsonl").symlink_to(data)

    assert {f.path for f in storage.list_files(str(tmp_path / "named")).files} == {
        f.path for f in storage.list_files(str(model)).files
    }
    listing = storage.list_files(str(tmp_path / "train.jsonl"))
    records = storage.download(listing, ["train.jsonl"], tmp_path / "copy")
    assert (tmp_path / "copy" / "train.jsonl").read_bytes() == data.read_bytes() and records


def test_a_data_file_swapped_for_a_link_after_the_listing_is_not_read(tmp_path, monkeypatch):
    """dataset-initialize reads local data in place: each file is checked again right before it is read."""
    other_team = build_tiny_dataset(tmp_path / "other-team", train_rows=8, eval_rows=2)["train.jsonl"]
    data = build_tiny_dataset(tmp_path / "data", train_rows=8, eval_rows=2)["train.jsonl"].parent
    detect = sources.detect_format

    def detect_then_swap(*args, **kwargs):  # runs after the listing, before any row is read
        found = detect(*args, **kwargs)
        (data / "train.jsonl").unlink()
        (data / "train.jsonl").symlink_to(other_team)
        return found

    monkeypatch.setattr(sources, "detect_format", detect_then_swap)
    with pytest.raises(storage.LinkEscape, match="train.jsonl is a symlink to"):
        initialize_dataset(str(data), str(tmp_path / "ws"), name="d", data_format="json")
