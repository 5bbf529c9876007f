"""Progress where operators look (progress.py): one computation from the step lines, rendered for the step log,
the TrainJob's annotations (launcher) and Kubeflow Trainer's progress API (trainer, against its stand-in)."""

import pytest

from kfp_finetune.components._shared.metrics_file import StepMetrics
from kfp_finetune.components.torchtune_finetune import progress as pg
from kfp_finetune.components.torchtune_finetune.backends.trainjob.annotations import ProgressAnnotations
from kfp_finetune.components.torchtune_finetune.metrics import TeeMetricLogger
from tests.support.trainer_status_standin import TrainerStatusStandin, problems


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def step(n, loss=2.0, lr=1e-4, tps=500.0):
    return StepMetrics(n, {"loss": loss, "lr": lr, "tokens_per_second_per_gpu": tps})


def test_eta_and_percent_come_from_the_step_rate():
    clock = Clock()
    progress = pg.ProgressClock(total_steps=100, clock=clock)
    first = progress.update(step(10))  # a resumed run's first step: no rate yet
    clock.now += 50
    later = progress.update(step(20))
    assert (first.percent, first.eta_seconds) == (10, None)
    assert (later.percent, later.eta_seconds) == (20, 400.0)  # 5 s a step, 80 steps left
    assert (
        later.line()
        == "progress: step 20/100 | loss 2.0000 | next step's lr 0.0001 | 500.0 tokens/s | ETA 6m40s"
    )
    assert later.annotations() == {
        pg.ANNOTATION_PROGRESS: "20% | step 20/100 | loss 2.0000 | next step's lr 0.0001 | 500.0 tokens/s | ETA 6m40s",
        pg.ANNOTATION_PERCENT: "20",
    }


def test_the_trainer_status_is_what_the_trainjob_crd_takes():
    status = pg.ProgressClock(total_steps=3).update(step(3, loss=float("1e-12")))
    body = {"trainerStatus": status.trainer_status()}
    assert problems(body) == []
    names = {m["name"]: m["value"] for m in body["trainerStatus"]["metrics"]}
    assert names == {
        "step": "3",
        "totalSteps": "3",
        "loss": "1e-12",
        "lr": "0.0001",
        "tokensPerSecond": "500",
    }
    assert body["trainerStatus"]["progressPercentage"] == 100
    # The stand-in is strict: what the CRD refuses, it refuses.
    assert problems({"trainerStatus": {"progressPercentage": 101}})
    assert problems({"trainerStatus": {"lastUpdatedTime": "2026-11-27T10:00:00Z", "percent": 5}})


def test_the_trainer_reports_to_the_progress_api_when_the_trainer_offers_it(tmp_path):
    token = tmp_path / "token"
    token.write_text("projected-token\n")
    clock = Clock()
    with TrainerStatusStandin() as api:
        environ = {pg.STATUS_URL: api.url, pg.STATUS_TOKEN: str(token)}
        reporter = pg.TrainerStatusReporter(environ, clock=clock)
        statuses = pg.ProgressClock(total_steps=4, clock=clock)
        sent = []
        for n in range(1, 5):
            clock.now += 10  # 10 s a step: only the first and, always, the last step are sent in 30 s
            sent.append(reporter.report(statuses.update(step(n)), final=n == 4))
        assert sent == [True, False, False, True]
        assert [s["progressPercentage"] for s in api.statuses] == [25, 100]
        assert api.statuses[-1]["estimatedRemainingSeconds"] == 0 and not api.rejected


def test_a_progress_api_that_refuses_never_stops_training(tmp_path, capsys):
    (tmp_path / "token").write_text("a token of another pod")
    with TrainerStatusStandin() as api:
        reporter = pg.TrainerStatusReporter(
            {pg.STATUS_URL: api.url, pg.STATUS_TOKEN: str(tmp_path / "token")}
        )
        for n in (1, 2):
            assert reporter.report(pg.ProgressClock(2).update(step(n)), final=True) is False
        assert [code for code, _ in api.rejected] == [401, 401]
    assert capsys.readouterr().out.count("progress not sent to the Trainer") == 1  # said once


def test_without_the_trainer_endpoint_the_logger_sends_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(pg.STATUS_URL, raising=False)
    logger = TeeMetricLogger(str(tmp_path))
    logger.total_steps = 2
    logger.log_dict({"loss": 1.0}, step=1)
    assert not logger._trainer_status.enabled
    logger.close()


def test_the_metric_logger_reports_each_step_through_the_progress_api(tmp_path, monkeypatch):
    (tmp_path / "token").write_text("projected-token")
    with TrainerStatusStandin() as api:
        monkeypatch.setenv(pg.STATUS_URL, api.url)
        monkeypatch.setenv(pg.STATUS_TOKEN, str(tmp_path / "token"))
        logger = TeeMetricLogger(str(tmp_path / "logs"))
        logger.total_steps = 2  # set by the recipe module once it knows the run's steps
        logger.log_dict({"loss": 1.5, "lr": 1e-4, "tokens_per_second_per_gpu": 100.0}, step=1)
        logger.log_dict({"loss": 1.25, "lr": 5e-5, "tokens_per_second_per_gpu": 100.0}, step=2)
        logger.close()
    assert [s["progressPercentage"] for s in api.statuses] == [50, 100]
    assert {m["name"]: m["value"] for m in api.statuses[-1]["metrics"]}["loss"] == "1.25"


class FakeCustom:
    def __init__(self, status=None):
        self.patches, self.status = [], status

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body):
        if self.status:
            raise type("ApiException", (Exception,), {"status": self.status})()
        self.patches.append((namespace, name, body))


class Log:
    def __init__(self):
        self.warnings = []

    def warning(self, text, *args):
        self.warnings.append(text % args)


def test_annotations_are_patched_at_most_every_minute_and_at_the_last_step():
    clock, custom = Clock(), FakeCustom()
    annotate = ProgressAnnotations(custom, "team-a", "job-a", log=Log(), clock=clock)
    progress = pg.ProgressClock(total_steps=3, clock=clock)
    for n in (1, 2, 3):
        clock.now += 20
        annotate(progress.update(step(n)))
    percents = [body["metadata"]["annotations"][pg.ANNOTATION_PERCENT] for _, _, body in custom.patches]
    assert percents == ["33", "100"]


@pytest.mark.parametrize(("status", "warned"), [(403, True), (404, False)])
def test_annotations_without_rbac_are_given_up_once(status, warned):
    log = Log()
    annotate = ProgressAnnotations(FakeCustom(status), "team-a", "job-a", log=log)
    for n in (1, 2, 3):
        annotate(pg.ProgressClock(total_steps=1).update(step(n)))
    assert len(log.warnings) == (1 if warned else 0)
    if warned:
        assert "patch on trainjobs is not granted" in log.warnings[0]
