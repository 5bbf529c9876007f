"""Node pods that are never created: the only trace is a Warning event, and the TrainJob never fails by itself.

Two controllers retry such failures for ever with back-off, recording a Warning event each time and setting no
condition (so without this the step would wait for its timeout, a day by default):

- the Job controller, when the API server or an admission policy rejects a node pod (a pod spec whose requests
  exceed the runtime's limits, GPUs without an equal limit, a ResourceQuota, a Pod Security level): reason
  `FailedCreate`, message `Error creating: <the API error>`, on the `node` Job (kubernetes
  pkg/controller/job/job_controller.go through pkg/controller/controller_utils.go);
- the Trainer, when it cannot build or apply the TrainJob's JobSet: reason `TrainJobResourcesCreationFailed`,
  message `TrainJob resources reconciliation failed: <error>`, on the TrainJob (kubeflow/trainer
  pkg/controller/trainjob_controller.go).

While fewer node pods exist than the TrainJob asks for, the launcher reads these events every
`event_poll_interval` seconds; a problem that persists for the start-failure grace fails the step like a pod
that cannot start (diagnostics.StartWatch). Events older than the TrainJob (an earlier one of the same name) are
ignored.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from kfp_finetune.components.torchtune_finetune.backends.trainjob.diagnostics import (
    StartProblem,
    node_job_name,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message

POD_CREATION_FAILED = "FailedCreate"
RESOURCES_CREATION_FAILED = "TrainJobResourcesCreationFailed"


def creation_problems(
    core: Any, namespace: str, trainjob: dict, *, api: Callable[..., Any]
) -> list[StartProblem]:
    """The creation failures reported for `trainjob` (a TrainJob object as read) since it was created."""
    name = trainjob["metadata"]["name"]
    created = _parse(trainjob["metadata"].get("creationTimestamp"))
    problems = []
    for involved, kind, reason in (
        (name, "resources", RESOURCES_CREATION_FAILED),
        (node_job_name(name), "create", POD_CREATION_FAILED),
    ):
        events = api(core.list_namespaced_event, namespace, field_selector=f"involvedObject.name={involved}")
        latest = None
        for event in events.items:
            when = event.last_timestamp or event.event_time or event.first_timestamp
            if event.type != "Warning" or event.reason != reason or (created and when and when < created):
                continue
            if latest is None or (when and (latest[0] is None or when >= latest[0])):
                latest = (when, event.message or "")
        if latest is not None:
            problems.append(StartProblem(kind, involved, reason, latest[1]))
    return problems


class CreationWatch:
    """The creation failures of one TrainJob, read at most every `interval` seconds while fewer node pods exist
    than it asks for (`expected_pods`); a Role without `list events` stops the reads, said once."""

    def __init__(self, core: Any, namespace: str, *, expected_pods: int, interval: float, log: Any) -> None:
        self.core, self.namespace, self.expected_pods = core, namespace, expected_pods
        self.interval, self.log = interval, log
        self._problems: list[StartProblem] = []
        self._next_read = 0.0

    def problems(
        self, trainjob: dict | None, node_pods: int, *, api: Callable[..., Any]
    ) -> list[StartProblem]:
        from kubernetes.client.exceptions import ApiException

        if trainjob is None or node_pods >= self.expected_pods:
            self._problems = []
            return []
        now = time.monotonic()
        if now >= self._next_read:
            self._next_read = now + self.interval
            try:
                self._problems = creation_problems(self.core, self.namespace, trainjob, api=api)
            except ApiException as error:  # diagnostics only: the timeout still ends the wait
                self.log.warning(
                    "cannot read the events of TrainJob %s: %s",
                    trainjob["metadata"]["name"],
                    api_message(error),
                )
                self._next_read = float("inf")
        return self._problems


def _parse(stamp: str | None) -> datetime | None:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")) if stamp else None
