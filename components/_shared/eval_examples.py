"""What evaluate and each engine's evaluation module share: an eval row as training tokenized it, and one
model's scores on those rows. Plain Python (no torch), so the evaluate step and its tests import it freely.

Each engine's `evaluation()` module (the face's; `__all__` lists the same names in every wing) is what the
evaluate step asks, in this order; `folder` is the engine's inspected model folder (`.path`, `.hf_config`,
`.num_parameters`), `tuned` its tuned model (`.folder`):

- `inspect_model(path, what) -> folder`; `check_same_tokenizer(tuned_folder, base_folder)`;
- `tuned_model(path, run_dir | None, base_folder | None, train_config) -> tuned`;
- `training_max_seq_len(train_config)`; `eval_dataset(train_config, eval_data, files, max_seq_len) -> data`;
- `load_tokenizer(folder, max_seq_len, train_config)`; `build_dataset(data, tokenizer)` (has len);
  `make_examples(dataset, tokenizer, rows) -> list[Example]`;
- `models_to_score(tuned, base_folder | None, device, dtype)` yields (label, model), one at a time;
  `score_model(model, tokenizer, examples, *, label, batch_size, max_new_tokens, device, dtype, seed) ->
  ModelScores`;
- lm-eval: `check_lm_eval()`, `lm_eval_folder(tuned, run_dir) -> folder`,
  `lm_eval_model(folder, settings, device, max_seq_len)` (the model lm-eval's `evaluate` scores).

evaluate/paired.py and the report read only Examples and ModelScores."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError

#: The label of a token training did not learn (torchtune's CROSS_ENTROPY_IGNORE_IDX, TRL's and PyTorch's -100).
IGNORE_INDEX = -100


@dataclass
class Example:
    """One eval row, tokenized as for training."""

    row: int  # index in the eval data
    tokens: list[int]
    labels: list[int]  # IGNORE_INDEX where training did not learn
    prompt_tokens: (
        list[int] | None
    )  # the training sequence up to the answer's text; None: nothing to generate
    prompt: str  # for people: the last user turn (classification: the text)
    reference: str  # the expected answer: the last assistant turn (classification: the class's name)
    class_id: int | None = None  # classification rows: the true class (labels is [class_id])
    # A vision-language model's inputs beyond the tokens, as training's collator made them: per-image tensors
    # (pixel_values, ...) and per-token lists (token_type_ids, ...); None for text models.
    model_inputs: dict[str, Any] | None = None


@dataclass
class ModelScores:
    loss_sum: float  # summed negative log-likelihood over response tokens
    loss_tokens: int
    example_losses: list[float | None]  # mean NLL per example (None: no response tokens)
    example_tokens: list[int]  # response tokens per example: its weight in the token-weighted eval_loss
    generations: list[str | None]  # None where the example has no prompt (text data); a classifier: the class
    seconds: float
    predictions: list[int] | None = None  # a classifier's predicted class ids (None: a language model)

    @property
    def eval_loss(self) -> float:
        return self.loss_sum / self.loss_tokens if self.loss_tokens else float("nan")


def batches(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def require_same_tokenizer(tuned: Any, base: Any, differing: list[str]) -> None:
    """Refuse a base that does not tokenize as the tuned model: `differing` names the tokenizer parts that differ
    (each engine finds them its way); the vocabulary sizes are compared here. `tuned`, `base`: model folders."""
    tuned_vocab, base_vocab = tuned.hf_config.get("vocab_size"), base.hf_config.get("vocab_size")
    if tuned_vocab != base_vocab:
        differing = [*differing, f"vocab_size {base_vocab} vs {tuned_vocab}"]
    if differing:
        raise ConfigError(
            f"base_model ({base.path}) does not share the tuned model's tokenizer ({tuned.path}): "
            f"{', '.join(differing)} differ. Compare a fine-tuned model with the base it was trained from."
        )
