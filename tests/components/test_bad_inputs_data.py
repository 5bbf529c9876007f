"""Bad inputs to dataset-initialize and model-initialize (issue 16 item 7), one table row each.

Each row builds real files, calls the component's plain-Python entry point and expects an error of a class the
component's `usage_errors(...)` turns into one line, whose message names the file / line / row / parameter and
the fix; and nothing left in the workspace (no entry folder, no partial copy). See test_bad_inputs_steps.py for
torchtune-finetune, evaluate, export and the CLI.
"""

from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from kfp_finetune.components._shared.storage import StorageError
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
from kfp_finetune.components.model_initialize.initialize import ModelVerificationError, initialize_model

# The classes each component body names in usage_errors(...): anything else would print a traceback.
DATASET_ERRORS = (StorageError, ValueError)
MODEL_ERRORS = (StorageError, ModelVerificationError, ValueError)

GOOD = [{"input": f"question {i}", "output": f"answer {i}"} for i in range(4)]


def jsonl(rows: list) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def write(folder: Path, name: str, content: str | bytes) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    return path


def parquet(folder: Path, name: str, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = folder / name
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def turn(role: str, content: str) -> dict:
    return {"role": role, "content": content}


def chat(src: Path, messages: list[dict]) -> dict:
    """Chat data whose second line is the conversation given (the first is a good one)."""
    good = {"messages": [turn("user", "hi"), turn("assistant", "hello")]}
    return {
        "source_uri": str(write(src, "train.jsonl", jsonl([good, {"messages": messages}]))),
        "dataset_type": "chat",
    }


def sharegpt(src: Path, turns: list[tuple[str, str]]) -> dict:
    good = {"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "hello"}]}
    bad = {"conversations": [{"from": speaker, "value": value} for speaker, value in turns]}
    return {"source_uri": str(write(src, "train.jsonl", jsonl([good, bad]))), "dataset_type": "chat"}


def truncated_parquet(src: Path) -> str:
    path = parquet(src, "train.parquet", GOOD * 50)
    path.write_bytes(path.read_bytes()[:-40])
    return str(path)


# --- dataset-initialize ---------------------------------------------------------------------------------------
# (id, builder(src) -> initialize_dataset keyword arguments, message fragments)
DATASET_ROWS = [
    ("empty-jsonl", lambda s: {"source_uri": str(write(s, "train.jsonl", ""))}, ["train.jsonl", "empty"]),
    (
        "blank-lines-only-jsonl",
        lambda s: {"source_uri": str(write(s, "train.jsonl", "\n\n  \n"))},
        ["train.jsonl", "empty"],
    ),
    (
        "non-utf8-jsonl",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl(GOOD[:2]).encode() + b'{"input": "caf\xe9"}\n'))
        },
        ["train.jsonl", "line 3", "UTF-8"],
    ),
    (
        "non-utf8-optional-system-column",
        lambda s: {
            "source_uri": str(
                write(
                    s,
                    "train.jsonl",
                    jsonl(GOOD).encode() + b'{"input": "q", "output": "a", "system": "\xff"}\n',
                )
            )
        },
        ["train.jsonl line 5", "system is not UTF-8", "Save the source files as UTF-8"],
    ),
    (
        "broken-json-line",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl(GOOD[:2]) + '{"input": "x", "output": \n'))
        },
        ["train.jsonl", "line 3"],
    ),
    (
        "json-line-not-an-object",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD[:2]) + "[1, 2]\n"))},
        ["train.jsonl", "line 3"],
    ),
    (
        "broken-json-array",
        lambda s: {"source_uri": str(write(s, "train.json", '[{"input": "a", "output": "b"}, {"input": '))},
        ["train.json"],
    ),
    ("truncated-parquet", lambda s: {"source_uri": truncated_parquet(s)}, ["train.parquet", "parquet"]),
    (
        "not-a-parquet-file",
        lambda s: {"source_uri": str(write(s, "train.parquet", "input,output\na,b\n"))},
        ["train.parquet", "parquet"],
    ),
    (
        "corrupt-gzip",
        lambda s: {"source_uri": str(write(s, "train.jsonl.gz", gzip.compress(jsonl(GOOD).encode())[:-12]))},
        ["train.jsonl.gz"],
    ),
    (
        "non-utf8-csv",
        lambda s: {"source_uri": str(write(s, "train.csv", b"input,output\na,b\ncaf\xe9,c\n"))},
        ["train.csv", "UTF-8"],
    ),
    (
        "empty-csv",
        lambda s: {"source_uri": str(write(s, "train.csv", ""))},
        ["train.csv", "empty"],
    ),
    (
        "missing-required-column",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl([{"input": "a"}])))},
        ["'output'", "column_map"],
    ),
    (
        "column-map-names-absent-column",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl(GOOD))),
            "column_map": {"input": "question"},
        },
        ["'question'", "column_map"],
    ),
    (
        "blank-output-row",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl([*GOOD[:2], {"input": "q", "output": " "}])))
        },
        ["train.jsonl line 3", "output is empty", "Fix or remove"],
    ),
    (
        "null-output-row",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl([*GOOD[:1], {"input": "q", "output": None}])))
        },
        ["train.jsonl line 2", "output is null"],
    ),
    (
        "numeric-output-column",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl([{"input": "q", "output": 3}] * 3)))},
        ["'output'", "int64", "strings"],
    ),
    (
        "non-string-system-column",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl([{**r, "system": 7} for r in GOOD])))},
        ["'system'", "strings"],
    ),
    (
        "blank-parquet-row",
        lambda s: {"source_uri": str(parquet(s, "train.parquet", [*GOOD, {"input": "", "output": "x"}]))},
        ["train.parquet row 4", "input is empty"],
    ),
    (
        "blank-csv-row",
        lambda s: {"source_uri": str(write(s, "train.csv", 'input,output\na,b\n"multi\nline",\n'))},
        ["train.csv line 3", "output is"],
    ),
    (
        "chat-data-without-messages",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "dataset_type": "chat"},
        ["messages", "conversations", "column_map"],
    ),
    (
        "chat-bad-role",
        lambda s: {
            "source_uri": str(
                write(s, "train.jsonl", jsonl([{"messages": [{"role": "robot", "content": "hi"}]}]))
            ),
            "dataset_type": "chat",
        },
        ["train.jsonl line 1", "'robot'"],
    ),
    (
        "chat-message-content-not-string",
        lambda s: {
            "source_uri": str(
                write(s, "train.jsonl", jsonl([{"messages": [{"role": "user", "content": 5}]}]))
            ),
            "dataset_type": "chat",
        },
        ["train.jsonl line 1", "content"],
    ),
    (
        "sharegpt-bad-from",
        lambda s: {
            "source_uri": str(
                write(s, "train.jsonl", jsonl([{"conversations": [{"from": "bot", "value": "hi"}]}]))
            ),
            "dataset_type": "chat",
        },
        ["train.jsonl line 1", "'bot'"],
    ),
    (
        "chat-tool-role",
        lambda s: chat(s, [turn("user", "weather?"), turn("assistant", "calling"), turn("tool", "sunny")]),
        [
            "train.jsonl line 2",
            "message 2 is a tool turn (role 'tool')",
            "torchtune 0.6.1",
            "take the tool turns out",
        ],
    ),
    (
        "chat-tool-calls",
        lambda s: chat(
            s,
            [
                turn("user", "weather?"),
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"type": "function", "function": {"name": "weather", "arguments": "{}"}}],
                },
            ],
        ),  # fmt: skip
        ["train.jsonl line 2", "message 1 is a tool turn (tool_calls)", "torchtune 0.6.1"],
    ),
    (
        "chat-ipython-role",
        lambda s: chat(s, [turn("user", "run it"), turn("ipython", "42"), turn("assistant", "42")]),
        ["train.jsonl line 2", "role 'ipython'", "system, user and assistant"],
    ),
    (
        "sharegpt-function-call",
        lambda s: sharegpt(s, [("human", "weather?"), ("function_call", "{}"), ("gpt", "sunny")]),
        ["train.jsonl line 2", "from 'function_call'", "tool turn"],
    ),
    (
        "chat-user-only",
        lambda s: chat(s, [turn("user", "hello?")]),
        ["train.jsonl line 2", "has no assistant turn", "nothing to learn"],
    ),
    (
        "chat-system-and-user-without-assistant",
        lambda s: chat(s, [turn("system", "be brief"), turn("user", "hello?")]),
        ["train.jsonl line 2", "has no assistant turn"],
    ),
    (
        "chat-empty-assistant-turn",
        lambda s: chat(s, [turn("user", "hello?"), turn("assistant", "  ")]),
        ["train.jsonl line 2", "message 1 (assistant) is empty", "Fix or remove"],
    ),
    (
        "sharegpt-empty-gpt-turn",
        lambda s: sharegpt(s, [("human", "hello?"), ("gpt", "")]),
        ["train.jsonl line 2", "message 1 (gpt) is empty"],
    ),
    (
        "chat-turns-out-of-order",
        lambda s: chat(s, [turn("assistant", "hi"), turn("user", "hello?")]),
        ["train.jsonl line 2", "message 0 (assistant) does not follow a user turn"],
    ),
    (
        "wrong-type-at-line-5000",
        lambda s: {
            "source_uri": str(
                write(s, "train.jsonl", jsonl([*GOOD * 1249, GOOD[0], {"input": 5, "output": "x"}]))
            ),
        },
        ["train.jsonl line 4998", "'input'", "1 of 4998 rows", "input is int 5"],
    ),
    (
        "wrong-type-list-output-at-a-late-line",
        lambda s: {
            "source_uri": str(
                write(s, "train.jsonl", jsonl([*GOOD * 1250, {"input": "q", "output": ["a"]}]))
            ),
        },
        ["train.jsonl line 5001", "'output'", "output is list ['a']", "strings"],
    ),
    (
        "column-map-two-columns-from-one",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl([{"q": "a"}] * 3))),
            "column_map": {"input": "q", "output": "q"},
        },
        ["data_column_map", "'input' and 'output'", "same source column 'q'"],
    ),
    (
        "text-data-without-text-column",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "dataset_type": "text"},
        ["'text'", "column_map"],
    ),
    (
        "unknown-dataset-type",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "dataset_type": "qa"},
        ["data_type", "'qa'", "instruct"],
    ),
    (
        "unknown-data-format",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "data_format": "xml"},
        ["data_format", "'xml'"],
    ),
    (
        "eval-fraction-out-of-range",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "eval_fraction": 1.5},
        ["eval_fraction", "[0, 1)"],
    ),
    (
        "eval-split-and-fraction",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl(GOOD))),
            "eval_split": "test",
            "eval_fraction": 0.1,
        },
        ["eval_split", "eval_fraction"],
    ),
    (
        "rows-per-shard-zero",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "rows_per_shard": 0},
        ["rows_per_shard"],
    ),
    (
        "unknown-split",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "eval_split": "test"},
        ["split 'test'", "train"],
    ),
    (
        "bad-split-expression",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "train_split": "train[abc]"},
        ["split 'train[abc]'"],
    ),
    (
        "empty-split-slice",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "train_split": "train[:0]"},
        ["train[:0]", "empty"],
    ),
    ("missing-source-path", lambda s: {"source_uri": str(s / "nope.jsonl")}, ["nope.jsonl"]),
    (
        "folder-without-data-files",
        lambda s: {"source_uri": str(write(s, "d/notes.md", "hi").parent)},
        ["no data files", "data_format"],
    ),
    (
        "unsupported-scheme",
        lambda s: {"source_uri": "ftp://example.com/train.jsonl"},
        ["ftp", "copy the files to S3"],
    ),
    (
        "entry-name-with-slash",
        lambda s: {"source_uri": str(write(s, "train.jsonl", jsonl(GOOD))), "name": "a/b"},
        ["'a/b'", "without '/'"],
    ),
    (
        "symlink-to-another-folders-file",
        lambda s: {
            "source_uri": str(
                linked_out(s / "data", "train.jsonl", write(s, "team-b/rows.jsonl", jsonl(GOOD)))
            )
        },
        ["train.jsonl is a symlink to", "team-b/rows.jsonl", "outside the source folder", "cp -L"],
    ),
]


@pytest.mark.parametrize(
    ("builder", "fragments"), [r[1:] for r in DATASET_ROWS], ids=[r[0] for r in DATASET_ROWS]
)
def test_dataset_initialize_refuses(tmp_path, workspace, builder, fragments):
    src = tmp_path / "src"
    src.mkdir()
    kwargs = builder(src)
    train, eval_ = artifact(tmp_path, "train"), artifact(tmp_path, "eval")
    with pytest.raises(DATASET_ERRORS) as caught:
        initialize_dataset(workspace_path=str(workspace), output_train=train, output_eval=eval_, **kwargs)
    assert_message(caught.value, fragments)
    assert_nothing_written(workspace, "datasets")
    assert not Path(train.path).exists() and not train.metadata


# Rows only the base model's tokenizer can find (dataset-initialize tokenizes every train row for its packs): the
# parquet entry stays (it is valid data, reused by a rerun with a longer tune_max_seq_len), no packs are kept.
# (id, builder(src) -> initialize_dataset keyword arguments, message fragments)
LONG = " ".join(f"word{i}" for i in range(150))  # about 300 tokens of the tiny tokenizer
DATASET_TOKEN_ROWS = [
    (
        "prompts-longer-than-max-seq-len",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl([*GOOD, {"input": LONG, "output": "x"}] * 2))),
            "max_seq_len": 128,
        },
        ["2 of 10 training rows", "fills the 128-token tune_max_seq_len", "train.jsonl line 5; train.jsonl line 10",
         "more than 1%", "set tune_max_seq_len to at least"],
    ),
    (
        "emoji-prompts-count-in-tokens",
        lambda s: {
            "source_uri": str(write(s, "train.jsonl", jsonl([*GOOD, *[{"input": "🙂" * 300, "output": "x"}] * 2]))),
            "max_seq_len": 1024,
        },
        ["2 of 6 training rows", "fills the 1024-token tune_max_seq_len", "train.jsonl line 5", "train.jsonl line 6"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(
    ("builder", "fragments"), [r[1:] for r in DATASET_TOKEN_ROWS], ids=[r[0] for r in DATASET_TOKEN_ROWS]
)
def test_dataset_initialize_refuses_rows_by_their_tokens(tmp_path, workspace, tiny_llama, builder, fragments):
    src = tmp_path / "src"
    src.mkdir()
    train, eval_ = artifact(tmp_path, "train"), artifact(tmp_path, "eval")
    with pytest.raises(DATASET_ERRORS) as caught:
        initialize_dataset(
            workspace_path=str(workspace), output_train=train, output_eval=eval_, base_model_path=tiny_llama,
            **builder(src),
        )  # fmt: skip
    assert_message(caught.value, fragments)
    assert not list(workspace.glob("datasets/*/packs/*")), "packs were kept"
    assert not Path(train.path).exists() and not train.metadata


# --- model-initialize -----------------------------------------------------------------------------------------


def linked_out(folder: Path, name: str, target: Path) -> Path:
    """`folder` holding `name`, a symlink to `target` outside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).symlink_to(target)
    return folder


def copy_model(tiny: Path, src: Path) -> Path:
    folder = src / "model"
    shutil.copytree(tiny, folder)
    return folder


def without(tiny: Path, src: Path, *patterns: str) -> Path:
    folder = copy_model(tiny, src)
    for pattern in patterns:
        for path in folder.glob(pattern):
            path.unlink()
    return folder


def edited(tiny: Path, src: Path, name: str, edit) -> Path:
    folder = copy_model(tiny, src)
    path = folder / name
    path.write_bytes(edit(path.read_bytes()))
    return folder


def sharded_missing(tiny: Path, src: Path) -> Path:
    folder = copy_model(tiny, src)
    index = {"metadata": {}, "weight_map": {"w": "model-00002-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


# (id, builder(tiny, src) -> initialize_model keyword arguments, message fragments)
MODEL_ROWS = [
    ("missing-folder", lambda t, s: {"source_uri": str(s / "nope")}, ["nope"]),
    (
        "empty-folder",
        lambda t, s: {"source_uri": str((s / "m").mkdir() or s / "m")},
        ["m is an empty directory", "put the files there"],
    ),
    (
        "no-config-json",
        lambda t, s: {"source_uri": str(without(t, s, "config.json"))},
        ["config.json is missing"],
    ),
    (
        "config-json-does-not-parse",
        lambda t, s: {"source_uri": str(edited(t, s, "config.json", lambda b: b[:-5]))},
        ["config.json", "does not parse", "line"],
    ),
    (
        "config-json-not-utf8",
        lambda t, s: {"source_uri": str(edited(t, s, "config.json", lambda b: b"\xff\xfe" + b))},
        ["config.json", "does not parse"],
    ),
    (
        "no-weights",
        lambda t, s: {"source_uri": str(without(t, s, "*.safetensors"))},
        ["no weights"],
    ),
    (
        "truncated-safetensors",
        lambda t, s: {"source_uri": str(edited(t, s, "model.safetensors", lambda b: b[: len(b) // 2]))},
        ["model.safetensors", "header says", "truncated", "fetch"],
    ),
    (
        "corrupt-safetensors-header",
        lambda t, s: {
            "source_uri": str(edited(t, s, "model.safetensors", lambda b: b[:8] + b"{oops" + b[13:]))
        },
        ["model.safetensors", "corrupt header", "bytes 8-", "fetch"],
    ),
    (
        "index-lists-missing-shard",
        lambda t, s: {"source_uri": str(sharded_missing(t, s))},
        ["model-00002-of-00002.safetensors", "missing"],
    ),
    (
        "no-tokenizer",
        lambda t, s: {
            "source_uri": str(without(t, s, "tokenizer*", "original/*", "vocab.json", "merges.txt"))
        },
        ["no tokenizer", "llama"],
    ),
    (
        "allow-patterns-match-nothing",
        lambda t, s: {"source_uri": str(copy_model(t, s)), "allow_patterns": ["*.gguf"]},
        ["no files match", "*.gguf"],
    ),
    (
        "entry-name-with-slash",
        lambda t, s: {"source_uri": str(copy_model(t, s)), "name": "../escape"},
        ["'../escape'", "without '/'"],
    ),
    ("unsupported-scheme", lambda t, s: {"source_uri": "gs://bucket/model"}, ["gs"]),
    (
        "license-symlink-outside",
        lambda t, s: {
            "source_uri": str(
                linked_out(copy_model(t, s), "LICENSE.txt", write(s, "etc/passwd", "root:x:0:0"))
            )
        },
        ["LICENSE.txt is a symlink to", "etc/passwd", "outside the source folder", "cp -L"],
    ),
]


@pytest.mark.parametrize(
    ("builder", "fragments"), [r[1:] for r in MODEL_ROWS], ids=[r[0] for r in MODEL_ROWS]
)
def test_model_initialize_refuses(tmp_path, workspace, tiny_llama, builder, fragments):
    src = tmp_path / "src"
    src.mkdir()
    kwargs = builder(Path(tiny_llama), src)
    output = artifact(tmp_path, "model")
    with pytest.raises(MODEL_ERRORS) as caught:
        initialize_model(workspace_path=str(workspace), output_model=output, max_workers=2, **kwargs)
    assert_message(caught.value, fragments)
    assert_nothing_written(workspace, "models")
    assert not Path(output.path).exists() and not output.metadata


# (id, the cache settings given the test's folders (src, a read-only folder), message fragments)
CACHE_ROWS = [
    (
        "relative",
        lambda src, ro: {"cache_path": "model-cache"},
        ["model_cache_path", "absolute path", "'model-cache'"],
    ),
    (
        "a-file",
        lambda src, ro: {"cache_path": str(write(src, "cache", ""))},
        ["model_cache_path", "is a file", "leave it empty for no cache"],
    ),
    (
        "under-a-file",
        lambda src, ro: {"cache_path": str(write(src, "cache", "") / "models")},
        ["model_cache_path (model-initialize's cache_path)", "is a file", "read-write volume"],
    ),
    (
        "read-only",
        lambda src, ro: {"cache_path": str(ro)},
        ["model_cache_path", "read-only", "cannot be written", "read-write volume"],
    ),
    # 0 would remove, at once, an entry another run is training from in place.
    (
        "keep-days-0",
        lambda src, ro: {"cache_path": str(src.parent / "cache"), "cache_keep_days": 0},
        ["model_cache_keep_days", "1 or more days", "-1 to keep every entry"],
    ),
    (
        "keep-days-negative",
        lambda src, ro: {"cache_path": str(src.parent / "cache"), "cache_keep_days": -2},
        ["model_cache_keep_days", "1 or more days", "got -2"],
    ),
]


@pytest.mark.parametrize(("cache", "fragments"), [r[1:] for r in CACHE_ROWS], ids=[r[0] for r in CACHE_ROWS])
def test_model_initialize_refuses_cache_settings(
    tmp_path, workspace, tiny_llama, read_only_folder, cache, fragments
):
    """A cache_path the step cannot write or a cache_keep_days below a day fails at once, naming it, before the
    source is listed or fetched."""
    src = tmp_path / "src"
    src.mkdir()
    output = artifact(tmp_path, "model")
    with pytest.raises(MODEL_ERRORS) as caught:
        initialize_model(
            source_uri=str(copy_model(Path(tiny_llama), src)),
            workspace_path=str(workspace),
            output_model=output,
            **cache(src, read_only_folder),
        )
    assert_message(caught.value, fragments)
    assert "\n" not in str(caught.value)
    assert_nothing_written(workspace, "models")
    assert not list((tmp_path / "cache").rglob("*.safetensors"))
    assert not Path(output.path).exists() and not output.metadata


# --- helpers shared by both tables --------------------------------------------------------------------------


def artifact(tmp_path: Path, name: str) -> SimpleNamespace:
    return SimpleNamespace(path=str(tmp_path / "artifacts" / name), metadata={})


def assert_message(error: BaseException, fragments: list[str]) -> None:
    message = str(error)
    assert "Traceback" not in message
    missing = [f for f in fragments if f.lower() not in message.lower()]
    assert not missing, f"message {message!r} lacks {missing}"


def assert_nothing_written(workspace: Path, area: str) -> None:
    """No file anywhere in the workspace, and no entry (finished, partial or scratch) in the area."""
    files = [p for p in workspace.rglob("*") if not p.is_dir()]
    assert not files, f"left in the workspace: {files}"
    entries = list((workspace / area).iterdir()) if (workspace / area).is_dir() else []
    assert not entries, f"left in {area}/: {entries}"


@pytest.mark.parametrize(
    "batch, fragments",
    [
        (
            {"gradient_accumulation_steps": 8},
            ["4 training row(s)", "tune_gradient_accumulation_steps=8", "(8 rows)"],
        ),
        (
            {"batch_size": 3, "gradient_accumulation_steps": 2},
            ["tune_batch_size=3", "(6 rows)", "Lower them"],
        ),
    ],
)
def test_batch_settings_larger_than_the_data_are_refused_at_dataset_initialize(
    tmp_path, workspace, batch, fragments
):
    """A gradient accumulation (or batch) the user set that no number of devices could fill from these rows is
    refused in seconds at dataset-initialize, not after the base model's download; the valid entry stays for a
    rerun with other settings."""
    source = write(tmp_path, "train.jsonl", jsonl(GOOD))
    with pytest.raises(DATASET_ERRORS) as caught:
        initialize_dataset(str(source), str(workspace), eval_fraction=0.0, **batch)
    assert_message(caught.value, fragments)
    # Unset settings are the fine-tune defaults' to fit (run_length.py); settings the rows fill pass.
    initialize_dataset(str(source), str(workspace), eval_fraction=0.0)
    initialize_dataset(
        str(source), str(workspace), eval_fraction=0.0, batch_size=2, gradient_accumulation_steps=2
    )
