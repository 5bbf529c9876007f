"""dataset-initialize, sequence-classification rows (the Training Operator's Hugging Face path: BERT on Yelp reviews,
`text` + a 5-class `label`): class ids and class names, the deterministic name table, the class balance in the
metadata, integer ClassLabel shards `datasets` loads; bad labels, gaps and eval-only classes named by row."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path
from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset, iter_rows
from kfp_finetune.components.dataset_initialize.sources import DatasetValidationError

STARS = ["1 star", "2 stars", "3 stars", "4 stars", "5 stars"]
WORDS = {0: "awful", 1: "poor", 2: "fine", 3: "good", 4: "superb"}


def yelp_rows(per_class: int = 4, seed: int = 0) -> list[dict]:
    """Reviews of 5 star classes (label 0..4, as the Hub's yelp_review_full), shuffled."""
    rows = [
        {"text": f"The food was {WORDS[k]}, review {i}.", "label": k}
        for k in range(5)
        for i in range(per_class)
    ]
    random.Random(seed).shuffle(rows)
    return rows


def outputs(tmp_path: Path) -> dict:
    return {
        "output_train": SimpleNamespace(path=str(tmp_path / "art" / "train"), metadata={}),
        "output_eval": SimpleNamespace(path=str(tmp_path / "art" / "eval"), metadata={}),
    }


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def shard_paths(meta: dict, workspace: Path) -> list[str]:
    return [str(workspace / f) for f in meta["data_files"]]


def test_class_ids_from_jsonl(tmp_path, workspace, log_lines):
    rows = yelp_rows()
    source = write_jsonl(tmp_path / "yelp" / "train.jsonl", rows)
    result = initialize_dataset(
        str(source), str(workspace), name="yelp", dataset_type="classification", eval_fraction=0.25,
        base_model_path=tmp_path / "any-model", **outputs(tmp_path),
    )  # fmt: skip
    train, held_out = result.train_metadata, result.eval_metadata
    assert train["dataset_type"] == "classification" and train["data_style"] == "classification"
    assert train["label_column"] == "label" and train["num_labels"] == held_out["num_labels"] == 5
    assert "label_names" not in train  # the data gives ids only
    assert set(train["label_counts"]) == {"0", "1", "2", "3", "4"}
    assert sum(train["label_counts"].values()) == train["num_rows"] == 15
    assert sum(held_out["label_counts"].values()) == held_out["num_rows"] == 5
    assert train["columns"] == ["text", "label"]
    assert not train["packs"] and "token_stats" not in train
    assert any("classification rows are not packed" in line for line in log_lines)
    assert any("train class balance, 5 classes:" in line for line in log_lines)

    # The shards hold int64 class ids with the ClassLabel feature: `datasets` gives ids and the name table.
    import datasets

    loaded = datasets.load_dataset("parquet", data_files=shard_paths(train, workspace))["train"]
    assert (
        isinstance(loaded.features["label"], datasets.ClassLabel)
        and loaded.features["label"].num_classes == 5
    )
    by_text = {row["text"]: row["label"] for row in rows}
    assert all(row["label"] == by_text[row["text"]] for row in loaded)
    assert {type(row["label"]) for row in iter_rows([Path(p) for p in shard_paths(train, workspace)])} == {
        int
    }

    again = initialize_dataset(
        str(source), str(workspace), name="yelp", dataset_type="classification", eval_fraction=0.25
    )
    assert again.skipped and again.train_metadata["label_counts"] == train["label_counts"]


def test_class_names_from_parquet_are_numbered_in_sorted_order(tmp_path, workspace):
    import datasets

    def written_ids(seed: int, name: str) -> tuple[dict, dict]:
        rows = [{"text": r["text"], "label": STARS[r["label"]]} for r in yelp_rows(seed=seed)]
        source = tmp_path / name
        source.mkdir()
        datasets.Dataset.from_list(rows).to_parquet(str(source / "train.parquet"))
        result = initialize_dataset(
            str(source), str(workspace), name=name, dataset_type="classification", eval_fraction=0.0
        )
        loaded = datasets.load_dataset("parquet", data_files=shard_paths(result.train_metadata, workspace))
        return result.train_metadata, {row["text"]: row["label"] for row in loaded["train"]}

    first, first_ids = written_ids(1, "stars-a")
    second, second_ids = written_ids(2, "stars-b")  # the same rows in another order
    assert first["label_names"] == second["label_names"] == STARS and first["num_labels"] == 5
    assert first_ids == second_ids
    assert all(first_ids[f"The food was {WORDS[k]}, review 0."] == k for k in range(5))
    assert first["label_counts"] == {str(k): 4 for k in range(5)}

    # label_names gives another order; a name it lacks is named by row.
    source = tmp_path / "stars-a"
    result = initialize_dataset(
        str(source), str(workspace), name="reversed", dataset_type="classification", eval_fraction=0.0,
        label_names=STARS[::-1], num_labels=5,
    )  # fmt: skip
    assert result.train_metadata["label_names"] == STARS[::-1]
    loaded = datasets.load_dataset("parquet", data_files=shard_paths(result.train_metadata, workspace))[
        "train"
    ]
    assert loaded.features["label"].names == STARS[::-1]
    assert all(row["label"] == 4 - first_ids[row["text"]] for row in loaded)
    with pytest.raises(
        DatasetValidationError, match=r"class name\(s\) \['5 stars'\] that label_names .* lacks"
    ):
        initialize_dataset(
            str(source), str(workspace), name="short", dataset_type="classification", eval_fraction=0.0,
            label_names=STARS[:4],
        )  # fmt: skip
    with pytest.raises(DatasetValidationError, match=r"num_labels=4, but the train rows hold 5 class names"):
        initialize_dataset(
            str(source), str(workspace), name="four", dataset_type="classification", eval_fraction=0.0,
            num_labels=4,
        )  # fmt: skip


def test_csv_sentence_pairs_mapped_columns_and_a_test_split(tmp_path, workspace):
    source = tmp_path / "pairs"
    source.mkdir()
    for split, n in (("train", 6), ("test", 2)):
        with (source / f"{split}.csv").open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(["premise", "hypothesis", "verdict", "note"])
            for i in range(n):
                writer.writerow(
                    [f"A cat sat {i}.", f"An animal sat {i}.", ["entailment", "neutral"][i % 2], "x"]
                )
    result = initialize_dataset(
        str(source), str(workspace), dataset_type="classification", eval_split="test",
        column_map={"text": "premise", "text_pair": "hypothesis", "label": "verdict"},
    )  # fmt: skip
    train, held_out = result.train_metadata, result.eval_metadata
    assert train["columns"] == ["text", "label", "text_pair"]
    assert train["label_names"] == ["entailment", "neutral"] and train["num_labels"] == 2
    assert train["label_counts"] == {"0": 3, "1": 3} and held_out["label_counts"] == {"0": 1, "1": 1}
    assert train["column_map"] == {"text": "premise", "text_pair": "hypothesis", "label": "verdict"}
    row = next(iter_rows([workspace / f for f in held_out["data_files"]]))
    assert row == {"text": "A cat sat 0.", "label": 0, "text_pair": "An animal sat 0."}


def test_bad_rows_are_named_together(tmp_path, workspace):
    rows = [
        {"text": "fine", "label": 1},
        {"text": "  ", "label": 2},
        {"text": "no label", "label": None},
        {"text": "half a star", "label": 2.5},
        {"text": "", "label": -1},
        {"text": "ok", "label": 0},
        {"text": "negative", "label": 3.0},  # a whole number: class 3
    ]
    source = write_jsonl(tmp_path / "bad" / "train.jsonl", rows)
    with pytest.raises(DatasetValidationError) as caught:
        initialize_dataset(str(source), str(workspace), dataset_type="classification", eval_fraction=0.0)
    message = str(caught.value)
    assert "train: 4 of 7 rows are not valid classification data" in message
    assert "train.jsonl line 2: text is empty;" in message
    assert "train.jsonl line 3: label is null;" in message
    assert "train.jsonl line 4: label 2.5 is not a whole number" in message
    assert "train.jsonl line 5: text is empty, label -1.0 is negative" in message
    assert "line 1:" not in message and "line 7" not in message
    assert not list((workspace / "datasets").iterdir())  # nothing written

    latin = tmp_path / "latin" / "train.jsonl"
    latin.parent.mkdir()
    latin.write_bytes(b'{"text": "fine", "label": 0}\n{"text": "caf\xe9", "label": 1}\n')
    with pytest.raises(DatasetValidationError, match=r"train.jsonl line 2: text is not UTF-8 text"):
        initialize_dataset(str(latin), str(workspace), dataset_type="classification", eval_fraction=0.0)
    mixed = write_jsonl(
        tmp_path / "mixed" / "train.jsonl",
        [{"text": "a", "label": 1}, {"text": "b", "label": "two"}, {"text": "c", "label": 0}],
    )
    with pytest.raises(
        DatasetValidationError,
        match=r"mix class ids \(2 row\(s\)\) and class names \(1 row\(s\)\); first of the names: train.jsonl line 2: label 'two'",
    ):
        initialize_dataset(str(mixed), str(workspace), dataset_type="classification", eval_fraction=0.0)
    booleans = write_jsonl(
        tmp_path / "bools" / "train.jsonl", [{"text": "a", "label": True}, {"text": "b", "label": False}]
    )
    with pytest.raises(
        DatasetValidationError, match=r"line 1: label is a boolean \(True\).*line 2: label is a boolean"
    ):
        initialize_dataset(str(booleans), str(workspace), dataset_type="classification", eval_fraction=0.0)


def test_gaps_eval_only_classes_and_one_class_are_refused(tmp_path, workspace):
    gaps = write_jsonl(
        tmp_path / "gaps" / "train.jsonl", [r for r in yelp_rows() if r["label"] not in (1, 3)]
    )
    with pytest.raises(DatasetValidationError) as caught:
        initialize_dataset(str(gaps), str(workspace), dataset_type="classification", eval_fraction=0.0)
    assert "class ids must be 0..4 without gaps, but no train row has class id(s) 1, 3: renumber" in str(
        caught.value
    )

    folder = tmp_path / "split"
    train_rows = [r for r in yelp_rows() if r["label"] < 4]
    write_jsonl(folder / "train.jsonl", train_rows)
    write_jsonl(folder / "test.jsonl", [{"text": "great", "label": 1}, {"text": "best ever", "label": 4}])
    with pytest.raises(DatasetValidationError) as caught:
        initialize_dataset(str(folder), str(workspace), dataset_type="classification", eval_split="test")
    message = str(caught.value)
    assert "eval: 1 row(s) hold label(s) 4 that no train row has" in message
    assert "test.jsonl line 2: label 4" in message

    with pytest.raises(
        DatasetValidationError, match=r"num_labels=3, but the train rows hold class id\(s\) \[3\]"
    ):
        initialize_dataset(
            str(folder / "train.jsonl"), str(workspace), dataset_type="classification", eval_fraction=0.0,
            num_labels=3,
        )  # fmt: skip
    one = write_jsonl(
        tmp_path / "one" / "train.jsonl", [{"text": "a", "label": "spam"}, {"text": "b", "label": "spam"}]
    )
    with pytest.raises(
        DatasetValidationError, match=r"every train row has the label 'spam': .* at least two classes"
    ):
        initialize_dataset(str(one), str(workspace), dataset_type="classification", eval_fraction=0.0)


def test_class_label_source_names_and_refused_parameters(tmp_path, workspace):
    import datasets

    features = datasets.Features(
        {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=STARS)}
    )
    source = tmp_path / "hub-like"
    source.mkdir()
    datasets.Dataset.from_list(yelp_rows(per_class=1), features=features).to_parquet(
        str(source / "train.parquet")
    )
    result = initialize_dataset(str(source), str(workspace), dataset_type="classification", eval_fraction=0.0)
    assert result.train_metadata["label_names"] == STARS  # the source's ClassLabel names

    with pytest.raises(ConfigError, match=r"num_labels / label_names apply to data_type classification only"):
        initialize_dataset(str(source), str(workspace), dataset_type="text", num_labels=5)
    with pytest.raises(ConfigError, match=r"label_names must be distinct.*listed twice: \['a'\]"):
        initialize_dataset(str(source), str(workspace), dataset_type="classification", label_names=["a", "a"])
    with pytest.raises(
        DatasetValidationError, match=r"classification data \(classification\) needs column\(s\) 'label'"
    ):
        initialize_dataset(
            str(source), str(workspace), dataset_type="classification", column_map={"label": "stars"}
        )
