"""`kfp-finetune schedule`: create a recurring run on a KFP backend (cron or fixed interval).

Defaults suit a nightly re-tune: at most one run at a time, and no catch-up, so a schedule that was paused or
fell behind starts one run for the latest slot instead of a burst of back-filled fine-tunes.
"""

from __future__ import annotations

import argparse

from kfp_finetune.commands import kfp_backend as kb

MAX_CONCURRENCY_LIMIT = 10  # the KFP API server rejects more


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kb.add_source_arguments(parser)
    when = parser.add_argument_group("schedule")
    trigger = when.add_mutually_exclusive_group(required=True)
    trigger.add_argument("--cron", help=kb.CRON_HELP)
    trigger.add_argument("--interval-seconds", type=int, help="start a run every N seconds instead")
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


def check_schedule(args: argparse.Namespace) -> dict:
    """The trigger arguments of kfp.Client.create_recurring_run, validated."""
    if not 1 <= args.max_concurrency <= MAX_CONCURRENCY_LIMIT:
        raise kb.UsageError(
            f"--max-concurrency must be 1-{MAX_CONCURRENCY_LIMIT}, got {args.max_concurrency}"
        )
    if args.interval_seconds is not None and args.interval_seconds < 1:
        raise kb.UsageError(f"--interval-seconds must be at least 1, got {args.interval_seconds}")
    start, end = kb.rfc3339(args.start, "--start"), kb.rfc3339(args.end, "--end")
    if start and end and end <= start:
        raise kb.UsageError(f"--end {end} is not after --start {start}")
    return {
        "cron_expression": kb.validate_cron(args.cron) if args.cron else None,
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
