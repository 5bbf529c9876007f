"""Experiment tracking in MLflow: the fine-tune's per-step metrics and settings, evaluate's scores, samples and
reports, beside KFP's own Metrics (which stay as they are).

Where it logs, first found:
- the task's run, when KFP made one (KEP-12862, KFP >= 2.17 with MLflow configured): its driver sets
  MLFLOW_TRACKING_URI and MLFLOW_RUN_ID (the task's nested run) and the credentials (MLFLOW_TRACKING_TOKEN, or
  MLFLOW_TRACKING_USERNAME / _PASSWORD) on the step's container; the run is KFP's to end;
- a new run in `experiment` at `tracking_uri`, when the pipeline's mlflow_tracking_uri is set (credentials from
  the Secret named by mlflow_secret, as the same environment variables, which the MLflow client reads itself);
  this step ends it;
- nowhere: every call is a no-op.

Tracking never fails a step that trained or scored: once the step's own work is done, a tracking server that
refuses or is away is logged as a warning (pre-flight checks it is reachable and writable before any GPU time).
The MLflow client (mlflow-skinny) is imported only when tracking is on.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components._shared.redact import credentials_in, redact_uri

log = get_logger(__name__)

#: What KFP's driver sets on a step's container when it made an MLflow run for the task (KEP-12862).
KFP_URI, KFP_RUN = "MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID"
#: The credentials the MLflow client reads from the environment (a Kubernetes Secret's keys).
CREDENTIAL_KEYS = ("MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
DEFAULT_EXPERIMENT = "kfp-finetune"
# MLflow's REST limits (mlflow/utils/validation.py): 100 params and 1000 metrics per log-batch call, 6000
# characters per param value.
_PARAMS_PER_BATCH, _METRICS_PER_BATCH, _PARAM_CHARS = 100, 1000, 6000


def check_tracking_uri(tracking_uri: str) -> None:
    """The mlflow_tracking_uri parameter: http(s):// without credentials in it, or empty."""
    if not tracking_uri:
        return
    if not tracking_uri.startswith(("http://", "https://")):
        raise ConfigError(
            f"mlflow_tracking_uri={redact_uri(tracking_uri)!r} must be the tracking server's http:// or https:// "
            "address, e.g. http://mlflow.mlflow.svc:5000, or empty for no tracking"
        )
    what = credentials_in(tracking_uri)
    if what:
        raise ConfigError(
            f"mlflow_tracking_uri carries credentials ({what}): KFP prints every pipeline parameter in each step's "
            "log and stores it with the run. Give the address without them, and the credentials through the "
            "Secret named by mlflow_secret (MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and "
            "MLFLOW_TRACKING_PASSWORD)"
        )


def check_tracking(tracking_uri: str) -> None:
    """What a step checks before its work when tracking will be on: the address, and that the image has the
    MLflow client."""
    if tracking_uri or (os.environ.get(KFP_URI) and os.environ.get(KFP_RUN)):
        check_tracking_uri(tracking_uri)
        _client_class()


@dataclass
class Tracker:
    """One MLflow run this step logs to (`client` None: tracking is off and every call does nothing)."""

    client: Any = None
    run_id: str = ""
    owned: bool = False  # this step created the run, and ends it
    where: str = ""  # the server, for people (credentials redacted)

    @classmethod
    def open(
        cls, tracking_uri: str = "", experiment: str = "", run_name: str = "", tags: dict | None = None
    ) -> Tracker:
        """KFP's run for this task, else a new run in `experiment` at `tracking_uri`, else a Tracker that does
        nothing (see the module's docstring)."""
        if os.environ.get(KFP_URI) and os.environ.get(KFP_RUN):
            where = redact_uri(os.environ[KFP_URI])
            tracker = cls(_client_class()(tracking_uri=os.environ[KFP_URI]), os.environ[KFP_RUN], where=where)
            log.info("MLflow: logging to this task's run %s at %s (set by KFP)", tracker.run_id, where)
            return tracker
        if not tracking_uri:
            return cls()
        check_tracking_uri(tracking_uri)
        where, name = redact_uri(tracking_uri), experiment or DEFAULT_EXPERIMENT
        client = _client_class()(tracking_uri=tracking_uri)
        try:
            found = client.get_experiment_by_name(name)
            experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
            run = client.create_run(experiment_id, run_name=run_name or None, tags=dict(tags or {}))
        except Exception as err:  # see the module's docstring: reported, never fatal
            log.warning(
                "MLflow at %s: could not start a run in experiment %s: %s", where, name, str(err)[:300]
            )
            return cls()
        log.info(
            "MLflow: logging to run %s (%s) of experiment %s at %s", run.info.run_id, run_name, name, where
        )
        return cls(client, run.info.run_id, owned=True, where=where)

    @property
    def on(self) -> bool:
        return self.client is not None

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(str(k), _text(v)) for k, v in params.items() if v is not None and v != ""]
        for start in range(0, len(items), _PARAMS_PER_BATCH):
            self._call("params", "log_batch", self.run_id, params=items[start : start + _PARAMS_PER_BATCH])

    def log_steps(self, steps: Iterable[Any]) -> None:
        """Each training step's metrics (metrics_file.StepMetrics), at its step."""
        from mlflow.entities import Metric

        stamp = _now_ms()
        items = [
            Metric(key, float(value), stamp, step.step)
            for step in steps
            for key, value in step.values.items()
        ]
        self._log_metrics(items)

    def log_metrics(self, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        stamp = _now_ms()
        self._log_metrics([Metric(k, float(v), stamp, 0) for k, v in values.items() if _is_number(v)])

    def _log_metrics(self, items: Sequence[Any]) -> None:
        for start in range(0, len(items), _METRICS_PER_BATCH):
            self._call("metrics", "log_batch", self.run_id, metrics=items[start : start + _METRICS_PER_BATCH])

    def log_files(self, files: Iterable[Path], folder: str) -> None:
        """Files (reports, sample tables) as the run's artifacts under `folder`."""
        for path in files:
            if Path(path).is_file():
                self._call(f"artifact {Path(path).name}", "log_artifact", self.run_id, str(path), folder)

    def log_text(self, name: str, text: str) -> None:
        """`text` as the run's artifact `name` (a path inside the run's artifacts, e.g. reports/evaluate.html)."""
        self._call(f"artifact {name}", "log_text", self.run_id, text, name)

    def finish(self) -> None:
        """End the run this step created (KFP ends its own)."""
        if self.owned:
            self._call("run status", "set_terminated", self.run_id, "FINISHED")

    def _call(self, what: str, method: str, *args: Any, **kwargs: Any) -> None:
        if self.client is None:
            return
        try:
            getattr(self.client, method)(*args, **kwargs)
        except Exception as err:  # the step's work is done: tracking that fails is reported, never fatal
            log.warning("MLflow at %s: could not log the %s: %s", self.where, what, str(err)[:300])


def _client_class() -> Any:
    try:
        from mlflow import MlflowClient
    except ImportError:
        raise ConfigError(
            "MLflow tracking is on (mlflow_tracking_uri, or KFP's MLFLOW_TRACKING_URI), but this image has no "
            "MLflow client: install kfp-finetune[tracking] (mlflow-skinny), or leave mlflow_tracking_uri empty"
        ) from None
    return MlflowClient


def _text(value: Any) -> str:
    return str(value)[:_PARAM_CHARS]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def track_step(
    tracking_uri: str,
    experiment: str,
    *,
    run_name: str,
    tags: dict[str, str],
    params: dict[str, Any],
    metrics: dict[str, float],
    steps: Sequence[Any] = (),
    files: dict[str, Sequence[Path]] | None = None,
    texts: dict[str, str] | None = None,
) -> None:
    """Log one step's outcome to MLflow where tracking is on (Tracker.open): its settings, its per-step metrics,
    its final metrics, its files (folder -> paths) and texts (artifact name -> text); nothing when it is off."""
    tracker = Tracker.open(tracking_uri, experiment, run_name, tags)
    if not tracker.on:
        return
    tracker.log_params(params)
    tracker.log_steps(steps)
    tracker.log_metrics(metrics)
    for folder, paths in (files or {}).items():
        tracker.log_files(paths, folder)
    for name, text in (texts or {}).items():
        tracker.log_text(name, text)
    tracker.finish()


#: Pre-flight asks the server at most this often and this long per request (MLflow's own defaults: 7 retries with
#: backoff, 120 s each), so a wrong address is reported in seconds.
_PROBE_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


def probe(tracking_uri: str, experiment: str) -> str:
    """Whether this step could log to `experiment` at `tracking_uri`: the experiment found or created, a run
    created and deleted in it. "" when it could, else the problem for people (the address's credentials redacted)."""
    check_tracking_uri(tracking_uri)
    name = experiment or DEFAULT_EXPERIMENT
    saved = {variable: os.environ.get(variable) for variable in _PROBE_ENV}
    os.environ.update(_PROBE_ENV)
    try:
        client = _client_class()(tracking_uri=tracking_uri)
        found = client.get_experiment_by_name(name)
        experiment_id = found.experiment_id if found is not None else client.create_experiment(name)
        run = client.create_run(experiment_id, run_name="kfp-finetune pre-flight probe")
        client.delete_run(run.info.run_id)
    except ConfigError:
        raise
    except Exception as err:
        return (
            f"the MLflow server at {redact_uri(tracking_uri)} did not take a run in experiment {name!r} "
            f"({str(err)[:300]}): check the address, that the server is up, and the credentials in the Secret "
            "named by mlflow_secret"
        )
    finally:
        for variable, value in saved.items():
            if value is None:
                os.environ.pop(variable, None)
            else:
                os.environ[variable] = value
    return ""
