"""Execute mode's disruptions of a training node pod, as a cluster does them (_disruption.py): the scheduler
preempts the pod (DisruptionTarget, the preStop hook, SIGTERM to the command, SIGKILL after the grace period) or its node is lost
(SIGKILL at once, PodGC's mark), and the Job controller applies the runtime's podFailurePolicy: a replacement pod
running the same command, or a failed Job.

The node command is a small Python "trainer": it prints ``Step N |`` lines, waits at step 3 on its first run (so
that the disruption comes there), keeps its step in the workspace on SIGTERM (exit 143) and starts after the kept
step."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import urllib3
from kubernetes import client, watch

from tests.support import kube_standin as standin
from tests.support.kube_standin import TRAINER_API_VERSION, TRAINER_GROUP, TRAINER_VERSION, Scenario

kube_standin = standin.kube_standin  # the shared fixture: a started stand-in with runtime torch-distributed

pytestmark = pytest.mark.slow

NS = "team-a"
IGNORE_DISRUPTIONS = {
    "rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]}},
    ]
}
TRAINER = textwrap.dedent(
    """
    import os, pathlib, signal, sys, time
    kept, ran = pathlib.Path(os.environ["WORKSPACE"], "kept-step"), pathlib.Path(os.environ["WORKSPACE"], "ran")
    first = not ran.exists()
    ran.touch()
    start = int(kept.read_text()) if kept.exists() else 0
    step = start
    def on_sigterm(signum, frame):
        hooked = os.environ.get("HOOK_MARK")
        print("got SIGTERM" + (f", the hook had run: {pathlib.Path(hooked).exists()}" if hooked else ""), flush=True)
        if os.environ.get("IGNORE_SIGTERM"):
            return
        kept.write_text(str(step))
        print(f"kept step {step}", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, on_sigterm)
    print(f"starting after step {start}", flush=True)
    for step in range(start + 1, 6):
        print(f"Step {step} | loss:{1.0 / step}", flush=True)
        if first and step == 3:
            time.sleep(120)  # a disruption comes here
    """
)


@pytest.fixture
def custom(kube_standin) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(kube_standin.api_client())


def start_trainer(kube, custom, tmp_path, name: str, *, pod_spec: dict | None = None, **env: str) -> str:
    """A TrainJob running TRAINER with a workspace (``pod_spec``: patched into the node pods' spec); returns the
    pods' resourceVersion before it (for their history)."""
    (workspace := tmp_path / name).mkdir()
    kube.execute(job=name, extra_env={"WORKSPACE": str(workspace), **env})
    spec = {
        "runtimeRef": {"name": "fail-fast"},
        "trainer": {"command": [sys.executable, "-c", TRAINER]},
    }
    if pod_spec:
        node = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
        spec["runtimePatches"] = [
            {
                "manager": "tests.example/disruption",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [node]}}},
            }
        ]
    rv = client.CoreV1Api(kube.api_client()).list_namespaced_pod(NS).metadata.resource_version
    body = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": spec}
    custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)
    return rv


def pod_history(kube, rv: str) -> list[dict]:
    """Every state the namespace's pods went through since ``rv`` (a watch from there, as a client sees it)."""
    response: urllib3.HTTPResponse = client.CoreV1Api(kube.api_client()).list_namespaced_pod(
        NS, watch=True, resource_version=rv, timeout_seconds=1, _preload_content=False
    )
    return [json.loads(line) for line in watch.watch.iter_resp_lines(response)]


def disruption_of(pod: dict) -> dict | None:
    return next((c for c in pod["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"), None)


def last_state(history: list[dict], uid: str) -> dict:
    """The pod's last state, and that it was deleted."""
    states = [e for e in history if e["object"]["metadata"]["uid"] == uid]
    assert states[-1]["type"] == "DELETED", [e["type"] for e in states]
    return states[-1]["object"]


def node_events(kube, pod: str) -> list[tuple[str, str, str]]:
    return [
        (e["type"], e["reason"], e["message"]) for e in kube.events() if e["involvedObject"]["name"] == pod
    ]


def test_a_preempted_pod_gets_sigterm_fails_with_its_exit_code_and_its_replacement_runs_the_same_command(
    kube_standin, custom, tmp_path
):
    kube_standin.add_runtime(
        "fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=IGNORE_DISRUPTIONS
    )
    kube_standin.scenario("pre", Scenario(preempt_on_line="Step 3 |"))
    rv = start_trainer(kube_standin, custom, tmp_path, "pre")
    kube_standin.wait_for_trainjob("pre", condition="Complete", timeout=30)

    (replacement,) = kube_standin.pods("pre")
    history = pod_history(kube_standin, rv)
    (preempted,) = {
        e["object"]["metadata"]["uid"]: e["object"] for e in history if disruption_of(e["object"])
    }.values()
    original = last_state(history, preempted["metadata"]["uid"])
    name = original["metadata"]["name"]
    condition = disruption_of(original)
    assert (condition["reason"], condition["message"]) == (
        "PreemptionByScheduler",
        "default-scheduler: preempting to accommodate a higher priority pod",
    )
    terminated = original["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (original["status"]["phase"], terminated["exitCode"], terminated["reason"]) == (
        "Failed",
        143,
        "Error",
    )
    assert original["metadata"]["deletionGracePeriodSeconds"] == 30, "the Kubernetes default grace period"
    assert kube_standin.pod_log(name).splitlines() == [
        "starting after step 0",
        "Step 1 | loss:1.0",
        "Step 2 | loss:0.5",
        "Step 3 | loss:0.3333333333333333",
        "got SIGTERM",
        "kept step 3",
    ]
    reasons = [(kind, reason) for kind, reason, _ in node_events(kube_standin, name)]
    assert ("Normal", "Preempted") in reasons and ("Normal", "Killing") in reasons

    # The Job replaced it (Ignore: not counted against backoffLimit 0): same rank, same command, resumed.
    labels = replacement["metadata"]["labels"]
    assert replacement["metadata"]["uid"] != original["metadata"]["uid"]
    assert labels["batch.kubernetes.io/job-completion-index"] == "0"
    assert replacement["status"]["phase"] == "Succeeded" and disruption_of(replacement) is None
    assert kube_standin.pod_log(replacement["metadata"]["name"]).splitlines() == [
        "starting after step 3",
        "Step 4 | loss:0.25",
        "Step 5 | loss:0.2",
    ]
    created = [e for e in history if e["type"] == "ADDED"]
    assert [e["object"]["metadata"]["uid"] for e in created] == [
        original["metadata"]["uid"],
        replacement["metadata"]["uid"],
    ]


def test_a_pod_whose_command_exits_with_an_ignored_code_is_kept_and_replaced_and_any_other_code_fails_the_job(
    kube_standin, custom, tmp_path
):
    """pod_failure_policy.go applies to every failed pod, not only disrupted ones: an Ignore rule on the exit code
    (our runtimes' 75) replaces the pod without counting it, and the failed pod stays (restartPolicy Never); the
    FailJob rule after it still fails the Job on another code."""
    policy = {"rules": [
        {"action": "Ignore", "onExitCodes": {"containerName": "node", "operator": "In", "values": [75]}},
        {"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "NotIn", "values": [0]}},
    ]}  # fmt: skip
    kube_standin.add_runtime("fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=policy)
    # The first run exits with FIRST_EXIT; the next one succeeds.
    script = (
        "import os, pathlib, sys; ran = pathlib.Path(os.environ['WORKSPACE'], 'ran'); first = not ran.exists(); "
        "ran.touch(); print('first' if first else 'again', flush=True); "
        "sys.exit(int(os.environ['FIRST_EXIT']) if first else 0)"
    )
    for name, first_exit in (("ignored", "75"), ("failing", "3")):
        (workspace := tmp_path / name).mkdir()
        kube_standin.execute(job=name, extra_env={"WORKSPACE": str(workspace), "FIRST_EXIT": first_exit})
        body = {"apiVersion": TRAINER_API_VERSION, "kind": "TrainJob", "metadata": {"name": name}, "spec": {
            "runtimeRef": {"name": "fail-fast"}, "trainer": {"command": [sys.executable, "-c", script]}}}  # fmt: skip
        custom.create_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", body)

    kube_standin.wait_for_trainjob("ignored", condition="Complete", timeout=30)
    kube_standin.wait_for_trainjob("failing", condition="Failed", timeout=30)
    pods = sorted(kube_standin.pods("ignored"), key=lambda p: kube_standin.pod_log(p["metadata"]["name"]))
    assert [kube_standin.pod_log(p["metadata"]["name"]) for p in pods] == ["again\n", "first\n"]
    assert [(p["status"]["phase"], p["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"])
            for p in pods] == [("Succeeded", 0), ("Failed", 75)]  # fmt: skip
    assert all(disruption_of(p) is None for p in pods)
    (failed,) = kube_standin.pods("failing")
    assert kube_standin.pod_log(failed["metadata"]["name"]) == "first\n"
    assert [reason for _, reason, _ in node_events(kube_standin, "failing-node-0")] == ["PodFailurePolicy"]


def test_a_preempted_pod_that_ignores_sigterm_is_killed_when_its_grace_period_ends(
    kube_standin, custom, tmp_path
):
    kube_standin.add_runtime(
        "fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=IGNORE_DISRUPTIONS
    )
    kube_standin.scenario("stubborn", Scenario(preempt_on_line="Step 3 |"))
    grace = {"terminationGracePeriodSeconds": 1}
    rv = start_trainer(kube_standin, custom, tmp_path, "stubborn", pod_spec=grace, IGNORE_SIGTERM="1")
    kube_standin.wait_for_trainjob("stubborn", condition="Complete", timeout=30)

    history = pod_history(kube_standin, rv)
    (uid,) = {e["object"]["metadata"]["uid"] for e in history if disruption_of(e["object"])}
    original = last_state(history, uid)
    terminated = original["status"]["containerStatuses"][0]["state"]["terminated"]
    assert (original["status"]["phase"], terminated["exitCode"]) == ("Failed", 137)
    assert original["metadata"]["deletionGracePeriodSeconds"] == 1
    assert kube_standin.pod_log(original["metadata"]["name"]).splitlines()[-2:] == [
        "Step 3 | loss:0.3333333333333333",
        "got SIGTERM",
    ]
    (replacement,) = kube_standin.pods("stubborn")
    assert kube_standin.pod_log(replacement["metadata"]["name"]).splitlines()[0] == "starting after step 0"


# A preStop exec hook: marks that it ran, then exits with HOOK_EXIT.
HOOK = [sys.executable, "-c", "import os, pathlib, sys; pathlib.Path(os.environ['HOOK_MARK']).write_text('ran'); "
        "sys.exit(int(os.environ['HOOK_EXIT']))"]  # fmt: skip


@pytest.mark.parametrize("hook_exit", [0, 3], ids=["hook-succeeds", "hook-fails"])
def test_a_preempted_pods_prestop_hook_runs_before_its_sigterm_and_a_failed_one_is_an_event(
    kube_standin, custom, tmp_path, hook_exit
):
    kube_standin.add_runtime(
        "fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=IGNORE_DISRUPTIONS,
        lifecycle={"preStop": {"exec": {"command": HOOK}}},
    )  # fmt: skip
    kube_standin.scenario("hooked", Scenario(preempt_on_line="Step 3 |"))
    mark = tmp_path / "hook-ran"
    rv = start_trainer(
        kube_standin, custom, tmp_path, "hooked", HOOK_MARK=str(mark), HOOK_EXIT=str(hook_exit)
    )
    kube_standin.wait_for_trainjob("hooked", condition="Complete", timeout=30)

    history = pod_history(kube_standin, rv)
    (uid,) = {e["object"]["metadata"]["uid"] for e in history if disruption_of(e["object"])}
    original = last_state(history, uid)
    name = original["metadata"]["name"]
    assert kube_standin.pod_log(name).splitlines()[-2:] == [
        "got SIGTERM, the hook had run: True",
        "kept step 3",
    ]
    assert original["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143
    failed = [
        message for _, reason, message in node_events(kube_standin, name) if reason == "FailedPreStopHook"
    ]
    if hook_exit:  # the stop goes on: SIGTERM all the same
        assert failed == ["PreStopHook failed"]
    else:
        assert failed == []


@pytest.mark.parametrize("pinned", [False, True], ids=["free", "pinned-to-the-lost-node"])
def test_a_lost_node_kills_the_pod_at_once_and_pod_gc_marks_it(kube_standin, custom, tmp_path, pinned):
    kube_standin.add_runtime(
        "fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=IGNORE_DISRUPTIONS
    )
    kube_standin.scenario("lost", Scenario(lose_node_on_line="Step 3 |"))
    if pinned:  # as the launcher pins a pod to the node that holds its ReadWriteOnce workspace
        term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}
        required = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}
        start_trainer(
            kube_standin, custom, tmp_path, "lost", pod_spec={"affinity": {"nodeAffinity": required}}
        )
        stuck = kube_standin.wait_for_pod(  # the scheduler's event comes after the pod's status
            "lost",
            lambda p: "nodeName" not in p["spec"] and node_events(kube_standin, p["metadata"]["name"]),
            timeout=30,
        )
        (scheduled,) = [c for c in stuck["status"]["conditions"] if c["type"] == "PodScheduled"]
        assert (scheduled["status"], scheduled["reason"]) == ("False", "Unschedulable")
        assert (
            "didn't match Pod's node affinity" in node_events(kube_standin, stuck["metadata"]["name"])[-1][2]
        )
        assert kube_standin.trainjob("lost")["status"].get("conditions", [{}])[-1].get("type") != "Complete"
        custom.delete_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, NS, "trainjobs", "lost")
        return
    rv = start_trainer(kube_standin, custom, tmp_path, "lost")
    kube_standin.wait_for_trainjob("lost", condition="Complete", timeout=30)

    history = pod_history(kube_standin, rv)
    (uid,) = {e["object"]["metadata"]["uid"] for e in history if disruption_of(e["object"])}
    original = last_state(history, uid)
    condition = disruption_of(original)
    assert (condition["reason"], condition["message"]) == ("DeletionByPodGC", "PodGC: node no longer exists")
    assert original["status"]["phase"] == "Failed"
    assert "running" in original["status"]["containerStatuses"][0]["state"], "as the lost kubelet last said"
    assert "got SIGTERM" not in kube_standin.pod_log(original["metadata"]["name"])
    (replacement,) = kube_standin.pods("lost")
    assert replacement["spec"]["nodeName"] != original["spec"]["nodeName"]
    assert kube_standin.pod_log(replacement["metadata"]["name"]).splitlines()[0] == "starting after step 0"


@pytest.mark.parametrize(
    ("policy", "event"),
    [
        (None, "BackoffLimitExceeded"),
        ({"rules": IGNORE_DISRUPTIONS["rules"][1:]}, "PodFailurePolicy"),
    ],
    ids=["no-policy", "exit-codes-only"],
)
def test_a_preemption_the_policy_does_not_ignore_fails_the_job(kube_standin, custom, tmp_path, policy, event):
    kube_standin.add_runtime("fail-fast", restart_policy="Never", backoff_limit=0, pod_failure_policy=policy)
    kube_standin.scenario("counted", Scenario(preempt_on_line="Step 3 |"))
    start_trainer(kube_standin, custom, tmp_path, "counted")
    failed = kube_standin.wait_for_trainjob("counted", condition="Failed", timeout=30)
    assert failed["status"]["conditions"][-1]["reason"] == "FailedJobs"
    assert [reason for _, reason, _ in node_events(kube_standin, "counted-node-0")] == [event]
    assert kube_standin.pods("counted") == [], "the preempted pod was deleted, and not replaced"
