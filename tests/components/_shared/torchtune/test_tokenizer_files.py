"""Qwen2 vocab.json + merges.txt derived from tokenizer.json: only where exact, proven by tokenizing both ways."""

import json
import shutil

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.torchtune.model_inspection import (
    derive_missing_tokenizer_files,
    inspect_model_dir,
)

TEXTS = [
    "Uppercase: c a t s",
    "It's 2024-11-25; 12345 apples\n\n  and   spaces\t\ttabs",
    "Cafe\u0301 vs café — naïve 東京 🙂🙂 <|im_end|> ünïcödé",
    "don't WON'T I'll we'd  \r\n\r\nend",
]


@pytest.fixture
def qwen_tokenizer_json_only(tiny_qwen, tmp_path):
    """The tiny Qwen2.5 model as a repo that ships only tokenizer.json (with Qwen2's NFC normalizer)."""
    folder = tmp_path / "qwen"
    shutil.copytree(tiny_qwen, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    (folder / "tokenizer.json").write_text(json.dumps({**tokenizer, "normalizer": {"type": "NFC"}}))
    originals = {name: (folder / name).read_text() for name in ("vocab.json", "merges.txt")}
    for name in originals:
        (folder / name).unlink()
    return folder, originals


def _torchtune_ids(model_dir, texts):
    from kfp_finetune.components._shared.torchtune.model_inspection import instantiate

    tokenizer = instantiate(inspect_model_dir(model_dir).tokenizer_node(None))
    return [tokenizer.encode(text, add_bos=False, add_eos=False) for text in texts]


def test_derived_files_tokenize_as_the_shipped_ones_and_as_tokenizer_json(
    qwen_tokenizer_json_only, tiny_qwen
):
    from tokenizers import Tokenizer

    folder, originals = qwen_tokenizer_json_only
    inspect_model_dir(folder, weights_required=False)  # pre-flight: accepted before the files exist
    assert derive_missing_tokenizer_files(folder) == ["vocab.json", "merges.txt"]
    assert json.loads((folder / "vocab.json").read_text()) == json.loads(originals["vocab.json"])
    assert (folder / "merges.txt").read_text().split("\n") == originals["merges.txt"].split("\n")
    derived = _torchtune_ids(folder, TEXTS)
    assert derived == _torchtune_ids(tiny_qwen, TEXTS)
    hf = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert derived == [hf.encode(text, add_special_tokens=False).ids for text in TEXTS]
    assert derive_missing_tokenizer_files(folder) == []  # nothing missing: nothing written


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda t: t["pre_tokenizer"]["pretokenizers"][0].update(pattern={"Regex": r"\p{N}{1,3}|\s+|\S+"}),
         "pre-tokenizes otherwise than torchtune's Qwen2 tokenizer"),
        (lambda t: t["model"].update(byte_fallback=True), "sets model.byte_fallback = True"),
        (lambda t: t["model"].update(ignore_merges=True), "sets model.ignore_merges = True"),
        (lambda t: t.update(normalizer=None), "does not normalize to NFC"),
        (lambda t: t.update(model={"type": "Unigram", "vocab": []}), "holds no BPE vocabulary and merges"),
    ],
)  # fmt: skip
def test_a_tokenizer_json_that_tokenizes_otherwise_is_refused_with_the_reason(
    qwen_tokenizer_json_only, change, reason
):
    folder, _ = qwen_tokenizer_json_only
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    change(tokenizer)
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    with pytest.raises(ConfigError, match=f"ships no vocab.json .*; its tokenizer.json {reason}") as refused:
        inspect_model_dir(folder, weights_required=False)
    assert "add the base model's vocab.json + merges.txt" in str(refused.value)
    assert derive_missing_tokenizer_files(folder) == []
    assert not (folder / "vocab.json").exists()


def test_model_initialize_writes_the_derived_files_into_the_model_folder(qwen_tokenizer_json_only, workspace):
    from kfp_finetune.components.model_initialize.initialize import initialize_model

    folder, originals = qwen_tokenizer_json_only
    result = initialize_model(str(folder), str(workspace), name="qwen")
    assert json.loads((result.path / "vocab.json").read_text()) == json.loads(originals["vocab.json"])
    assert (result.path / "merges.txt").read_text() == originals["merges.txt"]
    assert "vocab.json" not in {record["path"] for record in result.manifest["files"]}  # not from the source
    assert inspect_model_dir(result.path).tokenizer_paths["path"] == str(result.path / "vocab.json")
