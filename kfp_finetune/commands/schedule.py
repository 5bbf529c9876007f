"""`kfp-finetune schedule`: create a recurring run on a KFP backend (cron or fixed interval).

Defaults suit a nightly re-tune: at most one run at a time, and no catch-up, so a schedule that was paused or
fell behind starts one run for the latest slot instead of a burst of back-filled fine-tunes.
"""

from __future__ import annotations

import argparse
import datetime
import re

from kfp_finetune.commands import kfp_backend as kb

MAX_CONCURRENCY_LIMIT = 10  # the KFP API server rejects more
# The most often a schedule may start a fine-tune: once a minute. The API server takes any interval of at least a
# second (`@every 0s` too: robfig/cron rounds it up to 1 s), which would queue a run every second.
MIN_INTERVAL_SECONDS = 60
# robfig/cron v1 `SpecSchedule.Next` gives up when nothing matches within five years: the schedule never fires
# (and KFP's API server accepts it: `cron.Parse` checks each field alone, so `0 0 0 31 2 *` parses).
_HORIZON_DAYS = 5 * 366
_GO_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)")
_GO_UNIT_SECONDS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1, "m": 60, "h": 3600}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kb.add_source_arguments(parser)
    when = parser.add_argument_group("schedule")
    trigger = when.add_mutually_exclusive_group(required=True)
    trigger.add_argument("--cron", help=kb.CRON_HELP)
    trigger.add_argument(
        "--interval-seconds", type=int, help="start a run every N seconds (60 or more) instead"
    )
    when.add_argument("--start", help="first possible run, ISO 8601 (naive = UTC; default: now)")
    when.add_argument("--end", help="no runs after this time, ISO 8601 (naive = UTC)")
    when.add_argument(
        "--max-concurrency",
        type=int,
        default=1,
        help=f"runs allowed at once, 1-{MAX_CONCURRENCY_LIMIT} (default: 1)",
    )
    when.add_argument(
        "--catchup",
        action="store_true",
        help="back-fill every slot missed while paused or behind (default: off)",
    )
    state = when.add_mutually_exclusive_group()
    state.add_argument(
        "--enabled", dest="enabled", action="store_true", default=True, help="active now (default)"
    )
    state.add_argument("--disabled", dest="enabled", action="store_false", help="create it paused")
    parser.add_argument("--name", help="display name of the recurring run (default: <pipeline> schedule)")
    parser.add_argument("--description", help="description of the recurring run")
    kb.add_connection_arguments(parser)


def _values(field: str, low: int, high: int, names: list[str] | None) -> tuple[set[int], bool]:
    """The values one (already validated) cron field matches, and whether it is a plain `*` / `?` (robfig's star
    bit: parser.go `getRange`, which drops it for a step above 1)."""

    def number(text: str) -> int:
        return names.index(text.upper()) + low if names and text.upper() in names else int(text)

    values, star = set(), False
    for part in field.split(","):
        span, _, step_text = part.partition("/")
        step = int(step_text) if step_text else 1
        if span in ("*", "?"):
            first, last, star = low, high, star or step == 1
        else:
            start, dash, end = span.partition("-")
            first = number(start)
            last = number(end) if dash else (high if step_text else first)
        values.update(range(first, last + 1, step))
    return values, star


def _field_values(fields: list[str]) -> list[tuple[set[int], bool]]:
    return [
        _values(field, low, high, names)
        for field, (_, low, high, names) in zip(fields, kb.CRON_FIELDS, strict=True)
    ]


def _too_often(fields: list[str]) -> str | None:
    """Why a six-field cron starts more than one run a minute (several values in its seconds field), else None."""
    seconds, _ = _field_values(fields)[0]
    if len(seconds) > 1:
        return (f"would start {len(seconds)} runs a minute (seconds field {fields[0]!r}): a schedule may start "
                f"at most one a minute; put one second there, e.g. '0 {' '.join(fields[1:])}'")  # fmt: skip
    return None


def _never_fires(fields: list[str]) -> str | None:
    """Why a six-field cron never fires (no date in robfig's five-year horizon matches its days), else None."""
    _, _, _, (days, any_day), (months, _), (weekdays, any_weekday) = _field_values(fields)
    day = datetime.datetime.now(datetime.timezone.utc).date()
    for _ in range(_HORIZON_DAYS):
        by_date, by_weekday = day.day in days, (day.weekday() + 1) % 7 in weekdays
        # robfig `dayMatches`: both must match when either field is `*`, else either one.
        if day.month in months and (
            (by_date and by_weekday) if any_day or any_weekday else by_date or by_weekday
        ):
            return None
        day += datetime.timedelta(days=1)
    return (f"never fires: no date in the next five years has day of month {fields[3]!r} in month {fields[4]!r} "
            f"(day of week {fields[5]!r}), and KFP's scheduler gives up after five years; pick a day the month has")  # fmt: skip


def _every_problem(expression: str) -> str | None:
    seconds = sum(float(n) * _GO_UNIT_SECONDS[u] for n, u in _GO_DURATION_PART.findall(expression))
    if seconds < MIN_INTERVAL_SECONDS:
        shown = "every second" if seconds <= 1 else f"every {seconds:g} s"
        return (f"would start a run {shown}: a schedule may start at most one a minute, e.g. '@every "
                f"{MIN_INTERVAL_SECONDS}s' or more")  # fmt: skip
    return None


def check_cron(text: str) -> str:
    """The cron expression normalised, or UsageError: KFP's scheduler rejects it (kb.validate_cron), it never
    fires, or it fires more than once a minute. A five-field line that never fires says so first (its intent is
    clear; the six-field hint would only suggest the same impossible date)."""
    fields = text.split()
    if len(fields) == 5:
        try:
            meant = kb.validate_cron(" ".join(["0", *fields])).split(" ")
        except kb.UsageError:  # not a cron even with seconds: validate_cron below says why
            meant = None
        problem = meant and _never_fires(meant)
        if problem:
            raise kb.UsageError(
                f"--cron {' '.join(fields)!r} {problem} (KFP's cron has 6 fields, seconds first)"
            )
    expression = kb.validate_cron(text)
    if expression.startswith("@every "):
        problem = _every_problem(expression)
    elif expression.startswith("@"):
        problem = None  # the descriptors fire hourly at most
    else:
        problem = _too_often(expression.split(" ")) or _never_fires(expression.split(" "))
    if problem:
        raise kb.UsageError(f"--cron {expression!r} {problem}")
    return expression


def _check_end_reachable(start: str | None, end: str | None, interval: int | None) -> None:
    """UsageError when `end` leaves no time for a run: it is past, or (an interval schedule) it comes before the
    first run, which KFP's scheduler starts one interval after the start (periodic_schedule.go)."""
    if not end:
        return
    now = datetime.datetime.now(datetime.timezone.utc)
    until = datetime.datetime.fromisoformat(end.replace("Z", "+00:00"))
    if until <= now:
        raise kb.UsageError(f"--end {end} is in the past: the schedule would never start a run")
    if interval:
        begin = datetime.datetime.fromisoformat(start.replace("Z", "+00:00")) if start else now
        first = begin + datetime.timedelta(seconds=interval)
        if first > until:
            raise kb.UsageError(
                f"--end {end} comes before the first run ({first:%Y-%m-%dT%H:%M:%SZ}, one --interval-seconds "
                "after the start): the schedule would never start a run"
            )


def check_schedule(args: argparse.Namespace) -> dict:
    """The trigger arguments of kfp.Client.create_recurring_run, validated."""
    if not 1 <= args.max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise kb.UsageError(
            f"--max-concurrency must be 1-{MAX_CONCURRENCY_LIMIT}, got {args.max_concurrency}"
        )
    if args.interval_seconds is not None and args.interval_seconds < MIN_INTERVAL_SECONDS:
        raise kb.UsageError(
            f"--interval-seconds must be at least {MIN_INTERVAL_SECONDS} (a schedule may start at most one run a "
            f"minute), got {args.interval_seconds}"
        )
    start, end = kb.rfc3339(args.start, "--start"), kb.rfc3339(args.end, "--end")
    if start and end and end <= start:
        raise kb.UsageError(f"--end {end} is not after --start {start}")
    _check_end_reachable(start, end, args.interval_seconds)
    return {
        "cron_expression": check_cron(args.cron) if args.cron else None,
        "interval_second": args.interval_seconds,
        "start_time": start,
        "end_time": end,
    }


def run(args: argparse.Namespace) -> int:
    def create(workdir: str) -> int:
        trigger = check_schedule(args)
        client, target, values = kb.prepare(args, workdir)
        with kb.quiet_client():
            name = args.name or f"{target.display_name} schedule"
            created = client.create_recurring_run(
                experiment_id=kb.experiment_id(client, args),
                job_name=name,
                description=args.description,
                max_concurrency=args.max_concurrency,
                no_catchup=not args.catchup,
                params=values,
                enabled=args.enabled,
                pipeline_root=args.pipeline_root,
                service_account=args.service_account,
                **trigger,
                **target.job_arguments(),
            )
        when = f"cron {trigger['cron_expression']!r}" if args.cron else f"every {args.interval_seconds} s"
        print(f"recurring run: {name} ({when}, {'enabled' if args.enabled else 'disabled'})")
        print(f"recurring run id: {created.recurring_run_id}")
        link = kb.ui_link(args, f"recurringrun/details/{created.recurring_run_id}")
        if link:
            print(f"url: {link}")
        return 0

    return kb.run_command(args, create)
