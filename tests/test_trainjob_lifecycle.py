"""The TrainJob launcher against the stand-in when the cluster is unkind: API errors while a job runs, pods that
cannot start, and deletion that takes its time (DESIGN.md §3 "What a real cluster does")."""

from __future__ import annotations

import threading

from tests import test_trainjob_launcher as base
from tests.support.kube_standin import Scenario

NAME = base.NAME
kube = base.kube
user_log = base.user_log


class Running:
    """A launcher's run() in a thread, so the test can act on the stand-in meanwhile."""

    def __init__(self, launcher) -> None:
        self.outcome: dict = {}
        self.thread = threading.Thread(target=self._run, args=(launcher,), daemon=True)
        self.thread.start()

    def _run(self, launcher) -> None:
        try:
            self.outcome["result"] = launcher.run()
        except BaseException as error:  # handed to the test thread
            self.outcome["error"] = error

    def result(self, timeout: float = 60.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the launcher did not return"
        if "error" in self.outcome:
            raise self.outcome["error"]
        return self.outcome["result"]


def log_request_open(request) -> bool:
    return request.subresource == "log" and request.status == 200


# --- transient API errors -------------------------------------------------------------------------------------------


def test_api_errors_after_the_log_stream_ends_never_delete_a_running_trainjob(kube, user_log):
    """The rank-0 log stream ends while training goes on and the pod GETs that follow meet a 503/429 burst longer
    than one call's retries: the launcher keeps retrying with back-off, and the run finishes."""
    lines = [f"Step {i} | loss:1.0" for i in range(1, 41)]
    kube.scenario(None, Scenario.success(lines, line_interval=0.05))
    running = Running(base.launcher(kube, cleanup="never"))
    kube.wait_for_request("GET", "pods", where=log_request_open)
    kube.wait_for_pod(NAME, lambda pod: lines_logged(kube, pod) >= 2)
    # Each GET of the pod (and of its log) fails 12 times with 503, then 12 times with 429: more than the
    # 8 attempts one call is given, so only a launcher that keeps trying while the TrainJob runs gets through.
    kube.fail_next(12, status=503, method="GET", path_contains="/pods/")
    kube.fail_next(12, status=429, method="GET", path_contains="/pods/")
    kube.end_log_streams()
    result = running.result()
    assert result.status == "Complete"
    assert not kube.requests_for("DELETE", "trainjobs")
    failed = [r.status for r in kube.requests_for("GET", "pods") if r.status >= 400]
    assert failed.count(503) == 12 and failed.count(429) == 12  # the whole burst was met
    assert result.log_lines == lines  # reconnected without losing or repeating a line
    assert "lost track" not in user_log.text


def lines_logged(kube, pod: dict) -> int:
    return len(kube.pod_log(pod["metadata"]["name"]).splitlines())
