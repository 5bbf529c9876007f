"""`kfp-finetune run`: start one run on a KFP backend, from a local pipeline or an uploaded version.

Parameters are checked against the pipeline's inputs before anything is sent (unknown or missing names, types).
Prints the run id and, when the UI address is known, its link.
"""

from __future__ import annotations

import argparse
import datetime

from kfp_finetune.commands import kfp_backend as kb


def add_arguments(parser: argparse.ArgumentParser) -> None:
    kb.add_source_arguments(parser)
    parser.add_argument("--run-name", help="display name of the run (default: <pipeline> <date time>)")
    kb.add_connection_arguments(parser)


def run(args: argparse.Namespace) -> int:
    def start(workdir: str) -> int:
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
        return 0

    return kb.run_command(args, start)
