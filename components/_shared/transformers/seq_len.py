"""The transformers engine's max_seq_len where the step left it unset (auto): the rule both engines follow
(_shared/seq_len_rule.py: the 99th percentile of the rows' tokens rounded up to 256, capped by the model's
positions), over the rows as this engine trains them. It is chosen in the training process, where the tokenizer
is (the fine-tune step imports none), before TRL tokenizes and cuts the rows, and its reason is in the step log,
`trl_config.json` and the report.

- generation rows: a seeded sample (seq_len_rule.sample_indices: every process of a run draws the same, so all
  agree), rendered by TRL's own chat-template step (trl.data_utils.maybe_apply_chat_template) and tokenized;
- classification rows: as classify.py tokenizes them, text and text pair;
- image + text rows: the model's positions, at most WITHOUT_LENGTHS: TRL tokenizes them batch by batch with their
  images, so their lengths are not known before.

`positions` is what the model serves: max_position_embeddings, a scaled rotary length, or a vision-language model's
text_config's; the plan refuses a longer tune_max_seq_len before any download (plan.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.engines import CLASSIFICATION, IMAGE_TEXT, model_config
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.seq_len_rule import choose_max_seq_len, percentile, sample_indices
from kfp_finetune.components._shared.transformers.fast import AUTO
from kfp_finetune.components._shared.transformers.settings import SftSettings

#: The max_seq_len where the rows' lengths are not known before training (image + text rows) or the model's
#: positions are not known (evaluation without the run's config), where the model has more positions.
WITHOUT_LENGTHS = 2048


def positions(config: dict) -> int | None:
    """The positions a model serves: max_position_embeddings (GPT-2: n_positions), or where its rotary embedding
    is scaled (rope_scaling or transformers 5's rope_parameters with a factor: YaRN, linear, dynamic; Qwen2.5 ships
    32768 and documents YaRN x4) the original length times the factor, if that is more. A vision-language model's:
    its text model's."""
    config = config.get("text_config") or config
    found = config.get("max_position_embeddings", config.get("n_positions"))
    if not isinstance(found, int) or isinstance(found, bool) or found < 1:
        return None
    scaling = config.get("rope_scaling") or config.get("rope_parameters") or {}
    factor = scaling.get("factor") if isinstance(scaling, dict) else None
    if isinstance(factor, int | float) and not isinstance(factor, bool) and factor > 1:
        original = scaling.get("original_max_position_embeddings") or found
        if isinstance(original, int) and not isinstance(original, bool):
            return max(found, int(original * factor))
    return found


def model_limit(model_dir: str | Path) -> int:
    """WITHOUT_LENGTHS, at most the model's positions."""
    limit = positions(model_config(model_dir))
    return min(WITHOUT_LENGTHS, limit) if limit else WITHOUT_LENGTHS


def fit_to_rows(settings: SftSettings) -> SftSettings:
    """`settings` with max_seq_len chosen where it is auto (see the module docstring), the choice and its reason
    added to `planned`; unchanged where the user set it."""
    if settings.max_seq_len != AUTO:
        return settings
    limit = positions(model_config(settings.model_dir))
    if settings.task == IMAGE_TEXT:
        value = model_limit(settings.model_dir)
        reason = (
            f"image + text rows: {WITHOUT_LENGTHS} tokens at most, and at most the model's positions (TRL "
            "tokenizes them batch by batch, images included: their lengths are not known before)"
        )
    else:
        lengths = token_lengths(settings)
        value = choose_max_seq_len(lengths, limit)
        cap = f", capped at the model's {limit} positions" if limit else ""
        reason = (
            f"the 99th percentile of the rows' tokens ({percentile(lengths)}) rounded up to 256{cap} (longest "
            f"{max(lengths)}, over {len(lengths)} rows); longer rows are cut"
        )
    chosen = {"setting": "max_seq_len", "value": value, "reason": reason}
    return replace(settings, max_seq_len=value, planned=[*settings.planned, chosen])


def require_chosen(settings: SftSettings) -> None:
    """Refuse rows cut at a max_seq_len still auto: a trainer or eval rows need fit_to_rows' choice first."""
    if settings.max_seq_len == AUTO:
        raise ConfigError(
            "the rows' cut length is still auto: choose it from them first (seq_len.fit_to_rows)"
        )


def token_lengths(settings: SftSettings) -> list[int]:
    """The token lengths of a sample of the training rows, as this engine trains them."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(settings.model_dir, local_files_only=True)
    if settings.task == CLASSIFICATION:
        from kfp_finetune.components._shared.transformers import classify
        from kfp_finetune.components._shared.transformers.rows import read_rows

        rows = read_rows(settings)
        return classify.token_lengths(settings, rows.select(sample_indices(len(rows))), tokenizer)
    from trl.data_utils import maybe_apply_chat_template

    from kfp_finetune.components._shared.transformers.rows import trained_rows

    rows, _ = trained_rows(settings, tokenizer)
    texts = [_text(maybe_apply_chat_template(rows[i], tokenizer)) for i in sample_indices(len(rows))]
    return [len(ids) for ids in tokenizer(texts)["input_ids"]]


def _text(row: dict[str, Any]) -> str:
    """A row's whole text as TRL renders it: `text`, or `prompt` followed by `completion`."""
    if "text" in row:
        return row["text"]
    return row["prompt"] + row.get("completion", "")
