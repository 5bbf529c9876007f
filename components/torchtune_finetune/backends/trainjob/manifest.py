"""The Kubeflow Trainer v2.3 TrainJob (trainer.kubeflow.org/v1alpha1) that runs a resolved torchtune command.

What we send and why (DESIGN.md §3):

- `trainer.command` is the complete `tune run [torchrun flags] <recipe> --config <resolved.yaml>`. Checked in
  kubeflow/trainer v2.3.0 `pkg/runtime/framework/plugins/torch/torch.go`: both `Torch.Validate` (the torchtune
  model/LoRA-multi-node checks) and `Torch.EnforceMLPolicy` (the recipe/config/`--rdzv_endpoint` rewrite) run
  only when `slices.Equal(trainJob.Spec.Trainer.Command, constants.TorchTuneEntrypoint)`, i.e. the command is
  exactly `["tune", "run"]` (`pkg/constants/constants.go`). Any longer command takes the other branch, which
  leaves the command alone and injects `PET_MASTER_ADDR` / `PET_MASTER_PORT` next to `PET_NNODES`,
  `PET_NPROC_PER_NODE` and `PET_NODE_RANK`; `pkg/runtime/framework/plugins/jobset/builder.go` (`Builder.Trainer`)
  then copies `trainer.command` verbatim onto the `node` container. No other code path in v2.3.0 reads
  `trainer.command` for the torch runtime (the Flux plugin's rewrite needs a Flux mlPolicy).
- Node-pod settings go into one `runtimePatches` entry (manager-keyed, `validation.IsDomainPrefixedPath` in the
  JobSet plugin's `Validate`) for the `node` replicated job. `env` may not be patched on the `node` container
  (rejected by the same `Validate`), so env goes to `trainer.env`; `PET_*` there is rejected by `Torch.Validate`,
  so we refuse it up front with a clearer message.
- The trainer container is found by the `trainer.kubeflow.org/trainjob-ancestor-step: trainer` label on the
  runtime's replicated job, so our runtimes (runtimes/) carry it.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from kfp_finetune.components._shared.launch_settings import queue_problems
from kfp_finetune.components._shared.tracking import CREDENTIAL_KEYS
from kfp_finetune.components.torchtune_finetune.backends.trainjob.kueue import queue_labels

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "TrainJob"
PLURAL = "trainjobs"
NODE = "node"  # the trainer replicated job and its container (Trainer constants.Node)
CLUSTER_RUNTIME_KIND = "ClusterTrainingRuntime"
RUNTIME_KINDS = (CLUSTER_RUNTIME_KIND, "TrainingRuntime")
DEFAULT_RUNTIME = "torchtune"
#: Owner of our runtimePatches entry; must be a domain-prefixed path.
PATCH_MANAGER = "kfp-finetune.io/launcher"
#: Trainer's ContainerTrainerPort, the rendezvous port on the rank-0 pod.
RENDEZVOUS_PORT = 29500
#: KFP mounts the run workspace PVC here in every pod that uses it (backend/src/v2/component/constants.go).
KFP_WORKSPACE_MOUNT_PATH = "/kfp-workspace"
KFP_WORKSPACE_VOLUME = "kfp-workspace"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "kfp-finetune"
LABEL_RUN_ID = "kfp-finetune.io/run-id"
LABEL_TASK = "kfp-finetune.io/task"
ANNOTATION_RUN_ID = "kfp-finetune.io/run-id"
ANNOTATION_TASK = "kfp-finetune.io/task-name"

# JobSet rejects a JobSet whose longest pod name `<name>-node-0-<index>-xxxxx` exceeds 63 characters, which
# TrainJob validation does not catch (the TrainJob would just never start): 63 - len("-node-0-999-abcde") = 46.
MAX_NAME_LENGTH = 46
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
RESERVED_ENV_PREFIX = "PET_"


def _digest(*parts: str, length: int = 8) -> str:
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:length]


def _dns_slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def trainjob_name(run_id: str, task_name: str, task_id: str = "") -> str:
    """A deterministic TrainJob name for one KFP task instance of one run: a restart of the task's pod gets the
    same name (and re-attaches), another instance another one.

    Readable parts (task name, start of the run id) plus a hash of the run id, the task name and KFP's task id
    (`{{$.pipeline_task_uuid}}`, distinct for each nested use and ParallelFor iteration; empty: not under KFP)
    in full, so distinct runs and task instances never collide even when the readable parts are truncated.
    """
    if not run_id or not task_name:
        raise ValueError("a TrainJob name needs both the KFP run id and the task name")
    parts = [p for p in (_dns_slug(task_name)[:20].strip("-"), _dns_slug(run_id)[:8].strip("-")) if p]
    name = "-".join([*parts, _digest(run_id, task_name, *([task_id] if task_id else []))])
    if not name[0].isalpha():
        name = f"ft-{name}"
    return validate_name(name)


def validate_name(name: str) -> str:
    """`name` if it is a usable TrainJob name (RFC 1035 label, short enough for JobSet's pod names)."""
    if not _RFC1035.match(name):
        raise ValueError(
            f"invalid TrainJob name {name!r}: use lowercase letters, digits and '-', starting with a letter "
            "and ending with a letter or digit (RFC 1035)"
        )
    if len(name) > MAX_NAME_LENGTH:
        raise ValueError(
            f"TrainJob name {name!r} has {len(name)} characters; at most {MAX_NAME_LENGTH} keep the JobSet pod "
            "names within Kubernetes' 63-character limit"
        )
    return name


def label_value(text: str) -> str:
    """`text` as a valid label value (≤ 63 chars); long or odd values get a hashed suffix to stay unique."""
    value = re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-_.")
    if len(value) > 63 or value != text:
        value = f"{value[:54].rstrip('-_.')}-{_digest(text)}".lstrip("-")
    return value


def run_labels(run_id: str, task_name: str) -> dict[str, str]:
    """Labels tying a TrainJob (and its pods) to a KFP run and task; the launcher attaches only on a match."""
    return {
        LABEL_MANAGED_BY: MANAGED_BY,
        LABEL_RUN_ID: label_value(run_id),
        LABEL_TASK: label_value(task_name),
    }


def run_annotations(run_id: str, task_name: str) -> dict[str, str]:
    """The unabridged run id and task name (labels may be shortened)."""
    return {ANNOTATION_RUN_ID: run_id, ANNOTATION_TASK: task_name}


# ---------------------------------------------------------------------------------------------------------------
# Node pod settings (what a KFP TaskConfig carries)


@dataclasses.dataclass
class NodePodSettings:
    """Per-node settings for the TrainJob's `node` pods, as Kubernetes JSON fragments.

    Attributes:
        resources: `{"limits": {...}, "requests": {...}}` per node (GPUs, CPU, memory).
        env: Container env vars (`{"name", "value"}` or `{"name", "valueFrom"}`); never `PET_*`.
        volumes: Pod volumes (e.g. the KFP workspace PVC).
        volume_mounts: Mounts of those volumes into the `node` container.
        node_selector: Pod node selector.
        tolerations: Pod tolerations.
        affinity: Pod affinity.
        service_account_name: Service account of the node pods.
        image_pull_secrets: Names of image pull secrets.
    """

    resources: dict[str, Any] | None = None
    env: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    volumes: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    node_selector: dict[str, str] = dataclasses.field(default_factory=dict)
    tolerations: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    affinity: dict[str, Any] | None = None
    service_account_name: str | None = None
    image_pull_secrets: list[str] = dataclasses.field(default_factory=list)

    @property
    def gpus(self) -> int:
        return gpus_per_node(self.resources)


def _task_config_field(task_config: Any, snake: str, camel: str) -> Any:
    if task_config is None:
        return None
    if isinstance(task_config, Mapping):
        return task_config.get(camel, task_config.get(snake))
    return getattr(task_config, snake, None)


def trainjob_spec_from_task_config(task_config: Any) -> NodePodSettings:
    """The node-pod settings a KFP `dsl.TaskConfig` carries (kfp 2.17), to forward to the TrainJob.

    Accepts the `dsl.TaskConfig` object the component receives or the JSON the KFP driver injects
    (`backend/src/v2/driver/driver.go` `TaskConfig`: camelCase keys, fields may be null/empty). Only fields the
    component passes through are set. The run workspace arrives among the volumes: when a component both takes
    the workspace path and passes `KUBERNETES_VOLUMES` through, the driver adds volume `kfp-workspace`
    (PVC `<run>-kfp-workspace`) mounted at `/kfp-workspace` — the same path the KFP pod sees, so paths in the
    resolved torchtune YAML are valid in the node pods as they are.
    """
    resources = _task_config_field(task_config, "resources", "resources") or {}
    resources = {k: dict(v) for k, v in resources.items() if v} or None
    return NodePodSettings(
        resources=resources,
        # The step logs to MLflow itself (_shared/tracking.py): its credentials stay out of the node pods.
        env=[
            item
            for item in _task_config_field(task_config, "env", "env") or []
            if item.get("name") not in CREDENTIAL_KEYS
        ],
        volumes=list(_task_config_field(task_config, "volumes", "volumes") or []),
        volume_mounts=list(_task_config_field(task_config, "volume_mounts", "volumeMounts") or []),
        node_selector=dict(_task_config_field(task_config, "node_selector", "nodeSelector") or {}),
        tolerations=list(_task_config_field(task_config, "tolerations", "tolerations") or []),
        affinity=_task_config_field(task_config, "affinity", "affinity") or None,
    )


def gpus_per_node(resources: Mapping[str, Any] | None) -> int:
    """GPUs per node as the Trainer counts them: the first resource whose name contains "gpu", requests first."""
    for kind in ("requests", "limits"):
        for name, quantity in ((resources or {}).get(kind) or {}).items():
            if "gpu" in name.lower():
                return int(float(str(quantity)))
    return 0


def workspace_volume(claim_name: str, mount_path: str = KFP_WORKSPACE_MOUNT_PATH) -> tuple[dict, dict]:
    """The KFP workspace PVC as a (volume, volumeMount) pair, for callers without a TaskConfig."""
    return (
        {"name": KFP_WORKSPACE_VOLUME, "persistentVolumeClaim": {"claimName": claim_name}},
        {"name": KFP_WORKSPACE_VOLUME, "mountPath": mount_path},
    )


def unmounted_paths(paths: Iterable[str], volume_mounts: Iterable[Mapping[str, Any]]) -> list[str]:
    """The absolute paths that lie under none of the mounts (the node pods would not see them)."""
    mount_points = [m["mountPath"].rstrip("/") or "/" for m in volume_mounts]

    def mounted(path: str) -> bool:
        return any(path == mp or path.startswith(mp.rstrip("/") + "/") for mp in mount_points)

    return [p for p in paths if p.startswith("/") and not mounted(p)]


# ---------------------------------------------------------------------------------------------------------------
# The torchrun part of the command


def rank0_endpoint(job_name: str, port: int = RENDEZVOUS_PORT) -> str:
    """The rank-0 node pod's stable DNS name (JobSet headless service `<job>`) and port."""
    return f"{job_name}-{NODE}-0-0.{job_name}:{port}"


def torchrun_args(job_name: str, *, rdzv_endpoint: str | None = None) -> list[str]:
    """torchrun flags for a distributed recipe on N nodes × M processes, for `tune run` before the recipe.

    Sizes come from the `PET_*` env the Trainer injects, through the kubelet's `$(VAR)` expansion, so the
    command follows `numNodes` / `numProcPerNode` as the controller resolved them. The c10d rendezvous runs on
    the injected master (the rank-0 pod, `<job>-node-0-0.<job>:29500`) unless `rdzv_endpoint` is given.
    Single-device recipes must get no flags at all: any flag makes `tune run` launch torchrun.
    """
    return [
        "--nnodes",
        "$(PET_NNODES)",
        "--nproc_per_node",
        "$(PET_NPROC_PER_NODE)",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        rdzv_endpoint or "$(PET_MASTER_ADDR):$(PET_MASTER_PORT)",
        "--rdzv_id",
        job_name,
    ]


# ---------------------------------------------------------------------------------------------------------------
# The manifest


def _env_list(env: Sequence[Mapping[str, Any]] | Mapping[str, str] | None) -> list[dict[str, Any]]:
    """Env vars as a list of EnvVar dicts, one per name (last wins, first position kept), PET_* refused."""
    items = [{"name": k, "value": str(v)} for k, v in env.items()] if isinstance(env, Mapping) else env or []
    by_name: dict[str, dict[str, Any]] = {}
    for item in items:
        by_name[item["name"]] = dict(item)
    reserved = sorted(name for name in by_name if name.startswith(RESERVED_ENV_PREFIX))
    if reserved:
        raise ValueError(
            f"env must not set {', '.join(reserved)}: Kubeflow Trainer injects the PET_* variables for torchrun "
            "itself and rejects TrainJobs that set them; remove them from the task's environment"
        )
    return list(by_name.values())


def _quantities(resources: Mapping[str, Any] | None) -> dict[str, dict[str, str]] | None:
    """Resource requirements with every quantity as a string and empty parts dropped."""
    cleaned = {
        part: {name: str(q) for name, q in values.items()}
        for part, values in (resources or {}).items()
        if part in ("limits", "requests") and values
    }
    return cleaned or None


def _compact(fields: Mapping[str, Any]) -> dict[str, Any]:
    """`fields` without None or empty values, one level only: user-given fragments (`emptyDir: {}`) stay whole."""
    return {k: v for k, v in fields.items() if v not in (None, {}, [])}


def build_trainjob(
    name: str,
    command: Sequence[str],
    *,
    namespace: str | None = None,
    runtime: str = DEFAULT_RUNTIME,
    runtime_kind: str = CLUSTER_RUNTIME_KIND,
    image: str | None = None,
    args: Sequence[str] | None = None,
    num_nodes: int = 1,
    num_proc_per_node: int | None = None,
    pod: NodePodSettings | None = None,
    active_deadline_seconds: int | None = None,
    run_id: str | None = None,
    task_name: str | None = None,
    labels: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    queue_name: str = "",
    priority_class: str = "",
) -> dict[str, Any]:
    """A complete TrainJob manifest (a dict ready for the API), validated against the typed models.

    Args:
        name: TrainJob name (see `trainjob_name`).
        command: The full node command, e.g. `tune_command(recipe, yaml, torchrun_args(name))`.
        namespace: Namespace in the manifest (omitted when None).
        runtime: Name of the (Cluster)TrainingRuntime.
        runtime_kind: `ClusterTrainingRuntime` or `TrainingRuntime` (namespaced, same namespace as the job).
        image: Trainer image override (None: the runtime's image).
        args: Container args (usually None: the command is complete).
        num_nodes: Number of node pods.
        num_proc_per_node: Processes per node (None: the Trainer's default, `auto` = GPUs per node).
        pod: Node pod settings (resources, env, volumes, scheduling, service account, pull secrets).
        active_deadline_seconds: Hard limit on the TrainJob's run time (Trainer fails it with DeadlineExceeded).
        run_id: KFP run id, recorded in labels/annotations (required with `task_name` for re-attaching).
        task_name: KFP task name, likewise.
        labels: Extra metadata labels.
        annotations: Extra metadata annotations.
        queue_name: Kueue LocalQueue to wait in ("": none): Kueue's labels, and `spec.suspend` until admitted
            (kueue.py).
        priority_class: Kueue WorkloadPriorityClass ("": the queue's default).
    """
    validate_name(name)
    if runtime_kind not in RUNTIME_KINDS:
        raise ValueError(f"runtime kind must be one of {RUNTIME_KINDS}, got {runtime_kind!r}")
    if not command:
        raise ValueError("the TrainJob needs a command")
    if list(command) == ["tune", "run"]:
        raise ValueError(
            "a bare ['tune', 'run'] command triggers the Trainer's torchtune rewrite; pass it complete"
        )
    if num_nodes < 1:
        raise ValueError(f"tune_num_nodes must be at least 1, got {num_nodes}")
    if num_proc_per_node is not None and num_proc_per_node < 1:
        raise ValueError(f"num_proc_per_node must be at least 1, got {num_proc_per_node}")
    if active_deadline_seconds is not None and active_deadline_seconds < 1:
        raise ValueError(f"tune_timeout_seconds must be a positive integer, got {active_deadline_seconds}")
    if problems := queue_problems(
        queue_name=queue_name, priority_class=priority_class, queue_timeout_seconds=0
    ):
        raise ValueError(problems[0].named(f"tune_{problems[0].setting}"))
    pod = pod or NodePodSettings()

    meta_labels = {**(labels or {}), **queue_labels(queue_name, priority_class)}
    meta_annotations = dict(annotations or {})
    if run_id and task_name:
        meta_labels.update(run_labels(run_id, task_name))
        meta_annotations.update(run_annotations(run_id, task_name))

    pod_spec_patch = _compact(
        {
            "volumes": copy.deepcopy(pod.volumes),
            "containers": [{"name": NODE, "volumeMounts": copy.deepcopy(pod.volume_mounts)}]
            if pod.volume_mounts
            else None,
            "nodeSelector": dict(pod.node_selector),
            "tolerations": copy.deepcopy(pod.tolerations),
            "affinity": copy.deepcopy(pod.affinity),
            "serviceAccountName": pod.service_account_name,
            "imagePullSecrets": [{"name": secret} for secret in pod.image_pull_secrets],
        }
    )
    pod_labels = {k: v for k, v in meta_labels.items() if k in (LABEL_RUN_ID, LABEL_TASK)}
    pod_template_patch = _compact({"metadata": _compact({"labels": pod_labels}), "spec": pod_spec_patch})
    runtime_patches = []
    if pod_template_patch:
        replicated_job = {"name": NODE, "template": {"spec": {"template": pod_template_patch}}}
        runtime_patches.append(
            {
                "manager": PATCH_MANAGER,
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated_job]}}},
            }
        )

    trainer = _compact(
        {
            "image": image,
            "command": [str(part) for part in command],
            "args": [str(part) for part in args] if args else None,
            "env": _env_list(pod.env),
            "numNodes": num_nodes,
            "numProcPerNode": num_proc_per_node,
            "resourcesPerNode": _quantities(pod.resources),
        }
    )
    manifest = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": _compact(
            {"name": name, "namespace": namespace, "labels": meta_labels, "annotations": meta_annotations}
        ),
        "spec": _compact(
            {
                "runtimeRef": {"apiGroup": GROUP, "kind": runtime_kind, "name": runtime},
                "trainer": trainer,
                "runtimePatches": runtime_patches,
                "activeDeadlineSeconds": active_deadline_seconds,
                # As Kueue's webhook would set it: the Trainer creates nothing until Kueue admits the TrainJob.
                "suspend": True if queue_name else None,
            }
        ),
    }
    validate_trainjob(manifest)
    return manifest


def validate_trainjob(manifest: Mapping[str, Any]) -> None:
    """Check a TrainJob manifest against the `kubeflow-trainer-api` typed models (types, required fields).

    The models ignore unknown keys, so the manifest is also round-tripped through them: a key that does not
    survive is one the API server would reject (strict validation) or silently drop.
    """
    from kubeflow_trainer_api.models import TrainerV1alpha1TrainJob
    from pydantic import ValidationError

    try:
        model = TrainerV1alpha1TrainJob.from_dict(copy.deepcopy(dict(manifest)))
    except ValidationError as error:
        raise ValueError(f"invalid TrainJob manifest: {error}") from error
    dropped = _dropped_keys(manifest, model.to_dict())
    if dropped:
        raise ValueError(f"invalid TrainJob manifest: unknown fields {', '.join(dropped)}")


def _dropped_keys(original: Any, round_tripped: Any, path: str = "") -> list[str]:
    if isinstance(original, Mapping):
        kept = round_tripped if isinstance(round_tripped, Mapping) else {}
        missing = []
        for key, value in original.items():
            child = f"{path}.{key}" if path else key
            if key not in kept and value is not None:
                missing.append(child)
            elif key in kept:
                missing += _dropped_keys(value, kept[key], child)
        return missing
    if isinstance(original, list) and isinstance(round_tripped, list):
        return [
            m
            for i, (a, b) in enumerate(zip(original, round_tripped, strict=False))
            for m in _dropped_keys(a, b, f"{path}[{i}]")
        ]
    return []
