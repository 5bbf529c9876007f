"""The TrainJob backend: build the TrainJob for a resolved run, place its node pods, launch it and follow it."""

from __future__ import annotations

import dataclasses
from typing import Any

import yaml

from kfp_finetune.components._shared import engines
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.torchtune_finetune.backends import LaunchPlan, TrainingOutcome
from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import (
    CLUSTER_RUNTIME_KIND,
    NodePodSettings,
    build_trainjob,
    torchrun_args,
    trainjob_name,
    unmounted_paths,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.network import ANNOTATION_ALLOW_SLOW_NETWORK
from kfp_finetune.components.torchtune_finetune.entrypoint import node_command
from kfp_finetune.components.torchtune_finetune.lease import LEASE_FILE
from kfp_finetune.components.torchtune_finetune.warm_start import COMPILE_CACHE_ENV

log = get_logger(__name__)


@dataclasses.dataclass
class TrainJobBackend:
    """Trains in a Kubeflow Trainer TrainJob in the step's namespace (see launcher.py for how it is followed).

    Attributes:
        pod: Node-pod settings forwarded from the step's task (resources, volumes, placement, env).
        devices: Processes per node (`numProcPerNode`; None: the runtime's).
        nodes: Node pods.
        workspace_path: The run workspace, which must be on a volume the node pods mount ("": not checked).
        runtime: The (Cluster)TrainingRuntime; "auto": the engine's own (its face's RUNTIME: `torchtune` or
            `transformers`, whose images hold each engine's stack).
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime.
        image: Trainer image override (None: the runtime's).
        timeout: Seconds until the TrainJob is deleted and the step fails (also `activeDeadlineSeconds`).
        cleanup: Cleanup policy after the end (_shared/launch_settings.CLEANUP_POLICIES).
        run_id: The KFP run id (labels; with task_name and task_id, the TrainJob's name).
        task_name: The KFP task name.
        task_id: KFP's id of the task instance ("": not under KFP).
        job_name: The TrainJob's name (None: from run_id, task_name and task_id).
        namespace: Namespace written into the manifest (None: the step's own, when launched).
        queue_name: Kueue LocalQueue the TrainJob waits in for admission ("": none; kueue.py).
        priority_class: Kueue WorkloadPriorityClass of the TrainJob ("": the queue's default).
        queue_timeout: Seconds the TrainJob may wait in its queue, all waits together (None: no limit).
        allow_slow_network: Allow several nodes on a runtime that requests no RDMA network (network.py).
        persistent_compile_root: `<model cache>/compile` on the persistent model cache volume
            (warm_start.persistent_compile_root; "": none): torch.compile's caches go there when the node pods
            mount that volume writable, so the next run of a schedule starts warm; else into the run workspace.
    """

    name = "trainjob"

    pod: NodePodSettings
    devices: int | None = None
    nodes: int = 1
    workspace_path: str = ""
    runtime: str = engines.AUTO
    runtime_kind: str = CLUSTER_RUNTIME_KIND
    image: str | None = None
    timeout: int | None = None
    cleanup: str = "on-success"
    run_id: str = "local"
    task_name: str = "torchtune-finetune"
    task_id: str = ""
    job_name: str | None = None
    namespace: str | None = None
    queue_name: str = ""
    priority_class: str = ""
    queue_timeout: int | None = None
    allow_slow_network: bool = False
    persistent_compile_root: str = ""

    def __post_init__(self) -> None:
        self.job_name = self.job_name or trainjob_name(self.run_id, self.task_name, self.task_id)

    def gpus_available(self) -> bool:
        return self.pod.gpus > 0

    def prepare(self, run_dir: Any, *, resume_point: Any = None) -> None:
        """Nothing to clear: a retry re-attaches to the TrainJob, which writes into the same run folder, or
        replaces a failed one, whose node pods resume from its newest checkpoint (recipe.py)."""

    def manifest(self, plan: LaunchPlan, pod: NodePodSettings | None = None) -> dict[str, Any]:
        """The TrainJob this backend sends for `plan` (`pod`: placed node-pod settings; default: `self.pod`)."""
        torchrun = torchrun_args(self.job_name) if plan.distributed else ()
        pod = self.pod if pod is None else pod
        if self.compile_cache_mounted(pod):  # the training process reads it (warm_start.use_compile_cache)
            pod = dataclasses.replace(
                pod, env=[*pod.env, {"name": COMPILE_CACHE_ENV, "value": self.persistent_compile_root}]
            )
        return build_trainjob(
            self.job_name,
            node_command(plan.command(torchrun), plan.engine),
            namespace=self.namespace,
            runtime=self.runtime_for(plan),
            runtime_kind=self.runtime_kind,
            image=self.image,
            num_nodes=self.nodes,
            num_proc_per_node=self.devices,
            pod=pod,
            active_deadline_seconds=self.timeout,
            run_id=self.run_id,
            task_name=self.task_name,
            queue_name=self.queue_name,
            priority_class=self.priority_class,
            annotations={ANNOTATION_ALLOW_SLOW_NETWORK: "true"} if self.allow_slow_network else None,
        )

    def runtime_for(self, plan: LaunchPlan) -> str:
        """The runtime the TrainJob names: the one set, else the plan's engine's."""
        return engines.face(plan.engine).RUNTIME if self.runtime == engines.AUTO else self.runtime

    def compile_cache_mounted(self, pod: NodePodSettings) -> bool:
        """Whether the node pods mount the persistent compile cache root, writable."""
        writable = [mount for mount in pod.volume_mounts if not mount.get("readOnly")]
        return bool(self.persistent_compile_root) and not unmounted_paths(
            [self.persistent_compile_root], writable
        )

    def run(self, plan: LaunchPlan, *, total_steps: int | None) -> TrainingOutcome:
        from kfp_finetune.components._shared.kube.client import current_namespace, load_api_client
        from kfp_finetune.components.torchtune_finetune.backends.trainjob.launcher import launch_trainjob
        from kfp_finetune.components.torchtune_finetune.backends.trainjob.placement import place_node_pods

        unmounted = unmounted_paths([self.workspace_path], self.pod.volume_mounts)
        if unmounted:
            raise ConfigError(
                f"the workspace {unmounted[0]} is not among the volumes forwarded to the TrainJob: give the pipeline "
                "a workspace (dsl.PipelineConfig(workspace=...)) on KFP >= 2.15, or name its PVC in tune_workspace_pvc"
            )
        # A base model used in place from model-initialize's cache_path lies outside the workspace: the node pods
        # read it there.
        model = str(plan.model_path)
        if self.workspace_path and unmounted_paths([model], self.pod.volume_mounts):
            raise ConfigError(
                f"the base model {model} is used in place from a model cache outside the workspace, which is "
                "not among the volumes forwarded to the TrainJob: mount the model cache PVC on the fine-tune "
                "step as well (KFP_FINETUNE_MODEL_CACHE_PVC when compiling, or kubernetes.mount_pvc at the "
                "path model-initialize's cache_path names)"
            )
        api_client = load_api_client()
        namespace = current_namespace()
        placed = place_node_pods(self.pod, api_client=api_client, namespace=namespace, num_nodes=self.nodes)
        if self.persistent_compile_root and not self.compile_cache_mounted(placed):
            log.info(
                "torch.compile caches go to the run workspace, not the model cache volume: %s is not on a volume "
                "the node pods mount writable (the next run starts with a cold compile cache)",
                self.persistent_compile_root,
            )
        manifest = self.manifest(plan, placed)
        launch_trainjob(
            manifest,
            api_client,
            namespace=namespace,
            timeout=self.timeout,
            cleanup=self.cleanup,
            total_steps=total_steps,
            lease_path=plan.run_dir / LEASE_FILE,
            queue_timeout=self.queue_timeout,
        )
        return TrainingOutcome({"trainjob.yaml": yaml.safe_dump(manifest, sort_keys=False)})
