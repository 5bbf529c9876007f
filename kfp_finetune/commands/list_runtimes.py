"""`kfp-finetune list-runtimes`: the Kubeflow Trainer runtimes a fine-tune step can use.

Lists ClusterTrainingRuntimes (and, with --namespace, that namespace's TrainingRuntimes) with their framework label,
the `node` container image, the nodes (mlPolicy.numNodes) and the devices per node (the accelerators the `node`
container asks for: limits, else requests, of every resource but cpu/memory/storage, e.g. `nvidia.com/gpu: 8`;
"cpu" when none); the ones kfp-finetune ships (runtimes/) are marked.
"""

from __future__ import annotations

import argparse
import json
import sys

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
SHIPPED_LABEL = ("app.kubernetes.io/part-of", "kfp-finetune")  # set on every manifest in runtimes/
NODE = "node"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--namespace", help="also list the TrainingRuntimes of this namespace")
    parser.add_argument(
        "--kubeconfig", help="kubeconfig file (default: in-cluster account, $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument(
        "--kube-context", "--context", dest="context", help="kubeconfig context (default: the current one)"
    )
    parser.add_argument("--output", "-o", choices=["table", "json"], default="table", help="default: table")


def summarize(runtime: dict) -> dict:
    """The columns we show for one runtime object."""
    metadata = runtime.get("metadata") or {}
    labels = metadata.get("labels") or {}
    spec = runtime.get("spec") or {}
    return {
        "kind": runtime.get("kind", ""),
        "name": metadata.get("name", ""),
        "namespace": metadata.get("namespace"),
        "framework": labels.get(FRAMEWORK_LABEL, ""),
        "image": node_image(spec),
        "numNodes": (spec.get("mlPolicy") or {}).get("numNodes"),
        "devicesPerNode": devices_per_node(spec),
        "kfpFinetune": labels.get(SHIPPED_LABEL[0]) == SHIPPED_LABEL[1],
    }


def node_container(spec: dict) -> dict:
    """The trainer (`node`) container of the runtime's `node` job (what TrainJob.spec.trainer overrides)."""
    jobs = ((spec.get("template") or {}).get("spec") or {}).get("replicatedJobs") or []
    for job in sorted(jobs, key=lambda j: j.get("name") != NODE):
        pod = ((((job.get("template") or {}).get("spec") or {}).get("template") or {}).get("spec")) or {}
        containers = pod.get("containers") or []
        for container in sorted(containers, key=lambda c: c.get("name") != NODE):
            if container.get("image"):
                return container
    return {}


def node_image(spec: dict) -> str:
    return node_container(spec).get("image", "")


_NOT_DEVICES = ("cpu", "memory", "ephemeral-storage", "hugepages-")


def devices_per_node(spec: dict) -> dict[str, str]:
    """Accelerators one node's trainer asks for (resource name -> count): limits win over requests."""
    resources = node_container(spec).get("resources") or {}
    found = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
    return {name: str(count) for name, count in sorted(found.items()) if not name.startswith(_NOT_DEVICES)}


def fetch(api, namespace: str | None) -> list[dict]:
    from kubernetes import client

    custom = client.CustomObjectsApi(api)
    found = custom.list_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes").get("items") or []
    for item in found:
        item.setdefault("kind", "ClusterTrainingRuntime")
    if namespace:
        namespaced = custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes")
        for item in namespaced.get("items") or []:
            item.setdefault("kind", "TrainingRuntime")
            found.append(item)
    return found


def explain(error) -> str:
    if error.status == 404:
        return f"{GROUP}/{VERSION} is not served: is Kubeflow Trainer v2 installed on this cluster?"
    if error.status in (401, 403):
        return (
            f"not allowed to list training runtimes ({error.status} {error.reason}); listing ClusterTrainingRuntimes "
            "needs a ClusterRole granting list on clustertrainingruntimes.trainer.kubeflow.org"
        )
    return f"the Kubernetes API answered {error.status} {error.reason}"


def render(rows: list[dict]) -> str:
    header = ["KIND", "NAME", "FRAMEWORK", "NODES", "DEVICES/NODE", "IMAGE", "KFP-FINETUNE"]
    table = [header] + [
        [
            row["kind"] + (f" ({row['namespace']})" if row["namespace"] else ""),
            row["name"],
            row["framework"] or "-",
            "-" if row["numNodes"] is None else str(row["numNodes"]),
            ", ".join(f"{count} {name}" for name, count in row["devicesPerNode"].items()) or "cpu",
            row["image"] or "-",
            "yes" if row["kfpFinetune"] else "",
        ]
        for row in rows
    ]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in table
    )


def run(args: argparse.Namespace) -> int:
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config.config_exception import ConfigException
    from urllib3.exceptions import HTTPError

    from kfp_finetune.components._shared.kube.client import load_api_client

    try:
        api = load_api_client(args.kubeconfig, context=args.context)
    except (ConfigException, OSError) as error:
        print(f"error: no usable Kubernetes credentials: {error}", file=sys.stderr)
        return 2
    try:
        with api:
            items = fetch(api, args.namespace)
    except ApiException as error:
        print(f"error: {explain(error)}", file=sys.stderr)
        return 1
    except HTTPError as error:
        print(f"error: cannot reach the Kubernetes API: {error}", file=sys.stderr)
        return 1
    rows = sorted(
        (summarize(item) for item in items), key=lambda r: (r["kind"], r["namespace"] or "", r["name"])
    )
    if args.output == "json":
        print(json.dumps(rows, indent=2))
    elif rows:
        print(render(rows))
    else:
        print("no training runtimes found (install ours with `kubectl apply -k runtimes/`)", file=sys.stderr)
    return 0
