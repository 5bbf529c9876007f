"""Deleting the TrainJob and saying truthfully what came of it.

A DELETE can fail (the API server overloaded, a dropped connection, a Role without `delete`) and it can succeed
without the client hearing so: the API server's request timeout answers 504 "may still be processing the
request" while the write goes on (apiserver pkg/server/filters/timeout.go), so a retry that answers 404 means an
earlier attempt went through. Transient failures are retried with back-off for a bounded time (a cancelled
step has only its termination grace period); what the step log and the final line say follows what the API
answered: "deleted" only after a 200, "gone" after a 404, otherwise that it may still be running and how to
delete it by hand.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kfp_finetune.components._shared.kube.client import Backoff, is_retryable, retry_after_seconds
from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import api_message

DELETE_RETRY_SECONDS = 120.0  # back-off time spent retrying a DELETE at the end of a run
# SIGTERM: KFP's step pod is killed 30 s (terminationGracePeriodSeconds) after the signal; leave time to report.
CANCEL_DELETE_RETRY_SECONDS = 20.0


@dataclasses.dataclass(frozen=True)
class Deletion:
    """What deleting the TrainJob came to.

    Attributes:
        confirmed: The API answered that it is deleted (200) or gone (404).
        outcome: "deleted", "gone" (404: deleted before, perhaps by an earlier attempt of ours) or "failed".
        error: Why it failed (the API's message), "" otherwise.
    """

    confirmed: bool
    outcome: str
    error: str = ""

    def words(self, namespace: str, name: str) -> str:
        """How the final line says it, e.g. "deleted" or "NOT deleted (…): it may still be running; …"."""
        if self.outcome == "deleted":
            return "deleted"
        if self.outcome == "gone":
            return "gone"
        return f"NOT deleted ({self.error}): it may still be running; {kubectl_delete(namespace, name)}"


def kubectl_delete(namespace: str, name: str) -> str:
    return f"`kubectl delete trainjob -n {namespace} {name}` frees its nodes"


def delete_trainjob(
    custom: Any,
    namespace: str,
    name: str,
    *,
    reason: str,
    backoff: Backoff,
    retry_seconds: float,
    log: Any,
) -> Deletion:
    """DELETE the TrainJob (Background propagation: the garbage collector removes its JobSet and pods), retrying
    transient failures until `retry_seconds` of back-off have been spent; logs the outcome."""
    from kubernetes.client.exceptions import ApiException

    delays = Backoff(
        initial=backoff.initial, factor=backoff.factor, maximum=backoff.maximum, attempts=1_000_000
    ).delays()
    waited, failed_before = 0.0, False
    while True:
        try:
            custom.delete_namespaced_custom_object(
                tj.GROUP, tj.VERSION, namespace, tj.PLURAL, name, propagation_policy="Background"
            )
            log.info("deleted TrainJob %s (%s)", name, reason)
            return Deletion(confirmed=True, outcome="deleted")
        except Exception as error:
            if isinstance(error, ApiException) and error.status == 404:
                if failed_before:
                    log.info("TrainJob %s is gone (%s): an earlier DELETE went through", name, reason)
                return Deletion(confirmed=True, outcome="gone")
            if not is_retryable(error):
                if not isinstance(error, ApiException):
                    raise
                return _failed(log, namespace, name, reason, api_message(error))
            message = api_message(error) if isinstance(error, ApiException) else str(error)
            hint = retry_after_seconds(error)
        failed_before = True
        delay = next(delays)
        if hint is not None:
            delay = min(max(delay, hint), backoff.maximum)
        if waited + delay > retry_seconds:
            return _failed(log, namespace, name, reason, message)
        log.warning("deleting TrainJob %s failed (%s); retrying in %.1fs", name, message, delay)
        backoff.sleep(delay)
        waited += delay


def _failed(log: Any, namespace: str, name: str, reason: str, message: str) -> Deletion:
    log.error(
        "could not delete TrainJob %s (%s): %s. It may still be running: %s",
        name,
        reason,
        message,
        kubectl_delete(namespace, name),
    )
    return Deletion(confirmed=False, outcome="failed", error=message)
