"""The fine-tuning engines, and the one place that maps an engine's name to its wing.

Each engine's knowledge lives in its own folder under `_shared/` (its wing) and is reached from the steps above
through the wing's face module, which has the names in FACE. A step reads the engine a fine-tune recorded
(`TunedModel.engine`) and asks `face(name)` — it never compares engine names itself
(tests/components/test_engine_wings.py enforces both rules).
"""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from kfp_finetune.components._shared.errors import ConfigError

AUTO = "auto"
DEFAULT_ENGINE = "torchtune"
#: What a fine-tune learns, from the data's type: text generation (instruct, chat, text rows), sequence
#: classification (dataset_type `classification`: a text and a class id per row), or text generation from images
#: and text (dataset_type `multimodal`: a vision-language model; Hugging Face's task name).
GENERATION, CLASSIFICATION, IMAGE_TEXT = "generation", "classification", "image-text-to-text"
_TASKS = {"classification": CLASSIFICATION, "multimodal": IMAGE_TEXT}
#: The engines in the order `auto` tries them: the first that serves a model trains it.
WINGS = {
    "torchtune": "kfp_finetune.components._shared.torchtune.face",
    "transformers": "kfp_finetune.components._shared.transformers.face",
}
FACE = (
    "DATA_PACKS",
    "NAME",
    "PACKAGES",
    "RUNTIME",
    "TRAINED_WITH",
    "TRAINER_IMAGE",
    "serves",
    "read_resolved_config",
    "hyperparameters",
    "last_adapter_state",
    "resume_point",
    "merged_model_dir",
    "evaluation",
    "check_node_command",
    "run_node_command",
)


@dataclass(frozen=True)
class EngineChoice:
    engine: str
    reason: str  # for people: why this engine trains the model
    task: str = GENERATION  # what it trains the model to do

    def line(self) -> str:
        return f"engine: {self.engine} ({self.reason})"


def face(engine: str) -> ModuleType:
    """The face of `engine` ("" is the default engine: fine-tunes recorded before engines were named)."""
    name = engine or DEFAULT_ENGINE
    if name not in WINGS:
        raise ConfigError(
            f"the fine-tuned model names the engine {name!r}, which this version does not know (known: "
            f"{', '.join(WINGS)}): evaluate and export it with the kfp-finetune version that trained it"
        )
    return importlib.import_module(WINGS[name])


def trainer_images() -> dict[str, str]:
    """Each engine's trainer image, {engine: image}: the image with its packages, where evaluate loads its models.
    From images.py as this process sees it (when compiling: the KFP_FINETUNE_*_IMAGE settings)."""
    return {name: face(name).TRAINER_IMAGE for name in WINGS}


def model_config(model_dir: str | Path) -> dict:
    """The model folder's config.json, what `choose` decides from; refused naming the file when unreadable."""
    path = Path(model_dir) / "config.json"
    try:
        found = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(
            f"model directory {model_dir} has no config.json: is it an HF-layout model folder?"
        ) from None
    except ValueError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from err
    if not isinstance(found, dict):
        raise ConfigError(f"{path} must hold one JSON object")
    return found


def task_of(dataset_type: str | None) -> str:
    """The task a fine-tune on data of `dataset_type` (dataset-initialize's) learns."""
    return _TASKS.get(dataset_type or "", GENERATION)


def lm_eval_refusal(task: str) -> str:
    """Why lm-eval's tasks cannot score a model trained for `task` ("": they can; its HF causal-LM model loads
    text generators only). Pre-flight refuses the tasks with it, evaluate before loading a model."""
    if task == CLASSIFICATION:
        return (
            "eval_lm_eval_tasks: lm-eval's tasks score language models, and this fine-tune trains a sequence "
            "classifier: leave eval_lm_eval_tasks empty (evaluate reports accuracy and macro_f1)"
        )
    if task == IMAGE_TEXT:
        return (
            "eval_lm_eval_tasks: lm-eval's text tasks load a causal LM, and this fine-tune trains a vision-language "
            "model on image + text rows: leave eval_lm_eval_tasks empty (evaluate scores it on the eval images)"
        )
    return ""


def choose(
    model_dir: str | Path, hf_config: dict, requested: str = AUTO, task: str = GENERATION
) -> EngineChoice:
    """The engine that trains the model in `model_dir` (its config.json is `hf_config`) for `task`: `requested`
    when it serves the model, else (auto) the first engine in WINGS that does. Refused with every engine's reason
    when none does, before anything is downloaded beyond config.json and the tokenizer files."""
    if requested not in (AUTO, *WINGS):
        raise ConfigError(
            f"tune_engine={requested!r} is not an engine: set one of {', '.join((AUTO, *WINGS))}"
        )
    names = list(WINGS) if requested == AUTO else [requested]
    refusals = []
    for name in names:
        served, reason = face(name).serves(Path(model_dir), hf_config, task)
        if served:
            how = "chosen by the engine setting" if requested != AUTO else "the first engine that serves it"
            return EngineChoice(name, f"{reason}; {how}", task)
        refusals.append(f"{name}: {reason}")
    why = "; ".join(refusals)
    if task != GENERATION:
        why += f". The task, {task}, comes from data_type: use a model of that kind, or data of another type"
    raise ConfigError(f"no engine can fine-tune this model. {why}")
