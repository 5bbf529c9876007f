"""Optional lm-eval-harness tasks through torchtune's `eleuther_eval` recipe.

The recipe's own `evaluate()` only prints a table, so we set it up as `tune run eleuther_eval` would (same
config keys: model, checkpointer, tokenizer, tasks, limit, ...) and hand its model wrapper to lm-eval's
`evaluate` to get the numbers. Needs `kfp-finetune[lm-eval]` (lm-eval>=0.4.5,<0.4.10, DESIGN.md §4).
Note: torchtune 0.6.1's wrapper initialises lm-eval's HFLM with `pretrained="gpt2"` (then swaps in the
torchtune model), so the step needs Hub access or `gpt2` in its Hugging Face cache.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.torchtune.model_inspection import ModelDir
from kfp_finetune.components._shared.torchtune.tune_cli import recipe_module

log = get_logger(__name__)

DEFAULT_MAX_SEQ_LEN = 4096  # the eleuther_evaluation configs' max_seq_length
WRAPPER_PLACEHOLDER_MODEL = "gpt2"  # what torchtune 0.6.1's _LLMEvalWrapper hands HFLM before its own model


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
        "max_seq_length": max_seq_len or DEFAULT_MAX_SEQ_LEN,
        "enable_kv_cache": True,
        "include_path": settings.lm_eval_include_path or None,
        "quantizer": None,
    }


@dataclass
class LmEvalScores:
    """One model's lm-eval results: values and their standard errors by metric (lm_eval_<task>_<metric>), and
    how many examples each task scored."""

    values: dict[str, float]
    stderrs: dict[str, float]
    examples: dict[str, int]


def flatten_results(results: dict[str, dict]) -> dict[str, float]:
    """lm-eval's {task: {"acc,none": 0.5, "acc_stderr,none": ...}} → {"lm_eval_<task>_acc": 0.5}."""
    flat = {}
    for task, values in sorted(results.items()):
        for key, value in values.items():
            metric = key.split(",")[0]
            if "stderr" in metric or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            flat[f"lm_eval_{task}_{metric}"] = float(value)
    return flat


def flatten_stderrs(results: dict[str, dict]) -> dict[str, float]:
    """{task: {"acc_stderr,none": 0.1}} → {"lm_eval_<task>_acc": 0.1}; lm-eval writes "N/A" where it has none."""
    flat = {}
    for task, values in sorted(results.items()):
        for key, value in values.items():
            metric = key.split(",")[0]
            if (
                not metric.endswith("_stderr")
                or isinstance(value, bool)
                or not isinstance(value, (int, float))
            ):
                continue
            if math.isfinite(value):
                flat[f"lm_eval_{task}_{metric.removesuffix('_stderr')}"] = float(value)
    return flat


def task_examples(output: dict) -> dict[str, int]:
    """Examples scored per metric, from lm-eval's {"n-samples": {task: {"effective": n}}}."""
    counts = {task: int(n.get("effective", 0)) for task, n in (output.get("n-samples") or {}).items()}
    return {
        f"lm_eval_{task}_{key.split(',')[0]}": counts.get(task, 0)
        for task, values in output["results"].items()
        for key in values
    }


def require_lm_eval() -> None:
    """Fail before any model is loaded when lm_eval_tasks cannot run in this image."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"eval_lm_eval_tasks needs lm-eval in the step's image ({err}): install kfp-finetune[lm-eval] "
            "(lm-eval>=0.4.5,<0.4.10), or leave eval_lm_eval_tasks empty"
        ) from err
    from huggingface_hub import constants, try_to_load_from_cache

    if constants.HF_HUB_OFFLINE and not isinstance(
        try_to_load_from_cache(WRAPPER_PLACEHOLDER_MODEL, "config.json"), str
    ):
        raise ConfigError(
            f"eval_lm_eval_tasks: torchtune's eleuther_eval loads {WRAPPER_PLACEHOLDER_MODEL!r} from the Hugging Face "
            f"Hub before it swaps in the tuned model, but HF_HUB_OFFLINE is set and {constants.HF_HUB_CACHE} "
            f"has no {WRAPPER_PLACEHOLDER_MODEL!r}: allow the step Hub access, or put {WRAPPER_PLACEHOLDER_MODEL!r} "
            "in the image's Hugging Face cache (HF_HOME)"
        )


def run_lm_eval(
    model_dir: ModelDir, settings: Any, device: Any, max_seq_len: int | None, label: str
) -> LmEvalScores:
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager
    from omegaconf import OmegaConf

    EleutherEvalRecipe = recipe_module("eleuther_eval").EleutherEvalRecipe
    with tempfile.TemporaryDirectory(prefix="kfp-finetune-lm-eval-") as scratch:
        cfg = OmegaConf.create(recipe_config(model_dir, settings, device, max_seq_len, scratch))
        recipe = EleutherEvalRecipe(cfg=cfg)
        recipe.setup(cfg=cfg)
    task_manager = TaskManager(include_path=settings.lm_eval_include_path or None)
    unknown = [name for name in settings.lm_eval_tasks if name not in task_manager.all_tasks]
    if unknown:
        raise ConfigError(
            f"eval_lm_eval_tasks: unknown task(s) {', '.join(unknown)}; see `lm-eval --tasks list`, or give the "
            "folder of your task YAMLs as lm_eval_include_path"
        )
    try:
        # TaskManager directly: lm-eval 0.4.9's get_task_dict fails logging tasks from an include path.
        tasks = task_manager.load_task_or_group(list(settings.lm_eval_tasks))
    except (KeyError, ValueError) as err:
        raise ConfigError(f"eval_lm_eval_tasks: {err}") from err
    log.info("%s: lm-eval tasks %s", label, ", ".join(settings.lm_eval_tasks))
    output = evaluate(recipe.eleuther_model_wrapper, tasks, limit=settings.lm_eval_limit or None)
    values = flatten_results(output["results"])
    log.info("%s: lm-eval %s", label, values)
    return LmEvalScores(values, flatten_stderrs(output["results"]), task_examples(output))
