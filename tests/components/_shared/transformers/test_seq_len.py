"""The transformers engine's max_seq_len where the step leaves it unset: the rule both engines follow, over the rows
as TRL tokenizes them, capped by the model's positions (seq_len.py)."""

import json
from dataclasses import replace
from pathlib import Path

import pytest

from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len
from kfp_finetune.components._shared.transformers import seq_len, train
from kfp_finetune.components._shared.transformers.settings import SftSettings

pytest.importorskip("trl")

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    from kfp_finetune.tiny.hf_models import build_tiny_hf_model

    return build_tiny_hf_model(tmp_path_factory.mktemp("seq-len") / "base", "qwen3_moe")


def phrase(words: int) -> str:
    return " ".join(WORDS[i % len(WORDS)] for i in range(words))


def rows_file(path: Path, kind: str, sizes: list[int]) -> str:
    """JSON Lines rows of `kind` whose text is about `sizes` words each."""
    rows = {
        "instruct": lambda n: {"input": f"Repeat: {phrase(n // 2)}", "output": phrase(n - n // 2)},
        "chat": lambda n: {"messages": [{"role": "user", "content": phrase(n // 2)},
                                        {"role": "assistant", "content": phrase(n - n // 2)}]},
        "text": lambda n: {"text": phrase(n)},
    }[kind]  # fmt: skip
    path.write_text("".join(json.dumps(rows(n)) + "\n" for n in sizes))
    return str(path)


def settings(base: Path, tmp_path: Path, kind: str, sizes: list[int], **changes) -> SftSettings:
    tmp_path.mkdir(parents=True, exist_ok=True)
    data = rows_file(tmp_path / f"{kind}.jsonl", kind, sizes)
    return SftSettings(model_dir=str(base), data_files=[data], output_dir=str(tmp_path / kind),
                       dataset_type=kind, batch_size=2, max_steps=1, device="cpu", **changes)  # fmt: skip


@pytest.mark.parametrize("kind", ["instruct", "chat", "text"])
def test_the_lengths_measured_are_the_ones_trl_trains(base, tmp_path, kind):
    """Each row's measured length is within two tokens of the row TRL prepares from it uncut (its end-of-text
    token, the template's own BOS): the rule reads the lengths training has."""
    sizes = [5 + 37 * i % 300 for i in range(40)]
    unset = settings(base, tmp_path, kind, sizes)
    measured = seq_len.token_lengths(unset)
    trainer = train.build_trainer(replace(unset, max_seq_len=2048))  # nothing cut: the rows reach 2048 tokens
    trained = [len(ids) for ids in trainer.train_dataset["input_ids"]]
    assert len(measured) == len(trained) == len(sizes)
    assert max(abs(m - t) for m, t in zip(measured, trained, strict=True)) <= 2, (measured, trained)
    assert max(trained) > 256  # the rows are long enough for the rule to tell lengths apart


def test_an_unset_max_seq_len_follows_the_rows_and_stops_at_the_models_positions(base, tmp_path):
    """Short rows get a short max_seq_len, long ones a long one (one outlier never sets it); never more than the
    model's positions. The choice and its reason are in `planned`, which the step log and the report show. A
    max_seq_len the user set is kept."""
    short = seq_len.fit_to_rows(settings(base, tmp_path / "short", "text", [20] * 59 + [1500]))
    assert short.max_seq_len == 256
    (choice,) = [c for c in short.planned if c["setting"] == "max_seq_len"]
    assert choice["value"] == 256 and "99th percentile of the rows' tokens" in choice["reason"]
    assert (
        "capped at the model's 2048 positions" in choice["reason"]
        and "longer rows are cut" in choice["reason"]
    )

    longer = settings(base, tmp_path / "long", "text", [20] * 40 + [200] * 20)
    chosen = seq_len.fit_to_rows(longer).max_seq_len
    assert chosen == choose_max_seq_len(seq_len.token_lengths(longer), 2048) and 512 < chosen < 2048

    beyond = seq_len.fit_to_rows(settings(base, tmp_path / "beyond", "text", [3000] * 10))
    assert beyond.max_seq_len == 2048

    own = settings(base, tmp_path / "own", "text", [20] * 10, max_seq_len=64)
    assert seq_len.fit_to_rows(own) == own


def test_image_and_text_rows_get_the_models_positions_at_most_2048(tmp_path):
    """TRL tokenizes image + text rows batch by batch with their images: their lengths are not known before."""
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 1024}}))
    vision = SftSettings(model_dir=str(tmp_path), data_files=["rows.parquet"], output_dir=str(tmp_path / "run"),
                         dataset_type="multimodal")  # fmt: skip
    chosen = seq_len.fit_to_rows(vision)
    assert chosen.max_seq_len == 1024 and "image + text rows" in chosen.planned[-1]["reason"]
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 32768}}))
    assert seq_len.fit_to_rows(vision).max_seq_len == seq_len.WITHOUT_LENGTHS


@pytest.mark.parametrize(
    ("config", "served"),
    [
        ({"max_position_embeddings": 512}, 512),  # BERT's learned positions
        # Qwen2.5 with YaRN as its model card says to enable it: 32768 x 4.
        ({"max_position_embeddings": 32768,
          "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}}, 131072),
        ({"max_position_embeddings": 4096, "rope_parameters": {"rope_type": "default"}}, 4096),
        ({"text_config": {"max_position_embeddings": 1024}}, 1024),  # a vision-language model's text model
        ({"n_positions": 1024}, 1024),  # GPT-2
        ({"hidden_size": 8}, None),
    ],
)  # fmt: skip
def test_the_positions_a_model_serves(config, served):
    assert seq_len.positions(config) == served
