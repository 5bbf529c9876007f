"""Recurring runs of the KFP stand-in (kfp_standin.py): creating them as the API server does, and when KFP's
recurring-run controller starts a run (`tick`).

Creation follows server/api_converter.go `toModelJob` / `toModelJobEnabled`; starting runs follows

kubeflow/pipelines backend/src/crd/controller/scheduledworkflow/util/: scheduled_workflow.go
`GetNextScheduledEpoch` (disabled -> no run; active runs >= max_concurrency -> no run; next slot in the future -> no
run), periodic_schedule.go (catch-up: one slot after the last one; no catch-up: `now` when more than one slot was
missed) and cron_schedule.go (catch-up: the next slot; no catch-up: the latest slot not after `now`), with
robfig/cron v1.2.0 `Schedule.Next` in UTC (the controller's default location). Start/end times are honoured.
"""

from __future__ import annotations

import datetime
import re
import time
import uuid

from tests.support.kfp_http import ApiError, public
from tests.support.kfp_validation import BOUNDS, cron_problem

MAX_EPOCH = 2**63 - 1
_UTC = datetime.timezone.utc
_DESCRIPTORS = {
    "@yearly": "0 0 0 1 1 *", "@annually": "0 0 0 1 1 *", "@monthly": "0 0 0 1 * *",
    "@weekly": "0 0 0 * * 0", "@daily": "0 0 0 * * *", "@midnight": "0 0 0 * * *", "@hourly": "0 0 * * * *",
}  # fmt: skip
_UNITS = {"h": 3600, "m": 60, "s": 1, "ms": 0.001, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def should_run(recurring: dict, active: int, last: int | None, created: int, now: int) -> tuple[int, bool]:
    """(next scheduled epoch, whether a run starts now): scheduled_workflow.go `GetNextScheduledEpoch`."""
    trigger = recurring.get("trigger") or {}
    catchup = not recurring.get("no_catchup")
    if trigger.get("periodic_schedule"):
        next_epoch = _periodic_next(trigger["periodic_schedule"], last, created, now, catchup)
    else:
        next_epoch = _cron_next(trigger["cron_schedule"], last, created, now, catchup)
    if recurring.get("status") != "ENABLED" or active >= int(recurring.get("max_concurrency") or 1):
        return next_epoch, False
    return next_epoch, next_epoch <= now


def _epoch(text: str | None) -> int | None:
    if not text:
        return None
    return int(datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def _periodic_next(schedule: dict, last: int | None, created: int, now: int, catchup: bool) -> int:
    """periodic_schedule.go `GetNextScheduledEpoch` / `GetNextScheduledEpochNoCatchup`."""
    interval = int(schedule.get("interval_second") or 0) or 1
    start, end = _epoch(schedule.get("start_time")), _epoch(schedule.get("end_time"))
    effective = last if last is not None else (start if start is not None else created)
    if start is not None and start > effective:
        result = start
    else:
        result = effective + interval
        if end is not None and end < result:
            return MAX_EPOCH
    if catchup:
        return result
    if now >= result + interval:
        return end if end is not None and end < now else now
    return result


def _cron_next(schedule: dict, last: int | None, created: int, now: int, catchup: bool) -> int:
    """cron_schedule.go `getNextScheduledTimeImp`."""
    spec = schedule.get("cron") or ""
    start, end = _epoch(schedule.get("start_time")), _epoch(schedule.get("end_time"))
    effective = last if last is not None else (start if start is not None else created)
    if start is not None and start > effective:
        effective = start
    result = cron_after(spec, effective)
    end = MAX_EPOCH if end is None else end
    if result > end:
        return MAX_EPOCH
    if catchup:
        return result
    while (following := cron_after(spec, result)) <= now and following <= end:
        result = following
    return result


def cron_after(spec: str, epoch: int) -> int:
    """robfig/cron v1.2.0 `Schedule.Next`: the first matching second strictly after `epoch` (UTC)."""
    if spec.startswith("@every "):
        delay = sum(float(n) * _UNITS[u] for n, u in re.findall(r"([\d.]+)(ns|us|µs|ms|s|m|h)", spec[7:]))
        return epoch + max(1, int(delay))
    fields = _DESCRIPTORS.get(spec, spec).split()
    if len(fields) == 5:
        fields.append("*")  # DowOptional
    sets, starred = zip(
        *(_expand(text, *bounds) for text, bounds in zip(fields, BOUNDS, strict=True)), strict=True
    )
    seconds, minutes, hours, days, months, weekdays = sets
    after = datetime.datetime.fromtimestamp(epoch + 1, _UTC)
    day = after.date()
    for _ in range(366 * 5):  # robfig gives up after five years
        dom, dow = day.day in days, (day.weekday() + 1) % 7 in weekdays
        matches = (dom and dow) if (starred[3] or starred[5]) else (dom or dow)
        if day.month in months and matches:
            for hour in sorted(hours):
                for minute in sorted(minutes):
                    for second in sorted(seconds):
                        moment = datetime.datetime(
                            day.year, day.month, day.day, hour, minute, second, tzinfo=_UTC
                        )
                        if moment >= after:
                            return int(moment.timestamp())
        day += datetime.timedelta(days=1)
    return MAX_EPOCH


def _expand(text: str, low: int, high: int, names: dict[str, int]) -> tuple[set[int], bool]:
    """parser.go `getField`/`getRange`: the values of one field and whether it carries the star bit."""
    values, star = set(), False
    for part in text.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if span in ("*", "?"):
            start, end = low, high
            star = star or step == 1
        else:
            first, dash, last = span.partition("-")
            start = names[first.lower()] if first.lower() in names else int(first)
            end = (names[last.lower()] if last.lower() in names else int(last)) if dash else start
            if step_text and not dash:
                end = high  # "N/step" means N-max/step
        values.update(range(start, end + 1, step))
    return values, star


TERMINAL_STATES = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class RecurringRuns:
    """The recurring-run endpoints and the controller's `tick`, mixed into KfpStandin (which provides `runs`,
    `recurring_runs`, `_get`, `_order` and `_check_pipeline_source`)."""

    def _create_recurring_run(self, body: dict) -> dict:
        """server/api_converter.go `toModelJob` and `toModelJobEnabled` (checks, messages, mode), then the
        run checks of `createJob`."""
        concurrency = int(body.get("max_concurrency") or 0)
        if not 1 <= concurrency <= 10:
            raise ApiError(
                400,
                "Max concurrency of a recurring run must be at least 1 and at most 10. Received "
                f"{concurrency}",
            )
        trigger = body.get("trigger") or {}
        cron, periodic = trigger.get("cron_schedule"), trigger.get("periodic_schedule")
        if cron is not None:
            problem = cron_problem(cron.get("cron") or "")
            if problem:
                raise ApiError(
                    400,
                    "Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). "
                    f"Error: {problem}",
                )
        if periodic is not None and int(periodic.get("interval_second") or 0) < 1:
            raise ApiError(
                400,
                f"Found invalid period schedule interval {int(periodic.get('interval_second') or 0)}. "
                "Set at interval to least 1 second",
            )
        self._check_pipeline_source(body, what="recurring run")
        # MODE_UNSPECIFIED means disabled (toModelJobEnabled).
        enabled = body.get("mode") == "ENABLE"
        recurring = dict(
            body,
            recurring_run_id=str(uuid.uuid4()),
            max_concurrency=str(concurrency),
            no_catchup=bool(body.get("no_catchup")),
            mode="ENABLE" if enabled else "DISABLE",
            status="ENABLED" if enabled else "DISABLED",
            created_at=_now(),
            _order=next(self._order),
            _created_epoch=int(time.time()),
            _last_triggered=None,
        )
        self.recurring_runs[recurring["recurring_run_id"]] = recurring
        return recurring

    def _set_recurring_mode(self, recurring_run_id: str, enabled: bool) -> dict:
        """POST /recurringruns/{id}:enable and :disable (server/job_server.go): an empty answer."""
        recurring = self._get(self.recurring_runs, recurring_run_id, "recurring run")
        recurring["mode"], recurring["status"] = ("ENABLE", "ENABLED") if enabled else ("DISABLE", "DISABLED")
        return {}

    def tick(self, recurring_run_id: str, seconds_after_creation: int) -> dict | None:
        """One sync of KFP's recurring-run controller at creation time + `seconds_after_creation`
        (kfp_schedule.py): returns the run it starts, or None. Runs of the schedule count as active until a test
        moves them to a final state."""
        with self._lock:
            recurring = self._get(self.recurring_runs, recurring_run_id, "recurring run")
            created = recurring["_created_epoch"]
            active = sum(
                1
                for run in self.runs.values()
                if run.get("recurring_run_id") == recurring_run_id and run["state"] not in TERMINAL_STATES
            )
            slot, run_now = should_run(
                recurring, active, recurring["_last_triggered"], created, created + seconds_after_creation
            )
            if not run_now:
                return None
            recurring["_last_triggered"] = slot
            scheduled = datetime.datetime.fromtimestamp(slot, datetime.timezone.utc).strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            )
            copied = ("pipeline_spec", "pipeline_version_reference", "runtime_config", "experiment_id")
            run = {key: recurring[key] for key in copied if key in recurring}
            run.update(
                run_id=str(uuid.uuid4()), display_name=f"{recurring['display_name']}-{slot}", state="PENDING",
                recurring_run_id=recurring_run_id, scheduled_at=scheduled, created_at=_now(),
                _order=next(self._order), _plan=[],
            )  # fmt: skip
            self.runs[run["run_id"]] = run
            return public(run)
