"""An in-process stand-in for the Kubernetes API server, for tests that use the real ``kubernetes`` client.

It serves the subset of the REST API that the TrainJob launcher uses on 127.0.0.1 and drives created TrainJobs the
way Kubeflow Trainer v2.3 + JobSet would (DESIGN.md §3, §6). Public API (stable; other helpers build on it):

    with KubeStandin(namespace="team-a") as kube:
        kube.add_runtime("torch-distributed")                 # a minimal ClusterTrainingRuntime
        kube.scenario("my-job", Scenario.failure("FailedJobs", "boom"))   # or kube.scenario(None, ...) = default
        api = kubernetes.config.new_client_from_config(config_file=str(kube.kubeconfig_path))
        ...                                                   # launcher code under test
        kube.trainjob("my-job"), kube.pods("my-job"), kube.requests

Layout: ``standin`` (the facade), ``_knobs`` (its scenario and fault methods), ``_apiserver`` (REST semantics),
``_http`` (HTTP transport), ``_admission`` (the Trainer webhooks), ``_rbac`` (authorization), ``_controller`` (the
simulated Trainer/JobSet/kubelet), ``_workload`` (pod templates, pod states, execute-mode command lines),
``_execute`` (execute mode's processes), ``_devices`` (their GPUs, as the NVIDIA device plugin hands them out),
``_kueue`` (Kueue: queued TrainJobs, Workloads, admission, preemption), ``_store`` (objects, watch history, logs),
``_schema`` (CRD schema validation), ``_common`` (constants, errors, routing, selectors).

Served (anything else answers 404 like an unknown path):
  * ``/apis/trainer.kubeflow.org/v1alpha1``: trainjobs (namespaced create/get/list/watch/delete; cluster-wide
    list/watch), trainingruntimes (namespaced get/list/watch), clustertrainingruntimes (get/list/watch).
  * ``/apis/jobset.x-k8s.io/v1alpha2``: jobsets (namespaced get/list/watch), one per started TrainJob, named after it
    and owned by it; a new TrainJob that finds an old JobSet of its name adopts its state, as the Trainer does.
  * ``/apis/kueue.x-k8s.io/v1beta1``: localqueues (namespaced get/list/watch; seeded with ``add_local_queue``) and
    workloads (namespaced get/list/watch), one per TrainJob labelled ``kueue.x-k8s.io/queue-name``: such a TrainJob
    is suspended by Kueue's webhook and waits until ``admit``; ``preempt`` suspends it again (its pods deleted);
    workloadpriorityclasses (seeded; their ``value`` is the Workload's priority).
  * ``/apis/visibility.kueue.x-k8s.io/{v1beta2,v1beta1}``: ``localqueues/{name}/pendingworkloads`` (get), the
    positions of the LocalQueue's pending Workloads (_kueue.py; ``kueue_visibility`` makes it absent/unreachable).
  * ``/api/v1``: pods (namespaced list/watch/get), ``pods/{name}/log`` (container, follow, tailLines, sinceSeconds,
    timestamps, limitBytes), events (namespaced list/watch), secrets (namespaced get/list/watch).
  * ``/apis/authorization.k8s.io/v1/selfsubjectaccessreviews`` (create): the caller's RBAC decision for the
    attributes asked about, allowed to everyone as ``system:basic-user`` grants it.
  * ``labelSelector`` (=, ==, !=, in, notin, exists, !exists) and ``fieldSelector`` (=, ==, !=) on list and watch,
    limited to the fields the real server selects by (``_common.SELECTABLE_FIELDS``: pods ``spec.nodeName``,
    ``status.phase`` …, events ``involvedObject.*``, ``reason``, ``source``, ``type`` …, custom resources only
    ``metadata.name`` / ``metadata.namespace``); any other field answers 400 with the server's message.

Faults (see the methods): ``fail_next`` (N x 5xx/429 with a ``kind: Status`` body, optional Retry-After),
``drop_watch_after`` (clean or abrupt end of the next watch), ``expire_next_watch`` (410 "too old resource
version", as an ERROR event or as HTTP 410), ``compact_history`` (watches from an older resourceVersion get 410
Expired), ``send_bookmarks`` (BOOKMARK events now), ``end_log_streams`` (log follows end early), seeded objects via
``add_object`` (the retry/attach case), pods that cannot start (an image not in the registry list, ``images=`` /
``push_image``; a Secret the env needs that was not added; ``Scenario.stuck_pending``, unschedulable until
``free_node``), writes committed though answered with a 5xx (``fail_next(committed=True)``),
``delay_watch_events`` (a watch that trails the lists), a lost node (``Scenario.lost_node_after_lines``; in
execute mode ``Scenario.lose_node_on_line``), a preempted node pod in execute mode (``Scenario.preempt_on_line``:
the container's preStop exec hook, SIGTERM, SIGKILL after the grace period, a replacement pod running the same
command, _disruption.py),
``delete_pod`` (a step pod evicted or gone: the TrainJobs it owned are collected). Note that urllib3 under the
kubernetes client by itself retries GET/DELETE (not POST) on 429/503 carrying Retry-After.

Owners: TrainJobs may carry ownerReferences (validated as the API server does); when ``delete_pod`` removes a
pod (eviction, node loss, a deleted workflow) or a TrainJob names an owner absent from its namespace, the garbage
collector deletes the TrainJobs whose owners are all gone (_owners.py, _gc.py).

Authorization: ``enforce_rbac(documents, service_account="ns:name")`` makes every request need a grant from RBAC
documents (runtimes/rbac.yaml), else 403 Forbidden; ``authorizations`` lists each request's verb, group, resource,
subresource and namespace with the decision. The Trainer webhook's denials (_admission.py) answer 403 with the
``admission webhook ... denied the request`` message, as controller-runtime's Denied does.

To use the fixture in a test module: ``from tests.support import kube_standin as standin`` and
``kube_standin = standin.kube_standin`` (a plain import of the name trips ruff's F811 on the fixture arguments).

A crashing trainer is handled as on a cluster (``_jobpolicy``): JobSet defaults the node pods to ``restartPolicy:
OnFailure`` and the Job to ``backoffLimit: 6``, so unless the runtime says otherwise the container restarts in place
(``restartCount``, ``lastState.terminated``, ``CrashLoopBackOff`` with the kubelet's doubling back-off, scaled by
``Scenario.restart_backoff_scale``) and the pods are deleted when the Job fails; under ``Never`` failed pods are
replaced until ``backoffLimit``, a ``podFailurePolicy`` FailJob/Ignore rule applies, and failed pods are kept.

Known deviations from a real API server:
  * Unknown fields are always rejected with 422 (a real server answers 400 "strict decoding error" with
    ``fieldValidation=Strict``, and otherwise drops them with a warning). Non-nullable nulls are pruned.
  * CEL rules are evaluated for the rule shapes the Trainer CRDs use; transition rules (``oldSelf``) are skipped.
  * No PUT, and PATCH only as a JSON merge patch of a TrainJob's metadata (ownerReferences, labels, annotations;
    anything else 405): status and suspension are driven only by the simulated controllers; a suspended TrainJob
    gets ``Suspended=True`` and stays so unless it is queued and a test admits it (``_kueue.py``). Kueue admits
    and preempts only when a test says so (no quota, flavors, cohorts or priorities are simulated); the
    Workload appears within the TrainJob's create (Kueue's reconciler makes it a moment later); the visibility
    API serves only LocalQueues' pending workloads (``kueue_visibility``; _kueue.py lists what it leaves out).
    No pagination (``limit``/``continue`` ignored); the watch history
    is compacted only when a test asks (the real watch cache keeps a bounded window); ``events.k8s.io`` is not
    served. RBAC: no aggregated ClusterRoles, no non-resource URLs, no impersonation.
  * Unless ``hold_garbage_collection()`` was called, a TrainJob's JobSet and pods are deleted (and the pods
    terminated) within its DELETE request; held, each step waits for ``collect_garbage()`` (_gc.py).
  * Execute mode does not restart a failing command (a non-zero exit fails the job at once, whatever the
    runtime's restartPolicy) unless the pod was disrupted (then the podFailurePolicy applies); Job objects are not
    served (their failure shows as an Event on ``<job>-node-0``); a lost node and scheduler preemption are
    simulated (_disruption.py), drains and kubelet evictions are not; a preempted pod's replacement always finds
    room (the preemptor is not simulated as holding the node).
  * Secrets are seeded (``add_object``), not created through the API, and hold no data the kubelet reads. The
    controllers' retries are not repeated as events: one ``FailedCreate`` / ``TrainJobResourcesCreationFailed``
    event (count 1) stands for the series a cluster aggregates. Pod validation covers resource requests and
    limits only.
  * Only the ``node`` replicated job gets pods; other replicated jobs of a runtime (initializers) are reported as
    succeeded in ``jobsStatus``. ``trainer.command == ["tune", "run"]`` is not rewritten the way the Trainer's
    torchtune path does (no ``PET_*`` env is injected then, as upstream).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from ._common import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION
from ._schema import default_crd_dir
from ._types import DEFAULT_LOG_LINES, RecordedRequest, Scenario
from ._workload import expand_kube_vars
from .standin import KubeStandin

__all__ = [
    "DEFAULT_LOG_LINES",
    "TRAINER_API_VERSION",
    "TRAINER_GROUP",
    "TRAINER_VERSION",
    "KubeStandin",
    "RecordedRequest",
    "Scenario",
    "default_crd_dir",
    "expand_kube_vars",
    "kube_standin",
]


@pytest.fixture
def kube_standin(request) -> Iterator[KubeStandin]:
    """A started stand-in (namespace ``team-a``) with ClusterTrainingRuntime ``torch-distributed`` seeded.

    At the end no TrainJob a launcher created may still run, unless launched with cleanup policy ``never``. A test
    that failed (also by its timeout) gets the stand-in's state and logs in its report."""
    with KubeStandin(namespace="team-a") as kube:
        kube.add_runtime("torch-distributed")
        yield kube
        if getattr(request.node, "call_report", None) is not None and request.node.call_report.failed:
            print(f"kube-standin at the failure:\n{kube.state_report()}", file=sys.stderr)
        outliving = kube.outliving_trainjobs()
        assert not outliving, f"TrainJobs still running after their step ended: {outliving}"
