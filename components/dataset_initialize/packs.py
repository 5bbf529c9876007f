"""Tokenize and pack the train split once, with the base model's tokenizer (see _shared/torchtune/packing.py).

Every train row is tokenized here, so this is where the rows that would fail are found (seq_len.py's rule): rows
whose masked prompt fills max_seq_len are left out of the packs, counted, and the first few named by file and
line (`where`); more than unfit_rows.MAX_UNFIT_SHARE of them is refused before any pack is kept.

The packs go to `<dataset entry>/packs/<key>/` (key, packing.pack_key: tokenizer, template and masking —
train_on_input, new_system_prompt — and the max_seq_len asked for), beside the parquet shards, with a
`packs.json` of what the train artifact's metadata records; a rerun with the same key reuses them. Tokenizing
needs torchtune (the trainer image): where it is not installed the step says so and writes no packs, and the
fine-tune step tokenizes and packs as torchtune does. For a model whose attention takes no packed batches on
CUDA (model_inspection.Family.block_masks; its GPU runs train unpacked) the rows are measured only: lengths,
max_seq_len and the unfit rows are recorded (in `<dataset entry>/lengths/<key>/`), no packs are written.
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.artifacts import workspace_relative
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.workspace import atomic_dir, write_json_atomic
from kfp_finetune.components.dataset_initialize.sources import DatasetValidationError

log = get_logger(__name__)

PACKS_JSON = "packs.json"
MAX_NAMED_ROWS = 5


def pack_train(
    entry: Path,
    manifest: dict,
    hints: dict,
    model_dir: Path,
    workspace: str,
    max_seq_len: int | None,
    num_proc: int,
    train_on_input: bool = False,
    new_system_prompt: str | None = None,
    where: Callable[[int], str] | None = None,
) -> dict:
    """The train metadata keys of the packs of `entry`'s train split (DatasetSplit: token_stats, max_seq_len,
    packs, tokenizer_fingerprint, pack_fingerprint, pack_template); {} when torchtune is not installed.
    `train_on_input` / `new_system_prompt`: the masking and system prompt of the run that will train on them
    (None: torchtune's defaults), as the fine-tune step resolves them. `where(i)` names train row i (0-based, as
    written) by source file and line; None: by its row number in the written split."""
    if importlib.util.find_spec("torchtune") is None:
        log.warning(
            "base_model is connected but torchtune is not installed in this image: no packs written; the "
            "fine-tune step will tokenize and pack on every rank (run dataset-initialize on the trainer image)"
        )
        return {}
    from kfp_finetune.components._shared import engines
    from kfp_finetune.components._shared.torchtune import packing
    from kfp_finetune.components._shared.torchtune.defaults import no_packing_on_cuda
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir

    choice = engines.choose(model_dir, engines.model_config(model_dir))
    if not engines.face(choice.engine).DATA_PACKS:
        log.info(
            "no packs written: the %s engine tokenizes the rows itself (%s)", choice.engine, choice.reason
        )
        return {}
    model = inspect_model_dir(model_dir, weights_required=False)  # tokenizing reads no weights
    tokenizer_node = model.tokenizer_node(None)
    split = manifest["splits"]["train"]
    node = packing.sft_node(
        hints, [str(entry / f["path"]) for f in split["files"]], bool(train_on_input), new_system_prompt
    )
    tokenizer_fp = packing.tokenizer_fingerprint(tokenizer_node)
    no_packs = no_packing_on_cuda(model.family)  # why not, or ""
    if no_packs:
        log.info("no packs written: %s; the train rows are measured only", no_packs)
    area = "lengths" if no_packs else "packs"
    folder = entry / area / packing.pack_key(tokenizer_fp, node, max_seq_len)
    record = _present(folder)
    if record is None:
        with atomic_dir(folder) as tmp:
            result = packing.pack_split(
                tokenizer_node, node, tmp, max_seq_len=max_seq_len,
                max_position_embeddings=model.hf_config.get("max_position_embeddings"), num_proc=num_proc,
                write_packs=not no_packs,
            )  # fmt: skip
            stats = result.stats
            log.info(
                "tokenized %d rows in %.1fs (%d processes): tokens per row p50 %d, p90 %d, p99 %d, max %d; "
                "longest prompt %d",
                stats["count"], result.tokenize_seconds, num_proc, stats["p50"], stats["p90"], stats["p99"],
                stats["max"], stats["prompt_max"],
            )  # fmt: skip
            log.info(
                "max_seq_len %d (%s); %s; %d row(s) cut to it",
                result.max_seq_len, "set" if max_seq_len else "99th percentile of the rows, rounded up to 256, capped by the model",
                "no packs" if no_packs else f"{result.num_packs} packs in {result.pack_seconds:.1f}s",
                result.truncated_rows,
            )  # fmt: skip
            unfit = _unfit(
                result, stats["count"], where or (lambda i: f"train row {i}"),
                model.hf_config.get("max_position_embeddings"), packed=not no_packs,
            )  # fmt: skip
            record = {
                "token_stats": stats,
                "max_seq_len": result.max_seq_len,
                "num_packs": result.num_packs,
                "tokenizer_fingerprint": tokenizer_fp,
                "pack_fingerprint": packing.pack_fingerprint(tokenizer_node, node, result.max_seq_len),
                "pack_template": packing.template_of(node),
                "files": [_file_record(result.path, tmp)] if result.path else [],
                "unfit": unfit,
            }
            write_json_atomic(tmp / PACKS_JSON, record)
    else:
        log.info("%s for this tokenizer, template and masking already in %s: reused", area, folder)
        if record.get("unfit"):
            log.warning("%s", record["unfit"])
    measured = {
        "token_stats": record["token_stats"],
        "max_seq_len": record["max_seq_len"],
        "tokenizer_fingerprint": record["tokenizer_fingerprint"],
    }
    if no_packs:
        return measured
    return {
        **measured,
        "packs": [
            {**f, "path": workspace_relative(folder / f["path"], workspace), "num_packs": record["num_packs"]}
            for f in record["files"]
        ],
        "pack_fingerprint": record["pack_fingerprint"],
        "pack_template": record["pack_template"],
    }


def _unfit(
    result, rows: int, where: Callable[[int], str], max_position_embeddings: int | None, *, packed: bool
) -> str:
    """The warning about the rows whose prompt fills max_seq_len, left out of the packs where `packed` (empty:
    none); raises when they are too many."""
    from kfp_finetune.components._shared.torchtune import seq_len
    from kfp_finetune.components._shared.unfit_rows import too_many_unfit

    if not result.unfit_rows:
        return ""
    count, refused = len(result.unfit_rows), too_many_unfit(len(result.unfit_rows), rows)
    named = [where(i) for i in result.unfit_rows[:MAX_NAMED_ROWS]]
    message = seq_len.unfit_message(
        count, rows, result.max_seq_len, result.unfit_needed, named, refused, max_position_embeddings
    )
    if refused:
        raise DatasetValidationError(message)
    if packed:
        message = f"left out of the packs: {message}"
    log.warning("%s", message)
    return message


def _file_record(path: Path, root: Path) -> dict:
    return {"path": path.relative_to(root).as_posix(), "size": path.stat().st_size,
            "sha256": storage.hash_file(path).sha256}  # fmt: skip


def _present(where: Path) -> dict | None:
    try:
        record = json.loads((where / PACKS_JSON).read_text())
    except (OSError, ValueError):
        return None
    ok = all(
        (where / f["path"]).is_file() and (where / f["path"]).stat().st_size == f["size"]
        for f in record["files"]
    )
    return record if ok else None
