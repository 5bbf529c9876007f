"""A model's config and tokenizer files, fetched without its weights: what pre-flight needs to check the model
family and resolve the whole torchtune run, and what dataset-initialize needs to tokenize the data, in seconds
and while model-initialize is still fetching the weights (kilobytes to a few MB, against gigabytes).

The files come through storage (list, then a verified download of the chosen files), so every source model-
initialize reads works here too: hf://, s3://, a path; the same repo revision gives the same files, hence the
same tokenizer fingerprint as the full copy (packing.tokenizer_fingerprint hashes the files' content).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.errors import ConfigError

CONFIG = "config.json"
# config.json, generation_config.json and every tokenizer file a family reads (model_inspection.FAMILIES:
# tiktoken's original/tokenizer.model, sentencepiece's tokenizer.model, BPE's vocab.json + merges.txt) or that
# describes special tokens (tokenizer.json's added_tokens).
CONFIG_AND_TOKENIZER_FILES = (
    CONFIG,
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "tokenizer.model",
    "original/tokenizer.model",
    "tokenizer.tiktoken",
    "vocab.json",
    "merges.txt",
)


def fetch_config_and_tokenizer(
    uri: str | storage.StorageUri, dest: str | os.PathLike, *, endpoint_url: str | None = None
) -> list[str]:
    """Download the model's config.json, generation_config.json and tokenizer files present at `uri` into
    `dest` (verified, as any download); never a weights file. Returns the files fetched.

    Raises ValueError for a malformed URI, StorageError when the source cannot be read, ConfigError when it has
    no config.json."""
    listing = storage.list_files(uri, repo_type="model", endpoint_url=endpoint_url)
    present = {remote.path for remote in listing.files}
    if CONFIG not in present:
        raise ConfigError(
            f"{listing.uri.shown} has no {CONFIG}: point it at a Hugging Face-layout model folder (config.json, "
            "weights, tokenizer files)"
        )
    paths = [name for name in CONFIG_AND_TOKENIZER_FILES if name in present]
    storage.download(listing, paths, Path(dest), max_workers=4)
    return paths


@contextmanager
def config_and_tokenizer(uri: str, *, endpoint_url: str | None = None) -> Iterator[Path]:
    """A temporary folder holding the model's config and tokenizer files (fetch_config_and_tokenizer), removed
    on exit."""
    with tempfile.TemporaryDirectory(prefix="model-config-") as folder:
        fetch_config_and_tokenizer(uri, folder, endpoint_url=endpoint_url)
        yield Path(folder)
