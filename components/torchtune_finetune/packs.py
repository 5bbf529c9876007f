"""Train on the packs dataset-initialize wrote, when they were made the way this run would make them.

The resolved config's tokenizer node, dataset node (template, masking, columns) and max_seq_len give a
fingerprint (_shared/packing.pack_fingerprint); when it equals the one the train split's metadata records, the
dataset node becomes packed_data.packed_dataset over the packs (no tokenization on any rank), keeping the
torchtune node it stands for (_shared/torchtune/builder_nodes.stand_in: evaluation builds its split with it).
Otherwise the config is left as it is (torchtune tokenizes and packs) and the step log says why.
"""

from __future__ import annotations

import os
from pathlib import Path

from kfp_finetune.components._shared.artifacts import entry_path
from kfp_finetune.components._shared.contract import DatasetSplit
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune import builder_nodes
from kfp_finetune.components._shared.torchtune.packing import (
    pack_fingerprint,
    template_of,
    tokenizer_fingerprint,
)
from kfp_finetune.components.torchtune_finetune.packed_data import COMPONENT

log = get_logger(__name__)


def use_packs(config: dict, split: DatasetSplit | None, workspace: str | os.PathLike) -> bool:
    """Point `config["dataset"]` at the split's packs when they match the run (see the module docstring)."""
    if split is None or not split.packs:
        return False
    dataset, tokenizer = config.get("dataset") or {}, config.get("tokenizer") or {}
    why = _mismatch(dataset, tokenizer, split)
    if why:
        log.info(
            "not training on dataset-initialize's packs: %s; torchtune tokenizes and packs the data", why
        )
        return False
    files = [str(entry_path(workspace, p["path"]).resolve()) for p in split.packs]
    missing = [f for f in files if not Path(f).is_file()]
    if missing:
        log.warning(
            "not training on dataset-initialize's packs: %s missing; torchtune packs the data", missing
        )
        return False
    packs = {
        "_component_": COMPONENT,
        "files": files,
        "max_seq_len": split.max_seq_len,
        "packed": True,
        "pack_fingerprint": split.pack_fingerprint,
    }
    config["dataset"] = builder_nodes.stand_in(packs, dataset)
    log.info(
        "training on dataset-initialize's %d packs of %d tokens (%s): no tokenization on any rank",
        sum(int(p.get("num_packs", 0)) for p in split.packs), split.max_seq_len, ", ".join(files),
    )  # fmt: skip
    return True


def _mismatch(dataset: dict, tokenizer: dict, split: DatasetSplit) -> str:
    if not dataset.get("packed"):
        return "packing is off (packed: false)"
    if dataset.get("source") != "parquet" or not dataset.get("data_files"):
        return "the run reads another data source"
    if tokenizer.get("max_seq_len") != split.max_seq_len:
        return f"max_seq_len {tokenizer.get('max_seq_len')} differs from the packs' {split.max_seq_len}"
    if tokenizer_fingerprint(tokenizer) != split.tokenizer_fingerprint:
        return "they were made with another tokenizer"
    if pack_fingerprint(tokenizer, dataset, split.max_seq_len) != split.pack_fingerprint:
        return (
            f"the prompt template or masking differs, or the packs' format is older (packs: {split.pack_template}, "
            f"run: {template_of(dataset)})"
        )
    return ""
