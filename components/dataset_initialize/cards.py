"""Configs (subsets) of a dataset: those a folder's dataset card (README.md) declares, read as `datasets` reads a
Hub repo's, and the config names of a Hub dataset from the `datasets` error that asks for one (`data_subset`)."""

from __future__ import annotations

import ast
import fnmatch
import re
from pathlib import Path

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)

DATASET_CARD = "README.md"  # its YAML header may declare configs, each with its own data files


def config_splits(
    uri: str, listing: storage.Listing, subset: str, scratch: Path
) -> dict[str, list[str]] | None:
    """{split: listed files} of the chosen config (`subset`, else the card's default) when the folder's dataset
    card declares configs with data files; None when it declares none (file names give the splits then)."""
    paths = [f.path for f in listing.files]
    configs = _card_configs(uri, listing, paths, scratch)
    if not configs:
        if subset:
            raise ConfigError(
                f"data_subset={subset!r}, but {uri} has no configs (no {DATASET_CARD} declaring them): leave "
                "data_subset empty"
            )
        return None
    name = subset or configs.get_default_config_name()
    if name is None:
        raise ConfigError(
            f"{uri} has {len(configs)} configs ({', '.join(configs)}, declared in its {DATASET_CARD}): set "
            "data_subset to one of them"
        )
    if name not in configs:
        raise ConfigError(
            f"data_subset={name!r} is not a config of {uri}: choose one of {', '.join(configs)}"
        )
    patterns = configs[name].get("data_files")
    if not patterns:
        return None
    from datasets.data_files import sanitize_patterns

    splits = {
        split: sorted(p for p in paths if any(fnmatch.fnmatch(p, g.removeprefix("./")) for g in globs))
        for split, globs in sanitize_patterns(patterns).items()
    }
    empty = [split for split, files in splits.items() if not files]
    if empty:
        raise ConfigError(
            f"{uri}: config {name!r} of its {DATASET_CARD} names no existing files for split(s) "
            f"{', '.join(empty)} (`data_files`: {patterns!r})"
        )
    log.info("reading config %r of %s (splits %s)", name, uri, ", ".join(splits))
    return splits


def _card_configs(uri: str, listing: storage.Listing, paths: list[str], scratch: Path):
    """The configs the folder's dataset card declares (datasets' MetadataConfigs: name -> parameters)."""
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCard

    if DATASET_CARD not in paths:
        return MetadataConfigs()
    if listing.uri.scheme == "file":
        root = Path(listing.uri.path)
        card = (root if root.is_dir() else root.parent) / DATASET_CARD
        storage.LocalRoot(root, listing.uri.shown).resolve(card)  # read in place: checked again now
    else:
        storage.download(listing, [DATASET_CARD], scratch / "card")
        card = scratch / "card" / DATASET_CARD
    try:
        return MetadataConfigs.from_dataset_card_data(DatasetCard.load(card).data)
    except ValueError as err:  # a malformed `configs:` list
        raise ConfigError(f"{uri}: the configs of its {DATASET_CARD} cannot be read: {err}") from err


def hub_config_names(message: str) -> list[str] | None:
    """The config names in the `datasets` error for a missing or unknown config name (datasets/builder.py
    `_create_builder_config`), or None for any other error."""
    found = re.search(
        r"(?:Config name is missing|BuilderConfig '.*' not found)\.?.*?(\[.*?\])", message, re.S
    )
    return [str(name) for name in ast.literal_eval(found[1])] if found else None
