"""The TrainJob backend: the step's training as a Kubeflow Trainer v2 TrainJob (DESIGN.md §3).

Public face over small modules:

- manifest.py: the TrainJob we send (names, labels, node-pod settings, the complete `tune run` command);
- placement.py: node pods next to a ReadWriteOnce workspace;
- permissions.py: the reads made before creating (does the runtime exist);
- access.py: what the step's ServiceAccount may do, asked before creating (SelfSubjectAccessReview);
- launcher.py: create_or_attach → follow → finish, with attach.py (create, or attach to this run's TrainJob),
  finish.py (the result, the post-mortem, the cleanup policy, the failure text), pod_logs.py (the rank-0 log),
  diagnostics.py (pods that cannot start or restart in place), creation.py (pods never created), deletion.py (a
  DELETE retried and reported as the API answered), disruptions.py (lost nodes, replaced pods), following.py
  (degrade, never delete), owner.py (the step's pod owns the TrainJob), gone.py (waiting for a replaced TrainJob
  to go) and errors.py;
- backend.py: `TrainJobBackend`, the `run(resolved)` of the backend interface.
"""

from kfp_finetune.components.torchtune_finetune.backends.trainjob.backend import TrainJobBackend
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import (
    TrainJobCancelled,
    TrainJobConflict,
    TrainJobDiverged,
    TrainJobError,
    TrainJobFailed,
    TrainJobTimeout,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.launcher import (
    TrainJobLauncher,
    launch_trainjob,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import TrainJobResult

__all__ = [
    "TrainJobBackend",
    "TrainJobCancelled",
    "TrainJobConflict",
    "TrainJobDiverged",
    "TrainJobError",
    "TrainJobFailed",
    "TrainJobLauncher",
    "TrainJobResult",
    "TrainJobTimeout",
    "launch_trainjob",
]
