"""The parameter table (pipelines/parameters.py) against what it generates and what it feeds."""

import inspect
from pathlib import Path

import pytest

from kfp_finetune.components.dataset_initialize.component import dataset_initialize
from kfp_finetune.components.evaluate.component import evaluate
from kfp_finetune.components.export.component import export
from kfp_finetune.components.gpu_counts.component import gpu_counts
from kfp_finetune.components.model_initialize.component import model_initialize
from kfp_finetune.components.preflight.component import preflight
from kfp_finetune.components.quality_gate.component import quality_gate
from kfp_finetune.components.register_model.component import register_model
from kfp_finetune.components.sweep.component import select_best, sweep_grid
from kfp_finetune.components.torchtune_finetune.component import torchtune_finetune
from kfp_finetune.pipelines import PIPELINES, parameters
from kfp_finetune.pipelines.parameters import PARAMETERS, REQUIRED, TABLE

COMPONENTS = {
    c.python_func.__name__: c
    for c in (dataset_initialize, evaluate, gpu_counts, export, model_initialize, preflight, quality_gate,
              register_model, select_best, sweep_grid, torchtune_finetune)
}  # fmt: skip

# Where the pipeline's default differs from the component's on purpose: (component.argument) -> why.
DIFFERENT_DEFAULTS = {
    "torchtune_finetune.task_name": "a pipeline names its fine-tune after the tune; the component after itself",
    "evaluate.task_name": "evaluate's folder is named after the fine-tune it checks",
    "quality_gate.gate_metric": "only the log line of the gate uses it",
}

REQUIRED_PARAMETERS = {"model_uri", "data_uri", "export_destination", "base_model", "train_data", "eval_data"}


def feeds():
    for p in TABLE:
        for target in p.feeds:
            component, _, argument = target.partition(".")
            yield pytest.param(p, component, argument, id=f"{p.name}->{target}")


@pytest.mark.parametrize("parameter,component,argument", list(feeds()))
def test_each_parameter_feeds_a_real_component_argument_of_the_same_type_and_default(
    parameter, component, argument
):
    assert component in COMPONENTS, f"{parameter.name} feeds unknown component {component}"
    signature = inspect.signature(COMPONENTS[component].python_func)
    assert argument in signature.parameters, (
        f"{component} has no argument {argument} (fed by {parameter.name})"
    )
    target = signature.parameters[argument]
    assert target.annotation == parameter.type, (
        f"{parameter.name} is {parameter.type}, {component}.{argument} is {target.annotation}"
    )
    # A required pipeline parameter always passes a value: the component's own default is never used.
    if (
        f"{component}.{argument}" not in DIFFERENT_DEFAULTS
        and target.default is not inspect.Parameter.empty
        and parameter.default is not REQUIRED
    ):
        assert target.default == parameter.default, (
            f"{parameter.name} defaults to {parameter.default!r}, {component}.{argument} to {target.default!r}"
        )


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_pipeline_signature_and_ui_text_are_the_table(name):
    spec = PIPELINES[name].component_spec
    inputs = spec.inputs or {}
    assert inputs, name
    for key, input_spec in inputs.items():
        row = PARAMETERS[key]
        assert input_spec.description == row.doc, key
        assert (row.default is REQUIRED) == (key in REQUIRED_PARAMETERS), key
        if row.default is not REQUIRED:
            assert input_spec.default == row.default, key
    python_signature = inspect.signature(PIPELINES[name].pipeline_func)
    for key, parameter in python_signature.parameters.items():
        assert parameter.annotation == PARAMETERS[key].type, key


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_every_pipeline_parameter_reaches_a_step(name):
    """A parameter the table gives a pipeline but its body never passes on would be a knob that does nothing."""
    text = (Path(__file__).parents[2] / "compiled" / f"{name}.yaml").read_text()
    for key in PIPELINES[name].component_spec.inputs:
        assert (
            f"componentInputParameter: {key}\n" in text
            or f"componentInputArtifact: {key}\n" in text
            or (f"pipelinechannel--{key}" in text)
        ), f"{name}: {key} is not passed to any step"


def test_each_parameter_has_one_line_of_ui_text_and_a_stage():
    for p in TABLE:
        assert p.doc and p.doc.endswith((".", ")")) and "\n" not in p.doc, p.name
        assert p.group in (*parameters.GROUPS, "access", "artifacts"), p.name


def test_shared_parameters_are_declared_once():
    """The four pipelines share their parameters: the tune_ and eval_ knobs of the finetune pipeline are the sweep's
    too (except the two it sweeps and the per-trial run name)."""
    finetune = set(PIPELINES["finetune-pipeline"].component_spec.inputs)
    sweep = set(PIPELINES["sweep-pipeline"].component_spec.inputs)
    assert finetune - sweep == {"tune_learning_rate", "tune_lora_rank"}
    assert set(PIPELINES["prepare-inputs"].component_spec.inputs) <= finetune


def test_docs_parameter_table_is_current():
    path = Path(__file__).parents[2] / "docs" / "parameters.md"
    assert path.read_text() == parameters.markdown(), (
        "docs/parameters.md is stale: python -m kfp_finetune.pipelines.parameters > docs/parameters.md"
    )


# KEP-2401's fields (kubeflow/sdk kubeflow/trainer/types/types.py: TorchTuneConfig, LoraConfig,
# TorchTuneInstructDataset) and the finetune-pipeline parameter that sets each.
KEP_2401 = {
    "TorchTuneConfig.dtype": "tune_dtype",
    "TorchTuneConfig.batch_size": "tune_batch_size",
    "TorchTuneConfig.epochs": "tune_epochs",
    "TorchTuneConfig.loss": "tune_loss",
    "TorchTuneConfig.num_nodes": "tune_num_nodes",
    "TorchTuneConfig.resources_per_node": "tune_gpus_per_node",
    "LoraConfig.apply_lora_to_mlp": "tune_apply_lora_to_mlp",
    "LoraConfig.apply_lora_to_output": "tune_apply_lora_to_output",
    "LoraConfig.lora_attn_modules": "tune_lora_attn_modules",
    "LoraConfig.lora_rank": "tune_lora_rank",
    "LoraConfig.lora_alpha": "tune_lora_alpha",
    "LoraConfig.lora_dropout": "tune_lora_dropout",
    "LoraConfig.quantize_base": "tune_method",  # qlora
    "LoraConfig.use_dora": "tune_method",  # dora
    "TorchTuneInstructDataset.source": "data_uri",
    "TorchTuneInstructDataset.split": "data_train_split",
    "TorchTuneInstructDataset.train_on_input": "tune_train_on_input",
    "TorchTuneInstructDataset.new_system_prompt": "tune_new_system_prompt",
    "TorchTuneInstructDataset.column_map": "data_column_map",
}
# torchtune-finetune settings no pipeline parameter feeds, and why.
NOT_PIPELINE_PARAMETERS = {
    "column_map": "dataset-initialize already renames the columns (data_column_map)",
    "dataset_type": "read from the train_data artifact dataset-initialize wrote (data_type)",
    "save_adapter_weights_only": "adapter runs save only the adapter; export and evaluate merge it after training",
}


@pytest.mark.parametrize("name", ["finetune-pipeline", "sweep-pipeline"])
def test_every_kep_2401_field_is_a_typed_pipeline_parameter(name):
    inputs = PIPELINES[name].component_spec.inputs
    swept = {"tune_lora_rank": "sweep_lora_ranks"} if name == "sweep-pipeline" else {}
    missing = {f: p for f, p in KEP_2401.items() if swept.get(p, p) not in inputs}
    assert not missing, f"{name} lacks {missing}"


def test_every_torchtune_setting_of_the_component_is_a_pipeline_parameter():
    from kfp_finetune.components.torchtune_finetune.finetune import _STEP_PARAMETERS

    fed = {
        target.split(".")[1] for p in TABLE for target in p.feeds if target.startswith("torchtune_finetune.")
    }
    settings = set(inspect.signature(torchtune_finetune.python_func).parameters) - _STEP_PARAMETERS
    assert settings - fed == set(NOT_PIPELINE_PARAMETERS)
