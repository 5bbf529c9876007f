"""runtimes/: every manifest validates against the Trainer v2.3 typed models (and the CRDs when
KFP_FINETUNE_CRD_DIR points at them), kustomize is consistent, RBAC is minimal."""

from __future__ import annotations

import functools
import importlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from kfp_finetune.components.torchtune_finetune.backends.trainjob.manifest import NODE
from tests.deploy.kustomize_components import apply_component, build_with_components
from tests.support.kube_standin._typed_schema import typed_model_errors

REPO = Path(__file__).resolve().parents[2]
RUNTIMES = REPO / "runtimes"
# The upstream CRD files are not part of the repository: CI points KFP_FINETUNE_CRD_DIR at them (.ci/run).
CRD_DIR = Path(os.environ["KFP_FINETUNE_CRD_DIR"]) if os.environ.get("KFP_FINETUNE_CRD_DIR") else None
needs_crds = pytest.mark.skipif(CRD_DIR is None, reason="KFP_FINETUNE_CRD_DIR is not set")
CRD_FILES = {
    "TrainJob": "trainer.kubeflow.org_trainjobs.yaml",
    "TrainingRuntime": "trainer.kubeflow.org_trainingruntimes.yaml",
    "ClusterTrainingRuntime": "trainer.kubeflow.org_clustertrainingruntimes.yaml",
}
_RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


# --- Strict checks: the typed models always, the CRD schema too when given -------------------------------------


def manifest_errors(obj: dict) -> list[str]:
    """Violations of the object's typed model (unknown fields, types, required) and, with KFP_FINETUNE_CRD_DIR
    set, of its CRD schema (also enums, sizes, patterns)."""
    from kubeflow_trainer_api import models

    kind = obj.get("kind")
    if kind not in CRD_FILES:
        return [f"kind {kind!r} is not a Trainer CRD"]
    model = getattr(models, f"TrainerV1alpha1{kind}")
    errors = [f"{path}: {message}" for path, message in typed_model_errors(obj, model)]
    name = obj.get("metadata", {}).get("name", "")
    if kind == "TrainJob" and not (_RFC1035.match(name) and len(name) <= 63):
        errors.append(f"metadata.name {name!r} is not an RFC 1035 label of at most 63 characters")
    if obj.get("apiVersion") != "trainer.kubeflow.org/v1alpha1":
        errors.append(f"apiVersion {obj.get('apiVersion')!r}")
    return errors + (crd_errors(obj) if CRD_DIR else [])


# --- A strict structural-schema check, like `kubectl apply --validate=strict` against the CRD ----------------


@functools.cache
def crd_schema(kind: str) -> dict:
    crd = yaml.safe_load((CRD_DIR / CRD_FILES[kind]).read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1alpha1"]
    return version["schema"]["openAPIV3Schema"]


def crd_errors(obj: dict) -> list[str]:
    """Violations of the object's CRD schema: unknown fields, types, required, enums, sizes, patterns."""
    kind = obj["kind"]
    errors: list[str] = []
    body = {k: v for k, v in obj.items() if k != "metadata"}  # metadata is ObjectMeta, checked by the server
    _check(
        body,
        {**crd_schema(kind), "properties": {**crd_schema(kind)["properties"], "metadata": {}}},
        "",
        errors,
    )
    return errors


def _check(value: Any, schema: dict, path: str, errors: list[str]) -> None:
    if not schema:
        return
    if schema.get("x-kubernetes-int-or-string"):
        if not isinstance(value, int | str) or isinstance(value, bool):
            errors.append(f"{path}: must be an integer or a string")
        elif isinstance(value, str) and not re.search(_string_branch(schema).get("pattern", ""), value):
            errors.append(f"{path}: {value!r} is not a valid quantity")
        return
    expected = schema.get("type")
    checks = {
        "object": lambda v: isinstance(v, dict),
        "array": lambda v: isinstance(v, list),
        "string": lambda v: isinstance(v, str),
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
    }
    if expected and not checks[expected](value):
        errors.append(f"{path}: expected {expected}, got {type(value).__name__}")
        return
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{path}: {value!r} not one of {schema['enum']}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errors.append(f"{path}: longer than {schema['maxLength']}")
        if "minLength" in schema and len(value) < schema["minLength"]:
            errors.append(f"{path}: shorter than {schema['minLength']}")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            errors.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, int) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{path}: below {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{path}: above {schema['maximum']}")
    if isinstance(value, list):
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{path}: more than {schema['maxItems']} items")
        if "minItems" in schema and len(value) < schema["minItems"]:
            errors.append(f"{path}: fewer than {schema['minItems']} items")
        keys = schema.get("x-kubernetes-list-map-keys")
        if schema.get("x-kubernetes-list-type") == "map" and keys:
            seen = [tuple(item.get(k) for k in keys) for item in value if isinstance(item, dict)]
            if len(seen) != len(set(seen)):
                errors.append(f"{path}: duplicate entries for key {keys}")
        for index, item in enumerate(value):
            _check(item, schema.get("items", {}), f"{path}[{index}]", errors)
    if isinstance(value, dict):
        properties = schema.get("properties")
        for key in schema.get("required", []):
            if key not in value:
                errors.append(f"{path}: missing required field {key!r}")
        for key, item in value.items():
            child = f"{path}.{key}" if path else key
            if properties is not None and key in properties:
                _check(item, properties[key], child, errors)
            elif isinstance(schema.get("additionalProperties"), dict):
                _check(item, schema["additionalProperties"], child, errors)
            elif properties is not None and not schema.get("x-kubernetes-preserve-unknown-fields"):
                errors.append(f"{child}: unknown field")


def _string_branch(schema: dict) -> dict:
    return next((s for s in schema.get("anyOf", []) if s.get("type") == "string"), {})


# --- runtimes/ ----------------------------------------------------------------------------------------------


def runtime_documents() -> list[tuple[str, dict]]:
    return [
        (path.name, doc)
        for path in sorted(RUNTIMES.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for doc in yaml.safe_load_all(path.read_text())
        if doc
    ]


def runtimes_by_name() -> dict[str, dict]:
    return {
        doc["metadata"]["name"]: doc
        for _, doc in runtime_documents()
        if doc["kind"].endswith("TrainingRuntime")
    }


# The variants: runtimes/ with kustomize components applied. Each component alone, and gang scheduling with RDMA
# as runtimes/README.md suggests; "default" is the plain `kubectl apply -k runtimes/`.
COMPONENTS = RUNTIMES / "components"
VARIANTS = {
    "default": [],
    "coscheduling": ["coscheduling"],
    "volcano": ["volcano"],
    "rdma": ["rdma"],
    "coscheduling+rdma": ["coscheduling", "rdma"],
    "volcano+rdma": ["volcano", "rdma"],
}
RUNTIME_NAMES = ["torchtune", "torchtune-cpu", "transformers", "transformers-cpu"]
GPU_RUNTIMES = ["torchtune", "transformers"]


def variant_documents(variant: str) -> list[dict]:
    return build_with_components(RUNTIMES, [COMPONENTS / name for name in VARIANTS[variant]])


def variant_runtimes(variant: str) -> dict[str, dict]:
    return {
        doc["metadata"]["name"]: doc
        for doc in variant_documents(variant)
        if doc["kind"].endswith("TrainingRuntime")
    }


def test_kustomization_lists_every_manifest_and_nothing_else():
    kustomization = yaml.safe_load((RUNTIMES / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    on_disk = sorted(p.name for p in RUNTIMES.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(listed) == len(set(listed))
    # The default install stays the plain list: the variants are opt-in components.
    assert set(kustomization) == {"apiVersion", "kind", "resources"}
    readme = (RUNTIMES / "README.md").read_text()
    assert "kubectl apply -k runtimes/" in readme
    for name in on_disk:
        assert f"`{name}`" in readme, f"runtimes/README.md does not describe {name}"
    components = sorted(p.name for p in COMPONENTS.iterdir() if p.is_dir())
    assert components == sorted(v for v, names in VARIANTS.items() if names == [v])  # each one is tested
    for name in components:
        assert f"`components/{name}/`" in readme, f"runtimes/README.md does not describe components/{name}/"


def test_object_names_are_unique_per_kind_and_namespace():
    keys = [
        (doc["kind"], doc["metadata"].get("namespace"), doc["metadata"]["name"])
        for _, doc in runtime_documents()
    ]
    assert len(keys) == len(set(keys)), keys


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("name", RUNTIME_NAMES)
@pytest.mark.slow
def test_runtime_validates_against_crd_and_typed_models(variant, name):
    from kubeflow_trainer_api.models import TrainerV1alpha1ClusterTrainingRuntime

    runtime = variant_runtimes(variant)[name]
    if variant == "default":
        assert runtime == runtimes_by_name()[name]
    assert manifest_errors(runtime) == []
    model = TrainerV1alpha1ClusterTrainingRuntime.from_dict(runtime)
    assert model.spec.ml_policy.torch is not None
    assert model.to_dict()["spec"].get("podGroupPolicy") == runtime["spec"].get("podGroupPolicy")
    assert model.to_dict()["spec"]["template"]["spec"] == runtime["spec"]["template"][
        "spec"
    ] or _same_quantities(model.to_dict()["spec"]["template"]["spec"], runtime["spec"]["template"]["spec"])


def _same_quantities(a: Any, b: Any) -> bool:
    """Equal up to quantities written as numbers vs strings."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same_quantities(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same_quantities(x, y) for x, y in zip(a, b, strict=True))
    return str(a) == str(b)


def test_typed_model_check_catches_unknown_and_mistyped_fields():
    runtime = yaml.safe_load(yaml.safe_dump(runtimes_by_name()["torchtune"]))
    runtime["spec"]["mlPolicy"]["numNode"] = 1
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"] = 3
    errors = manifest_errors(runtime)
    assert any("image in body must be of type string" in e for e in errors), errors
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"] = "trainer:1"
    assert any(
        e.startswith('spec.mlPolicy.numNode: unknown field "spec.mlPolicy.numNode"')
        for e in manifest_errors(runtime)
    )


@needs_crds
def test_crd_check_catches_unknown_and_mistyped_fields():
    runtime = yaml.safe_load(yaml.safe_dump(runtimes_by_name()["torchtune"]))
    runtime["spec"]["mlPolicy"]["numNode"] = 1
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"] = 3
    errors = crd_errors(runtime)
    assert any("spec.mlPolicy.numNode: unknown field" in e for e in errors)
    assert any(e.endswith("image: expected string, got int") for e in errors)


@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_runtime_has_only_the_trainer_node_job_with_shm_and_no_owned_pvc(name):
    runtime = runtimes_by_name()[name]
    template = runtime["spec"]["template"]["spec"]
    assert "volumeClaimPolicies" not in template
    assert "initializer" not in yaml.safe_dump(runtime)
    (job,) = template["replicatedJobs"]
    assert job["name"] == NODE
    # The Trainer finds the trainer container through this label (Builder.Trainer, Torch.EnforceMLPolicy).
    assert job["template"]["metadata"]["labels"]["trainer.kubeflow.org/trainjob-ancestor-step"] == "trainer"
    pod = job["template"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["name"] == NODE
    shm = {v["name"]: v for v in pod["volumes"]}[
        next(m["name"] for m in container["volumeMounts"] if m["mountPath"] == "/dev/shm")
    ]
    assert shm["emptyDir"]["medium"] == "Memory"
    assert all("persistentVolumeClaim" not in v for v in pod["volumes"])
    assert runtime["spec"]["mlPolicy"]["torch"] == {}
    limits = container.get("resources", {}).get("limits", {})
    assert ("nvidia.com/gpu" in limits) == (name in GPU_RUNTIMES)


def _runtime_jobs() -> list[tuple[str, dict]]:
    """Every runtime's jobs, the variants' included: gang scheduling and RDMA keep the failure policy."""
    files = [(path, doc) for path, doc in runtime_documents() if doc["kind"].endswith("TrainingRuntime")]
    variants = [(variant, doc) for variant in VARIANTS for doc in variant_runtimes(variant).values()]
    return [
        (f"{where}:{doc['metadata']['name']}/{job['name']}", job)
        for where, doc in files + variants
        for job in doc["spec"]["template"]["spec"]["replicatedJobs"]
    ]


@pytest.mark.parametrize("where, job", _runtime_jobs(), ids=[where for where, _ in _runtime_jobs()])
def test_runtime_fails_fast_on_a_trainer_crash(where, job):
    """A crash fails the TrainJob at once and its pod (exit code, OOMKilled, log) is kept: without these, JobSet
    defaults restartPolicy to OnFailure and the Job backoffLimit to 6 (7 attempts, then the pods are deleted)."""
    job_spec = job["template"]["spec"]
    assert job_spec["template"]["spec"].get("restartPolicy") == "Never", where
    assert job_spec.get("backoffLimit") == 0, where
    rules = (job_spec.get("podFailurePolicy") or {}).get("rules") or []
    ignore = [i for i, r in enumerate(rules) if r["action"] == "Ignore" and r.get("onPodConditions")]
    assert any(
        c["type"] == "DisruptionTarget" and c.get("status", "True") == "True"
        for i in ignore
        for c in rules[i]["onPodConditions"]
    ), f"{where}: a preemption (DisruptionTarget) must be retried, not fail the job"
    fail_job = [
        i
        for i, r in enumerate(rules)
        if r["action"] == "FailJob"
        and r.get("onExitCodes") == {"containerName": NODE, "operator": "NotIn", "values": [0]}
    ]
    assert fail_job, f"{where}: no FailJob rule on the node container's non-zero exit codes"
    assert min(ignore) < min(fail_job), f"{where}: rules apply in order; a preempted pod also exits non-zero"


@pytest.mark.parametrize("where, job", _runtime_jobs(), ids=[where for where, _ in _runtime_jobs()])
def test_a_node_pod_that_stopped_for_another_nodes_pod_is_replaced_and_only_that(where, job):
    """On several nodes a preempted pod's training stops the others' at the same step; they exit 75 and must be
    replaced as the preempted one is (every new pod resumes), ahead of the FailJob rule. A SIGTERM'd one (143: a
    lapsed lease stops the training that way) must still fail the TrainJob."""
    from kfp_finetune.components._shared.stop_exit import OTHER_POD_STOPPING

    rules = job["template"]["spec"]["podFailurePolicy"]["rules"]
    on_codes = [(i, r) for i, r in enumerate(rules) if "onExitCodes" in r]
    ignored = [(i, r["onExitCodes"]) for i, r in on_codes if r["action"] == "Ignore"]
    assert [codes for _, codes in ignored] == [
        {"containerName": NODE, "operator": "In", "values": [OTHER_POD_STOPPING]}
    ], where
    assert ignored[0][0] < min(i for i, r in on_codes if r["action"] == "FailJob"), where


@pytest.mark.parametrize("where, job", _runtime_jobs(), ids=[where for where, _ in _runtime_jobs()])
def test_a_stopping_node_pod_asks_its_training_to_save_before_the_sigterm(where, job):
    """The node container's preStop hook asks the training to save and waits for it (torchrun SIGKILLs its workers
    30 s after a SIGTERM), within a grace period longer than Kubernetes' default 30 s."""
    from kfp_finetune.components._shared.stop_request import HOOK_COMMAND

    pod = job["template"]["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == NODE]
    assert container["lifecycle"]["preStop"] == {"exec": {"command": list(HOOK_COMMAND)}}, where
    assert pod["terminationGracePeriodSeconds"] > 30, where


# --- Variants: what each component changes, and nothing else -------------------------------------------------

# The scheduler names the schedulers' own installs use: scheduler-plugins' as-a-second-scheduler chart, Volcano.
GANG_SCHEDULERS = {"coscheduling": "scheduler-plugins-scheduler", "volcano": "volcano"}
RDMA_RESOURCE = "rdma/rdma_shared_device_a"
NCCL_VARIABLES = {"NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "NCCL_IB_GID_INDEX", "NCCL_DEBUG"}


def _pod(runtime: dict) -> dict:
    return runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("variant", GANG_SCHEDULERS)
@pytest.mark.parametrize("name", RUNTIME_NAMES)
def test_gang_variant_adds_only_the_pod_group_policy_and_scheduler(variant, name):
    """Trainer's plugin labels or annotates the pods with their PodGroup itself; the runtime only chooses the
    policy and the scheduler that honours it."""
    runtime = variant_runtimes(variant)[name]
    assert list(runtime["spec"]["podGroupPolicy"]) == [variant]
    assert _pod(runtime)["schedulerName"] == GANG_SCHEDULERS[variant]
    del runtime["spec"]["podGroupPolicy"], _pod(runtime)["schedulerName"]
    assert runtime == runtimes_by_name()[name]


@pytest.mark.parametrize("variant", [v for v in VARIANTS if "rdma" in VARIANTS[v]])
def test_rdma_variant_sets_devices_and_nccl_on_the_gpu_runtimes_node_containers_only(variant):
    runtimes = variant_runtimes(variant)
    without_rdma = variant_runtimes(variant.removesuffix("+rdma") if "+" in variant else "default")
    for name in GPU_RUNTIMES:
        runtime = runtimes[name]
        assert runtime["metadata"]["labels"]["kfp-finetune.io/network"] == "rdma"
        (container,) = _pod(runtime)["containers"]
        assert container["name"] == NODE
        assert container["resources"]["limits"][RDMA_RESOURCE] == 1
        assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
        env = {e["name"]: e["value"] for e in container["env"]}
        nccl = {k: v for k, v in env.items() if k.startswith("NCCL_")}
        assert set(nccl) == NCCL_VARIABLES
        # Safe where the fabric differs or is absent: NCCL's automatic GID choice, HCAs by prefix, and interfaces
        # as an exclusion list (an exact name that does not exist stops NCCL's bootstrap).
        assert (nccl["NCCL_IB_DISABLE"], nccl["NCCL_IB_GID_INDEX"], nccl["NCCL_DEBUG"]) == ("0", "-1", "WARN")
        assert nccl["NCCL_SOCKET_IFNAME"].startswith("^") and "=" not in nccl["NCCL_IB_HCA"]
        # Nothing else changed.
        del runtime["metadata"]["labels"]["kfp-finetune.io/network"], container["securityContext"]
        del container["resources"]["limits"][RDMA_RESOURCE]
        container["env"] = [e for e in container["env"] if e["name"] not in nccl]
        assert runtime == without_rdma[name]
    # The CPU runtimes (small single-node jobs) not at all.
    for name in set(RUNTIME_NAMES) - set(GPU_RUNTIMES):
        assert runtimes[name] == without_rdma[name]


@pytest.mark.parametrize("component", [v for v, names in VARIANTS.items() if names == [v]])
def test_component_refuses_a_runtime_whose_first_job_or_container_is_not_node(component):
    """The patches address the job and container by index; their `test` operations stop the build instead."""
    runtime = yaml.safe_load(yaml.safe_dump(runtimes_by_name()["torchtune"]))
    runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["name"] = "launcher"
    _pod(runtime)["containers"][0]["name"] = "sidecar"
    with pytest.raises(ValueError, match="test failed at /spec/template/spec/replicatedJobs/0/"):
        apply_component([runtime], COMPONENTS / component)


def test_registry_overlays_commented_components_build_valid_runtimes():
    """images/registry-overlay offers the components as commented-out lines; uncommented, they build."""
    overlay = REPO / "images" / "registry-overlay"
    lines = (overlay / "kustomization.yaml").read_text().splitlines()
    block = [line.removeprefix("# ") for line in lines if line.startswith(("# components:", "#   - "))]
    components = [(overlay / path).resolve() for path in yaml.safe_load("\n".join(block))["components"]]
    assert components and all(component.parent == COMPONENTS for component in components)
    built = build_with_components(RUNTIMES, components)
    runtimes = [doc for doc in built if doc["kind"].endswith("TrainingRuntime")]
    assert runtimes and all(manifest_errors(runtime) == [] for runtime in runtimes)


needs_kubectl = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def _kubectl_kustomize(overlay_dir: Path, base: Path, components: list[str]) -> subprocess.CompletedProcess:
    """`kubectl kustomize` of an overlay in `overlay_dir`: `base` plus the named components of runtimes/."""
    overlay = {  # kustomize takes relative paths only
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(base, overlay_dir)],
        "components": [os.path.relpath(COMPONENTS / name, overlay_dir) for name in components],
    }
    (overlay_dir / "kustomization.yaml").write_text(yaml.safe_dump(overlay))
    command = ["kubectl", "kustomize", str(overlay_dir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


@needs_kubectl
@pytest.mark.parametrize("variant", VARIANTS)
def test_python_build_matches_kubectl_kustomize(variant, tmp_path):
    """An overlay of the user's (runtimes/ plus components) builds with kustomize as the tests build it."""
    built = _kubectl_kustomize(tmp_path, RUNTIMES, VARIANTS[variant])
    assert built.returncode == 0, built.stderr

    def keyed(documents) -> dict:
        return {(doc["kind"], doc["metadata"]["name"]): doc for doc in documents}

    assert keyed(yaml.safe_load_all(built.stdout)) == keyed(variant_documents(variant))


@needs_kubectl
def test_kubectl_kustomize_stops_at_a_failed_test_operation(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    runtime = yaml.safe_load(yaml.safe_dump(runtimes_by_name()["torchtune"]))
    _pod(runtime)["containers"][0]["name"] = "sidecar"
    (base / "torchtune.yaml").write_text(yaml.safe_dump(runtime))
    (base / "kustomization.yaml").write_text(yaml.safe_dump({"resources": ["torchtune.yaml"]}))
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    built = _kubectl_kustomize(overlay, base, ["rdma"])
    assert built.returncode != 0, built.stdout
    assert "testing value /spec/template/spec/replicatedJobs/0/template/spec/template/spec/containers/0/" in (
        built.stderr
    )


def test_runtimes_use_their_engines_default_trainer_image(monkeypatch):
    from kfp_finetune.components._shared import images

    monkeypatch.delenv("KFP_FINETUNE_TRAINER_IMAGE", raising=False)
    monkeypatch.delenv("KFP_FINETUNE_TRANSFORMERS_TRAINER_IMAGE", raising=False)
    module = importlib.reload(images)
    try:
        for name, runtime in runtimes_by_name().items():
            expected = (
                module.TRANSFORMERS_TRAINER_IMAGE if name.startswith("transformers") else module.TRAINER_IMAGE
            )
            assert _pod(runtime)["containers"][0]["image"] == expected, name
    finally:
        monkeypatch.undo()
        importlib.reload(images)


# --- RBAC (what the backend really calls is checked against rbac.yaml in tests/deploy/test_rbac.py) -------------------


def rbac_documents() -> list[dict]:
    return [
        doc for _, doc in runtime_documents() if doc["apiVersion"].startswith("rbac.authorization.k8s.io/")
    ]


def test_rbac_is_least_privilege():
    for doc in rbac_documents():
        for rule in doc.get("rules", []):
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            writes = {"update", "patch", "deletecollection", "escalate", "bind"} & set(rule["verbs"])
            # One exception: a retry adds its pod to a TrainJob's owners (owner.py). No escalation: whoever may
            # create and delete a TrainJob may already replace it whole.
            if rule["resources"] == ["trainjobs"]:
                writes -= {"patch"}
            assert not writes, (rule, writes)
    # Cluster-wide grants are limited to reading cluster-scoped runtimes.
    for binding in (d for d in rbac_documents() if d["kind"] == "ClusterRoleBinding"):
        role = next(d for d in rbac_documents() if d["metadata"]["name"] == binding["roleRef"]["name"])
        assert [r["resources"] for r in role["rules"]] == [["clustertrainingruntimes"]]
        assert {v for r in role["rules"] for v in r["verbs"]} <= {"get", "list"}
    namespaced = [d for d in rbac_documents() if d["kind"] == "RoleBinding"]
    assert namespaced and all(d["metadata"]["namespace"] == "kubeflow" for d in namespaced)
