"""dataset-initialize: formats, split expressions, type validation, held-out split, skip-if-present, sources."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import boto3
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset, iter_rows
from kfp_finetune.components.dataset_initialize.sources import DatasetValidationError, detect_format
from kfp_finetune.tiny.dataset import build_tiny_dataset
from tests.support.hub_standin import HubStandin
from tests.support.sources import https_server, hub_env, moto_s3, result, run_python, use_s3_credentials

ROWS = [{"input": f"Reverse: {c} x", "output": f"x {c}"} for c in "abcdefghijklmnopqrst"]  # 20 rows


def write_rows(path: Path, rows: list[dict], fmt: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path.write_text(json.dumps(rows))
    elif fmt == "csv":
        import csv

        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "arrow":
        table = pa.Table.from_pylist(rows)
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    return path


def rows_of(result_meta: dict, workspace: Path) -> list[dict]:
    return list(iter_rows([workspace / f for f in result_meta["data_files"]]))


def outputs(tmp_path: Path) -> dict:
    return {
        "output_train": SimpleNamespace(path=str(tmp_path / "art" / "train"), metadata={}),
        "output_eval": SimpleNamespace(path=str(tmp_path / "art" / "eval"), metadata={}),
    }


def test_detect_format():
    assert detect_format(["a.jsonl", "README.md"]) == ("json", ["a.jsonl"])
    assert detect_format(["d/train.parquet", "d/test.parquet"])[0] == "parquet"
    assert detect_format(["x.csv.gz"]) == ("csv", ["x.csv.gz"])
    assert detect_format(["data-00000-of-00001.arrow", "state.json", "dataset_info.json"]) == (
        "arrow",
        ["data-00000-of-00001.arrow"],
    )
    assert detect_format(["a.txt"], "jsonl") == ("json", ["a.txt"])
    assert detect_format(["train.jsonl", "train.parquet", "eval.jsonl"]) == ("parquet", ["train.parquet"])
    assert detect_format(["a.csv", "b.jsonl"], "csv") == ("csv", ["a.csv"])
    assert detect_format(["corpus/a.txt", "corpus/b.txt"]) == ("text", ["corpus/a.txt", "corpus/b.txt"])
    with pytest.raises(ValueError, match="set data_format"):
        detect_format(["a.dat"])


@pytest.mark.parametrize("fmt", ["jsonl", "json", "csv", "parquet", "arrow"])
def test_every_local_format_is_written_as_parquet_with_metadata(tmp_path, workspace, fmt):
    src = write_rows(tmp_path / "src" / f"data.{fmt}", ROWS, fmt)
    out = outputs(tmp_path)
    res = initialize_dataset(str(src), str(workspace), name="d", **out)
    meta = out["output_train"].metadata
    assert rows_of(meta, workspace) == ROWS
    assert meta["workspace_path"] == "datasets/d/train" and meta["format"] == "parquet"
    assert meta["num_rows"] == 20 and meta["columns"] == ["input", "output"]
    assert meta["dataset_type"] == "instruct" and meta["data_style"] == "input_output"
    assert (
        meta["files"][0]["path"] == "train/part-00000-of-00001.parquet"
        and len(meta["files"][0]["sha256"]) == 64
    )
    assert out["output_eval"].metadata["num_rows"] == 0 and out["output_eval"].metadata["data_files"] == []
    assert res.manifest["source_format"] == ("json" if fmt == "jsonl" else fmt)
    assert json.loads(Path(out["output_train"].path).read_text())["name"] == "d"
    assert sorted(p.name for p in (workspace / "datasets").iterdir()) == ["d"]  # no scratch or temp left


def test_folder_splits_and_split_expressions(tmp_path, workspace):
    build_tiny_dataset(tmp_path / "tiny", train_rows=100, eval_rows=10)
    res = initialize_dataset(
        str(tmp_path / "tiny"),
        str(workspace),
        data_format="jsonl",
        train_split="train[:30]",
        eval_split="test",
    )
    assert res.path.name == "tiny"
    assert res.train_metadata["num_rows"] == 30 and res.train_metadata["source_split"] == "train[:30]"
    assert res.eval_metadata["num_rows"] == 10 and res.eval_metadata["source_split"] == "test"
    expected = [json.loads(line) for line in (tmp_path / "tiny" / "train.jsonl").read_text().splitlines()]
    assert rows_of(res.train_metadata, workspace) == expected[:30]

    # The kit writes the same rows as jsonl and parquet; without data_format the parquet files are read.
    auto = initialize_dataset(str(tmp_path / "tiny"), str(workspace), name="auto", train_split="train[:30]")
    assert auto.manifest["source_format"] == "parquet"
    assert rows_of(auto.train_metadata, workspace) == expected[:30]

    pct = initialize_dataset(
        str(tmp_path / "tiny" / "train.parquet"),
        str(workspace),
        name="pct",
        train_split="train[:90%]",
        eval_split="train[90%:]",
    )
    assert (pct.train_metadata["num_rows"], pct.eval_metadata["num_rows"]) == (90, 10)
    assert rows_of(pct.eval_metadata, workspace) == expected[90:]

    with pytest.raises(ValueError, match="split 'validation'"):
        initialize_dataset(
            str(tmp_path / "tiny"), str(workspace), name="x", data_format="jsonl", eval_split="validation"
        )


def test_column_map_and_alpaca(tmp_path, workspace):
    qa = [{"question": f"q{i}", "answer": f"a{i}", "extra": i} for i in range(5)]
    res = initialize_dataset(
        str(write_rows(tmp_path / "qa.jsonl", qa, "jsonl")),
        str(workspace),
        column_map={"input": "question", "output": "answer"},
    )
    assert res.train_metadata["columns"] == ["input", "output"]
    assert res.train_metadata["column_map"] == {"input": "question", "output": "answer"}
    assert rows_of(res.train_metadata, workspace)[0] == {"input": "q0", "output": "a0"}

    alpaca = [{"instruction": "Add", "input": "1 1" if i % 2 else None, "output": "2"} for i in range(4)]
    res = initialize_dataset(str(write_rows(tmp_path / "alpaca.parquet", alpaca, "parquet")), str(workspace))
    assert res.train_metadata["data_style"] == "alpaca"
    assert res.train_metadata["columns"] == ["instruction", "output", "input"]


def test_json_lines_streamed_by_pyarrow_match_the_datasets_json_builder(tmp_path):
    """JSON Lines take a faster path than `datasets.load_dataset("json")`: same rows, same column types."""
    import datasets

    from kfp_finetune.components.dataset_initialize.sources import _read_json_lines

    rows = [
        {
            "messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": f"a {i}"}],
            "score": i / 7,
            "turns": i,
            "flagged": i % 2 == 0,
            "tags": ["x"] * (i % 3),
            "note": None if i % 4 else f"n {i}",
        }
        for i in range(50)
    ]
    src = write_rows(tmp_path / "mixed.jsonl", rows, "jsonl")
    streamed = _read_json_lines([str(src)], tmp_path / "scratch" / "train.arrow")
    reference = datasets.load_dataset(
        "json", data_files=str(src), split="train", cache_dir=str(tmp_path / "c")
    )
    assert streamed.features == reference.features
    assert streamed.to_list() == reference.to_list() == rows


def test_json_lines_pyarrow_cannot_stream_are_read_by_the_datasets_builder(tmp_path, workspace):
    """A field that first appears after pyarrow's first block (1 MiB) stops its streaming reader."""
    rows = [{"input": f"Reverse: {i}", "output": str(i)} for i in range(40_000)]
    rows[-1]["source"] = "added late"
    src = write_rows(tmp_path / "late.jsonl", rows, "jsonl")
    assert src.stat().st_size > 1 << 20
    res = initialize_dataset(str(src), str(workspace), name="late")
    assert res.train_metadata["num_rows"] == 40_000
    assert rows_of(res.train_metadata, workspace)[-1] == {"input": "Reverse: 39999", "output": "39999"}


def test_chat_and_text_types(tmp_path, workspace):
    openai = [
        {"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": "hello"}]}
        for i in range(3)
    ]
    res = initialize_dataset(
        str(write_rows(tmp_path / "chat.jsonl", openai, "jsonl")), str(workspace), dataset_type="chat"
    )
    assert res.train_metadata["data_style"] == "openai"
    assert res.train_metadata["conversation_style"] == "openai"
    assert res.train_metadata["conversation_column"] == "messages"
    assert rows_of(res.train_metadata, workspace) == openai

    sharegpt = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}]}] * 2
    res = initialize_dataset(
        str(write_rows(tmp_path / "sg.jsonl", sharegpt, "jsonl")), str(workspace), dataset_type="chat"
    )
    assert res.train_metadata["data_style"] == "sharegpt"
    assert res.train_metadata["conversation_column"] == "conversations"

    text = [{"content": f"line {i}"} for i in range(3)]
    res = initialize_dataset(
        str(write_rows(tmp_path / "t.csv", text, "csv")),
        str(workspace),
        dataset_type="text",
        column_map={"text": "content"},
    )
    assert res.train_metadata["columns"] == ["text"] and res.train_metadata["num_rows"] == 3
    assert res.train_metadata["text_column"] == "text"


@pytest.mark.parametrize(
    ("rows", "kwargs", "message"),
    [
        (
            [{"prompt": "a", "output": "b"}],
            {},
            r"needs column\(s\) 'input'; the data has \['prompt', 'output'\]",
        ),
        (
            [{"q": "a", "output": "b"}],
            {"column_map": {"input": "question"}},
            r"'input' \(mapped to 'question'\)",
        ),
        (
            [{"input": "a", "output": "b"}] * 3
            + [{"input": "a", "output": None}, {"input": " ", "output": "b"}],
            {},
            r"2 of 5 rows .* first: bad.jsonl line 4: output is null; bad.jsonl line 5: input is empty",
        ),
        ([{"input": "a", "output": 1}], {}, r"column 'output' has type int64, expected strings"),
        (
            [
                {"messages": [{"role": "user", "content": "a"}]},
                {"messages": [{"role": "robot", "content": "b"}]},
            ],
            {"dataset_type": "chat"},
            r"bad.jsonl line 2: messages message 0 has role 'robot'",
        ),
        ([{"messages": []}], {"dataset_type": "chat"}, r"bad.jsonl line 1: messages is not a non-empty list"),
        (
            [{"dialog": "x"}],
            {"dataset_type": "chat"},
            r"`messages` \(OpenAI\) or `conversations` \(ShareGPT\)",
        ),
        ([{"text": "ok"}, {"text": None}], {"dataset_type": "text"}, r"bad.jsonl line 2: text is null"),
    ],
)
def test_validation_errors_name_columns_and_first_bad_rows(tmp_path, workspace, rows, kwargs, message):
    src = write_rows(tmp_path / "bad.jsonl", rows, "jsonl")
    with pytest.raises(DatasetValidationError, match=message):
        initialize_dataset(str(src), str(workspace), name="bad", **kwargs)
    assert not (workspace / "datasets" / "bad").exists()
    assert not [p for p in (workspace / "datasets").iterdir()]  # no temp or scratch dirs left


def test_validation_errors_name_the_source_line_not_the_shuffled_index(tmp_path, workspace):
    rows = [{"input": f"i{i}", "output": f"o{i}"} for i in range(200)]
    rows[150]["output"] = " "
    src = tmp_path / "d.jsonl"
    # A blank line before the bad row: it is skipped by the reader but counts as a line of the file.
    lines = [json.dumps(r) for r in rows]
    src.write_text("\n".join(lines[:100] + [""] + lines[100:]) + "\n")
    with pytest.raises(
        DatasetValidationError, match=r"1 of \d+ rows .* first: d.jsonl line 152: output is empty"
    ):
        initialize_dataset(str(src), str(workspace), eval_fraction=0.5, seed=3)
    # A slice keeps the file's numbering.
    with pytest.raises(DatasetValidationError, match=r"d.jsonl line 152: output is empty"):
        initialize_dataset(str(src), str(workspace), train_split="train[120:]")


def test_validation_errors_name_the_file_of_a_folder_and_its_row_or_line(tmp_path, workspace):
    rows = [{"input": f"i{i}", "output": f"o{i}"} for i in range(6)]
    bad = [*rows[:4], {"input": "x", "output": None}, rows[5]]
    folder = tmp_path / "folder"
    write_rows(folder / "train-0.jsonl", rows, "jsonl")
    write_rows(folder / "train-1.jsonl", bad, "jsonl")
    with pytest.raises(DatasetValidationError, match=r"first: train-1.jsonl line 5: output is null"):
        initialize_dataset(str(folder), str(workspace))

    for fmt, location in (("parquet", "row 4"), ("json", "row 4"), ("arrow", "row 4")):
        many = tmp_path / fmt
        write_rows(many / f"train-0.{fmt}", rows, fmt)
        write_rows(many / f"train-1.{fmt}", bad, fmt)
        with pytest.raises(DatasetValidationError, match=rf"first: train-1.{fmt} {location}: output is null"):
            initialize_dataset(str(many), str(workspace), name=fmt)

    # CSV: the header is line 1, and a quoted value may span lines.
    csv_file = tmp_path / "d.csv"
    csv_file.write_text('input,output\n"two\nlines",a\nb,c\n\nd,\n')
    with pytest.raises(DatasetValidationError, match=r"first: d.csv line 6: output is null"):
        initialize_dataset(str(csv_file), str(workspace), name="csv")


def test_per_row_system_prompt_is_written_as_openai_messages(tmp_path, workspace, log_lines):
    rows = [
        {"persona": "You are terse.", "question": "q0", "answer": "a0", "extra": 1},
        {"persona": None, "question": "q1", "answer": "a1", "extra": 2},
        {"persona": " ", "question": "q2", "answer": "a2", "extra": 3},
    ]
    src = write_rows(tmp_path / "sys.jsonl", rows, "jsonl")
    res = initialize_dataset(
        str(src), str(workspace), column_map={"input": "question", "output": "answer", "system": "persona"}
    )
    meta = res.train_metadata
    assert (meta["dataset_type"], meta["data_style"], meta["columns"]) == ("chat", "openai", ["messages"])
    assert (meta["conversation_style"], meta["conversation_column"]) == ("openai", "messages")
    assert rows_of(meta, workspace) == [
        {
            "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "q0"},
                {"role": "assistant", "content": "a0"},
            ]
        },
        {"messages": [{"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]},
        {"messages": [{"role": "user", "content": "q2"}, {"role": "assistant", "content": "a2"}]},
    ]
    assert any("per-row system prompt (column 'persona')" in line for line in log_lines)
    assert "columns not used by input_output data, dropped: extra" in log_lines

    alpaca = [
        {"system": "Be exact.", "instruction": "Add", "input": "1 1", "output": "2"},
        {"system": "Be exact.", "instruction": "Say hi", "input": "", "output": "hi"},
    ]
    res = initialize_dataset(
        str(write_rows(tmp_path / "alpaca.parquet", alpaca, "parquet")), str(workspace), eval_fraction=0.5
    )
    written = rows_of(res.train_metadata, workspace) + rows_of(res.eval_metadata, workspace)
    users = sorted(m["messages"][1]["content"] for m in written)
    assert users == ["Add\n\n1 1", "Say hi"]
    assert all(m["messages"][0] == {"role": "system", "content": "Be exact."} for m in written)
    assert res.eval_metadata["dataset_type"] == "chat"


def test_eval_split_without_the_optional_system_column(tmp_path, workspace):
    folder = tmp_path / "splits"
    write_rows(folder / "train.jsonl", [{"system": "S", "input": "i", "output": "o"}] * 2, "jsonl")
    write_rows(folder / "test.jsonl", [{"input": "j", "output": "p"}], "jsonl")
    res = initialize_dataset(str(folder), str(workspace), eval_split="test")
    assert rows_of(res.eval_metadata, workspace) == [
        {"messages": [{"role": "user", "content": "j"}, {"role": "assistant", "content": "p"}]}
    ]
    write_rows(folder / "test.jsonl", [{"input": "j"}], "jsonl")
    with pytest.raises(
        DatasetValidationError, match=r"lacks column\(s\) \['output'\] that the train split has"
    ):
        initialize_dataset(str(folder), str(workspace), name="bad", eval_split="test")


def test_text_files_one_row_per_line(tmp_path, workspace, log_lines):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("first line\n\nsecond line\n")
    (corpus / "b.txt").write_text("third line\n   \nfourth line")
    res = initialize_dataset(str(corpus), str(workspace), dataset_type="text")
    meta = res.train_metadata
    assert (meta["dataset_type"], meta["text_column"], res.manifest["source_format"]) == (
        "text",
        "text",
        "text",
    )
    assert [r["text"] for r in rows_of(meta, workspace)] == [
        "first line",
        "second line",
        "third line",
        "fourth line",
    ]
    assert "skipped 2 blank line(s) of the text files" in log_lines

    single = initialize_dataset(str(corpus / "a.txt"), str(workspace), name="one", dataset_type="text")
    assert single.train_metadata["num_rows"] == 2
    with pytest.raises(
        DatasetValidationError, match=r"needs column\(s\) 'input', 'output'; the data has \['text'\]"
    ):
        initialize_dataset(str(corpus), str(workspace), name="bad")


def test_empty_split_is_an_error(tmp_path, workspace):
    src = tmp_path / "empty.csv"
    src.write_text("input,output\n")
    with pytest.raises(DatasetValidationError, match="split 'train' is empty"):
        initialize_dataset(str(src), str(workspace))
    rows = write_rows(tmp_path / "rows.jsonl", ROWS, "jsonl")
    with pytest.raises(DatasetValidationError, match=r"split 'train\[:0\]' is empty"):
        initialize_dataset(str(rows), str(workspace), train_split="train[:0]")


def test_eval_fraction_is_deterministic_per_seed(tmp_path, workspace):
    rows = [{"input": f"i{i}", "output": f"o{i}"} for i in range(200)]
    src = str(write_rows(tmp_path / "d.parquet", rows, "parquet"))
    a = initialize_dataset(src, str(workspace), name="a", eval_fraction=0.1, seed=7)
    b = initialize_dataset(src, str(workspace), name="b", eval_fraction=0.1, seed=7)
    c = initialize_dataset(src, str(workspace), name="c", eval_fraction=0.1, seed=8)
    eval_a, eval_b = rows_of(a.eval_metadata, workspace), rows_of(b.eval_metadata, workspace)
    assert len(eval_a) == 20 and eval_a == eval_b
    assert eval_a != rows_of(c.eval_metadata, workspace)
    train_a = rows_of(a.train_metadata, workspace)
    assert sorted(r["input"] for r in train_a + eval_a) == sorted(r["input"] for r in rows)
    assert a.eval_metadata["files"] == b.eval_metadata["files"]  # byte-identical shards
    with pytest.raises(ValueError, match="either data_eval_split or data_eval_fraction"):
        initialize_dataset(src, str(workspace), eval_split="test", eval_fraction=0.1)


def test_shards_keep_row_order(tmp_path, workspace):
    rows = [{"input": f"i{i}", "output": f"o{i}"} for i in range(25)]
    res = initialize_dataset(
        str(write_rows(tmp_path / "d.jsonl", rows, "jsonl")), str(workspace), rows_per_shard=10
    )
    assert [Path(f).name for f in res.train_metadata["data_files"]] == [
        "part-00000-of-00003.parquet",
        "part-00001-of-00003.parquet",
        "part-00002-of-00003.parquet",
    ]
    assert rows_of(res.train_metadata, workspace) == rows


def test_skip_if_present_and_rebuild_on_change(tmp_path, workspace):
    src = write_rows(tmp_path / "d.jsonl", ROWS, "jsonl")
    first = initialize_dataset(str(src), str(workspace))
    again = initialize_dataset(str(src), str(workspace))
    assert again.skipped and again.train_metadata["reused_existing_copy"] is True
    assert again.train_metadata["files"] == first.train_metadata["files"]
    assert not initialize_dataset(
        str(src), str(workspace), train_split="train[:5]"
    ).skipped  # other parameters
    write_rows(src, ROWS[:10], "jsonl")
    changed = initialize_dataset(str(src), str(workspace))  # other content
    assert not changed.skipped and changed.train_metadata["num_rows"] == 10


def test_leftovers_of_a_killed_run_are_removed_and_not_reused(tmp_path, workspace):
    src = write_rows(tmp_path / "d.jsonl", ROWS, "jsonl")
    datasets_dir = workspace / "datasets"
    (datasets_dir / ".d.tmp-0123abcd" / "train").mkdir(parents=True)
    (datasets_dir / ".d.tmp-scratch-xyz" / "cache").mkdir(parents=True)
    (datasets_dir / "d" / "train").mkdir(parents=True)  # no manifest: not complete
    (datasets_dir / "d" / "train" / "part-00000-of-00001.parquet").write_bytes(b"half")
    res = initialize_dataset(str(src), str(workspace), name="d")
    assert not res.skipped and rows_of(res.train_metadata, workspace) == ROWS
    assert sorted(p.name for p in datasets_dir.iterdir()) == ["d"]


def test_https_single_file(tmp_path, workspace, monkeypatch):
    served = tmp_path / "www"
    write_rows(served / "train.jsonl", ROWS, "jsonl")
    with https_server(served, tmp_path, monkeypatch) as server:
        url = f"{server.url}/train.jsonl"
        res = initialize_dataset(url, str(workspace), eval_fraction=0.25)
    assert res.path.name == "train" and res.train_metadata["source_uri"] == url
    assert (res.train_metadata["num_rows"], res.eval_metadata["num_rows"]) == (15, 5)


@pytest.mark.slow
def test_s3_folder(tmp_path, workspace, monkeypatch):
    use_s3_credentials(monkeypatch)
    build_tiny_dataset(tmp_path / "tiny", train_rows=40, eval_rows=5)
    with moto_s3() as endpoint:
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="data")
        for name in ("train.parquet", "eval.parquet"):
            client.upload_file(str(tmp_path / "tiny" / name), "data", f"reverse/{name}")
        res = initialize_dataset(
            "s3://data/reverse", str(workspace), eval_split="test", s3_endpoint_url=endpoint
        )
    assert (res.train_metadata["num_rows"], res.eval_metadata["num_rows"]) == (40, 5)
    assert res.path.name == "reverse"


INIT_FROM_HUB = """
    import json, sys
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    try:
        res = initialize_dataset(*sys.argv[1:3], **json.loads(sys.argv[3]))
        print(json.dumps({"train": res.train_metadata, "eval": res.eval_metadata}))
    except Exception as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


@pytest.mark.slow
def test_hf_dataset_repo_through_the_datasets_library(tmp_path, workspace):
    build_tiny_dataset(tmp_path / "repo", train_rows=60, eval_rows=6)
    (tmp_path / "repo" / "README.md").write_text("# reverse\n")
    with HubStandin() as hub:
        repo = hub.add_repo("org/reverse", {"main": tmp_path / "repo"}, repo_type="dataset")
        hub.add_repo("org/gated-data", tmp_path / "repo", repo_type="dataset", gated=True)
        hub.fail_once("train.parquet", "500")  # a transient hub error while `datasets` downloads
        env = hub_env(hub.endpoint, tmp_path)
        kwargs = json.dumps({"train_split": "train[:50%]", "eval_split": "test"})
        out = result(run_python(INIT_FROM_HUB, env, "hf://org/reverse@main", str(workspace), kwargs))
        gated = result(run_python(INIT_FROM_HUB, env, "hf://org/gated-data", str(workspace), "{}"))
        train_gets = [
            s for m, p, s in hub.requests if m == "GET" and p.split("?")[0].endswith("/train.parquet")
        ]
    assert out["train"]["commit_sha"] == repo.revisions["main"].commit and out["train"]["revision"] == "main"
    assert (out["train"]["num_rows"], out["eval"]["num_rows"]) == (30, 6)
    assert out["train"]["workspace_path"] == "datasets/reverse/train"
    assert "gated" in gated["message"] and "org/gated-data" in gated["message"]
    assert train_gets[0] == 500 and train_gets[-1] == 200
