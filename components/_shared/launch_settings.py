"""The fine-tune step's own settings (where and how it trains, not what torchtune does): their vocabularies and
checks, here so that pre-flight checks the pipeline's tune_backend, tune_cleanup_policy, tune_timeout_seconds,
tune_gpu_memory_gib, the Kueue settings (tune_queue_name, tune_priority_class, tune_queue_timeout_seconds) and the
network several nodes need with the rules the step applies, before anything is downloaded."""

from __future__ import annotations

import math
import re

from kfp_finetune.components._shared.errors import SettingError, one_of

BACKENDS = ("trainjob", "local")
CLEANUP_POLICIES = ("on-success", "always", "never")
# A recurring (nightly) fine-tune that has not been admitted within a day would meet the next night's run in the
# queue: it gives up then, and says so. 0 waits as long as the queue takes (within the step's own backstop).
DEFAULT_QUEUE_TIMEOUT_SECONDS = 86400
# Kueue's webhook takes the queue-name label as a LocalQueue name (a DNS-1123 subdomain: kueue
# pkg/controller/jobframework/validation.go ValidateLabelAsCRDName); both labels' values must also be label
# values (at most 63 characters). Together: lower-case alphanumerics, '-' and '.', alphanumeric at both ends.
_QUEUE_OBJECT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
MAX_LABEL_VALUE_LENGTH = 63


def problems(
    *,
    backend: str,
    cleanup_policy: str,
    timeout_seconds: int,
    gpu_memory_gib: float,
    queue_name: str = "",
    priority_class: str = "",
    queue_timeout_seconds: int = DEFAULT_QUEUE_TIMEOUT_SECONDS,
) -> list[SettingError]:
    """Each problem named by the step's parameter (backend, cleanup_policy, timeout_seconds, gpu_memory_gib,
    queue_name, priority_class, queue_timeout_seconds)."""
    found = [
        *one_of("backend", backend, BACKENDS),
        *one_of("cleanup_policy", cleanup_policy, CLEANUP_POLICIES),
        *queue_problems(
            queue_name=queue_name, priority_class=priority_class, queue_timeout_seconds=queue_timeout_seconds
        ),
    ]
    if timeout_seconds < 0:
        found.append(SettingError("timeout_seconds", f"must be 0 (no limit) or more (got {timeout_seconds})"))
    if gpu_memory_gib != -1 and not (math.isfinite(gpu_memory_gib) and gpu_memory_gib > 0):
        found.append(
            SettingError(
                "gpu_memory_gib", f"must be the GiB of one GPU, e.g. 80, or -1 (got {gpu_memory_gib})"
            )
        )
    return found


def queue_problems(*, queue_name: str, priority_class: str, queue_timeout_seconds: int) -> list[SettingError]:
    """The Kueue settings: names Kueue's webhook accepts as label values, a timeout of 0 (no limit) or more."""
    found = [
        SettingError(setting, problem)
        for setting, value in (("queue_name", queue_name), ("priority_class", priority_class))
        if (problem := _queue_object_name_problem(value))
    ]
    if queue_timeout_seconds < 0:
        found.append(
            SettingError(
                "queue_timeout_seconds", f"must be 0 (no limit) or more (got {queue_timeout_seconds})"
            )
        )
    return found


def _queue_object_name_problem(value: str) -> str:
    if not value or (len(value) <= MAX_LABEL_VALUE_LENGTH and _QUEUE_OBJECT_NAME.match(value)):
        return ""
    return (
        f"must name a Kueue object as a label value: at most {MAX_LABEL_VALUE_LENGTH} lower-case letters, "
        f"digits, '-' or '.', starting and ending with a letter or digit (got {value!r}); "
        "`kubectl get localqueues` lists the queues of the namespace"
    )


# Several nodes need a fast network between them. FSDP moves about three times the model's weights between the
# GPUs every optimizer step; on an ordinary pod network (TCP, ~10-25 Gb/s) two nodes reach an estimated ~20 % of
# linear scaling, with InfiniBand / RoCE (RDMA, 200-400 Gb/s per GPU) ~80-90 %. A runtime says what it requests:
# the `rdma` kustomize component (runtimes/components/rdma) labels it `kfp-finetune.io/network: rdma`.
NETWORK_LABEL = "kfp-finetune.io/network"
RDMA = "rdma"


def network_problem(runtime: dict, kind: str, name: str, nodes: int, gpus_per_node: int) -> str | None:
    """Why `nodes` nodes with GPUs on this runtime object would train over a slow network, or None (one node, no
    GPUs — CPU training is not network-bound the same way —, or RDMA)."""
    network = ((runtime.get("metadata") or {}).get("labels") or {}).get(NETWORK_LABEL)
    if nodes < 2 or gpus_per_node < 1 or network == RDMA:
        return None
    return (
        f"{nodes} nodes on {kind} {name!r}, which requests no RDMA network (no label {NETWORK_LABEL}: {RDMA}): "
        "FSDP's traffic between the nodes would go over the pod network, an estimated ~20% of linear scaling "
        "(InfiniBand/RoCE: 80-90%)"
    )


def slow_network_fix() -> str:
    return (
        "use a runtime with the rdma component (docs/cluster-install.md, 'Which runtime?'), train on one node "
        "with more GPUs, or set tune_allow_slow_network=true"
    )
