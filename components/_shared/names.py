"""Names a step writes or creates (workspace entries, run and eval folders, staging, TrainJobs) come from KFP's
identity of the task instance, so two uses of a component in one run never collide.

The pipelines pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (`{{$.pipeline_task_uuid}}`) to every component that
writes into the workspace, as its `task_id` parameter: KFP resolves it once per task execution, a distinct value
for each nested use of a sub-DAG and for each ParallelFor iteration, and the same value when the task's pod
restarts (kfp.local resolves it too: kfp/local/placeholder_utils.py, `make_random_id` once per task). A name is a
readable part followed by 8 hex characters of a hash of that id: `datasets/train-3f9a0c21`.
"""

from __future__ import annotations

import hashlib
import re

TASK_HASH_LENGTH = 8


def task_hash(task_id: str, length: int = TASK_HASH_LENGTH) -> str:
    """The first `length` hex characters of the sha256 of `task_id`."""
    return hashlib.sha256(task_id.encode()).hexdigest()[:length]


def instance_name(readable: str, task_id: str) -> str:
    """`<readable>-<hash of task_id>`, path-safe; `readable` alone when `task_id` is empty (a call from outside
    KFP, which names its own entries)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip(".-") or "default"
    return f"{readable}-{task_hash(task_id)}" if task_id else readable
