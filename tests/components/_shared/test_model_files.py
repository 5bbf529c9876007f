"""A model's config and tokenizer files, fetched without its weights (pre-flight, dataset-initialize)."""

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.model_files import config_and_tokenizer, fetch_config_and_tokenizer
from tests.support.sources import write_fake_model


def test_only_the_config_and_tokenizer_files_are_fetched(tmp_path):
    model = write_fake_model(tmp_path / "model", shards=2)  # with .bin, .h5 and .pth weights besides
    fetched = fetch_config_and_tokenizer(str(model), tmp_path / "out")
    assert fetched == ["config.json", "generation_config.json", "tokenizer.json", "original/tokenizer.model"]
    on_disk = sorted(
        p.relative_to(tmp_path / "out").as_posix() for p in (tmp_path / "out").rglob("*") if p.is_file()
    )
    assert [p for p in on_disk if not p.startswith(".")] == sorted(fetched)
    with config_and_tokenizer(str(model)) as folder:
        assert (folder / "config.json").read_bytes() == (model / "config.json").read_bytes()
    assert not folder.exists(), "removed on exit"


def test_a_source_without_config_json_is_refused(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "model.safetensors").write_bytes(b"\0" * 16)
    with pytest.raises(
        ConfigError, match="has no config.json: point it at a Hugging Face-layout model folder"
    ):
        fetch_config_and_tokenizer(str(tmp_path / "weights"), tmp_path / "out")
