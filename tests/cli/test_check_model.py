"""`kfp-finetune check-model --model-dir DIR`: from DIR/config.json alone, the family, each math-changing field
and whether a parity case proves it, and the measured logit parity per direction; exit 0 only when all is proven."""

from __future__ import annotations

import importlib.util
import json
import shutil

import pytest

from kfp_finetune import cli

pytest.importorskip("transformers")


def check_model(capsys, folder) -> tuple[int, str, str]:
    code = cli.main(["check-model", "--model-dir", str(folder)])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def config_only(tiny_llama, tmp_path):
    """The tiny Llama 3.2 model's config.json and tokenizer, without weights: what the command reads."""
    folder = tmp_path / "model"
    shutil.copytree(tiny_llama, folder, ignore=shutil.ignore_patterns("*.safetensors"))
    return folder


def _edit_config(folder, **fields) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **fields}))


@pytest.mark.slow
def test_a_proven_layout_passes_with_every_field_and_direction_shown(config_only, capsys):
    code, out, _ = check_model(capsys, config_only)
    assert code == 0, out
    assert out.startswith("family: llama3_2 (builder torchtune.models.llama3_2.llama3_2"), out
    assert "  tie_word_embeddings = true (carried: true): proven" in out, out
    assert "  rope_scaling.rope_type = llama3 (neutral: llama3): proven" in out, out
    for direction in ("load", "save", "lora merged", "lora peft", "dora merged", "dora peft"):
        assert f"  {direction}: max |Δlogit| " in out, out
    assert "NOT PROVEN" not in out and out.rstrip().endswith("every direction is within 2e-05"), out


@pytest.mark.slow
def test_an_unproven_field_fails_naming_it(config_only, capsys):
    _edit_config(config_only, tie_word_embeddings=False)
    code, out, err = check_model(capsys, config_only)
    assert code == 1
    assert "  tie_word_embeddings = false (carried: false): NOT PROVEN" in out, out
    named = (
        "not proven: tie_word_embeddings = false (carried: false): no parity case of llama3_2 has this kind"
    )
    assert named in err, err


def test_a_refused_field_fails_naming_it_without_measuring(config_only, capsys):
    _edit_config(config_only, rope_scaling={"rope_type": "yarn", "factor": 4.0})
    code, out, err = check_model(capsys, config_only)
    assert code == 1
    assert "  rope_scaling.rope_type = yarn (refused): refused" in out, out
    assert "parity with transformers" not in out
    assert "refused: rope_scaling.rope_type = 'yarn'" in err, err


def test_without_transformers_it_names_the_extra_to_install(config_only, capsys, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *args: None if name == "transformers" else find_spec(name, *args),
    )
    code, _, err = check_model(capsys, config_only)
    assert code == 2
    assert err.strip() == (
        "error: check-model measures with transformers, not installed: pip install 'kfp-finetune[train,parity]'"
    )
