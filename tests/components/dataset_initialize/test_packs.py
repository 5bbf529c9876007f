"""dataset-initialize with the base model: the train split tokenized and packed once, recorded in its metadata."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("torchtune")

from kfp_finetune.components._shared.contract import DatasetSplit  # noqa: E402
from kfp_finetune.components._shared.cpus import pod_processes  # noqa: E402
from kfp_finetune.components._shared.seq_len_rule import MULTIPLE  # noqa: E402
from kfp_finetune.components._shared.torchtune import packing  # noqa: E402
from kfp_finetune.components._shared.torchtune.pack_file import ArrowPacks  # noqa: E402
from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset  # noqa: E402
from kfp_finetune.tiny.dataset import build_tiny_dataset  # noqa: E402


@pytest.fixture
def source(tmp_path):
    return build_tiny_dataset(tmp_path / "tiny", train_rows=600, eval_rows=20)["train.jsonl"]


def test_train_split_is_packed_with_the_base_models_tokenizer(source, tmp_path, tiny_llama, log_lines):
    workspace = tmp_path / "ws"
    result = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.1, base_model_path=tiny_llama, num_proc=2
    )
    split = DatasetSplit.from_metadata(result.train_metadata, input_name="train_data")
    stats = split.token_stats
    assert stats["count"] == split.num_rows == 540
    assert (
        0 < stats["prompt_max"] < stats["max"]
        and stats["p50"] <= stats["p90"] <= stats["p99"] <= stats["max"]
    )
    assert split.max_seq_len == MULTIPLE  # the tiny rows' 99th percentile, rounded up to 256
    assert split.tokenizer_fingerprint and split.pack_fingerprint
    assert split.pack_template["_component_"] == "torchtune.datasets.instruct_dataset"
    (pack,) = split.packs
    packs = ArrowPacks([workspace / pack["path"]])
    assert len(packs) == pack["num_packs"] > 0 and packs.max_seq_len == split.max_seq_len
    assert int(sum((p["labels"] != -100).sum() for p in [packs[i] for i in range(len(packs))])) > 0
    assert any("tokenized 540 rows" in line for line in log_lines)
    assert "token_stats" not in result.eval_metadata  # only the train split is packed

    again = initialize_dataset(str(source), str(workspace), eval_fraction=0.1, base_model_path=tiny_llama)
    assert again.skipped and again.train_metadata["packs"] == result.train_metadata["packs"]
    assert any("already in" in line for line in log_lines)

    fixed = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.1, base_model_path=tiny_llama, max_seq_len=64
    )
    assert fixed.train_metadata["max_seq_len"] == 64
    assert fixed.train_metadata["pack_fingerprint"] != result.train_metadata["pack_fingerprint"]


def test_without_the_base_model_nothing_is_tokenized(source, tmp_path):
    result = initialize_dataset(str(source), str(tmp_path / "ws"))
    assert "packs" not in result.train_metadata or not result.train_metadata["packs"]
    assert "token_stats" not in result.train_metadata


def test_the_component_packs_with_the_masking_it_is_given(source, tmp_path, tiny_llama, capsys):
    """The component's train_on_input / new_system_prompt (the fine-tune step's spelling: "auto" | "true" |
    "false", "" for none) reach the dataset node the packs are made from, and so the recorded template."""
    from kfp.dsl import Dataset, Model

    from kfp_finetune.components.dataset_initialize.component import dataset_initialize

    def run(**masking):
        train, held_out = Dataset(uri=str(tmp_path / "train")), Dataset(uri=str(tmp_path / "eval"))
        base_model = Model(uri=str(tmp_path / "model"), metadata={"workspace_path": str(tiny_llama)})
        dataset_initialize.python_func(
            source_uri=str(source), workspace_path=str(tmp_path / "ws"), train=train, eval=held_out,
            base_model=base_model, max_seq_len=64, **masking,
        )  # fmt: skip
        return train.metadata

    default = run()
    assert default["pack_template"]["train_on_input"] is False
    assert "new_system_prompt" not in default["pack_template"]
    masked = run(train_on_input="true", new_system_prompt="Reverse it.")
    assert masked["pack_template"]["train_on_input"] is True
    assert masked["pack_template"]["new_system_prompt"] == "Reverse it."
    assert masked["packs"] != default["packs"] and masked["pack_fingerprint"] != default["pack_fingerprint"]
    with pytest.raises(SystemExit):
        run(train_on_input="yes")
    assert "train_on_input must be auto" in capsys.readouterr().err


def test_a_long_prompt_row_is_left_out_of_the_packs_and_named_by_file_and_line(
    tmp_path, tiny_llama, log_lines
):
    """The row's prompt is longer than the 99th percentile's length: the packs keep that length, and the row,
    which would train nothing once cut, is named by its line in the source file (also through the eval shuffle),
    and the reused packs say so again."""
    from tests.support.long_prompt import LONG_ROW, write_jsonl

    source = write_jsonl(tmp_path / "long-prompt.jsonl")
    workspace = tmp_path / "ws"
    result = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.05, seed=3, base_model_path=tiny_llama
    )
    assert result.train_metadata["max_seq_len"] == MULTIPLE
    warning = next(line for line in log_lines if "left out of the packs" in line)
    assert "1 of 95 training rows have a prompt that fills the 256-token tune_max_seq_len" in warning
    assert f"long-prompt.jsonl line {LONG_ROW + 1}" in warning and "tune_max_seq_len to at least" in warning
    log_lines.clear()
    initialize_dataset(str(source), str(workspace), eval_fraction=0.05, seed=3, base_model_path=tiny_llama)
    assert any(f"long-prompt.jsonl line {LONG_ROW + 1}" in line for line in log_lines)


@pytest.mark.parametrize("column", ["input", "output"])
def test_one_100k_character_row_does_not_raise_the_pack_length(tmp_path, tiny_llama, log_lines, column):
    """60 short rows and one of 100,000 characters: the packs stay 256 tokens long. A long answer is cut there
    (it keeps trained tokens); a long question is left out and named."""
    import json

    rows = [{"input": f"question {i}", "output": f"answer {i}"} for i in range(60)]
    rows.insert(30, {"input": "short question", "output": "short answer", column: "lorem ipsum " * 8334})
    source = tmp_path / "train.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = initialize_dataset(str(source), str(tmp_path / "ws"), base_model_path=tiny_llama)
    split = DatasetSplit.from_metadata(result.train_metadata, input_name="train_data")
    assert split.max_seq_len == MULTIPLE and split.token_stats["max"] > 10_000
    packs = ArrowPacks([tmp_path / "ws" / split.packs[0]["path"]])
    whole_pack_rows = [i for i in range(len(packs)) if packs[i]["seq_lens"].tolist() == [MULTIPLE]]
    if column == "output":  # cut to the pack length: one pack holds it alone
        assert any("1 row(s) cut to it" in line for line in log_lines) and len(whole_pack_rows) == 1
        assert not any("left out of the packs" in line for line in log_lines)
    else:  # left out: no pack holds it
        assert any("1 of 61 training rows" in line and "train.jsonl line 31" in line for line in log_lines)
        assert whole_pack_rows == []


def test_a_model_whose_attention_takes_no_packs_has_its_rows_measured_not_packed(
    source, tmp_path, gemma2_tokenizer_only, log_lines
):
    """Gemma 2 trains unpacked on GPUs (torchtune 0.6.1's Gemma 2 attention takes no block masks: defaults.py):
    dataset-initialize writes no packs for it, and still tokenizes the train rows for the lengths the fine-tune
    step's max_seq_len comes from; that step, on CUDA, trains the rows unpacked at that length."""
    from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run
    from kfp_finetune.components.torchtune_finetune.finetune import recorded_lengths
    from kfp_finetune.components.torchtune_finetune.packs import use_packs

    workspace = tmp_path / "ws"
    result = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.1, base_model_path=gemma2_tokenizer_only
    )
    split = DatasetSplit.from_metadata(result.train_metadata, input_name="train_data")
    assert split.token_stats["count"] == split.num_rows == 540 and split.max_seq_len == MULTIPLE
    assert (split.packs, split.pack_fingerprint) == ([], None)
    assert not list(workspace.rglob("packs.arrow"))
    written = "no packs written: torchtune 0.6.1's gemma2 attention takes no block masks"
    assert any(written in line for line in log_lines)
    again = initialize_dataset(
        str(source), str(workspace), eval_fraction=0.1, base_model_path=gemma2_tokenizer_only
    )
    assert {**again.train_metadata, "reused_existing_copy": False} == result.train_metadata
    assert any("lengths for this tokenizer, template and masking already in" in line for line in log_lines)

    run = resolve_run(
        TorchtuneConfig(method="lora", device="cuda"), gemma2_tokenizer_only, result.path / "train",
        tmp_path / "run", write=False, token_lengths=recorded_lengths(split), weights_required=False,
        packs=lambda config: use_packs(config, split, workspace),
    )  # fmt: skip
    assert run.config["dataset"]["_component_"] == "torchtune.datasets.instruct_dataset"
    assert run.config["dataset"]["packed"] is False
    assert run.config["tokenizer"]["max_seq_len"] == split.max_seq_len


def test_by_default_the_rows_are_tokenized_in_as_many_processes_as_the_pod_has(
    tmp_path, tiny_llama, log_lines, monkeypatch
):
    """num_proc unset: the pod's CPUs (here: this machine's, through its cgroup files and affinity) tokenize, each
    in a process of its own. tokenize gives a process at least 1000 rows, so 2100 rows make 2 processes."""
    available = pod_processes()
    if available.count < 2:
        pytest.skip(f"one process is all this machine allows ({available})")
    source = build_tiny_dataset(tmp_path / "tiny", train_rows=2100, eval_rows=10)["train.jsonl"]
    pids, samples = tmp_path / "pids", packing._samples

    def recording(dataset, start, end):  # runs in the tokenizing processes (forked: the patch is inherited)
        with pids.open("a") as f:
            f.write(f"{os.getpid()}\n")
        return samples(dataset, start, end)

    monkeypatch.setattr(packing, "_samples", recording)
    result = initialize_dataset(str(source), str(tmp_path / "ws"), base_model_path=tiny_llama)
    assert result.train_metadata["token_stats"]["count"] == 2100
    assert f"parsing and tokenizing with {available}" in log_lines
    workers = set(pids.read_text().split())
    assert len(workers) == 2 and str(os.getpid()) not in workers


def test_num_proc_set_is_used_as_set_and_must_be_positive(source, tmp_path, log_lines):
    initialize_dataset(str(source), str(tmp_path / "ws"), num_proc=1)
    assert "parsing and tokenizing with 1 process: set by num_proc" in log_lines
    with pytest.raises(ValueError, match="num_proc must be at least 1"):
        initialize_dataset(str(source), str(tmp_path / "ws"), num_proc=0)
