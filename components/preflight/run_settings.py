"""Pre-flight's checks of the run's settings and model: the pipeline's tune_ / eval_ / export_ parameters with the
same rules the steps apply (the typed torchtune settings, _shared/eval_settings.py, _shared/export_settings.py),
the device and GPU counts against each other, the trainer image reference, and the whole torchtune run resolved
from the model's config.json and tokenizer files alone (fetched without the weights).

Every problem names the pipeline parameter the user sets (`tune_learning_rate`, not the step's `learning_rate`).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kfp_finetune.components._shared import images, launch_settings, unset
from kfp_finetune.components._shared.errors import ConfigError, SettingError
from kfp_finetune.components._shared.eval_settings import EvalSettings
from kfp_finetune.components._shared.export_settings import dtype_problem, format_problem
from kfp_finetune.components._shared.gpus import gpu_counts
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.model_files import fetch_config_and_tokenizer
from kfp_finetune.components._shared.torchtune.config import (
    OTHER_ENGINES_SETTINGS,
    SWITCHES,
    TorchtuneConfig,
    from_flat,
    other_engines_settings,
)
from kfp_finetune.components.preflight.problems import Problem

if TYPE_CHECKING:
    from kfp_finetune.components._shared.torchtune.model_inspection import ModelDir

log = get_logger(__name__)

TUNE = "tune_"
# tune_ parameters of the fine-tune step itself (where and how it runs), not torchtune settings.
STEP_PARAMETERS = (
    "tune_backend", "tune_runtime", "tune_num_nodes", "tune_gpus_per_node", "tune_gpu_memory_gib",
    "tune_trainer_image", "tune_cleanup_policy", "tune_timeout_seconds", "tune_queue_name", "tune_priority_class",
    "tune_queue_timeout_seconds", "tune_allow_slow_network", "tune_engine",
)  # fmt: skip
# The settings the pipeline parameters give each step, by the step's name for them.
EVAL_PARAMETERS = {
    "eval_max_samples": "max_samples",
    "eval_max_new_tokens": "max_new_tokens",
    "eval_gate_metric": "gate_metric",
    "eval_min_improvement": "min_improvement",
    "eval_confidence": "confidence",
    "eval_thresholds": "thresholds",
    "eval_lm_eval_tasks": "lm_eval_tasks",
    "eval_device": "device",
}
EXPORT_PARAMETERS = {"export_format": "format", "export_dtype": "dtype"}
# Settings the fine-tune checks whose pipeline parameter is not tune_<setting>.
_PARAMETER_OF = {
    "dataset_type": "data_type",
    "column_map": "data_column_map",
    "quantize_base": "tune_method",
    "use_dora": "tune_method",
    "export_format": "export_format",
    "devices": "tune_gpus_per_node",
    "nodes": "tune_num_nodes",
}


@dataclass
class RunSettings:
    """The pipeline parameters pre-flight checks, by name; those not given keep the pipelines' defaults (the
    step's defaults for the typed settings: unset)."""

    values: dict[str, Any] = field(default_factory=dict)
    #: The engine the model check chose ("": not chosen yet: the default engine's), for the runtime check.
    engine: str = ""

    def get(self, name: str, default: Any) -> Any:
        return self.values.get(name, default)

    @property
    def backend(self) -> str:
        return self.get("tune_backend", "trainjob")

    @property
    def gpus_per_node(self) -> int:
        return self.get("tune_gpus_per_node", 1)

    @property
    def nodes(self) -> int:
        return self.get("tune_num_nodes", 1)

    def training(self) -> dict[str, Any]:
        """The typed torchtune settings as the fine-tune step gets them: unset sentinels read as None."""
        given = {
            name.removeprefix(TUNE): value
            for name, value in self.values.items()
            if name.startswith(TUNE) and name not in STEP_PARAMETERS
        }
        return {
            k: v for k, v in unset.settings_from_parameters(given, switches=SWITCHES).items() if v is not None
        }


def parameter_of(setting: str) -> str:
    """The pipeline parameter that sets a fine-tune setting."""
    return _PARAMETER_OF.get(setting, f"{TUNE}{setting}")


def named(error: ConfigError, fallback: str) -> Problem:
    """A step's error as a problem of the pipeline parameter: a SettingError by its setting, else `fallback`."""
    if isinstance(error, SettingError):
        return Problem(parameter_of(error.setting), error.problem)
    return Problem(fallback, str(error))


def check_training(settings: RunSettings) -> tuple[TorchtuneConfig | None, list[Problem]]:
    """The typed torchtune settings (types, ranges, vocabularies, combinations), and the device they run on."""
    # Another engine's settings are checked once the model says which engine trains (check_model_and_run).
    torchtune_settings = {k: v for k, v in settings.training().items() if k not in OTHER_ENGINES_SETTINGS}
    try:
        config = from_flat(torchtune_settings)
    except ConfigError as error:
        return None, [named(error, "tune_overrides")]
    if config.device == unset.AUTO:
        # As the fine-tune step picks it (finetune.pick_device): cuda when the TrainJob has GPUs. The local
        # backend looks at its own machine, which pre-flight cannot see: the base config's device then.
        config.device = (
            ("cuda" if settings.gpus_per_node > 0 else "cpu") if settings.backend == "trainjob" else None
        )
    found = [named(problem, "tune_overrides") for problem in config.problems()]
    return (None if found else config), found


def check_hardware(settings: RunSettings, device: str | None) -> list[Problem]:
    """GPU counts (gpu-counts' rule), nodes, and the devices asked for against the GPUs: the latter on a cluster
    only (backend trainjob), as under kfp.local the steps see the machine's own GPUs, whatever the counts say."""
    try:
        tune_gpus, eval_gpus = (
            int(n) for n in gpu_counts(settings.gpus_per_node, settings.get("eval_gpus", -1))
        )
    except SettingError as error:  # named by its pipeline parameter already
        return [Problem(error.setting, error.problem)]
    found = []
    if settings.nodes < 1:
        found.append(Problem("tune_num_nodes", f"must be at least 1 (got {settings.nodes})"))
    if settings.backend == "local" and settings.nodes > 1:
        found.append(Problem("tune_num_nodes", f"{settings.nodes} nodes need tune_backend=trainjob; the local "
                                             "backend trains in the step's own pod: set tune_num_nodes=1"))  # fmt: skip
    if settings.backend == "trainjob" and device == "cuda" and tune_gpus == 0:
        found.append(Problem("tune_device", "cuda needs GPUs, but tune_gpus_per_node is 0: set tune_gpus_per_node "
                                          "to the GPUs of each node, or tune_device=cpu"))  # fmt: skip
    if settings.backend == "trainjob" and device == "cpu" and tune_gpus > 0:
        found.append(Problem("tune_device", f"cpu trains on no GPU, but tune_gpus_per_node={tune_gpus} requests "
                                          f"{tune_gpus} per node: set tune_gpus_per_node=0, or tune_device=cuda"))  # fmt: skip
    eval_device = settings.get("eval_device", "auto")
    if settings.backend == "trainjob" and str(eval_device).startswith("cuda") and eval_gpus == 0:
        found.append(Problem("eval_device", f"{eval_device} needs a GPU, but the evaluate step gets none "
                                          "(eval_gpus, or tune_gpus_per_node when eval_gpus is -1): set eval_gpus=1, "
                                          "or eval_device=auto"))  # fmt: skip
    return found


def check_evaluate_and_export(settings: RunSettings) -> list[Problem]:
    """The eval_ and export_ parameters, by the evaluate and export steps' own checks."""
    given = {step: settings.values[name] for name, step in EVAL_PARAMETERS.items() if name in settings.values}
    by_setting = {step: name for name, step in EVAL_PARAMETERS.items()}
    found = [Problem(by_setting[p.setting], p.problem) for p in EvalSettings(**given).problems()]
    for name, problem in (
        ("export_format", format_problem(settings.get("export_format", "merged"))),
        ("export_dtype", dtype_problem(settings.get("export_dtype", ""))),
    ):
        if problem:
            found.append(Problem(name, problem.problem))
    return found


def check_launch(settings: RunSettings) -> list[Problem]:
    """The fine-tune step's own settings: backend, cleanup policy, timeout, GPU memory, Kueue queue."""
    problems = launch_settings.problems(
        backend=settings.backend,
        cleanup_policy=settings.get("tune_cleanup_policy", "on-success"),
        timeout_seconds=settings.get("tune_timeout_seconds", 86400),
        gpu_memory_gib=settings.get("tune_gpu_memory_gib", -1.0),
        queue_name=settings.get("tune_queue_name", ""),
        priority_class=settings.get("tune_priority_class", ""),
        queue_timeout_seconds=settings.get(
            "tune_queue_timeout_seconds", launch_settings.DEFAULT_QUEUE_TIMEOUT_SECONDS
        ),
    )
    return [Problem(parameter_of(p.setting), p.problem) for p in problems]


def check_image(settings: RunSettings) -> list[Problem]:
    reference = settings.get("tune_trainer_image", "")
    problem = images.reference_problem(reference) if reference else None
    return [Problem("tune_trainer_image", problem)] if problem else []


def check_model_and_run(
    settings: RunSettings, config: TorchtuneConfig | None, model_uri: str, endpoint_url: str | None
) -> list[Problem]:
    """Fetch config.json and the tokenizer files (no weights), check the model family and layout, and resolve
    the complete torchtune run as the fine-tune step will (recipe, base config, every key and `_component_`);
    `config` None (settings already refused): the model alone."""
    from kfp_finetune.components._shared import engines, storage
    from kfp_finetune.components._shared.torchtune.model_inspection import inspect_model_dir
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run

    with tempfile.TemporaryDirectory(prefix="preflight-model-") as folder:
        try:
            fetched = fetch_config_and_tokenizer(model_uri, folder, endpoint_url=endpoint_url)
            log.info("model_uri: fetched %s (no weights)", ", ".join(fetched))
            hf_config = _hf_config(Path(folder) / "config.json")
            if hf_config:  # else the inspection below names what is wrong with config.json
                choice = engines.choose(
                    folder,
                    hf_config,
                    settings.get("tune_engine", engines.AUTO),
                    engines.task_of(settings.get("data_type", "instruct")),
                )
                log.info("%s", choice.line())
                settings.engine = choice.engine
                face = engines.face(choice.engine)
                if settings.get("eval_lm_eval_tasks", []) and engines.lm_eval_refusal(choice.task):
                    return [Problem("eval_lm_eval_tasks", engines.lm_eval_refusal(choice.task))]
                if hasattr(
                    face, "check_settings"
                ):  # a wing that plans its own runs checks the settings itself
                    return check_planned(face, settings, folder)
            model = inspect_model_dir(folder, weights_required=False)
        except (ConfigError, storage.StorageError, ValueError) as error:
            return [Problem("model_uri", str(error).replace(folder, model_uri))]
        refused = [named(problem, "tune_engine") for problem in other_engines_settings(settings.training())]
        if refused:
            return refused
        unproven = check_layout_proven(model, model_uri)
        if unproven:
            return unproven
        too_big = check_evaluation_fits(settings, model, model_uri)
        if config is None:
            return too_big
        # The data's files are dataset-initialize's to write: a placeholder source, as `resolve-config` without
        # --data; the data's lengths are unknown here, so the defaults that read them take the base config's.
        config.dataset.source = "parquet"
        devices = max(settings.gpus_per_node, 1) if config.device == "cuda" else 1
        try:
            run = resolve_run(
                config,
                folder,
                None,
                Path(folder) / "run",
                devices=devices,
                nodes=settings.nodes,
                write=False,
                export_format=settings.get("export_format", "merged"),
                gpu_memory_gib=_unset_number(settings.get("tune_gpu_memory_gib", -1.0)),
                tokenize_sample=False,
                weights_required=False,
            )
        except ConfigError as error:
            found = named(error, "tune_config")
            return [Problem(found.parameter, found.message.replace(folder, model_uri))]
        except KeyError as error:  # a config.json field the resolver reads, absent (any other key: a bug)
            if error.args[0] in model.hf_config:
                raise
            return [Problem("model_uri", f"{model_uri}: config.json has no {error.args[0]!r}, which the fine-tune "
                                         "reads: is it a complete Hugging Face model config?")]  # fmt: skip
    log.info("tune_*: resolved recipe %s with base config %s", run.recipe, run.config_name or "user file")
    return too_big


def check_planned(face: Any, settings: RunSettings, model_dir: str) -> list[Problem]:
    """The step's settings as the engine's wing plans them (its `check_settings`, against the model's config.json
    in `model_dir`), each problem by its parameter."""
    values = {**settings.training(), "dataset_type": settings.get("data_type", "instruct")}
    try:  # with the data's type: a classifier's or a vision-language model's settings have rules of their own
        face.check_settings(values, model_dir)
    except SettingError as error:
        return [Problem(error.setting, error.problem)]
    log.info("tune_*: the %s engine's settings checked", face.NAME)
    return []


#: What evaluate holds on its GPU beside the weights: the batch's activations and KV cache, CUDA's own context.
EVAL_HEADROOM_GIB = 6.0
DEFAULT_GPU_GIB = 80.0


def check_evaluation_fits(settings: RunSettings, model: ModelDir, model_uri: str) -> list[Problem]:
    """Evaluate builds the whole model on one GPU (placement.py) in the training dtype (bf16): a model whose
    weights do not fit one GPU would fail after training. Refused here, on a cluster where evaluate gets a GPU."""
    try:
        _, eval_gpus = (int(n) for n in gpu_counts(settings.gpus_per_node, settings.get("eval_gpus", -1)))
    except SettingError:
        return []  # check_hardware names it
    if settings.backend != "trainjob" or eval_gpus == 0 or settings.get("eval_device", "auto") == "cpu":
        return []
    gpu_gib = _unset_number(settings.get("tune_gpu_memory_gib", -1.0)) or DEFAULT_GPU_GIB
    weights_gib = model.num_parameters * 2 / 2**30
    if weights_gib + EVAL_HEADROOM_GIB <= gpu_gib:
        return []
    return [Problem("eval_gpus", f"evaluate loads the whole model on one GPU: {model_uri} has "
                                 f"{model.num_parameters / 1e9:.1f}B parameters, {weights_gib:.0f} GiB in bf16 plus "
                                 f"~{EVAL_HEADROOM_GIB:.0f} GiB for its batch, more than one {gpu_gib:.0f} GiB GPU "
                                 "(tune_gpu_memory_gib), so the run would fail after training. Evaluation across "
                                 "GPUs is not supported yet: fine-tune this model with the torchtune-finetune and "
                                 "export components alone, or a model that fits one GPU")]  # fmt: skip


def check_layout_proven(model: ModelDir, model_uri: str) -> list[Problem]:
    """Every config.json field that changes the math is of a kind a parity case of the model's family proves equal
    to transformers (parity_cases; the fine-tune's node pods measure the exact layout before training)."""
    from kfp_finetune.components._shared.torchtune.parity_cases import unproven

    raw = json.loads((model.path / "config.json").read_text())  # model.hf_config may carry a position limit
    found = unproven(model.family, raw)
    if not found:
        return []
    fields = "; ".join(flag.line() for flag in found)
    return [Problem("model_uri", f"{model_uri}: config.json has {fields}, which no parity case of the "
                                 f"{model.family.name} family proves computes what transformers computes "
                                 "(docs/families.md lists the proven layouts): choose a model of a proven layout, "
                                 "or measure this one with `kfp-finetune check-model --model-dir <its folder>` and "
                                 "add its case to components/_shared/torchtune/parity_cases.py")]  # fmt: skip


def _unset_number(value: float) -> float | None:
    return None if value == unset.UNSET_NUMBER else value


def _hf_config(path: Path) -> dict:
    """config.json as a dict; a file that is not a JSON object is the model inspection's to refuse, by name."""
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}
