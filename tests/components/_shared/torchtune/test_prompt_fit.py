"""A max_seq_len shorter than the prompts is refused before training, counted with the tokenizer and template
training uses; a long enough max_seq_len, or trained prompts, pass."""

import json

import pytest

from kfp_finetune.components._shared.torchtune.config import TorchtuneConfig
from kfp_finetune.components._shared.torchtune.prompt_fit import PromptTooLong
from kfp_finetune.components._shared.torchtune.resolve import resolve_run


@pytest.fixture(scope="module")
def long_prompt_data(tmp_path_factory):
    """Short rows, and one row (index 3) whose prompt is about 300 tokens of the tiny tokenizer."""
    rows = [{"input": f"say {i}", "output": f"ok {i}"} for i in range(6)]
    rows[3] = {"input": " ".join(f"word{i}" for i in range(150)), "output": "fine"}
    path = tmp_path_factory.mktemp("prompt-fit") / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def resolve(tiny_llama, data, tmp_path, **settings):
    cfg = TorchtuneConfig(**settings)
    return resolve_run(cfg, tiny_llama, data, tmp_path / "run", write=False, validate=True)


def test_prompt_longer_than_max_seq_len_is_refused(tiny_llama, long_prompt_data, tmp_path):
    with pytest.raises(PromptTooLong) as caught:
        resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=64)
    message = str(caught.value)
    assert "max_seq_len=64" in message and "1 training row(s) (row 3," in message
    prompt_tokens = int(message.split("the longest prompt is ")[1].split()[0])
    needed = int(message.split("at least ")[1].split()[0])
    assert 64 < prompt_tokens < needed
    # The boundary is exact: torchtune ends a cut row in a masked EOS, so a limit of the prompt's length + 1 still
    # keeps no trained token (the row's labels after the cut say so); + 2 keeps one.
    for limit in (prompt_tokens, prompt_tokens + 1):
        with pytest.raises(PromptTooLong):
            resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=limit)
    assert _trained_tokens_after_cut(tiny_llama, long_prompt_data, tmp_path, prompt_tokens + 1) == 0
    assert _trained_tokens_after_cut(tiny_llama, long_prompt_data, tmp_path, prompt_tokens + 2) == 1
    resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=prompt_tokens + 2)
    resolve(tiny_llama, long_prompt_data, tmp_path, max_seq_len=needed)


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


def test_trained_prompts_and_no_limit_are_accepted(tiny_llama, long_prompt_data, tmp_path):
    from kfp_finetune.components._shared.torchtune.config import DatasetSettings

    resolve(
        tiny_llama, long_prompt_data, tmp_path, max_seq_len=64, dataset=DatasetSettings(train_on_input=True)
    )
    resolve(tiny_llama, long_prompt_data, tmp_path)  # no max_seq_len: nothing is cut
