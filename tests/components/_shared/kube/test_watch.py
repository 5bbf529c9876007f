"""components/_shared/kube/watch.py against the Kubernetes stand-in, with the real client."""

from __future__ import annotations

import logging
import threading

import pytest
from kubernetes import client

from kfp_finetune.components._shared.kube.client import Backoff
from kfp_finetune.components._shared.kube.watch import LISTED, Watch, WatchEvent
from tests.support.kube_standin import KubeStandin

NS = "team-a"
SELECTOR = "app=mine"


def pod(name: str, **labels: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
        "status": {"phase": "Running"},
    }


@pytest.fixture
def kube():
    with KubeStandin(namespace=NS) as standin:
        yield standin


def new_watch(**options) -> Watch:
    return Watch(backoff=Backoff(initial=0.01, maximum=0.05, sleep=lambda _: None), **options)


def watches(kube: KubeStandin) -> list:
    return [r for r in kube.requests_for("GET", "pods") if r.query.get("watch") == "True"]


def nth_watch(kube: KubeStandin, n: int):
    return kube.wait_for_request("GET", "pods", where=lambda r: r in watches(kube)[n - 1 : n])


def follow(kube: KubeStandin, watch: Watch, until: str) -> list[WatchEvent]:
    """The events of watching our pods until the pod `until` is ADDED."""
    core = client.CoreV1Api(kube.api_client())
    events = []
    for event in watch.stream(core.list_namespaced_pod, NS, label_selector=SELECTOR):
        events.append(event)
        if event.type == "ADDED" and event.object["metadata"]["name"] == until:
            watch.stop()
    return events


def in_background(target) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


@pytest.mark.slow
def test_bookmarks_only_advance_the_resource_version(kube):
    """A bookmark is never passed on as an object, and the next watch starts from its resourceVersion."""
    watch = new_watch(timeout_seconds=1)
    moved_past: list[int] = []

    def cluster() -> None:
        nth_watch(kube, 1)
        other = kube.add_object(pod("not-mine", app="other"))  # filtered out of our watch
        moved_past.append(int(other["metadata"]["resourceVersion"]))
        kube.send_bookmarks()
        nth_watch(kube, 2)  # the server ended the first watch (timeoutSeconds); it was re-opened
        kube.add_object(pod("mine", app="mine"))

    helper = in_background(cluster)
    events = follow(kube, watch, until="mine")
    helper.join(10)
    assert [(e.type, (e.object or {}).get("metadata", {}).get("name")) for e in events] == [
        (LISTED, None),
        ("ADDED", "mine"),
    ]
    first, second = watches(kube)[:2]
    assert first.query["allowWatchBookmarks"] == "True"
    assert int(second.query["resourceVersion"]) >= moved_past[0] > int(first.query["resourceVersion"])


class Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.slow
def test_410_relists_and_goes_on(kube):
    """A resourceVersion compacted away: the watch is answered 410 Expired, so the Watch lists again."""
    kube.add_object(pod("early", app="mine"))
    log, messages = logging.getLogger("test.kube_watch"), Messages()
    log.addHandler(messages)
    log.setLevel(logging.INFO)
    watch = new_watch(timeout_seconds=1, log=log)

    def cluster() -> None:
        nth_watch(kube, 1)
        kube.add_object(pod("not-mine", app="other"))  # moves the history on; our watch sees nothing
        kube.compact_history()  # the open watch is not affected; re-opening it from its version is
        kube.wait_for_request("GET", "pods", where=lambda r: "watch" not in r.query and r in relists())
        kube.add_object(pod("mine", app="mine"))

    def relists() -> list:
        return [r for r in kube.requests_for("GET", "pods") if "watch" not in r.query][1:]

    helper = in_background(cluster)
    events = follow(kube, watch, until="mine")
    log.removeHandler(messages)
    helper.join(10)
    assert [e.type for e in events] == [LISTED, LISTED, "ADDED"]
    assert [p["metadata"]["name"] for p in events[1].items] == ["early"]
    assert messages.lines == ["watch expired (410 Gone); re-listing"]
    assert len(watches(kube)) == 3  # from the list, re-opened (410), from the re-list


def test_stop_cuts_a_quiet_watch_at_once(kube):
    watch = new_watch(timeout_seconds=300)
    reader = in_background(lambda: follow(kube, watch, until="never"))
    nth_watch(kube, 1)
    watch.stop()
    reader.join(10)  # a bound, not a measurement: without the cut the read would block for 300s
    assert not reader.is_alive()
    assert len(watches(kube)) == 1  # stopped: not re-opened


def test_non_transient_errors_raise(kube):
    kube.fail_next(status=403, method="GET", path_contains="/pods")
    with pytest.raises(client.ApiException) as raised:
        follow(kube, new_watch(), until="never")
    assert raised.value.status == 403
