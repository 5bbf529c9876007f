"""dataset-initialize, multimodal rows: image paths under image_dir, embedded bytes and image tags; every bad image
named by its row; the images embedded into the shards byte for byte; the split's metadata."""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from pathlib import Path
from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset, iter_rows
from kfp_finetune.components.dataset_initialize.sources import DatasetValidationError


def png(rgb: tuple[int, int, int], width: int = 2, height: int = 2) -> bytes:
    """A valid RGB PNG of one colour, written by hand (signature, IHDR, one zlib IDAT, IEND)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    scanlines = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))  # filter byte 0 per line
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(scanlines))
        + chunk(b"IEND", b"")
    )


RED, GREEN, BLUE = png((255, 0, 0)), png((0, 255, 0)), png((0, 0, 255), width=3)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def outputs(tmp_path: Path) -> dict:
    return {
        "output_train": SimpleNamespace(path=str(tmp_path / "art" / "train"), metadata={}),
        "output_eval": SimpleNamespace(path=str(tmp_path / "art" / "eval"), metadata={}),
    }


def written(meta: dict, workspace: Path) -> list[dict]:
    return list(iter_rows([workspace / f for f in meta["data_files"]]))


def sharegpt(question: str, answer: str = "an answer") -> list[dict]:
    return [{"from": "human", "value": question}, {"from": "gpt", "value": answer}]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture
def picture_folder(tmp_path):
    """A dataset folder: images/{red,green,blue}.png beside the data file the test writes."""
    folder = tmp_path / "source"
    (folder / "images" / "more").mkdir(parents=True)
    (folder / "images" / "red.png").write_bytes(RED)
    (folder / "images" / "green.png").write_bytes(GREEN)
    (folder / "images" / "more" / "blue.png").write_bytes(BLUE)
    return folder


def test_image_paths_with_tags_are_embedded_into_the_shards(picture_folder, workspace, tmp_path, log_lines):
    rows = [
        {"conversations": sharegpt("<image>\nWhat colour is this?"), "image": "red.png"},
        {"conversations": sharegpt("Compare <image> with <image>."), "image": ["green.png", "more/blue.png"]},
        {"conversations": sharegpt("No picture here."), "image": None},  # a text-only row among them
    ]
    write_jsonl(picture_folder / "train.jsonl", rows)
    result = initialize_dataset(
        str(picture_folder), str(workspace), name="pics", dataset_type="multimodal", image_dir="images",
        eval_fraction=0.0, base_model_path=tmp_path / "any-model", **outputs(tmp_path),
    )  # fmt: skip
    meta = result.train_metadata
    assert meta["dataset_type"] == "multimodal" and meta["data_style"] == "sharegpt"
    assert meta["conversation_column"] == "conversations"
    assert meta["image_column"] == "images" and meta["image_tag"] == "<image>"
    assert meta["num_images"] == 3 and meta["image_bytes"] == len(RED) + len(GREEN) + len(BLUE)
    assert not meta["packs"] and "token_stats" not in meta  # not packed, and said why
    assert any("multimodal rows are not packed" in line for line in log_lines)
    shards = written(meta, workspace)
    assert [[sha(image["bytes"]) for image in row["images"]] for row in shards] == [
        [sha(RED)], [sha(GREEN), sha(BLUE)], []
    ]  # fmt: skip
    assert shards[1]["images"][1]["path"] == "more/blue.png"
    assert shards[0]["conversations"][0]["value"] == "<image>\nWhat colour is this?"

    # The shards carry the `datasets` Image feature: the library decodes them without the source folder.
    import datasets

    loaded = datasets.load_dataset("parquet", data_files=[str(workspace / f) for f in meta["data_files"]])
    assert loaded["train"][1]["images"][1].size == (3, 2)

    again = initialize_dataset(
        str(picture_folder), str(workspace), name="pics", dataset_type="multimodal", image_dir="images",
        eval_fraction=0.0,
    )  # fmt: skip
    assert again.skipped and again.train_metadata["num_images"] == 3


def test_embedded_bytes_in_parquet_and_instruct_rows(tmp_path, workspace):
    import datasets

    # As `datasets` writes an Image feature: a struct {bytes, path} per image, with its feature in the metadata.
    structs = datasets.Dataset.from_dict(
        {
            "question": ["What colour? <image>", "Which two? <image> <image>"],
            "answer": ["red", "green and blue"],
            "picture": [
                [{"bytes": RED, "path": "red.png"}],
                [{"bytes": GREEN, "path": None}, {"bytes": BLUE, "path": None}],
            ],
        }  # fmt: skip
    ).cast_column("picture", datasets.Sequence(datasets.Image()))
    source = tmp_path / "structs"
    source.mkdir()
    structs.to_parquet(str(source / "train.parquet"))
    result = initialize_dataset(
        str(source), str(workspace), name="structs", dataset_type="multimodal", eval_fraction=0.0,
        column_map={"input": "question", "output": "answer", "images": "picture"},
    )  # fmt: skip
    meta = result.train_metadata
    assert meta["data_style"] == "input_output" and meta["num_images"] == 3
    assert meta["column_map"] == {"input": "question", "output": "answer", "images": "picture"}
    rows = written(meta, workspace)
    assert [[sha(i["bytes"]) for i in row["images"]] for row in rows] == [[sha(RED)], [sha(GREEN), sha(BLUE)]]

    # Raw bytes in a binary column, alpaca rows with a system prompt (written as messages, images kept).
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(
        {
            "instruction": ["Name the colour. <image>", "And this one? <image>"],
            "output": ["red", "green"],
            "system": ["Be brief.", None],
            "image": pa.array([RED, GREEN], pa.binary()),
        }
    )
    raw = tmp_path / "raw"
    raw.mkdir()
    pq.write_table(table, raw / "train.parquet")
    result = initialize_dataset(
        str(raw), str(workspace), name="raw", dataset_type="multimodal", eval_fraction=0.5
    )
    train, held_out = result.train_metadata, result.eval_metadata
    assert train["dataset_type"] == "multimodal" and train["data_style"] == "openai"
    assert train["num_images"] == held_out["num_images"] == 1
    rows = written(train, workspace) + written(held_out, workspace)
    assert {sha(row["images"][0]["bytes"]) for row in rows} == {sha(RED), sha(GREEN)}
    assert all(set(row) == {"images", "messages"} for row in rows)


def test_bad_images_are_named_by_row_together(picture_folder, workspace, tmp_path):
    (picture_folder / "images" / "broken.png").write_bytes(RED[:30])  # a truncated PNG
    (picture_folder / "secret.png").write_bytes(BLUE)  # outside image_dir: never read
    rows = [
        {"conversations": sharegpt("<image> ok"), "image": "red.png"},
        {"conversations": sharegpt("<image> gone"), "image": "nowhere.png"},
        {"conversations": sharegpt("<image> broken"), "image": "broken.png"},
        {"conversations": sharegpt("<image> <image> one too many"), "image": "green.png"},
        {"conversations": sharegpt("<image> climbing"), "image": "../secret.png"},
        {"conversations": sharegpt("<image> absolute"), "image": str(picture_folder / "images" / "red.png")},
    ]
    write_jsonl(picture_folder / "bad.jsonl", rows)
    with pytest.raises(DatasetValidationError) as caught:
        initialize_dataset(
            str(picture_folder), str(workspace), name="bad", dataset_type="multimodal", image_dir="images",
            eval_fraction=0.0,
        )  # fmt: skip
    message = str(caught.value)
    assert "5 of 6 rows have images that cannot be used" in message
    assert "bad.jsonl line 2: image file images/nowhere.png is missing" in message
    assert "bad.jsonl line 3: image 0 (broken.png) is not a readable image" in message
    assert "bad.jsonl line 4: the text holds 2 '<image>' tag(s) for 1 image(s)" in message
    assert "bad.jsonl line 5: image path '../secret.png' is absolute or leaves data_image_dir" in message
    assert "bad.jsonl line 6: image path" in message and "line 1:" not in message
    assert not list((workspace / "datasets").iterdir())  # nothing written, no temp folders left

    with pytest.raises(
        ConfigError, match=r"data_image_dir='../elsewhere' must be a folder inside the dataset source"
    ):
        initialize_dataset(
            str(picture_folder), str(workspace), dataset_type="multimodal", image_dir="../elsewhere"
        )


def test_parquet_bytes_that_are_not_an_image_and_a_missing_image_column(tmp_path, workspace):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = tmp_path / "junk"
    source.mkdir()
    pq.write_table(
        pa.table(
            {"input": ["<image> a", "<image> b"], "output": ["x", "y"], "image": [RED, b"GIF89a-not-really"]}
        ),
        source / "train.parquet",
    )
    with pytest.raises(DatasetValidationError, match=r"train.parquet row 1: image 0 is not a readable image"):
        initialize_dataset(str(source), str(workspace), dataset_type="multimodal", eval_fraction=0.0)
    with pytest.raises(DatasetValidationError, match=r"multimodal data needs an image column"):
        initialize_dataset(
            str(source), str(workspace), dataset_type="multimodal", column_map={"images": "photo"}
        )


def test_empty_image_tag_counts_no_placeholders(picture_folder, workspace):
    write_jsonl(
        picture_folder / "train.jsonl", [{"input": "What colour?", "output": "red", "images": ["red.png"]}]
    )
    result = initialize_dataset(
        str(picture_folder), str(workspace), dataset_type="multimodal", image_dir="images", image_tag="",
        eval_fraction=0.0,
    )  # fmt: skip
    assert result.train_metadata["image_tag"] == "" and result.train_metadata["num_images"] == 1
    with pytest.raises(DatasetValidationError, match=r"holds 0 '<image>' tag\(s\) for 1 image\(s\)"):
        initialize_dataset(str(picture_folder), str(workspace), name="tagged", dataset_type="multimodal",
                           image_dir="images", eval_fraction=0.0)  # fmt: skip


def test_images_of_an_s3_source_are_fetched_and_embedded(picture_folder, workspace, monkeypatch):
    import boto3

    from tests.support.sources import moto_s3, use_s3_credentials

    use_s3_credentials(monkeypatch)
    rows = [{"messages": [{"role": "user", "content": "<image> colour?"}, {"role": "assistant", "content": "blue"}],
             "images": ["more/blue.png"]}]  # fmt: skip
    write_jsonl(picture_folder / "train.jsonl", rows)
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")
        for path in picture_folder.rglob("*"):
            if path.is_file():
                client.upload_file(str(path), "data", f"pics/{path.relative_to(picture_folder).as_posix()}")
        result = initialize_dataset(
            "s3://data/pics", str(workspace), dataset_type="multimodal", image_dir="images", eval_fraction=0.0,
            s3_endpoint_url=endpoint,
        )  # fmt: skip
    meta = result.train_metadata
    assert meta["data_style"] == "openai" and meta["num_images"] == 1
    assert sha(written(meta, workspace)[0]["images"][0]["bytes"]) == sha(BLUE)
    assert not [p for p in (workspace / "datasets").iterdir() if p.name.startswith(".")]  # downloads removed


def test_without_pillow_the_image_signature_is_checked(monkeypatch):
    import sys

    from kfp_finetune.components.dataset_initialize.images import not_an_image

    monkeypatch.setitem(sys.modules, "PIL", None)  # as in an image without Pillow: `import PIL` fails
    assert not_an_image(RED) == ""
    assert not_an_image(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == ""
    assert "is not an image (9 bytes starting b'not an i'" in not_an_image(b"not an im")
