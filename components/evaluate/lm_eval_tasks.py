"""Optional lm-eval-harness tasks, scored on the model lm-eval gets from the engine that trained it (the engine's
evaluation module: `lm_eval_model(model_dir, settings, device, max_seq_len)`, e.g. torchtune's `eleuther_eval`
recipe wrapper; the transformers engine's lm-eval HF model), and the results flattened into metrics with their
standard errors. Needs lm-eval in the step's image: `kfp-finetune[lm-eval]` (lm-eval>=0.4.5,<0.4.10, DESIGN.md §4)
on torchtune's, `kfp-finetune[lm-eval-transformers]` on the transformers engine's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)


@dataclass
class LmEvalScores:
    """One model's lm-eval results: values and their standard errors by metric (lm_eval_<task>_<metric>), and
    how many examples each task scored."""

    values: dict[str, float]
    stderrs: dict[str, float]
    examples: dict[str, int]


def _scores(results: dict[str, dict]) -> Iterator[tuple[str, str, float]]:
    """(task, metric, value) for lm-eval's numeric "<metric>,<filter>" entries; the task's other keys ("alias";
    lm-eval 0.4.10 and later: "name", "sample_len") are not scores."""
    for task, values in sorted(results.items()):
        for key, value in values.items():
            if "," in key and isinstance(value, (int, float)) and not isinstance(value, bool):
                yield task, key.split(",")[0], float(value)


def flatten_results(results: dict[str, dict]) -> dict[str, float]:
    """lm-eval's {task: {"acc,none": 0.5, "acc_stderr,none": ...}} → {"lm_eval_<task>_acc": 0.5}."""
    return {
        f"lm_eval_{task}_{metric}": value
        for task, metric, value in _scores(results)
        if not metric.endswith("_stderr")
    }


def flatten_stderrs(results: dict[str, dict]) -> dict[str, float]:
    """{task: {"acc_stderr,none": 0.1}} → {"lm_eval_<task>_acc": 0.1}; lm-eval writes "N/A" where it has none."""
    return {
        f"lm_eval_{task}_{metric.removesuffix('_stderr')}": value
        for task, metric, value in _scores(results)
        if metric.endswith("_stderr") and math.isfinite(value)
    }


def task_examples(output: dict) -> dict[str, int]:
    """Examples scored per metric, from lm-eval's {"n-samples": {task: {"effective": n}}}."""
    counts = {task: int(n.get("effective", 0)) for task, n in (output.get("n-samples") or {}).items()}
    return {f"lm_eval_{task}_{metric}": counts.get(task, 0) for task, metric, _ in _scores(output["results"])}


def require_lm_eval(model_eval: ModuleType) -> None:
    """Fail before any model is loaded when lm_eval_tasks cannot run in this image (`model_eval`: the engine's
    evaluation module, which checks what its lm-eval model needs and says what to do without lm-eval)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as err:
        raise ConfigError(
            f"eval_lm_eval_tasks needs lm-eval in the step's image ({err}): {model_eval.LM_EVAL_MISSING}"
        ) from err
    model_eval.check_lm_eval()


def run_lm_eval(
    model_dir: Any, settings: Any, device: Any, max_seq_len: int | None, label: str, model_eval: ModuleType
) -> LmEvalScores:
    """lm-eval's tasks on the model folder `model_dir`, loaded by the engine's evaluation module `model_eval`."""
    from lm_eval.evaluator import evaluate
    from lm_eval.tasks import TaskManager

    model = model_eval.lm_eval_model(model_dir, settings, device, max_seq_len)
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
    output = evaluate(model, tasks, limit=settings.lm_eval_limit or None)
    values = flatten_results(output["results"])
    log.info("%s: lm-eval %s", label, values)
    return LmEvalScores(values, flatten_stderrs(output["results"]), task_examples(output))
