"""The torchtune engine's evaluation inputs, re-exported by evaluation.py: the model folders (inspected as torchtune
reads them), the tuned model (merged, or the base + the run's adapter), the eval rows as the run's dataset node
reads them, and the lm-eval model through torchtune's `eleuther_eval` recipe. No torch at import."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared import contract
from kfp_finetune.components._shared.contract import ArtifactInput
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.eval_examples import require_same_tokenizer
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune import builder_nodes, sample_packing
from kfp_finetune.components._shared.torchtune.dataset_node import dataset_builder_node, source_of
from kfp_finetune.components._shared.torchtune.merge import merged_model_dir
from kfp_finetune.components._shared.torchtune.model_inspection import (
    ModelDir,
    inspect_model_dir,
    tokenizer_fingerprint,
)
from kfp_finetune.components._shared.torchtune.run_layout import last_adapter_state
from kfp_finetune.components._shared.torchtune.tune_cli import recipe_module

log = get_logger(__name__)

# The rows' shape for each data style dataset-initialize writes, and a dataset type's default style.
_STYLE_TYPES = {
    "input_output": "instruct",
    "alpaca": "instruct",
    "openai": "chat",
    "sharegpt": "chat",
    "text": "text",
}
_DEFAULT_STYLE = {"instruct": "input_output", "chat": "openai", "text": "text"}
DEFAULT_LM_EVAL_MAX_SEQ_LEN = 4096  # the eleuther_evaluation configs' max_seq_length
#: The lm-eval versions torchtune's eleuther_eval runs (check_lm_eval), and what to do where lm-eval does not import.
LM_EVAL_LOWEST, LM_EVAL_BEYOND = "0.4.5", "0.4.10"
LM_EVAL_MISSING = f"install kfp-finetune[lm-eval] (lm-eval>={LM_EVAL_LOWEST},<{LM_EVAL_BEYOND}), or leave eval_lm_eval_tasks empty"
WRAPPER_PLACEHOLDER_MODEL = "gpt2"  # what torchtune 0.6.1's _LLMEvalWrapper hands HFLM before its own model


# --- the models -----------------------------------------------------------------------------------------------


def inspect_model(path: Path, what: str) -> ModelDir:
    """The model folder at `path` as torchtune reads it; `what` (model, base_model) names it in errors."""
    try:
        return inspect_model_dir(path)
    except ConfigError as err:
        raise ConfigError(f"{what}: {err}") from err


def check_same_tokenizer(tuned: ModelDir, base: ModelDir) -> None:
    base_fingerprint = tokenizer_fingerprint(base)
    differing = [k for k, v in tokenizer_fingerprint(tuned).items() if base_fingerprint.get(k) != v]
    require_same_tokenizer(tuned, base, differing)


@dataclass
class TunedModel:
    folder: ModelDir  # tokenizer and architecture; the base model's folder for an adapter-only fine-tune
    adapter_file: Path | None = None  # epoch_N/adapter_model.pt when the fine-tune saved only its adapter
    lora_node: dict | None = None  # the training run's LoRA `model` node, to rebuild that model


def tuned_model(
    path: Path, run_dir: Path | None, base_dir: ModelDir | None, train_config: dict
) -> TunedModel:
    """The merged model folder at `path`, or for save_adapter_weights_only runs (`path` holds only the adapter)
    the base + the run's adapter weights."""
    if not (path / "adapter_config.json").is_file() or (path / "config.json").is_file():
        return TunedModel(inspect_model(path, "model"))
    if base_dir is None:
        raise ConfigError(
            f"model is a LoRA adapter without merged weights ({path}): connect base_model (model-initialize's "
            "output) so evaluate can apply the adapter to it"
        )
    lora_node = train_config.get("model") or {}
    adapter_state = last_adapter_state(run_dir) if run_dir is not None else None
    if "lora_rank" not in lora_node or adapter_state is None:
        raise ConfigError(
            f"model is a LoRA adapter without merged weights ({path}) and its fine-tune run folder "
            f"({run_dir}) lacks the resolved LoRA config or epoch_N/adapter_model.pt evaluate rebuilds it from"
        )
    return TunedModel(base_dir, adapter_state, lora_node)


def lm_eval_folder(tuned: TunedModel, run_dir: Path) -> ModelDir:
    """The HF folder lm-eval reads the tuned model from. torchtune's eleuther_eval loads no adapter: an adapter-only
    fine-tune is merged into its base first, on CPU, once per run (`<run>/merged/`, which export reuses)."""
    if tuned.adapter_file is None:
        return tuned.folder
    log.info("lm-eval tasks: merging the fine-tune's adapter into the base model (torchtune's eleuther_eval "
             "loads no adapter)")  # fmt: skip
    return inspect_model_dir(merged_model_dir(run_dir, tuned.folder.path))


# --- the eval rows --------------------------------------------------------------------------------------------


def training_max_seq_len(train_config: dict) -> int | None:
    return (train_config.get("tokenizer") or {}).get("max_seq_len")


def eval_dataset(
    train_config: dict, eval_data: ArtifactInput, files: list[str], max_seq_len: int | None
) -> dict:
    """The dataset node build_dataset reads the eval files with, its columns checked against the files
    (`max_seq_len` is the tokenizer's to apply: load_tokenizer)."""
    node = dataset_node(train_config, eval_data, files)
    check_columns(node, files)
    return node


def dataset_node(train_config: dict, eval_data: ArtifactInput, files: list[str]) -> dict:
    """The training run's dataset node pointed at the eval files; response-only labels, no packing.

    Builder, column mapping, system prompt and conversation style are kept from training so examples are built
    (and masked) exactly as the model saw them: from the torchtune node, behind our packing builder or the packs
    dataset-initialize wrote (builder_nodes.py); without a training config they come from eval_data.
    """
    meta = contract.DatasetSplit.from_metadata(eval_data.metadata, input_name="eval_data")
    trained = builder_nodes.torchtune_node(train_config.get("dataset") or {})
    node = dict(sample_packing.unwrap(trained))
    if not node.get("_component_"):
        style = meta.data_style or _DEFAULT_STYLE.get(meta.dataset_type or "instruct", "")
        if style not in _STYLE_TYPES:
            raise ConfigError(
                f"eval_data has `dataset_type` {meta.dataset_type or None!r} / `data_style` {style!r}; expected "
                f"instruct, chat or text (styles {', '.join(_STYLE_TYPES)})"
            )
        chat = _STYLE_TYPES[style] == "chat"
        node = dataset_builder_node(
            _STYLE_TYPES[style],
            source="",
            data_style=style,
            text_column=meta.text_column or "",
            conversation_column=meta.conversation_column or "",
            conversation_style=(meta.conversation_style or style) if chat else "",
        )
    node.update(
        source=source_of(files[0]),
        data_files=files,
        split="train",  # a `datasets` builder over plain files names its only split "train"
        packed=False,
    )
    if "train_on_input" in node or node["_component_"].endswith("alpaca_dataset"):
        node["train_on_input"] = (
            False  # loss on the response only, whatever training did (alpaca: default True)
        )
    return node


def needed_columns(node: dict) -> dict[str, str] | None:
    """{role: column} the node's torchtune builder reads; None for a builder this library does not write."""
    column_map = node.get("column_map") or {}
    builder = node["_component_"].rsplit(".", 1)[-1]
    if builder == "instruct_dataset":
        return {"prompt": column_map.get("input", "input"), "response": column_map.get("output", "output")}
    if builder == "alpaca_dataset":
        return {
            "instruction": column_map.get("instruction", "instruction"),
            "response": column_map.get("output", "output"),
        }
    if builder == "chat_dataset":
        return {"conversation": node.get("conversation_column", "messages")}
    if builder == "text_completion_dataset":
        return {"text": node.get("column", "text")}
    return None


def check_columns(node: dict, files: list[str]) -> None:
    """Fail early, naming the column, when the eval files lack what the dataset builder reads."""
    import pyarrow.parquet as pq

    needed = needed_columns(node)
    if needed is None or not files[0].endswith(".parquet"):
        return
    present = set(pq.read_schema(files[0]).names)
    for role, column in needed.items():
        if column not in present:
            raise ConfigError(
                f"eval_data lacks the {role} column {column!r} that training's {node['_component_']} reads (it "
                f"has {', '.join(sorted(present))}); prepare train and eval data with one dataset-initialize step"
            )


# --- lm-eval --------------------------------------------------------------------------------------------------


def check_lm_eval() -> None:
    """Checked before any model is loaded. torchtune 0.6.1's eleuther_eval compares lm-eval's version with "0.4.5"
    as strings, so it refuses 0.4.10 and later as too old; and its lm-eval wrapper initialises lm-eval's HFLM with
    `pretrained="gpt2"` (then swaps in the torchtune model): offline, that needs gpt2 in the Hugging Face cache."""
    from importlib.metadata import version

    from huggingface_hub import constants, try_to_load_from_cache
    from packaging.version import Version

    found = version("lm-eval")
    if not Version(LM_EVAL_LOWEST) <= Version(found) < Version(LM_EVAL_BEYOND):
        raise ConfigError(
            f"eval_lm_eval_tasks: this image has lm-eval {found}, and torchtune's eleuther_eval runs "
            f"lm-eval>={LM_EVAL_LOWEST},<{LM_EVAL_BEYOND} only (it compares versions as strings, so it takes "
            f"0.4.10 and later for older than {LM_EVAL_LOWEST}): {LM_EVAL_MISSING}"
        )
    if constants.HF_HUB_OFFLINE and not isinstance(
        try_to_load_from_cache(WRAPPER_PLACEHOLDER_MODEL, "config.json"), str
    ):
        raise ConfigError(
            f"eval_lm_eval_tasks: torchtune's eleuther_eval loads {WRAPPER_PLACEHOLDER_MODEL!r} from the Hugging Face "
            f"Hub before it swaps in the tuned model, but HF_HUB_OFFLINE is set and {constants.HF_HUB_CACHE} "
            f"has no {WRAPPER_PLACEHOLDER_MODEL!r}: allow the step Hub access, or put {WRAPPER_PLACEHOLDER_MODEL!r} "
            "in the image's Hugging Face cache (HF_HOME)"
        )


def recipe_config(
    model_dir: ModelDir, settings: Any, device: Any, max_seq_len: int | None, output_dir: str
) -> dict:
    """The eleuther_eval recipe's config for one model (what its YAML configs contain)."""
    return {
        "model": model_dir.model_node(),
        "checkpointer": model_dir.checkpointer_node(output_dir),
        "tokenizer": model_dir.tokenizer_node(max_seq_len),
        "device": device.type,
        "dtype": "bf16" if device.type == "cuda" else "fp32",
        "seed": settings.seed,
        "tasks": list(settings.lm_eval_tasks),
        "limit": settings.lm_eval_limit or None,
        "batch_size": settings.batch_size,
        "max_seq_length": max_seq_len or DEFAULT_LM_EVAL_MAX_SEQ_LEN,
        "enable_kv_cache": True,
        "include_path": settings.lm_eval_include_path or None,
        "quantizer": None,
    }


def lm_eval_model(model_dir: ModelDir, settings: Any, device: Any, max_seq_len: int | None) -> Any:
    """The lm-eval model of `model_dir`: the eleuther_eval recipe set up as `tune run eleuther_eval` would (its
    own `evaluate()` only prints a table), and its model wrapper handed on."""
    from omegaconf import OmegaConf

    EleutherEvalRecipe = recipe_module("eleuther_eval").EleutherEvalRecipe
    with tempfile.TemporaryDirectory(prefix="kfp-finetune-lm-eval-") as scratch:
        cfg = OmegaConf.create(recipe_config(model_dir, settings, device, max_seq_len, scratch))
        recipe = EleutherEvalRecipe(cfg=cfg)
        recipe.setup(cfg=cfg)
    return recipe.eleuther_model_wrapper
