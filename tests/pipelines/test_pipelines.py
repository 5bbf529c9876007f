"""The pipelines: golden YAML current, reloadable and nestable, carrying their platform config; and whole DAGs
run end to end under kfp.local on the tiny model (local backend, and the trainjob backend through the Kubernetes
API stand-in's execute mode)."""

# No `from __future__ import annotations`: KFP reads pipeline signatures' annotations as types.

import html
import os
import sys
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl, local
from kfp.components import load_component_from_file

from kfp_finetune.commands.compile import stale_files
from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.gpus import gpu_counts
from kfp_finetune.components._shared.tracking import CREDENTIAL_KEYS
from kfp_finetune.components.torchtune_finetune import finetune
from kfp_finetune.pipelines import PIPELINES, finetune_pipeline, settings, sweep_pipeline
from tests.support import kfp_driver
from tests.support import kube_standin as standin

ROOT = Path(__file__).resolve().parents[2]
COMPILED = ROOT / "compiled"
kube_standin = standin.kube_standin


@pytest.mark.slow
def test_compiled_yaml_is_current():
    assert stale_files(COMPILED) == []


# The pre-flight step gets the export's volumes: a local destination is checked where the export writes it.
CACHE_STEPS = {
    "exec-preflight",
    "exec-model-initialize",
    "exec-torchtune-finetune",
    "exec-evaluate",
    "exec-export",
}


def _compile(out: Path, **env) -> dict[str, list[dict]]:
    """Compile in a child process: the settings are read from the environment when the modules are imported."""
    import subprocess

    env = {k: v for k, v in os.environ.items() if not k.startswith("KFP_FINETUNE_MODEL_CACHE")} | env
    subprocess.run(
        [sys.executable, "-m", "kfp_finetune.cli", "compile", "--output", str(out)],
        env=env,
        check=True,
        cwd=ROOT,
    )
    return {
        name: list(yaml.safe_load_all((out / f"{name}.yaml").read_text()))
        for name in ("finetune-pipeline", "sweep-pipeline")
    }


@pytest.mark.parametrize("pvc", ["", "shared-model-cache"])
@pytest.mark.slow
def test_model_cache_pvc_is_mounted_on_the_steps_that_read_the_base_model(tmp_path, pvc):
    """KFP_FINETUNE_MODEL_CACHE_PVC at compile time: the PVC is mounted on model-initialize, fine-tune (whose
    volumes reach the TrainJob's node pods), evaluate and export, and its mount path is model_cache_path's
    default; unset: no mount and no cache."""
    for name, docs in _compile(tmp_path, **({"KFP_FINETUNE_MODEL_CACHE_PVC": pvc} if pvc else {})).items():
        spec, platform = docs[0], (docs[1] if len(docs) > 1 else {})
        default = spec["root"]["inputDefinitions"]["parameters"]["model_cache_path"].get("defaultValue", "")
        executors = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {})["executors"]
        mounted = {
            executor
            for executor, config in executors.items()
            for mount in config.get("pvcMount", [])
            if mount.get("constant") == pvc and mount["mountPath"] == "/kfp-finetune/model-cache"
        }
        if pvc:
            assert default == "/kfp-finetune/model-cache", name
            assert mounted == CACHE_STEPS, name
        else:
            assert default == "", name
            assert not any(config.get("pvcMount") for config in executors.values()), name


def _argument_for(spec_type: str):
    return {
        "STRING": "x",
        "NUMBER_INTEGER": 1,
        "NUMBER_DOUBLE": 0.5,
        "BOOLEAN": True,
        "LIST": [],
        "STRUCT": {},
    }[spec_type]


@pytest.mark.parametrize("name", sorted(PIPELINES))
@pytest.mark.slow
def test_compiled_pipeline_reloads_and_nests_in_a_larger_pipeline(name, tmp_path):
    reloaded = load_component_from_file(str(COMPILED / f"{name}.yaml"))
    spec = next(yaml.safe_load_all((COMPILED / f"{name}.yaml").read_text()))
    inputs = spec["root"].get("inputDefinitions", {})
    required = {
        key: _argument_for(p["parameterType"])
        for key, p in inputs.get("parameters", {}).items()
        if not p.get("isOptional")
    }
    artifacts = inputs.get("artifacts", {})

    @dsl.pipeline(name="outer", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")))
    def outer():
        upstream = {
            key: dsl.importer(
                artifact_uri=f"s3://bucket/{key}",
                artifact_class=dsl.Model if "Model" in a["artifactType"]["schemaTitle"] else dsl.Dataset,
            ).output
            for key, a in artifacts.items()
        }
        reloaded(**required, **upstream).set_display_name(f"nested {name}")

    target = tmp_path / "outer.yaml"
    compiler.Compiler().compile(outer, str(target))
    outer_spec = next(yaml.safe_load_all(target.read_text()))
    nested = set(spec["components"]) & set(outer_spec["components"])
    assert nested, f"{name}'s components are not in the outer pipeline"


def test_compiled_finetune_pipeline_carries_secrets_timeouts_and_workspace():
    spec, platform = yaml.safe_load_all((COMPILED / "finetune-pipeline.yaml").read_text())
    kubernetes = platform["platforms"]["kubernetes"]
    assert kubernetes["pipelineConfig"]["workspace"]["size"] == "100Gi"
    executors = kubernetes["deploymentSpec"]["executors"]
    assert all(int(e["activeDeadlineSeconds"]) > 0 for e in executors.values())
    for step in ("exec-model-initialize", "exec-dataset-initialize", "exec-export"):
        secrets = executors[step]["secretAsEnv"]
        names = [s["secretNameParameter"]["componentInputParameter"] for s in secrets]
        assert [n.removeprefix("pipelinechannel--") for n in names] == ["hf_token_secret", "s3_secret"]
        assert all(s["optional"] for s in secrets)
        assert {"secretKey": "HF_TOKEN", "envVar": "HF_TOKEN"} in secrets[0]["keyToEnv"]
    # The fine-tune and evaluate steps log to MLflow with its Secret only (the node pods get none of it: the
    # TrainJob manifest leaves the MLflow credentials out).
    for step in ("exec-torchtune-finetune", "exec-evaluate"):
        (secret,) = executors[step]["secretAsEnv"]
        assert secret["secretNameParameter"]["componentInputParameter"].endswith("mlflow_secret")
        assert {k["envVar"] for k in secret["keyToEnv"]} == set(CREDENTIAL_KEYS) and secret["optional"]
    inputs = spec["root"]["inputDefinitions"]["parameters"]
    required = sorted(k for k, p in inputs.items() if not p.get("isOptional"))
    assert required == ["data_uri", "export_destination", "model_uri"], (
        "a recurring run needs only the essentials"
    )
    assert all(p.get("description") for p in inputs.values()), "every parameter is documented for the UI"


def test_dataset_initialize_asks_for_the_cpus_it_tokenizes_with():
    """Its processes follow the pod's CPU limit (_shared/cpus.py): without one it would get a single process'
    worth of CPU on a busy node, or count every CPU of an idle one."""
    expected = {
        "resourceCpuRequest": settings.DATASET_CPUS,
        "resourceCpuLimit": settings.DATASET_CPUS,
        "resourceMemoryRequest": settings.DATASET_MEMORY,
    }
    for name in ("finetune-pipeline", "sweep-pipeline", "prepare-inputs"):
        spec, _ = yaml.safe_load_all((COMPILED / f"{name}.yaml").read_text())
        resources = spec["deploymentSpec"]["executors"]["exec-dataset-initialize"]["container"]["resources"]
        assert {k: resources.get(k) for k in (*expected, "resourceMemoryLimit")} == {
            **expected,
            "resourceMemoryLimit": None,
        }, name


@pytest.mark.slow
def test_every_parameterised_resource_field_is_fed_text_as_the_kfp_driver_reads_it():
    """The driver reads a parameterised resource field as a string (kfp_driver.py): fed an integer, the step
    would silently get no GPU limit — on a real cluster the TrainJob would train on CPU."""
    for compiled in sorted(COMPILED.glob("*.yaml")):
        spec, _ = yaml.safe_load_all(compiled.read_text())
        sources = kfp_driver.placeholder_sources(spec)
        wrong = [s for s in sources if s.parameter_type != "STRING"]
        assert not wrong, f"{compiled.name}: {wrong}"
        if compiled.name == "tune-and-evaluate.yaml":
            assert {(s.task, s.source) for s in sources} == {
                ("torchtune-finetune", "output tune_gpus of gpu-counts"),
                ("evaluate", "output eval_gpus of gpu-counts"),
                ("evaluate", "output model_image of torchtune-finetune"),
            }


@pytest.mark.parametrize(("tune_gpus", "eval_gpus", "limits"), [(1, -1, ("1", "1")), (8, -1, ("8", "1")),
                                                                 (0, -1, ("0", "0")), (4, 0, ("4", "0"))])  # fmt: skip
def test_both_steps_get_their_gpus_from_the_gpu_counts_step_as_the_driver_resolves_them(
    tune_gpus, eval_gpus, limits
):
    """eval_gpus -1 (the default): one GPU for evaluation when the fine-tune uses GPUs. The values are resolved
    from the compiled YAML the way the driver does, with gpu-counts' own code producing the outputs."""
    spec, _ = yaml.safe_load_all((COMPILED / "tune-and-evaluate.yaml").read_text())
    root = spec["root"]
    assert root["inputDefinitions"]["parameters"]["eval_gpus"]["defaultValue"] == -1
    tasks = root["dag"]["tasks"]
    inputs = tasks["gpu-counts"]["inputs"]["parameters"]
    assert {k: v["componentInputParameter"] for k, v in inputs.items()} == {
        "eval_gpus": "eval_gpus", "tune_gpus_per_node": "tune_gpus_per_node"}  # fmt: skip
    arguments = {"tune_gpus_per_node": tune_gpus, "eval_gpus": eval_gpus}
    outputs = dict(zip(("tune_gpus", "eval_gpus"), gpu_counts(tune_gpus, eval_gpus), strict=True))
    fed = {
        **{f"dag input {k}": v for k, v in arguments.items()},
        **{f"output {k} of gpu-counts": v for k, v in outputs.items()},
    }
    executors = spec["deploymentSpec"]["executors"]
    for task, limit in zip(("torchtune-finetune", "evaluate"), limits, strict=True):
        assert "gpu-counts" in tasks[task]["dependentTasks"], "a resource field adds no dependency by itself"
        values = {
            s.input_name: s.runtime_value(fed[s.source])
            for s in kfp_driver.placeholder_sources(spec)
            if s.task == task and s.field != "image"
        }
        resources = executors[f"exec-{task}"]["container"]["resources"]
        assert kfp_driver.accelerator_limits(resources, values) == {"nvidia.com/gpu": limit}


@pytest.mark.parametrize("engine", sorted(engines.WINGS))
@pytest.mark.parametrize("trainer_image", ["", "registry.example/own-trainer:2"])
def test_evaluate_runs_on_the_image_of_the_engine_that_trained_the_model(engine, trainer_image):
    """The engine is chosen at run time (tune_engine auto), and only its image builds the eval rows and loads the
    model as training did: the transformers engine's evaluation needs TRL and transformers 5, which the torchtune
    trainer image (lm-eval's transformers 4) lacks. The image is resolved from the compiled YAML as the driver
    does, fed the fine-tune step's own model_image for the engine images the pipeline was compiled with."""
    spec, _ = yaml.safe_load_all((COMPILED / "tune-and-evaluate.yaml").read_text())
    tasks = spec["root"]["dag"]["tasks"]
    compiled_images = tasks["torchtune-finetune"]["inputs"]["parameters"]["engine_images"]["runtimeValue"]
    assert compiled_images["constant"] == engines.trainer_images()
    params = {"engine_images": compiled_images["constant"], "trainer_image": trainer_image}
    produced = finetune.model_image(params, finetune.engine_images(params), engine)
    (source,) = [
        s for s in kfp_driver.placeholder_sources(spec) if (s.task, s.field) == ("evaluate", "image")
    ]
    assert source.source == "output model_image of torchtune-finetune"
    container = spec["deploymentSpec"]["executors"]["exec-evaluate"]["container"]
    image = kfp_driver.resolve_field(container["image"], {source.input_name: source.runtime_value(produced)})
    assert image == (trainer_image or engines.face(engine).TRAINER_IMAGE)
    assert "torchtune-finetune" in tasks["evaluate"]["dependentTasks"]


@pytest.mark.parametrize(
    ("pipeline", "producer"), [("finetune-pipeline", "tune-and-evaluate"), ("sweep-pipeline", "select-best")]
)
def test_export_runs_on_the_image_that_trained_the_model(pipeline, producer):
    """The export merges an adapter and converts weights with the packages that saved them: a transformers-engine
    model on the torchtune trainer image would meet transformers 4 and no TRL. The image is the fine-tune step's
    model_image, for a sweep the best trial's (select-best's), fed into the gate's branch as the driver reads it."""
    spec, _ = yaml.safe_load_all((COMPILED / f"{pipeline}.yaml").read_text())
    (source,) = [s for s in kfp_driver.placeholder_sources(spec) if (s.task, s.field) == ("export", "image")]
    assert kfp_driver.origin(spec, source) == f"output model_image of {producer}"
    assert source.parameter_type == "STRING"
    container = spec["deploymentSpec"]["executors"]["exec-export"]["container"]
    image = kfp_driver.resolve_field(container["image"], {source.input_name: "registry.example/trainer:2"})
    assert image == "registry.example/trainer:2"


# --- whole DAGs under kfp.local ------------------------------------------------------------------------------

FAST_TRAINING = {
    "tune_backend": "local", "tune_device": "cpu", "tune_gpus_per_node": 0, "tune_batch_size": 8,
    "tune_max_steps_per_epoch": 12, "tune_learning_rate": 3e-3, "tune_seed": 0,
    "eval_max_samples": 12, "eval_max_new_tokens": 10, "eval_device": "cpu", "data_eval_fraction": 0.02,
}  # fmt: skip


def run_locally(tmp_path, pipeline, **arguments):
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(tmp_path / "pipeline_root"),
        workspace_root=str(tmp_path / "workspace"),
    )
    return pipeline(**arguments)


# The whole DAG as a cluster runs it: training in a TrainJob the stand-in executes. The local backend goes through
# the whole DAG for every family and data shape (test_families_and_data_shapes_pipeline.py), and the gate's other
# way, a model that fails it kept by run-local and not exported, in tests/pipelines/test_ecosystem_pipeline.py.
@pytest.mark.slow
def test_finetune_pipeline_end_to_end_with_the_trainjob_backend_exports_when_the_gate_passes(
    kube_standin, tiny_llama, tiny_dataset, tmp_path, monkeypatch
):
    kube = kube_standin
    kube.add_object(yaml.safe_load((ROOT / "runtimes" / "torchtune-cpu.yaml").read_text()))
    workspace_pvc = "run-kfp-workspace"
    kube.add_claim(workspace_pvc, "ReadWriteMany")
    kube.execute(
        {workspace_pvc: tmp_path / "workspace"},
        extra_env={"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
    )
    monkeypatch.setenv("KUBECONFIG", str(kube.kubeconfig_path))  # inherited by the step subprocesses
    destination = tmp_path / "exported"
    task = run_locally(
        tmp_path, finetune_pipeline, model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]),
        export_destination=str(destination),
        **{**FAST_TRAINING, "tune_backend": "trainjob", "tune_runtime": "torchtune-cpu",
           "tune_workspace_pvc": workspace_pvc},
        # Typed torchtune settings (not tune_overrides), with 0 as a real value and an on/off switch as text.
        tune_weight_decay=0.0, tune_lora_dropout=0.0, tune_train_on_input="false", tune_dtype="fp32",
    )  # fmt: skip
    created = kube.requests_for("POST", "trainjobs")
    assert len(created) == 1
    spec = created[0].body["spec"]
    assert spec["runtimeRef"]["name"] == "torchtune-cpu"
    # The entrypoint runs torch's checks first in the node pod, then `tune run` (the launcher imports no torch).
    assert spec["trainer"]["command"][:8] == [
        "python", "-m", "kfp_finetune.components.torchtune_finetune.entrypoint", "--engine", "torchtune",
        "tune", "run", "kfp_finetune/components/torchtune_finetune/recipe.py",
    ]  # fmt: skip
    outputs = task.outputs
    assert outputs["model"].metadata["backend"] == "trainjob"
    assert outputs["passed"] is True
    assert outputs["model_image"] == engines.face("torchtune").TRAINER_IMAGE
    # The resolved torchtune YAML, as the train report shows it (kfp.local deletes the run workspace).
    report = Path(outputs["train_report"].path).read_text()
    config = yaml.safe_load(
        html.unescape(report.split("Resolved torchtune config", 1)[1].split("<pre>")[1].split("</pre>")[0])
    )
    assert (config["optimizer"]["weight_decay"], config["model"]["lora_dropout"]) == (0.0, 0.0)
    assert (config["dataset"]["train_on_input"], config["dtype"]) == (False, "fp32")
    evaluation = outputs["eval_metrics"].metadata
    assert evaluation["tuned_eval_loss"] < evaluation["base_eval_loss"]
    assert outputs["train_metrics"].metadata["steps"] == 12
    assert "<svg" in report
    assert "base" in Path(outputs["eval_report"].path).read_text()
    assert outputs["model"].metadata["recipe"] == "lora_finetune_single_device"
    files = {p.name for p in destination.iterdir()}
    assert {"config.json", "README.md", "checksums.sha256", "model-00001-of-00001.safetensors"} <= files
    assert "adapter_config.json" not in files


@pytest.mark.slow
def test_sweep_pipeline_exports_the_best_trial(tiny_llama, tiny_dataset, tmp_path):
    destination = tmp_path / "exported"
    task = run_locally(
        tmp_path, sweep_pipeline, model_uri=str(tiny_llama), data_uri=str(tiny_dataset["train.jsonl"]),
        export_destination=str(destination), sweep_learning_rates=[1e-6, 3e-3], sweep_lora_ranks=[8],
        sweep_metric="eval_loss",
        **{k: v for k, v in FAST_TRAINING.items() if k != "tune_learning_rate"},
    )  # fmt: skip
    best = task.outputs["best_model"].metadata
    assert best["sweep_trial"] == 1, "lr 3e-3 learns in 12 steps, lr 1e-6 does not"
    assert "trial-lr0p003-r8" in best["run_dir"]
    assert (
        task.outputs["best_eval_metrics"].metadata["tuned_eval_loss"]
        < task.outputs["best_eval_metrics"].metadata["base_eval_loss"]
    )
    assert task.outputs["passed"] is True and (destination / "config.json").is_file()
    assert best["model_image"] == engines.face("torchtune").TRAINER_IMAGE, "the image its export runs on"


@pytest.mark.parametrize("pipeline", [finetune_pipeline, sweep_pipeline], ids=lambda p: p.name)
def test_the_fine_tune_step_learns_the_pipelines_export_format(pipeline, tmp_path):
    """So that an adapter-only checkpoint the export could not publish is refused before training."""
    target = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(target))
    spec = next(yaml.safe_load_all(target.read_text()))
    wiring = {
        name: task["inputs"]["parameters"].get("export_format")
        for dag in [spec["root"], *spec["components"].values()]
        for name, task in (dag.get("dag") or {}).get("tasks", {}).items()
        if name in ("tune-and-evaluate", "torchtune-finetune")
    }
    assert wiring["torchtune-finetune"] == {"componentInputParameter": "export_format"}
    assert (
        wiring["tune-and-evaluate"]["componentInputParameter"].removeprefix("pipelinechannel--")
        == "export_format"
    )


def _root_parameter(spec: dict, component: str, parameter: str) -> str | None:
    """The pipeline parameter a component's input comes from, followed up through the DAGs that call it."""
    if component == "root":
        return parameter.removeprefix("pipelinechannel--")
    for caller, dag in [("root", spec["root"]), *spec["components"].items()]:
        for task in (dag.get("dag") or {}).get("tasks", {}).values():
            fed = task["inputs"].get("parameters", {}).get(parameter, {}) if "inputs" in task else {}
            if task["componentRef"]["name"] == component and "componentInputParameter" in fed:
                return _root_parameter(spec, caller, fed["componentInputParameter"])
    return None


@pytest.mark.parametrize("pipeline", [finetune_pipeline, sweep_pipeline], ids=lambda p: p.name)
def test_one_parameter_gives_the_packs_and_the_fine_tune_the_same_masking(pipeline, tmp_path):
    """dataset-initialize packs with the max_seq_len, train_on_input and new_system_prompt the fine-tune trains
    with, so that the fine-tune step can use its packs (else it packs again on every rank)."""
    target = tmp_path / "pipeline.yaml"
    compiler.Compiler().compile(pipeline, str(target))
    spec = next(yaml.safe_load_all(target.read_text()))
    for argument in ("max_seq_len", "train_on_input", "new_system_prompt"):
        sources = {}
        for caller, dag in [("root", spec["root"]), *spec["components"].items()]:
            for name, task in (dag.get("dag") or {}).get("tasks", {}).items():
                if name in ("dataset-initialize", "torchtune-finetune"):
                    fed = task["inputs"]["parameters"].get(argument, {}).get("componentInputParameter")
                    sources[name] = fed and _root_parameter(spec, caller, fed)
        assert sources == {"dataset-initialize": f"tune_{argument}", "torchtune-finetune": f"tune_{argument}"}
