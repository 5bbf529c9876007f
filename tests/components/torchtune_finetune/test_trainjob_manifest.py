"""The TrainJob manifest: names, where every input lands, CRD/typed-model validity, TaskConfig translation."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from kfp_finetune.components._shared.torchtune.resolve import ResolvedRun
from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.warm_start import COMPILE_CACHE_ENV
from tests.deploy.test_runtimes import RUNTIMES, manifest_errors
from tests.support.kube_standin import KubeStandin, expand_kube_vars

RUN_ID = "8d5c1e0a-4a1b-4c55-9a3e-0f6b2d1c7e42"
TASK = "torchtune-finetune"
CONFIG = "/kfp-workspace/runs/r1/config.yaml"


def node_patch(manifest: dict) -> dict:
    (patch,) = manifest["spec"]["runtimePatches"]
    assert patch["manager"] == tj.PATCH_MANAGER
    (job,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert job["name"] == "node"
    return job["template"]["spec"]["template"]


def full_pod_settings() -> tj.NodePodSettings:
    volume, mount = tj.workspace_volume("run-x-kfp-workspace")
    return tj.NodePodSettings(
        resources={"limits": {"nvidia.com/gpu": 4, "memory": "64Gi"}, "requests": {"cpu": "16"}},
        env=[
            {"name": "HF_HUB_OFFLINE", "value": "1"},
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}},
        ],
        volumes=[volume, {"name": "cache", "emptyDir": {}}],
        volume_mounts=[mount, {"name": "cache", "mountPath": "/cache"}],
        node_selector={"cloud.google.com/gke-accelerator": "nvidia-l4"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        service_account_name="trainer",
        image_pull_secrets=["regcred"],
    )


def full_manifest() -> dict:
    name = tj.trainjob_name(RUN_ID, TASK)
    return tj.build_trainjob(
        name,
        ["tune", "run", *tj.torchrun_args(name), "lora_finetune_distributed", "--config", CONFIG],
        namespace="team-a",
        runtime="torchtune",
        image="registry.example/trainer:1",
        num_nodes=2,
        num_proc_per_node=4,
        pod=full_pod_settings(),
        active_deadline_seconds=7200,
        run_id=RUN_ID,
        task_name=TASK,
        labels={"team": "nlp"},
        annotations={"note": "nightly"},
    )


# --- names -----------------------------------------------------------------------------------------------------


def test_name_is_deterministic_readable_and_unique_per_run_and_task():
    name = tj.trainjob_name(RUN_ID, TASK)
    assert name == tj.trainjob_name(RUN_ID, TASK)
    assert name.startswith("torchtune-finetune-8d5c1e0a-")
    assert len({name, tj.trainjob_name(RUN_ID, "other"), tj.trainjob_name("other-run", TASK)}) == 3
    # Same readable parts, different full values: the hash keeps them apart.
    long_task = "x" * 30
    assert tj.trainjob_name(RUN_ID, long_task + "a") != tj.trainjob_name(RUN_ID, long_task + "b")


@pytest.mark.parametrize(
    "run_id, task",
    [
        (RUN_ID, TASK),
        ("123", "0-starts-with-digit"),
        ("Run_ID.With/Odd:Chars", "Täsk Ñame!!"),
        ("r" * 200, "t" * 200),
        ("---", "___"),
    ],
)
def test_name_is_a_short_rfc1035_label(run_id, task):
    name = tj.trainjob_name(run_id, task)
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    # JobSet's longest pod name `<name>-node-0-<idx>-xxxxx` must stay within 63 characters.
    assert len(f"{name}-node-0-999-abcde") <= 63


def test_name_needs_run_and_task():
    with pytest.raises(ValueError, match="run id and the task name"):
        tj.trainjob_name("", TASK)


@pytest.mark.parametrize("bad", ["Upper", "1abc", "has_underscore", "ends-", "a" * 47, ""])
def test_invalid_explicit_names_are_refused(bad):
    with pytest.raises(ValueError, match="TrainJob name"):
        tj.validate_name(bad)


def test_label_values_are_valid_and_distinct():
    for text in ["simple", "with spaces and / slashes", "x" * 100, "-leading"]:
        value = tj.label_value(text)
        assert len(value) <= 63 and re.fullmatch(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?", value)
    assert tj.label_value("x" * 100 + "a") != tj.label_value("x" * 100 + "b")
    assert tj.label_value("simple") == "simple"


# --- every input lands in the right field -----------------------------------------------------------------------


def test_every_input_lands_in_its_field():
    manifest = full_manifest()
    name = manifest["metadata"]["name"]
    assert manifest["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and manifest["kind"] == "TrainJob"
    meta = manifest["metadata"]
    assert meta["namespace"] == "team-a"
    assert meta["labels"] == {
        "team": "nlp",
        tj.LABEL_MANAGED_BY: "kfp-finetune",
        tj.LABEL_RUN_ID: RUN_ID,
        tj.LABEL_TASK: TASK,
    }
    assert meta["annotations"] == {"note": "nightly", tj.ANNOTATION_RUN_ID: RUN_ID, tj.ANNOTATION_TASK: TASK}

    spec = manifest["spec"]
    assert spec["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "ClusterTrainingRuntime",
        "name": "torchtune",
    }
    assert spec["activeDeadlineSeconds"] == 7200
    trainer = spec["trainer"]
    assert trainer["image"] == "registry.example/trainer:1"
    assert trainer["command"][:2] == ["tune", "run"] and trainer["command"][-3:] == [
        "lora_finetune_distributed",
        "--config",
        CONFIG,
    ]
    assert "args" not in trainer
    assert trainer["numNodes"] == 2 and trainer["numProcPerNode"] == 4
    assert trainer["resourcesPerNode"] == {
        "limits": {"nvidia.com/gpu": "4", "memory": "64Gi"},
        "requests": {"cpu": "16"},
    }
    assert trainer["env"] == full_pod_settings().env

    template = node_patch(manifest)
    assert template["metadata"]["labels"] == {tj.LABEL_RUN_ID: RUN_ID, tj.LABEL_TASK: TASK}
    pod = template["spec"]
    settings = full_pod_settings()
    assert pod["volumes"] == settings.volumes
    # Env is never patched onto the node container (the Trainer rejects that); only mounts are.
    assert pod["containers"] == [{"name": "node", "volumeMounts": settings.volume_mounts}]
    assert pod["nodeSelector"] == settings.node_selector
    assert pod["tolerations"] == settings.tolerations
    assert pod["affinity"] == settings.affinity
    assert pod["serviceAccountName"] == "trainer"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert name in trainer["command"]  # rdzv id


def test_minimal_manifest_has_no_empty_parts():
    manifest = tj.build_trainjob("job-a", ["tune", "run", "lora_finetune_single_device", "--config", CONFIG])
    assert manifest == {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainJob",
        "metadata": {"name": "job-a"},
        "spec": {
            "runtimeRef": {
                "apiGroup": "trainer.kubeflow.org",
                "kind": "ClusterTrainingRuntime",
                "name": "torchtune",
            },
            "trainer": {
                "command": ["tune", "run", "lora_finetune_single_device", "--config", CONFIG],
                "numNodes": 1,
            },
        },
    }


def test_namespaced_runtime_reference():
    manifest = tj.build_trainjob("job-a", ["python", "x.py"], runtime="mine", runtime_kind="TrainingRuntime")
    assert manifest["spec"]["runtimeRef"]["kind"] == "TrainingRuntime"
    with pytest.raises(ValueError, match="runtime kind"):
        tj.build_trainjob("job-a", ["python", "x.py"], runtime_kind="JobSet")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"command": []}, "needs a command"),
        ({"command": ["tune", "run"]}, "torchtune rewrite"),
        ({"num_nodes": 0}, "num_nodes"),
        ({"num_proc_per_node": 0}, "num_proc_per_node"),
        ({"active_deadline_seconds": 0}, "tune_timeout_seconds"),
    ],
)
def test_bad_inputs_are_refused(kwargs, message):
    arguments = {"command": ["python", "x.py"], **kwargs}
    with pytest.raises(ValueError, match=message):
        tj.build_trainjob("job-a", **arguments)


@pytest.mark.parametrize(
    "env",
    [
        [{"name": "PET_NNODES", "value": "2"}, {"name": "OK", "value": "1"}],
        {"PET_MASTER_ADDR": "x", "PET_NODE_RANK": "0"},
    ],
)
def test_pet_env_is_refused_with_a_clear_message(env):
    with pytest.raises(ValueError, match=r"must not set PET_.*Kubeflow Trainer injects the PET_\* variables"):
        tj.build_trainjob("job-a", ["python", "x.py"], pod=tj.NodePodSettings(env=env))


def test_env_mapping_and_duplicates():
    pod = tj.NodePodSettings(
        env=[{"name": "A", "value": "1"}, {"name": "B", "value": "2"}, {"name": "A", "value": "3"}]
    )
    manifest = tj.build_trainjob("job-a", ["python", "x.py"], pod=pod)
    assert manifest["spec"]["trainer"]["env"] == [{"name": "A", "value": "3"}, {"name": "B", "value": "2"}]
    manifest = tj.build_trainjob("job-a", ["python", "x.py"], pod=tj.NodePodSettings(env={"N": 5}))
    assert manifest["spec"]["trainer"]["env"] == [{"name": "N", "value": "5"}]


# --- validity -------------------------------------------------------------------------------------------------


def test_manifest_validates_against_crd_schema_and_typed_models():
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob

    manifest = full_manifest()
    assert manifest_errors(manifest) == []
    model = TrainerV1alpha1TrainJob.from_dict(manifest)
    assert model.spec.trainer.num_nodes == 2
    assert model.spec.runtime_patches[0].manager == tj.PATCH_MANAGER


def test_the_compile_cache_goes_to_the_model_cache_volume_only_where_the_node_pods_write_it():
    """The model cache PVC (pipelines' KFP_FINETUNE_MODEL_CACHE_PVC) reaches the node pods among the task's volumes;
    the training process is told its compile folder through trainer.env (env may not be patched on `node`)."""
    workspace, workspace_mount = tj.workspace_volume("run-x-kfp-workspace")
    cache = {"name": "model-cache", "persistentVolumeClaim": {"claimName": "kfp-finetune-model-cache"}}
    cache_mount = {"name": "model-cache", "mountPath": "/kfp-finetune/model-cache"}
    resolved = ResolvedRun(
        "lora_finetune_single_device", "c", {}, Path(CONFIG), Path(CONFIG).parent, None, False
    )

    def trainer_env(*mounts: dict) -> dict:
        pod = tj.NodePodSettings(volumes=[workspace, cache], volume_mounts=[workspace_mount, *mounts])
        backend = TrainJobBackend(
            pod=pod,
            run_id=RUN_ID,
            task_name=TASK,
            persistent_compile_root="/kfp-finetune/model-cache/compile",
        )
        manifest = backend.manifest(resolved)
        assert manifest_errors(manifest) == []
        return {item["name"]: item["value"] for item in manifest["spec"]["trainer"].get("env", [])}

    assert trainer_env(cache_mount) == {COMPILE_CACHE_ENV: "/kfp-finetune/model-cache/compile"}
    assert (
        trainer_env() == {}
    )  # not mounted there: the workspace's folder, which the training process finds itself
    assert trainer_env({**cache_mount, "readOnly": True}) == {}


def test_typed_model_check_catches_unknown_and_mistyped_fields():
    manifest = full_manifest()
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["trainer"]["numNode"] = 2
    with pytest.raises(ValueError, match=r"unknown fields spec\.trainer\.numNode"):
        tj.validate_trainjob(broken)
    broken = json.loads(json.dumps(manifest))
    node_patch(broken)["spec"]["tolerations"][0]["tolerationSecond"] = 5
    with pytest.raises(ValueError, match=r"tolerations\[0\]\.tolerationSecond"):
        tj.validate_trainjob(broken)
    broken = json.loads(json.dumps(manifest))
    broken["spec"]["trainer"]["numProcPerNode"] = "auto"
    with pytest.raises(ValueError, match="numProcPerNode"):
        tj.validate_trainjob(broken)


def test_stand_in_accepts_the_manifest_and_builds_node_pods_from_it():
    """The strict stand-in admits it; its pods get the workspace, scheduling and env where the Trainer puts them."""
    manifest = full_manifest()
    with KubeStandin(namespace="team-a") as kube:
        kube.add_object(yaml.safe_load((RUNTIMES / "torchtune.yaml").read_text()))
        kube.scenario(None, stay_pending=True)
        from kubernetes import client

        api = client.CustomObjectsApi(kube.api_client())
        api.create_namespaced_custom_object(
            "trainer.kubeflow.org", "v1alpha1", "team-a", "trainjobs", manifest
        )
        name = manifest["metadata"]["name"]
        kube.wait_for_trainjob(name)
        pods = kube.pods(name)
        assert len(pods) == 2
        pod = pods[0]
        container = next(c for c in pod["spec"]["containers"] if c["name"] == "node")
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert mounts["/kfp-workspace"] == "kfp-workspace" and mounts["/dev/shm"] == "dshm"
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes["kfp-workspace"]["persistentVolumeClaim"]["claimName"] == "run-x-kfp-workspace"
        assert tj.unmounted_paths([CONFIG], container["volumeMounts"]) == []
        assert pod["spec"]["nodeSelector"] == full_pod_settings().node_selector
        assert pod["spec"]["serviceAccountName"] == "trainer"
        assert pod["metadata"]["labels"][tj.LABEL_RUN_ID] == RUN_ID
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env["HF_HUB_OFFLINE"] == "1" and env["PYTHONUNBUFFERED"] == "1"
        assert container["command"] == manifest["spec"]["trainer"]["command"]


# --- the multi-node command ---------------------------------------------------------------------------------------


def test_torchrun_args_use_the_injected_pet_env_and_a_c10d_rendezvous():
    name = "job-a"
    args = tj.torchrun_args(name)
    injected = {  # what the Trainer's torch plugin sets for a non-`tune run` command, 2 nodes x 4 GPUs
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "4",
        "PET_NODE_RANK": "1",
        "PET_MASTER_ADDR": "job-a-node-0-0.job-a",
        "PET_MASTER_PORT": "29500",
    }
    expanded = [expand_kube_vars(a, injected) for a in args]
    assert expanded == [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "4",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        "job-a-node-0-0.job-a:29500",
        "--rdzv_id",
        "job-a",
    ]
    assert tj.rank0_endpoint(name) == "job-a-node-0-0.job-a:29500"
    explicit = tj.torchrun_args(name, rdzv_endpoint=tj.rank0_endpoint(name))
    assert explicit[explicit.index("--rdzv_endpoint") + 1] == "job-a-node-0-0.job-a:29500"


def test_torchrun_flags_parse_as_tune_run_distributed_flags():
    """`tune run` (torchtune 0.6.1) takes these as torchrun flags, so it launches torchrun, not in-process."""
    torch_run = pytest.importorskip("torch.distributed.run")
    parser = torch_run.get_args_parser()
    expanded = [
        expand_kube_vars(
            a,
            {
                "PET_NNODES": "2",
                "PET_NPROC_PER_NODE": "4",
                "PET_MASTER_ADDR": "h",
                "PET_MASTER_PORT": "29500",
            },
        )
        for a in tj.torchrun_args("job-a")
    ]
    args = parser.parse_args([*expanded, "lora_finetune_distributed", "--config", CONFIG])
    assert (args.nnodes, args.nproc_per_node, args.rdzv_backend, args.rdzv_endpoint, args.rdzv_id) == (
        "2",
        "4",
        "c10d",
        "h:29500",
        "job-a",
    )
    assert args.training_script == "lora_finetune_distributed"


# --- KFP TaskConfig -----------------------------------------------------------------------------------------------

# What the KFP 2.17 driver injects (backend/src/v2/driver/driver.go TaskConfig, json.Marshal of Go structs).
DRIVER_TASK_CONFIG = {
    "affinity": None,
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "nodeSelector": {"pool": "gpu"},
    "env": [{"name": "HF_HUB_OFFLINE", "value": "1"}],
    "volumes": [{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "wf-abc-kfp-workspace"}}],
    "volumeMounts": [{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}],
    "resources": {"limits": {"nvidia.com/gpu": "2", "memory": "50G"}, "requests": {"cpu": "4"}},
}


def test_task_config_from_the_driver_json():
    settings = tj.trainjob_spec_from_task_config(DRIVER_TASK_CONFIG)
    assert settings.resources == DRIVER_TASK_CONFIG["resources"]
    assert settings.gpus == 2
    assert settings.env == DRIVER_TASK_CONFIG["env"]
    assert settings.volumes == DRIVER_TASK_CONFIG["volumes"]
    assert settings.volume_mounts == DRIVER_TASK_CONFIG["volumeMounts"]
    assert settings.node_selector == {"pool": "gpu"}
    assert settings.tolerations == DRIVER_TASK_CONFIG["tolerations"]
    assert settings.affinity is None
    manifest = tj.build_trainjob("job-a", ["tune", "run", "x", "--config", CONFIG], pod=settings)
    pod = node_patch(manifest)["spec"]
    # The workspace PVC is mounted in the node pods at the path the KFP pod sees, so the YAML's paths hold.
    assert pod["containers"][0]["volumeMounts"] == [{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}]
    assert tj.unmounted_paths([CONFIG, "/kfp-workspace/models/m"], pod["containers"][0]["volumeMounts"]) == []
    assert manifest_errors(manifest) == []


def test_task_config_from_the_kfp_dataclass_and_empty_parts():
    from kfp import dsl

    config = dsl.TaskConfig(
        resources={"limits": {}, "requests": {}},
        node_selector={"a": "b"},
        volumes=DRIVER_TASK_CONFIG["volumes"],
        volume_mounts=DRIVER_TASK_CONFIG["volumeMounts"],
    )
    settings = tj.trainjob_spec_from_task_config(config)
    assert settings.resources is None and settings.gpus == 0
    assert settings.node_selector == {"a": "b"} and settings.volumes == DRIVER_TASK_CONFIG["volumes"]
    empty = tj.trainjob_spec_from_task_config(dsl.TaskConfig())  # kfp.local: nothing passed through
    assert empty == tj.NodePodSettings()
    assert tj.trainjob_spec_from_task_config(None) == tj.NodePodSettings()
    manifest = tj.build_trainjob("job-a", ["python", "x.py"], pod=empty)
    assert "runtimePatches" not in manifest["spec"]


def test_pet_env_from_the_task_config_is_refused():
    settings = tj.trainjob_spec_from_task_config({"env": [{"name": "PET_NNODES", "value": "4"}]})
    with pytest.raises(ValueError, match="PET_NNODES"):
        tj.build_trainjob("job-a", ["python", "x.py"], pod=settings)


def test_mlflow_credentials_from_the_task_config_stay_out_of_the_node_pods():
    """The step logs to MLflow itself; its Secret's variables reach the step's env (and so the task config's) only."""
    token = {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "mlflow", "key": "t"}}}
    kept = {"name": "NCCL_DEBUG", "value": "WARN"}
    settings = tj.trainjob_spec_from_task_config({"env": [token, kept]})
    assert settings.env == [kept]
    assert "MLFLOW" not in str(tj.build_trainjob("job-a", ["python", "x.py"], pod=settings))


def test_unmounted_paths_are_reported():
    mounts = [{"name": "w", "mountPath": "/kfp-workspace/"}]
    assert tj.unmounted_paths(
        ["/kfp-workspace", "/kfp-workspace/a", "/kfp-workspace2/a", "/tmp/x", "rel"], mounts
    ) == [
        "/kfp-workspace2/a",
        "/tmp/x",
    ]


def test_gpus_per_node_counts_like_the_trainer():
    assert tj.gpus_per_node({"limits": {"nvidia.com/gpu": "2"}}) == 2
    assert tj.gpus_per_node({"requests": {"amd.com/gpu": 1}, "limits": {"amd.com/gpu": 3}}) == 1
    assert tj.gpus_per_node({"limits": {"cpu": "8"}}) == 0
    assert tj.gpus_per_node(None) == 0


# --- `kfp-finetune trainjob --dry-run` -----------------------------------------------------------------------------


def dry_run(*argv: str) -> tuple[dict, str]:
    """The CLI in its own process: its stdout is exactly what `| kubectl apply -f -` would read (in-process,
    threads left by earlier tests could write into the captured stdout)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "kfp_finetune.cli", "trainjob", "--dry-run", *argv],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return yaml.safe_load(done.stdout), done.stderr


# The node pods check the config with torch first (entrypoint.py), then run `tune run` in the same process.
ENTRYPOINT = [
    "python",
    "-m",
    "kfp_finetune.components.torchtune_finetune.entrypoint",
    "--engine",
    "torchtune",
]


@pytest.mark.slow
def test_dry_run_single_device_cpu(tiny_llama, tiny_dataset, tmp_path):
    manifest, notes = dry_run(
        "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]), "--gpus", "0",
        "--workspace", str(tmp_path), "--run-id", RUN_ID, "--task", TASK,
    )  # fmt: skip
    name = tj.trainjob_name(RUN_ID, TASK)
    assert manifest["metadata"]["name"] == name
    assert manifest["spec"]["runtimeRef"]["name"] == "torchtune-cpu"
    # A single-device recipe gets no torchrun flag, so `tune run` stays in-process.
    assert manifest["spec"]["trainer"]["command"] == [
        *ENTRYPOINT, "tune", "run", "kfp_finetune/components/torchtune_finetune/recipe.py", "--config",
        str(tmp_path / "runs" / name / "torchtune_config.yaml"),
    ]  # fmt: skip
    assert "resourcesPerNode" not in manifest["spec"]["trainer"]
    assert manifest_errors(manifest) == [] and tj.validate_trainjob(manifest) is None
    assert "recipe lora_finetune_single_device" in notes
    assert "warning: not on a volume mounted in the node pods" in notes
    assert not (tmp_path / "runs").exists()  # a dry run writes nothing


@pytest.mark.slow
def test_dry_run_names_the_trainjob_as_the_pipeline_task_would(tiny_llama, tiny_dataset, tmp_path):
    manifest, _ = dry_run(
        "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]), "--gpus", "0",
        "--workspace", str(tmp_path), "--run-id", RUN_ID, "--task", TASK, "--task-id", "task-uuid-1",
    )  # fmt: skip
    assert manifest["metadata"]["name"] == tj.trainjob_name(RUN_ID, TASK, "task-uuid-1")
    assert manifest["metadata"]["name"] != tj.trainjob_name(RUN_ID, TASK)


@pytest.mark.slow
def test_dry_run_multi_node_gpus_with_workspace_pvc(tiny_llama, tiny_dataset, tmp_path):
    manifest, notes = dry_run(
        "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]), "--gpus", "4",
        "--nodes", "2", "--name", "nightly-tune", "--runtime", "my-runtime", "--workspace", str(tmp_path),
        "--workspace-pvc", "ws-claim", "--namespace", "team-a", "--timeout", "3600",
    )  # fmt: skip
    trainer = manifest["spec"]["trainer"]
    assert manifest["metadata"] == {**manifest["metadata"], "name": "nightly-tune", "namespace": "team-a"}
    assert trainer["command"] == [
        *ENTRYPOINT, "tune", "run", *tj.torchrun_args("nightly-tune"), "kfp_finetune/components/torchtune_finetune/recipe.py", "--config",
        str(tmp_path / "runs" / "nightly-tune" / "torchtune_config.yaml"),
    ]  # fmt: skip
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (2, 4)
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "4"}}
    assert manifest["spec"]["runtimeRef"]["name"] == "my-runtime"
    assert manifest["spec"]["activeDeadlineSeconds"] == 3600
    pod = node_patch(manifest)["spec"]
    assert pod["volumes"] == [{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "ws-claim"}}]
    assert pod["containers"][0]["volumeMounts"] == [{"name": "kfp-workspace", "mountPath": str(tmp_path)}]
    assert manifest_errors(manifest) == []
    assert "recipe lora_finetune_distributed" in notes
    # The model and data live outside the workspace here, so they are flagged; the YAML path is mounted.
    assert str(tmp_path / "runs") not in notes.split("warning:")[-1]


def test_dry_run_rejects_bad_names(capsys, tiny_llama, tiny_dataset):
    from kfp_finetune.cli import main

    code = main(
        ["trainjob", "--dry-run", "--model-dir", str(tiny_llama), "--data", str(tiny_dataset["train.jsonl"]),
         "--name", "Bad_Name"]
    )  # fmt: skip
    assert code == 2 and "invalid TrainJob name 'Bad_Name'" in capsys.readouterr().err
