"""How long a torchtune training sequence is by default: the rule both engines follow (_shared/seq_len_rule.py).

On every torchtune path (dataset-initialize's packs, and the fine-tune step's tokenizer on every device, CPU
included): `max_seq_len` is seq_len_rule's choice over the rows' prompt + response tokens as torchtune tokenizes
them (template included), capped by the model's `max_position_embeddings`. Where the data's
lengths were not measured (no dataset-initialize stats; on CUDA a sample is tokenized) the fine-tune step's
tokenizer gets the model's limit (`cut_length`), so no row ever reaches past the model's positions.

Rows longer than max_seq_len are cut as torchtune cuts them, and counted in the step log. A row whose masked
prompt (`train_on_input: False`) fills max_seq_len keeps no trained token once cut (torchtune ends a cut instruct
or chat row in a masked EOS: a prompt of P tokens needs P + 2 — prompt, one trained token, EOS): it trains
nothing, and a micro-batch of only such rows makes the loss NaN. Such "unfit" rows are left out of
dataset-initialize's packs, counted, and the first few named by file and line; the fine-tune step, where it
tokenizes the rows itself, counts them the same way (prompt_fit.py). More than `unfit_rows.MAX_UNFIT_SHARE` of the rows (and
more than one) is refused with the numbers and the fix: a longer max_seq_len (`tune_max_seq_len`), or
`train_on_input`. So memory and the pack length follow the data, not its longest outlier.
"""

from __future__ import annotations

from collections.abc import Sequence

from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len

#: Tokens a cut row needs beyond its prompt: one trained token and the masked EOS torchtune ends the cut with.
CUT_EXTRA = 2
#: The fix the messages about such rows give, in the pipeline's parameter names.
FIX = "set tune_max_seq_len to at least {needed} (their prompt + response), set tune_train_on_input=true, or remove them"


def cut_length(lengths: Sequence[int] | None, max_position_embeddings: int | None) -> int | None:
    """The tokenizer's max_seq_len where no other is set: the rule's where the data's lengths are known, else the
    model's limit (None only when neither is known)."""
    if lengths:
        return choose_max_seq_len(lengths, max_position_embeddings)
    return max_position_embeddings


def fits(prompt_tokens, max_seq_len: int):
    """Whether a row whose masked prompt is `prompt_tokens` long (an int, or a numpy array of them) keeps a
    trained token when cut at max_seq_len."""
    return prompt_tokens + CUT_EXTRA <= max_seq_len


def unfit_message(
    unfit: int,
    rows: int,
    max_seq_len: int,
    needed: int,
    named: Sequence[str],
    refused: str,
    max_position_embeddings: int | None = None,
) -> str:
    """The line that refuses (`refused`: why) or reports rows whose prompt fills max_seq_len, naming the first few
    and the fix (none longer than the model's `max_position_embeddings`, when known)."""
    shown = "; ".join(named) + (" …" if unfit > len(named) else "")
    what = (
        f"{unfit} of {rows} training rows have a prompt that fills the {max_seq_len}-token tune_max_seq_len (cut "
        f"there, they keep no trained token): {shown}"
    )
    fix = FIX.format(needed=needed)
    if max_position_embeddings and needed > max_position_embeddings:
        fix = (
            f"set tune_train_on_input=true, or remove them (they need {needed} tokens, more than the model's "
            f"{max_position_embeddings})"
        )
    if refused:
        return f"{what}. That is {refused}. Fix: {fix}"
    return f"{what}. They train nothing; to train on them: {fix}"
