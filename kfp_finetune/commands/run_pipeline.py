"""`kfp-finetune run`: start one run on a KFP backend, from a local pipeline or an uploaded version.

Parameters are checked against the pipeline's inputs before anything is sent (unknown or missing names, types).
Prints the run id and, when the UI address is known, its link. With `--wait` it then polls the run until it ends
and exits 0 when it SUCCEEDED, 1 otherwise; `--follow` also prints every task state change, one line each.
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

from kfp_finetune.commands import kfp_backend as kb

# v2beta1 RuntimeState values after which a run does not change (backend/api/v2beta1/run.proto).
FINAL_STATES = ("SUCCEEDED", "SKIPPED", "FAILED", "CANCELED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kb.add_source_arguments(parser)
    parser.add_argument("--run-name", help="display name of the run (default: <pipeline> <date time>)")
    wait = parser.add_argument_group("waiting")
    wait.add_argument(
        "--wait",
        action="store_true",
        help="wait until the run ends; exit 0 when it SUCCEEDED, 1 when it ended in any other state",
    )
    wait.add_argument(
        "--follow", action="store_true", help="like --wait, and print each task state change (one line each)"
    )
    wait.add_argument(
        "--poll-interval",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="seconds between status checks while waiting (default: 10)",
    )
    kb.add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def start(workdir: str) -> int:
        if args.poll_interval < 0:
            raise kb.UsageError(f"--poll-interval must be >= 0, got {args.poll_interval}")
        client, target, values = kb.prepare(args, workdir)
        with kb.quiet_client():
            run_name = args.run_name or f"{target.display_name} {datetime.datetime.now():%Y-%m-%d %H-%M-%S}"
            created = client.run_pipeline(
                experiment_id=kb.experiment_id(client, args),
                job_name=run_name,
                params=values,
                pipeline_root=args.pipeline_root,
                service_account=args.service_account,
                **target.job_arguments(),
            )
        print(f"run: {run_name}")
        print(f"run id: {created.run_id}")
        link = kb.ui_link(args, f"runs/details/{created.run_id}")
        if link:
            print(f"url: {link}")
        if not (args.wait or args.follow):
            return 0
        state = wait_for(client, created.run_id, args.poll_interval, follow=args.follow)
        if state == "SUCCEEDED":
            print(f"run {run_name} SUCCEEDED")
            return 0
        print(f"error: run {run_name} ({created.run_id}) ended in state {state}", file=sys.stderr)
        return 1

    return kb.run_command(args, start)


def wait_for(client, run_id: str, interval: float, *, follow: bool) -> str:
    """Poll the run until it reaches a final state and return that state; with `follow`, print the run's and each
    task's state whenever it changes."""
    seen: dict[str, str] = {}
    while True:
        with kb.quiet_client():
            current = client.get_run(run_id)
        state = str(current.state or "RUNTIME_STATE_UNSPECIFIED")
        if follow:
            tasks = (current.run_details.task_details or []) if current.run_details else []
            changes = [("run", "run", state)] + [
                (task.task_id or task.display_name, f"task {task.display_name}", str(task.state))
                for task in tasks
            ]
            for key, label, task_state in changes:
                if seen.get(key) != task_state:
                    seen[key] = task_state
                    print(f"{label}: {task_state}", flush=True)
        if state in FINAL_STATES:
            return state
        if interval:
            time.sleep(interval)
