"""Rows whose prompt fills max_seq_len, counted with the tokenizer and template training uses before training
starts: a few are reported and train nothing; as many as a micro-batch holds, or more than seq_len's share, are
refused. A long enough max_seq_len, or trained prompts, pass."""

import json

import pytest

from kfp_finetune.components._shared.torchtune.config import DatasetSettings, TorchtuneConfig
from kfp_finetune.components._shared.torchtune.defaults import TokenLengths
from kfp_finetune.components._shared.torchtune.prompt_fit import PromptTooLong
from kfp_finetune.components._shared.torchtune.resolve import resolve_run

LONG = " ".join(f"word{i}" for i in range(150))  # about 300 tokens of the tiny tokenizer


def write_rows(path, long_rows=(3,), rows=6, long=LONG):
    data = [{"input": f"say {i}", "output": f"ok {i}"} for i in range(rows)]
    for index in long_rows:
        data[index] = {"input": long, "output": "fine"}
    path.write_text("".join(json.dumps(r) + "\n" for r in data))
    return path


@pytest.fixture(scope="module")
def long_prompt_data(tmp_path_factory):
    """Short rows, and one row (index 3) whose prompt is about 300 tokens."""
    return write_rows(tmp_path_factory.mktemp("prompt-fit") / "train.jsonl")


def resolve(tiny_llama, data, tmp_path, **settings):
    cfg = TorchtuneConfig(**settings)
    return resolve_run(cfg, tiny_llama, data, tmp_path / "run", write=False, validate=True)


def test_a_prompt_that_could_fill_a_micro_batch_is_refused(tiny_llama, long_prompt_data, tmp_path):
    with pytest.raises(PromptTooLong) as caught:
        resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=64, batch_size=1)
    message = str(caught.value)
    assert "1 of 6 training rows have a prompt that fills the 64-token tune_max_seq_len" in message
    assert "train_data row 3 (counted from 0)" in message and "a micro-batch of 1" in message
    needed = int(message.split("set tune_max_seq_len to at least ")[1].split()[0])
    # The boundary is exact: torchtune ends a cut row in a masked EOS, so a limit of the prompt's length + 1 still
    # keeps no trained token (the row's labels after the cut say so); + 2 keeps one.
    prompt_tokens = _prompt_tokens(tiny_llama, long_prompt_data, tmp_path)
    assert 64 < prompt_tokens < needed
    for limit in (prompt_tokens, prompt_tokens + 1):
        with pytest.raises(PromptTooLong):
            resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=limit, batch_size=1)
    assert _trained_tokens_after_cut(tiny_llama, long_prompt_data, tmp_path, prompt_tokens + 1) == 0
    assert _trained_tokens_after_cut(tiny_llama, long_prompt_data, tmp_path, prompt_tokens + 2) == 1
    resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=prompt_tokens + 2, batch_size=1)
    resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=needed, batch_size=1)


def test_one_prompt_among_larger_micro_batches_is_counted_not_refused(
    tiny_llama, long_prompt_data, tmp_path, log_lines
):
    resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=64, batch_size=2)
    warning = next(line for line in log_lines if "fills the 64-token tune_max_seq_len" in line)
    assert "1 of 6 training rows" in warning and "train_data row 3" in warning and "train nothing" in warning


def test_more_than_the_share_of_unfit_rows_is_refused(tiny_llama, tmp_path):
    data = write_rows(tmp_path / "two.jsonl", long_rows=(1, 4))
    with pytest.raises(PromptTooLong, match=r"2 of 6 training rows .* more than 1% of the rows"):
        resolve(tiny_llama, data, tmp_path, max_seq_len=64, batch_size=8)


def test_prompts_are_counted_in_tokens_not_characters(tiny_llama, tmp_path):
    """300 emoji are short in characters but ~1,200 tokens: among 70 rows longer in characters (but not in
    tokens), the emoji row is still one of the rows tokenized."""
    rows = [{"input": "plain text " * 60, "output": "ok"} for _ in range(70)]  # 660 characters, 660 bytes
    rows.append({"input": "🙂" * 300, "output": "ok"})  # 300 characters, 1,200 bytes
    path = tmp_path / "emoji.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(PromptTooLong, match=r"1 of 71 training rows .* train_data row 70 "):
        resolve(tiny_llama, path, tmp_path, max_seq_len=1024, batch_size=1)


def _prompt_tokens(tiny_llama, data, tmp_path) -> int:
    from kfp_finetune.components._shared.torchtune.prompt_fit import (
        prompt_tokens,
        rows_as_trained,
        uncut_tokenizer,
    )

    run = resolve_run(TorchtuneConfig(), tiny_llama, data, tmp_path / "uncut", write=False)
    return prompt_tokens(rows_as_trained(run.config, uncut_tokenizer(run.config))[3]["labels"])


def _trained_tokens_after_cut(tiny_llama, data, tmp_path, max_seq_len: int) -> int:
    """Row 3's trained labels as torchtune cuts it at `max_seq_len` (the resolved dataset and tokenizer nodes)."""
    from omegaconf import OmegaConf
    from torchtune import config as torchtune_config

    run = resolve_run(
        TorchtuneConfig(max_seq_len=max_seq_len), tiny_llama, data, tmp_path / "cut", write=False
    )
    tokenizer = torchtune_config.instantiate(OmegaConf.create(run.config["tokenizer"]))
    dataset = torchtune_config.instantiate(
        OmegaConf.create({**run.config["dataset"], "packed": False}), tokenizer
    )
    return sum(1 for label in dataset[3]["labels"] if label != -100)


def test_trained_prompts_and_the_default_length_are_accepted(tiny_llama, long_prompt_data, tmp_path):
    resolve(
        tiny_llama,
        long_prompt_data,
        tmp_path,
        max_seq_len=64,
        batch_size=1,
        dataset=DatasetSettings(train_on_input=True),
    )
    # No lengths measured: the model's limit, which holds the long row whole.
    assert resolve(tiny_llama, long_prompt_data, tmp_path).config["tokenizer"]["max_seq_len"] == 2048
    # dataset-initialize's lengths: seq_len's rule, which one long row does not set (it is counted, not refused).
    measured = TokenLengths([12, 12, 12, 12, 12, 320], num_rows=6, how="dataset-initialize")
    run = resolve_run(
        TorchtuneConfig(batch_size=2), tiny_llama, long_prompt_data, tmp_path / "run", write=False,
        validate=True, token_lengths=measured,
    )  # fmt: skip
    assert run.config["tokenizer"]["max_seq_len"] == 256
