"""How the torchtune-finetune step trains a resolved run: one small interface, two backends, chosen once.

- `local` (local.py): the training command as a child process of the step, checked first as in a TrainJob.
- `trainjob` (trainjob/): a Kubeflow Trainer TrainJob running the same command, followed to its end.

`backend_for` picks one from the step's `backend` parameter; nothing above it branches on the name.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.launch_settings import BACKENDS

if TYPE_CHECKING:
    from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NodePodSettings


#: An engine's finder of the newest complete checkpoint an earlier attempt left in a run folder (its face's
#: `resume_point`): a description of it, None when there is none.
ResumePoint = Callable[[Path], "str | None"]


@dataclasses.dataclass
class TrainingOutcome:
    """What a backend hands back when training succeeded (a failure raises).

    Attributes:
        files: Extra files for the step's train_config artifact, name -> text (e.g. the TrainJob manifest).
    """

    files: dict[str, str] = dataclasses.field(default_factory=dict)


class LaunchPlan(Protocol):
    """One engine's planned run, as a backend launches it: the torchtune wing's ResolvedRun, the transformers
    wing's SftRun."""

    #: The engine whose face checks and runs the command in a TrainJob's node pods (entrypoint.py).
    engine: str

    @property
    def run_dir(self) -> Path: ...

    @property
    def model_path(self) -> Path: ...

    @property
    def distributed(self) -> bool: ...

    def command(self, torchrun_args: tuple[str, ...] | list[str] = ()) -> list[str]:
        """The training command; with torchrun flags, one process per device."""
        ...


class TrainingBackend(Protocol):
    """Trains one planned run: its training command (`tune run ...` over a resolved YAML, or the transformers
    engine's), writing into its run folder.

    Attributes:
        name: The backend's name, recorded in the model's metadata.
        devices: Processes (devices) per node the run is resolved for.
        nodes: Nodes the run is resolved for.
    """

    name: str
    devices: int
    nodes: int

    def gpus_available(self) -> bool:
        """Whether the training will see GPUs (picks the device when the settings leave it to us)."""
        ...

    def prepare(self, run_dir: Path, *, resume_point: ResumePoint | None = None) -> None:
        """Before resolving: deal with what an earlier attempt of this task left in the run folder (with
        `resume_point`, the engine's finder of its newest complete checkpoint, one stays for the training to
        continue from; None: the run starts over)."""
        ...

    def run(self, plan: LaunchPlan, *, total_steps: int | None) -> TrainingOutcome:
        """Train to the end; raise (ConfigError, TrainingFailed, TrainJobError) when it cannot or fails."""
        ...


def backend_for(
    name: str,
    *,
    devices: int = 1,
    nodes: int = 1,
    pod: NodePodSettings | None = None,
    persistent_compile_root: str = "",
    **trainjob: Any,
) -> TrainingBackend:
    """The backend called `name`.

    Args:
        name: "trainjob" or "local".
        devices: Processes per node.
        nodes: Nodes (the local backend takes only 1).
        pod: The node-pod settings the step's task forwards (its GPUs; for a TrainJob, all of them).
        persistent_compile_root: `<model cache>/compile` when the base model came through the persistent model
            cache (warm_start.persistent_compile_root; "": none): torch.compile's caches go there when training
            sees that volume, so the next run of a schedule starts warm.
        **trainjob: The TrainJob backend's settings (see `TrainJobBackend`).
    """
    if name == "local":
        from kfp_finetune.components.torchtune_finetune.backends.local import LocalBackend

        return LocalBackend(
            devices=devices,
            nodes=nodes,
            gpus=pod.gpus if pod is not None else 0,
            persistent_compile_root=persistent_compile_root,
        )
    if name == "trainjob":
        from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
        from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NodePodSettings

        return TrainJobBackend(
            pod=pod or NodePodSettings(),
            devices=devices,
            nodes=nodes,
            persistent_compile_root=persistent_compile_root,
            **trainjob,
        )
    raise ConfigError(f"tune_backend must be one of {', '.join(BACKENDS)} (got {name!r})")
