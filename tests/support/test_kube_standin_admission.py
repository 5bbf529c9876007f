"""The stand-in's authorization (RBAC) and the Trainer admission webhook, through the real ``kubernetes`` client."""

from __future__ import annotations

import json

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.support import kube_standin as standin
from tests.support.kube_standin import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION, KubeStandin

kube_standin = standin.kube_standin  # the shared fixture: a started stand-in with runtime torch-distributed

NS = "team-a"
USER = 'User "system:serviceaccount:team-a:launcher"'
ROLES = [
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "reader", "namespace": NS},
        "rules": [
            {"apiGroups": [""], "resources": ["pods", "pods/log"], "verbs": ["get", "list"]},
            {"apiGroups": [TRAINER_GROUP], "resources": ["trainjobs"], "verbs": ["list"]},
        ],
    },
    {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "reader", "namespace": NS},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "launcher", "namespace": NS}],
    },
]


def status_of(error: ApiException) -> dict:
    return json.loads(error.body)


def forbidden(call, *args, **kwargs) -> dict:
    with pytest.raises(ApiException) as raised:
        call(*args, **kwargs)
    assert raised.value.status == 403
    status = status_of(raised.value)
    assert status["reason"] == "Forbidden"
    return status


# --- RBAC ---------------------------------------------------------------------------------------------------------


def review(api, verb: str, resource: str, subresource: str = "", group: str = "") -> bool:
    attributes = client.V1ResourceAttributes(
        namespace=NS, verb=verb, group=group, resource=resource, subresource=subresource or None
    )
    body = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
    )
    return client.AuthorizationV1Api(api).create_self_subject_access_review(body).status.allowed


def test_self_subject_access_reviews_answer_what_a_request_would_meet(kube_standin):
    api = kube_standin.api_client()
    assert review(api, "delete", "trainjobs", group=TRAINER_GROUP)  # no RBAC enforced: anything goes
    kube_standin.enforce_rbac(ROLES, service_account=f"{NS}:launcher")
    assert review(api, "get", "pods", "log") and review(api, "list", "trainjobs", group=TRAINER_GROUP)
    assert not review(api, "watch", "pods") and not review(api, "delete", "trainjobs", group=TRAINER_GROUP)
    assert not review(api, "list", "trainjobs")  # the core group grants nothing here
    # Any authenticated user may ask (system:basic-user); the review itself is not an authorization decision.
    assert all(a.attributes.resource != "selfsubjectaccessreviews" for a in kube_standin.authorizations)


def test_rbac_forbids_what_no_binding_grants_with_the_apiservers_message(kube_standin):
    assert kube_standin.enforce_rbac(ROLES, service_account=f"{NS}:launcher") == USER.split('"')[1]
    api = kube_standin.api_client()
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    assert core.list_namespaced_pod(NS).items == []
    custom.list_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs")

    status = forbidden(core.list_namespaced_pod, NS, watch=True, _preload_content=False)
    assert status["message"] == (
        f'pods is forbidden: {USER} cannot watch resource "pods" in API group "" in the namespace "{NS}"'
    )
    status = forbidden(core.list_namespaced_pod, NS, field_selector="metadata.name=p", watch=True)
    assert status["message"].startswith(f'pods "p" is forbidden: {USER} cannot watch resource "pods"')
    status = forbidden(
        custom.get_namespaced_custom_object, TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", "x"
    )
    assert status["message"] == (
        f'trainjobs.{TRAINER_GROUP} "x" is forbidden: {USER} cannot get resource "trainjobs" in API group '
        f'"{TRAINER_GROUP}" in the namespace "{NS}"'
    )
    assert status["details"] == {"name": "x", "group": TRAINER_GROUP, "kind": "trainjobs"}
    # A Role grants only in its namespace; cluster-scoped resources need a ClusterRoleBinding.
    status = forbidden(core.list_namespaced_pod, "other")
    assert status["message"].endswith('in the namespace "other"')
    status = forbidden(
        custom.get_cluster_custom_object, TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", "t"
    )
    assert status["message"].endswith(f'cannot get resource "clustertrainingruntimes" in API group "{TRAINER_GROUP}" '
                                      "at the cluster scope")  # fmt: skip
    # Subresources are granted on their own (pods/log is, pods/exec is not); authorization comes before the
    # server knows the object (a 403, not a 404).
    with pytest.raises(ApiException) as raised:
        core.read_namespaced_pod_log("no-such-pod", NS)
    assert raised.value.status == 404
    status = forbidden(core.connect_get_namespaced_pod_exec, "no-such-pod", NS, command="ls")
    assert 'cannot get resource "pods/exec" in API group ""' in status["message"]

    recorded = [(d.attributes.key, d.allowed) for d in kube_standin.authorizations]
    assert recorded[:3] == [
        (("list", "", "pods", "", NS), True),
        (("list", TRAINER_GROUP, "trainjobs", "", NS), True),
        (("watch", "", "pods", "", NS), False),
    ]
    assert (("get", "", "pods", "log", NS), True) in recorded
    assert {d.user for d in kube_standin.authorizations} == {USER.split('"')[1]}


def test_without_rbac_every_call_is_recorded_and_allowed(kube_standin):
    client.CoreV1Api(kube_standin.api_client()).list_namespaced_pod(NS, watch=False)
    (decision,) = kube_standin.authorizations
    assert decision.allowed and decision.attributes.key == ("list", "", "pods", "", NS)


# --- the Trainer admission webhook (kubeflow/trainer v2.3 pkg/webhooks, pkg/runtime) ----------------------------


def create(kube: KubeStandin, **spec) -> dict:
    spec.setdefault("runtimeRef", {"name": "torch-distributed"})
    body = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": "job"}, "spec": spec}
    return client.CustomObjectsApi(kube.api_client()).create_namespaced_custom_object(
        TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body
    )


def patch(manager: str = "kfp-finetune.io/launcher", job: str = "node", **pod_spec) -> dict:
    replicated = {"name": job, "template": {"spec": {"template": {"spec": pod_spec}}}}
    return {
        "manager": manager,
        "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [replicated]}}},
    }


DENIED = 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request: '


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"runtimePatches": [patch("kfp-finetune")]},
            'spec.runtimePatches.manager: Invalid value: "kfp-finetune": must be a domain-prefixed path '
            '(such as "acme.io/foo")',
        ),
        (
            {"runtimePatches": [patch("Not_A_Domain/launcher")]},
            'spec.runtimePatches.manager: Invalid value: "Not_A_Domain": a lowercase RFC 1123 subdomain',
        ),
        (
            {"runtimePatches": [patch(job="launcher")]},
            "must not have replicated job that doesn't exist in the runtime job template",
        ),
        (
            {"runtimePatches": [patch(containers=[{"name": "sidecar"}])]},
            "must not have container that doesn't exist in the runtime job node",
        ),
        (
            {"runtimePatches": [patch(initContainers=[{"name": "setup"}])]},
            "must not have initContainer that doesn't exist in the runtime job node",
        ),
        (
            {"runtimePatches": [patch(containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])]},
            "must not have envs for the dataset-initializer, model-initializer, node containers",
        ),
        (
            # The torch plugin checks reserved names whatever the command (also for the torchtune entrypoint).
            {"trainer": {"command": ["tune", "run"], "env": [{"name": "PET_NNODES", "value": "2"}]}},
            "spec.trainer.env: Invalid value: ",
        ),
    ],
)
def test_webhook_denials(kube_standin, spec, message):
    with pytest.raises(ApiException) as raised:
        create(kube_standin, **spec)
    status = status_of(raised.value)
    assert (raised.value.status, status["reason"]) == (403, "Forbidden")  # controller-runtime's Denied
    assert status["message"].startswith(DENIED) and message in status["message"]
    assert kube_standin.trainjobs() == []


def test_webhook_aggregates_every_denial_and_admits_a_valid_patch(kube_standin):
    with pytest.raises(ApiException) as raised:
        create(
            kube_standin,
            runtimePatches=[
                patch("kfp", containers=[{"name": "node", "env": [{"name": "A", "value": "1"}]}])
            ],
            trainer={"env": [{"name": "PET_NODE_RANK", "value": "0"}]},
        )
    message = status_of(raised.value)["message"]
    assert message.startswith(DENIED + "[spec.runtimePatches.manager: ") and message.endswith("]")
    assert "must not have envs" in message and "PET_NODE_RANK" in message

    with pytest.raises(ApiException) as raised:  # the same message twice is said once
        create(kube_standin, runtimePatches=[patch(containers=[{"name": "sidecar"}, {"name": "other"}])])
    message = status_of(raised.value)["message"]
    assert not message.startswith(DENIED + "[") and message.count("must not have container") == 1

    valid = patch(
        containers=[{"name": "node", "volumeMounts": [{"name": "ws", "mountPath": "/ws"}]}],
        volumes=[{"name": "ws", "persistentVolumeClaim": {"claimName": "ws"}}],
    )
    created = create(kube_standin, runtimePatches=[valid], trainer={"env": [{"name": "A", "value": "1"}]})
    assert created["spec"]["runtimePatches"][0]["time"]  # stamped by the defaulting webhook
