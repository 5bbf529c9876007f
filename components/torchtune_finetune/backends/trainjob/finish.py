"""The end of a followed TrainJob: its TrainJobResult, what a failure leaves in the step log, the cleanup.

After the end the cleanup policy decides (default "on-success": delete successful TrainJobs, keep failed ones
for debugging). A TrainJob we declare failed while it has not ended (pods that cannot start, a trainer
restarting in place, a diverged loss) would hold its nodes, and start training unobserved once a node frees up
or a missing Secret appears: it is deleted unless the policy is "never", after its reason, pod status and events
are in the step log (diagnostics.py). A failure raises with the condition's reason and message, each failing
pod's termination reason and disruptions, a DELETE that did not go through, and the last log lines.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from kfp_finetune.components.torchtune_finetune.backends.trainjob.deletion import Deletion, kubectl_delete
from kfp_finetune.components.torchtune_finetune.backends.trainjob.diagnostics import (
    log_post_mortem,
    termination_summary,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.disruptions import disruption_summary
from kfp_finetune.components.torchtune_finetune.backends.trainjob.errors import (
    TrainJobDiverged,
    TrainJobFailed,
)
from kfp_finetune.components.torchtune_finetune.backends.trainjob.pod_logs import RankZeroLog
from kfp_finetune.components.torchtune_finetune.backends.trainjob.result import TrainJobResult, condition
from kfp_finetune.components.torchtune_finetune.metrics import LossDiverged


def finish(
    job: Mapping[str, Any] | None,
    state: str,
    *,
    created: bool,
    ended: tuple[str, str] | None,
    diverged: LossDiverged | None,
    core: Any,
    namespace: str,
    name: str,
    cleanup: str,
    started: float,
    rank0_log: RankZeroLog,
    node_pods: Callable[[], list[dict]],
    listed_node_pods: Callable[[], list[dict]],
    delete: Callable[..., Deletion],
    api: Callable[..., Any],
    log: Any,
    shown_events: set[str],
    gone_disruptions: Callable[[list[dict]], list[str]],
) -> TrainJobResult:
    """Report the end: return the result of a Complete TrainJob, raise TrainJobFailed / TrainJobDiverged.

    ``ended``: our own (reason, message) when we stop before the TrainJob ends; ``diverged``: why, when it is a
    non-finite loss (a one-line failure: the log was shown). ``node_pods``: as the pod watch saw them;
    ``listed_node_pods``: a fresh list (following.py); ``delete(reason=...)``: deletion.py; ``started``: the
    monotonic time the run started; ``gone_disruptions(pods)``: disruptions.PodChanges'.
    """
    terminal = dict(zip(("reason", "message"), ended, strict=True)) if ended else condition(job, state) or {}
    lines, steps = rank0_log.shown()
    result = TrainJobResult(
        name=name,
        namespace=namespace,
        status=state,
        created=created,
        log_lines=lines,
        steps=steps,
        wall_time=time.monotonic() - started,
        reason=terminal.get("reason") or "",
        message=terminal.get("message") or "",
    )
    if state == "Failed":
        pods = listed_node_pods()
        terminations = termination_summary(pods) + disruption_summary(pods) + gone_disruptions(pods)
        if not result.log_lines:
            rank0_log.fetch_tail(api, pods)
        if ended and not diverged:
            # What a deleted TrainJob no longer shows (its pods go with it) goes into the step log first.
            log_post_mortem(
                core,
                namespace,
                name,
                node_pods(),
                f"{result.reason}: {result.message}",
                api=api,
                log=log,
                shown_events=shown_events,
            )
        deletion = None
        if cleanup == "always":
            deletion = delete(reason="cleanup policy 'always'")
        elif ended and cleanup == "on-success":
            # Not ended by itself: kept, it would hold its nodes (and a pending one would start training
            # unobserved once it can); its log, pod status and events are in the step log already.
            deletion = delete(reason=f"{result.reason} (cleanup policy 'on-success')")
        elif ended:
            log.warning(
                "kept TrainJob %s (cleanup policy %r) for debugging: it holds its nodes until deleted; %s now",
                name,
                cleanup,
                kubectl_delete(namespace, name),
            )
        result.deleted = deletion is not None and deletion.confirmed
        if diverged:
            raise TrainJobDiverged(diverged, result)
        text = [f"TrainJob {namespace}/{name} failed: {result.reason or 'Failed'}: {result.message}"]
        text += [f"  {line}" for line in terminations]
        if deletion is not None and not deletion.confirmed:
            text.append(f"  TrainJob {deletion.words(namespace, name)}")
        raise TrainJobFailed("\n".join(text) + rank0_log.tail_text(), result)
    log.info("TrainJob %s completed in %.0fs", name, result.wall_time)
    if cleanup in ("on-success", "always"):
        result.deleted = delete(reason=f"cleanup policy {cleanup!r}").confirmed
    return result
