"""The torchtune engine's side of evaluation: load a model and its tokenizer the way training does, turn the eval rows into
examples with torchtune's own dataset builders, then score teacher-forced loss and greedy generations. The
inputs (model folders, the tuned model, the dataset node, lm-eval) are eval_inputs.py's, re-exported here: this
module is what the face's `evaluation()` hands the evaluate step, with the names every engine's has.

Masking matches training because the examples come from the same builder node (instruct_dataset /
chat_dataset / text_completion_dataset) and tokenizer the run's resolved torchtune YAML used: `labels` are
the tokens the recipe trained on, everything else is CROSS_ENTROPY_IGNORE_IDX. The generation prompt is the
training sequence cut where the answer's text begins, so the model sees exactly its training prompt format.
"""

from __future__ import annotations

import inspect
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.eval_examples import Example, ModelScores
from kfp_finetune.components._shared.eval_scoring import score_examples
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune.eval_inputs import (
    LM_EVAL_MISSING,
    TunedModel,
    check_lm_eval,
    check_same_tokenizer,
    eval_dataset,
    inspect_model,
    lm_eval_folder,
    lm_eval_model,
    training_max_seq_len,
    tuned_model,
)
from kfp_finetune.components._shared.torchtune.lora_model import load_lora_model
from kfp_finetune.components._shared.torchtune.model_inspection import ModelDir

log = get_logger(__name__)

__all__ = [
    "LM_EVAL_MISSING",
    "Example",
    "ModelScores",
    "TunedModel",
    "build_dataset",
    "check_lm_eval",
    "check_same_tokenizer",
    "eval_dataset",
    "inspect_model",
    "lm_eval_folder",
    "lm_eval_model",
    "load_tokenizer",
    "make_examples",
    "models_to_score",
    "score_model",
    "training_max_seq_len",
    "tuned_model",
]


def load_tokenizer(model_dir: ModelDir, max_seq_len: int | None, train_config: dict | None = None) -> Any:
    """The model's tokenizer files; settings training's tokenizer node added beyond the files (e.g. a
    prompt_template) kept."""
    from omegaconf import OmegaConf
    from torchtune import config

    node = model_dir.tokenizer_node(max_seq_len)
    for key, value in ((train_config or {}).get("tokenizer") or {}).items():
        node.setdefault(key, value)
    return config.instantiate(OmegaConf.create(node))


def load_model(model_dir: ModelDir, device: Any, dtype: Any) -> Any:
    """The family's component builder with the checkpoint's dims, weights through the project's HF checkpointer."""
    from omegaconf import OmegaConf
    from torchtune import config, training

    with training.set_default_dtype(dtype), device:
        model = config.instantiate(OmegaConf.create(model_dir.model_node()))
    # The checkpointer insists on an output dir outside the checkpoint; loading writes nothing there.
    with tempfile.TemporaryDirectory(prefix="kfp-finetune-eval-") as scratch:
        checkpointer = config.instantiate(OmegaConf.create(model_dir.checkpointer_node(scratch)))
        state_dict = checkpointer.load_checkpoint()[training.MODEL_KEY]
    model.load_state_dict(state_dict)
    model.eval()
    return model


def load_adapter_model(
    base_dir: ModelDir, lora_node: dict, adapter_file: Path, device: Any, dtype: Any
) -> Any:
    """A LoRA/DoRA/QLoRA model as the LoRA recipe builds it (lora_model.py): the training run's `model` node, the
    base weights of `base_dir`, then the adapter weights in torchtune's names (`epoch_N/adapter_model.pt`)."""
    from omegaconf import OmegaConf
    from torchtune import config

    # The checkpointer insists on an output dir outside the checkpoint; loading writes nothing there.
    with tempfile.TemporaryDirectory(prefix="kfp-finetune-eval-") as scratch:
        checkpointer = config.instantiate(OmegaConf.create(base_dir.checkpointer_node(scratch)))
        model = load_lora_model(lora_node, checkpointer, adapter_file, dtype=dtype, device=device)
    model.eval()
    return model


def models_to_score(
    tuned: TunedModel, base_dir: ModelDir | None, device: Any, dtype: Any
) -> Iterator[tuple[str, Any]]:
    """("tuned", model), then ("base", model) when there is a base, one model in memory at a time (the caller
    drops each before asking for the next). For a fine-tune that handed on only an adapter of `base_dir`, the
    tuned model is the run's LoRA `model` node with its adapter weights, and the base is the same model with its
    adapter disabled (LoRA and DoRA layers return their base layer's output, bit for bit): the weights are loaded
    once. A QLoRA model's base layers are NF4-quantized, so its base is loaded on its own, in the precision it was
    published in.
    """
    if tuned.adapter_file is None:
        yield "tuned", load_model(tuned.folder, device, dtype)
    else:
        lora_node = tuned.lora_node or {}
        log.info("tuned: base model + the fine-tune's adapter %s", tuned.adapter_file)
        model = load_adapter_model(tuned.folder, lora_node, tuned.adapter_file, device, dtype)
        yield "tuned", model
        if base_dir is not None and not lora_node.get("quantize_base"):
            from torchtune.modules.peft import disable_adapter

            log.info("base: the same model with its adapter disabled (its weights are not loaded again)")
            with disable_adapter(model):
                yield "base", model
            return
        del model
    if base_dir is not None:
        yield "base", load_model(base_dir, device, dtype)


def build_dataset(dataset_node: dict, tokenizer: Any) -> Any:
    from omegaconf import OmegaConf
    from torchtune import config

    return config.instantiate(OmegaConf.create(dataset_node), tokenizer)


def answer_start(tokenizer: Any, messages: list, answer: int, tokens: list[int]) -> int:
    """Where the answer's text begins in the training tokens: after the assistant header, which training also
    learns. Found as the common prefix with the same conversation whose answer is blank, so it holds for any
    chat format the tokenizer writes."""
    from torchtune.data import Message

    original = messages[answer]
    blank = Message(role=original.role, content="", masked=original.masked, eot=original.eot)
    blank_tokens = tokenizer({"messages": [*messages[:answer], blank]})["tokens"]
    start = 0
    while start < min(len(tokens), len(blank_tokens)) and tokens[start] == blank_tokens[start]:
        start += 1
    return start


def make_examples(dataset: Any, tokenizer: Any, rows: Sequence[int]) -> list[Example]:
    """Examples for the chosen rows. Text (completion) data has no prompt/answer split: loss only."""
    # SFTDataset keeps its rows and message transform as attributes (torchtune 0.6.1); the transform turns a
    # row into the same Message list the tokenizer saw, from which the prompt and reference text come.
    message_transform = getattr(dataset, "_message_transform", None)
    examples = []
    for row in rows:
        sample = dataset[row]
        tokens, labels = list(sample["tokens"]), [int(x) for x in sample["labels"]]
        prompt, reference, prompt_tokens = "", "", None
        if message_transform is not None:
            messages = message_transform(dataset._data[row])["messages"]
            answers = [i for i, m in enumerate(messages) if m.role == "assistant"]
            if answers:
                last = answers[-1]
                reference = messages[last].text_content
                users = [m for m in messages[:last] if m.role == "user"]
                prompt = users[-1].text_content if users else ""
                start = answer_start(tokenizer, messages, last, tokens)
                # A prompt truncated by max_seq_len leaves nothing to generate from.
                if 0 < start < len(tokens):
                    prompt_tokens = tokens[:start]
        else:
            prompt = str(dataset._data[row].get(getattr(dataset, "_column", "text"), ""))[:200]
        examples.append(Example(row, tokens, labels, prompt_tokens, prompt, reference))
    return examples


def greedy_generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[list[int]],
    *,
    max_new_tokens: int,
    device: Any,
    dtype: Any,
    rng: Any,
) -> list[str]:
    """Greedy continuations of a batch of prompts with torchtune's `generate` (left-padded, KV-cached)."""
    import torch
    from torchtune.data import left_pad_sequence
    from torchtune.generation import generate
    from torchtune.modules import local_kv_cache

    batch = left_pad_sequence(
        [torch.tensor(p) for p in prompts], batch_first=True, padding_value=tokenizer.pad_id
    ).to(device)
    stop_tokens = list(tokenizer.stop_tokens)
    with (
        torch.inference_mode(),
        local_kv_cache(
            model,
            batch_size=batch.shape[0],
            device=device,
            dtype=dtype,
            decoder_max_seq_len=batch.shape[1] + max_new_tokens,
        ),
    ):
        # top_k=1 makes sampling an argmax: greedy whatever the random draw, hence deterministic.
        output, _ = generate(
            model,
            batch,
            max_generated_tokens=max_new_tokens,
            pad_id=tokenizer.pad_id,
            top_k=1,
            stop_tokens=stop_tokens,
            rng=rng,
        )
    texts = []
    for row in output[:, batch.shape[1] :].tolist():
        cut = next((i for i, token in enumerate(row) if token in stop_tokens), len(row))
        texts.append(decode(tokenizer, row[:cut]))
    return texts


def decode(tokenizer: Any, token_ids: list[int]) -> str:
    if "skip_special_tokens" in inspect.signature(tokenizer.decode).parameters:
        return tokenizer.decode(token_ids, skip_special_tokens=True)
    return tokenizer.decode(token_ids)


def score_model(
    model: Any,
    tokenizer: Any,
    examples: Sequence[Example],
    *,
    label: str,
    batch_size: int,
    max_new_tokens: int,
    device: Any,
    dtype: Any,
    seed: int,
    progress: Callable[[str], None] = log.info,
) -> ModelScores:
    """Loss over all examples, then greedy generations for those with a prompt (eval_scoring.py)."""
    import torch

    rng = torch.Generator(device=device).manual_seed(seed)

    def generate(batch: Sequence[Example]) -> list[str]:
        prompts = [e.prompt_tokens for e in batch]
        return greedy_generate(
            model, tokenizer, prompts, max_new_tokens=max_new_tokens, device=device, dtype=dtype, rng=rng
        )

    return score_examples(
        examples, forward=lambda tokens, mask, batch: model(tokens), generate=generate, pad_id=tokenizer.pad_id,
        label=label, batch_size=batch_size, device=device, seed=seed, progress=progress,
    )  # fmt: skip
