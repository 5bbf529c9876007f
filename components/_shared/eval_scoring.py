"""Scoring one model on eval examples, the same for every engine: teacher-forced loss on the trained tokens, then
greedy generations for the examples with a prompt. Each engine's evaluation module hands in how its model computes
logits and how it generates (`forward`, `generate`); torch is imported when scoring starts."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kfp_finetune.components._shared.eval_examples import IGNORE_INDEX, Example, ModelScores, batches

#: forward(tokens [batch, width], attention_mask [batch, width], the batch's examples) -> logits [batch, width,
#: vocabulary]; the examples carry any inputs beyond the tokens (a vision-language model's images)
Forward = Callable[[Any, Any, Sequence[Example]], Any]
#: generate(examples) -> the texts generated from their prompt_tokens, in order
Generate = Callable[[Sequence[Example]], list[str]]


def right_padded(batch: Sequence[Example], pad_id: int, device: Any) -> tuple[Any, Any]:
    """The batch's tokens right-padded to its longest, and their attention mask (1: a token, 0: padding)."""
    import torch

    width = max(len(e.tokens) for e in batch)
    tokens = torch.tensor([e.tokens + [pad_id] * (width - len(e.tokens)) for e in batch], device=device)
    mask = torch.tensor([[1] * len(e.tokens) + [0] * (width - len(e.tokens)) for e in batch], device=device)
    return tokens, mask


def teacher_forced_losses(
    forward: Forward, examples: Sequence[Example], batch_size: int, pad_id: int, device: Any
) -> tuple[float, int, list[float | None], list[int]]:
    """(summed NLL, token count, per-example mean NLL, per-example token count) on the trained tokens: right-padded
    batches, position t predicting token t+1 (as the recipes and the models' own losses shift)."""
    import torch
    import torch.nn.functional as F

    total, count, per_example, per_example_tokens = 0.0, 0, [], []
    with torch.inference_mode():
        for batch in batches(examples, batch_size):
            tokens, mask = right_padded(batch, pad_id, device)
            width = tokens.shape[1]
            labels = torch.tensor(
                [e.labels + [IGNORE_INDEX] * (width - len(e.labels)) for e in batch], device=device
            )
            logits, labels = forward(tokens, mask, batch)[:, :-1], labels[:, 1:]
            # Only the trained positions go to fp32: full-vocabulary logits of whole batches are the memory peak.
            trained = labels != IGNORE_INDEX
            nll = F.cross_entropy(logits[trained].float(), labels[trained], reduction="none")
            nll_per_row = torch.zeros(labels.shape[0], device=device).index_add_(
                0, trained.nonzero()[:, 0], nll
            )
            for row_nll, row_count in zip(nll_per_row.tolist(), trained.sum(dim=1).tolist(), strict=True):
                per_example.append(row_nll / row_count if row_count else None)
                per_example_tokens.append(row_count)
                total += row_nll
                count += row_count
    return total, count, per_example, per_example_tokens


def score_examples(
    examples: Sequence[Example],
    *,
    forward: Forward,
    generate: Generate,
    pad_id: int,
    label: str,
    batch_size: int,
    device: Any,
    seed: int,
    progress: Callable[[str], None],
) -> ModelScores:
    """Loss over all examples, then greedy generations for those with a prompt, logging progress."""
    import torch

    started = time.monotonic()
    torch.manual_seed(seed)
    loss_sum, loss_tokens, per_example, per_example_tokens = teacher_forced_losses(
        forward, examples, batch_size, pad_id, device
    )
    progress(
        f"{label}: eval loss {loss_sum / max(loss_tokens, 1):.4f} over {loss_tokens} response tokens "
        f"({time.monotonic() - started:.1f}s)"
    )
    generations: list[str | None] = [None] * len(examples)
    todo = [i for i, e in enumerate(examples) if e.prompt_tokens]
    generation_started, done = time.monotonic(), 0
    for batch in batches(todo, batch_size):
        texts = generate([examples[i] for i in batch])
        for i, text in zip(batch, texts, strict=True):
            generations[i] = text
        done += len(batch)
        elapsed = time.monotonic() - generation_started
        progress(f"{label}: generated {done}/{len(todo)} samples ({done / max(elapsed, 1e-9):.2f} samples/s)")
    return ModelScores(
        loss_sum, loss_tokens, per_example, per_example_tokens, generations, time.monotonic() - started
    )
