"""The free `overrides` setting: dotted keys applied to the resolved torchtune config, checked as they land.

A key must exist in the resolved config (`+key` adds a new one, `~key` removes one), so a misspelling fails at
once, naming the key and the base config; a number torchtune reads stays a number.
"""

from __future__ import annotations

from typing import Any

from kfp_finetune.components._shared.errors import SettingError


def apply_overrides(config: dict, overrides: dict[str, Any], base_name: str) -> None:
    """Dotted keys that must exist (`+key` adds a new one, `~key` removes one); values are YAML-typed."""
    for raw_key, value in overrides.items():
        key = str(raw_key)
        add, remove = key.startswith("+"), key.startswith("~")
        parts = key.lstrip("+~").split(".")
        node = config
        for depth, part in enumerate(parts[:-1]):
            if not isinstance(node.get(part), dict):
                if add and part not in node:
                    node[part] = {}
                else:
                    missing = ".".join(parts[: depth + 1])
                    raise SettingError("overrides", missing_key(key, missing, base_name))
            node = node[part]
        leaf = parts[-1]
        if remove:
            if leaf not in node:
                raise SettingError("overrides", missing_key(key, key.lstrip("~"), base_name))
            del node[leaf]
        elif leaf in node or add:
            node[leaf] = number_checked(key, node.get(leaf), value)
        else:
            raise SettingError("overrides", missing_key(key, key, base_name))


# Keys torchtune reads as numbers even where a base config leaves them out or null.
NUMERIC_KEYS = {
    "clip_grad_norm", "optimizer.lr", "optimizer.weight_decay", "batch_size", "epochs", "seed",
    "gradient_accumulation_steps", "max_steps_per_epoch", "log_every_n_steps", "tokenizer.max_seq_len",
    "lr_scheduler.num_warmup_steps", "model.lora_rank", "model.lora_alpha", "model.lora_dropout",
}  # fmt: skip


def number_checked(key: str, current: Any, value: Any) -> Any:
    """`value`, as a number for a numeric key (a number in the base config, or a known one): a string that is
    not a number there would fail only inside training."""
    numeric = key.lstrip("+~") in NUMERIC_KEYS or (
        isinstance(current, (int, float)) and not isinstance(current, bool)
    )
    if not numeric or value is None or (isinstance(value, (int, float)) and not isinstance(value, bool)):
        return value
    if isinstance(value, str):
        try:
            number = float(value)
            return int(number) if number.is_integer() and isinstance(current, int) else number
        except ValueError:
            pass
    example = current if current is not None else 1.0
    raise SettingError(
        "overrides", f"[{key!r}] must be a number (got {value!r}), e.g. {{{key!r}: {example}}}"
    )


def missing_key(key: str, missing: str, base_name: str) -> str:
    return (
        f"key {key!r}: {missing!r} does not exist in the resolved config (base {base_name}); "
        f"check the spelling with `kfp-finetune resolve-config`, or write '+{key.lstrip('+~')}' to add a new key"
    )
