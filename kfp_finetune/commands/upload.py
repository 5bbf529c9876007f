"""`kfp-finetune upload`: put a pipeline on a KFP backend: create it if new, else add a version.

The version name defaults to `v<kfp-finetune version>-<content hash>`. Uploading a spec equal to the newest version's
(or to the version of that name) reports the existing version instead of adding a duplicate.
"""

from __future__ import annotations

import argparse

from kfp_finetune.commands import kfp_backend as kb


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "source",
        help="one of our pipelines (e.g. finetune-pipeline, compiled now) or a compiled "
        "pipeline file (.yaml, .zip, .tar.gz)",
    )
    parser.add_argument("--name", help="pipeline name in KFP (default: the name inside the pipeline)")
    parser.add_argument("--version-name", help="name of the new version (default: v<package version>-<hash>)")
    parser.add_argument("--description", help="description of the pipeline (when new) or of the version")
    kb.add_connection_arguments(parser)


def default_version_name(package: kb.Package) -> str:
    from kfp_finetune import __version__

    return f"v{__version__}-{package.sha256()[:12]}"


def run(args: argparse.Namespace) -> int:
    def upload(workdir: str) -> int:
        package = kb.load_package(args.source, workdir)
        name = args.name or package.name or package.path.stem
        version_name = args.version_name or default_version_name(package)
        client = kb.connect(args)
        with kb.quiet_client():
            pipeline_id = kb.find_pipeline_id(client, name, args.namespace)
            if pipeline_id is None:
                pipeline = client.upload_pipeline(
                    str(package.path),
                    pipeline_name=name,
                    description=args.description,
                    namespace=args.namespace,
                )
                pipeline_id, outcome = pipeline.pipeline_id, "created"
                # KFP names a new pipeline's first version after the pipeline.
                version = kb.find_version(client, pipeline_id, None)
            else:
                version = kb.find_version(client, pipeline_id, version_name)
                if version is not None and args.version_name:
                    raise kb.UsageError(f"pipeline {name!r} already has a version called {version_name!r}")
                if version is None and not args.version_name:
                    # The first version is named after the pipeline, so also compare with the newest one's spec.
                    newest = kb.find_version(client, pipeline_id, None)
                    if newest is not None and package.stored_form() == newest.pipeline_spec:
                        version = newest
                outcome = "unchanged: the version below has the same spec" if version else "new version"
                if version is None:
                    version = client.upload_pipeline_version(
                        str(package.path), version_name, pipeline_id=pipeline_id, description=args.description
                    )
        print(f"pipeline: {name} ({outcome})")
        print(f"pipeline id: {pipeline_id}")
        if version is not None:
            print(f"version: {version.display_name} (id {version.pipeline_version_id})")
            link = kb.ui_link(args, f"pipelines/details/{pipeline_id}/version/{version.pipeline_version_id}")
        else:
            link = kb.ui_link(args, f"pipelines/details/{pipeline_id}")
        if link:
            print(f"url: {link}")
        return 0

    return kb.run_command(args, upload)
