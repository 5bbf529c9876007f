"""`kfp-finetune upload`: put a pipeline on a KFP backend: create it if new, else add a version.

The version name defaults to `v<kfp-finetune version>-<content hash>`. Uploading a spec equal to the newest version's
(or to the version of that name) reports the existing version instead of adding a duplicate.

Names are checked here first, with the API server's rules, so a bad one fails before anything is sent. The name
inside the spec (`pipelineInfo.name`, which KFP also uses as the pipeline's MLMD context) is checked, never
rewritten: it is part of the compiled file the user chose, and an upload must store that file as it is.
"""

from __future__ import annotations

import argparse
import re

from kfp_finetune.commands import kfp_backend as kb

# The API server's second check of an uploaded spec's name (backend/src/apiserver/common/utils.go
# `ValidatePipelineName`, "to match MLMD requirements"; applied on upload by resource/resource_manager.go) and the
# column lengths of the pipeline and version names (apiserver/validation/length.go).
_SPEC_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,127}")
MAX_PIPELINE_NAME = 128
MAX_VERSION_NAME = 127


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


def check_names(package: kb.Package, name: str, version_name: str, source: str) -> None:
    """UsageError naming what to change when KFP would refuse the upload for a name."""
    spec_name = package.name
    if package.spec is not None and not (spec_name and _SPEC_NAME.fullmatch(spec_name)):
        suggestion = re.sub(r"[^a-z0-9]+", "-", (spec_name or "").lower()).strip("-")[:128]
        hint = f", e.g. @dsl.pipeline(name={suggestion!r})," if suggestion else ""
        raise kb.UsageError(
            f"{source}: KFP refuses the pipeline name {spec_name!r} (pipelineInfo.name): it takes 1-128 lowercase "
            f"letters, digits and '-', starting with a letter or digit. Rename the pipeline{hint} and compile again"
        )
    for flag, value, longest in (
        ("--name", name, MAX_PIPELINE_NAME),
        ("--version-name", version_name, MAX_VERSION_NAME),
    ):
        if len(value) > longest:
            raise kb.UsageError(f"{flag} is {len(value)} characters long; KFP takes at most {longest}")


def run(args: argparse.Namespace) -> int:
    def upload(workdir: str) -> int:
        package = kb.load_package(args.source, workdir)
        name = args.name or package.name or package.path.stem
        version_name = args.version_name or default_version_name(package)
        check_names(package, name, version_name, args.source)
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
