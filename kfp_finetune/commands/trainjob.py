"""`kfp-finetune trainjob --dry-run`: print the TrainJob a fine-tune step would create, without a cluster.

The manifest comes from `TrainJobBackend.manifest`, the very function the TrainJob backend builds what it sends with.

The manifest on stdout is what `kubectl apply -f -` would get; notes (recipe, unmounted paths) go to stderr.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

DEFAULT_RUN_ID = "local"
DEFAULT_TASK = "torchtune-finetune"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run", action="store_true", required=True, help="print the manifest only (the only mode so far)"
    )
    parser.add_argument("--model-dir", required=True, help="HF-layout model folder (as the node pods see it)")
    parser.add_argument(
        "--data", required=True, help="training data file or folder (as the node pods see it)"
    )
    parser.add_argument("--method", default="lora", choices=["full", "lora", "qlora", "dora"])
    parser.add_argument("--nodes", type=int, default=1, help="number of node pods (default: 1)")
    parser.add_argument("--gpus", type=int, default=1, help="GPUs per node; 0 = CPU (default: 1)")
    parser.add_argument(
        "--runtime", help="ClusterTrainingRuntime (default: torchtune, or torchtune-cpu with --gpus 0)"
    )
    parser.add_argument("--name", help="TrainJob name (default: derived from --run-id, --task and --task-id)")
    parser.add_argument("--run-id", default=DEFAULT_RUN_ID, help="KFP run id recorded on the TrainJob")
    parser.add_argument("--task", default=DEFAULT_TASK, help="KFP task name recorded on the TrainJob")
    parser.add_argument(
        "--task-id",
        default="",
        help="KFP task id ({{$.pipeline_task_uuid}}) of the fine-tune step, to get the name a pipeline run gives",
    )
    parser.add_argument("--namespace", help="namespace to put in the manifest")
    parser.add_argument("--image", help="trainer image override (default: the runtime's)")
    parser.add_argument(
        "--workspace",
        help="run workspace directory (default: the folder holding models/<name>, else the current one); "
        "the resolved YAML goes to <workspace>/runs/<name>/",
    )
    parser.add_argument(
        "--workspace-pvc", help="PVC holding the workspace, mounted in the node pods at the workspace path"
    )
    parser.add_argument(
        "--timeout", type=int, default=0, help="activeDeadlineSeconds of the TrainJob; 0 (default): no limit"
    )


# Kubernetes' object-name rules (k8s.io/apimachinery/pkg/util/validation/validation.go): a namespace is a DNS-1123
# label (IsDNS1123Label, at most 63), a ClusterTrainingRuntime or a PVC a DNS-1123 subdomain (IsDNS1123Subdomain,
# at most 253). The API server would refuse the manifest with a 422 only once it is applied.
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(rf"{_DNS1123_LABEL.pattern}(\.{_DNS1123_LABEL.pattern})*")
# (flag, argument, form, longest, what the form allows)
_NAME_FLAGS = (
    ("--namespace", "namespace", _DNS1123_LABEL, 63, "lowercase letters, digits and '-'"),
    ("--runtime", "runtime", _DNS1123_SUBDOMAIN, 253, "lowercase letters, digits, '-' and '.'"),
    ("--workspace-pvc", "workspace_pvc", _DNS1123_SUBDOMAIN, 253, "lowercase letters, digits, '-' and '.'"),
)


def _problems(args: argparse.Namespace) -> list[str]:
    """What is wrong with the flags' values, each naming its flag and the fix (the manifest is built from them)."""
    from kfp_finetune.components._shared.images import reference_problem

    found = []
    if args.gpus < 0:
        found.append(f"--gpus must be 0 (CPU) or more (got {args.gpus})")
    if args.nodes < 1:
        found.append(f"--nodes must be at least 1 (got {args.nodes})")
    if args.timeout < 0:
        found.append(f"--timeout must be 0 (no limit) or more seconds (got {args.timeout})")
    for flag, attribute, form, longest, allowed in _NAME_FLAGS:
        value = getattr(args, attribute)
        if value is not None and not (form.fullmatch(value) and len(value) <= longest):
            found.append(
                f"{flag} {value!r} is not a Kubernetes name: use at most {longest} {allowed}, starting and "
                "ending with a letter or digit"
            )
    problem = reference_problem(args.image) if args.image is not None else None
    if problem:
        found.append(f"--image {problem}")
    return found


def _workspace(args: argparse.Namespace) -> Path:
    if args.workspace:
        return Path(args.workspace).absolute()
    model_dir = Path(args.model_dir).absolute()
    return model_dir.parent.parent if model_dir.parent.name == "models" else Path.cwd()


def run(args: argparse.Namespace) -> int:
    import yaml

    from kfp_finetune.components._shared import engines
    from kfp_finetune.components._shared.torchtune.config import ConfigError, TorchtuneConfig
    from kfp_finetune.components._shared.torchtune.resolve import resolve_run
    from kfp_finetune.components.torchtune_finetune.backends.trainjob import TrainJobBackend
    from kfp_finetune.components.torchtune_finetune.backends.trainjob import manifest as tj

    problems = _problems(args)
    if problems:
        print(f"error: {'; '.join(problems)}", file=sys.stderr)
        return 2
    try:
        name = (
            tj.validate_name(args.name)
            if args.name
            else tj.trainjob_name(args.run_id, args.task, args.task_id)
        )
        workspace = _workspace(args)
        run_dir = workspace / "runs" / name
        choice = engines.choose(args.model_dir, engines.model_config(args.model_dir))
        face = engines.face(choice.engine)
        device = "cpu" if args.gpus == 0 else None
        if hasattr(face, "plan_run"):  # a wing that plans its own runs
            resolved = face.plan_run(
                {"method": args.method, "device": device}, model_dir=Path(args.model_dir).absolute(),
                data_files=[str(Path(args.data).absolute())], run_dir=run_dir, devices=max(args.gpus, 1),
                nodes=args.nodes, write=False,
            )  # fmt: skip
        else:
            resolved = resolve_run(
                TorchtuneConfig(method=args.method, device=device),
                args.model_dir,
                args.data,
                run_dir,
                devices=max(args.gpus, 1),
                nodes=args.nodes,
                write=False,
            )
    except (ConfigError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    pod = tj.NodePodSettings()
    if args.gpus:
        pod.resources = {"limits": {"nvidia.com/gpu": str(args.gpus)}}
    if args.workspace_pvc:
        volume, mount = tj.workspace_volume(args.workspace_pvc, str(workspace))
        pod.volumes.append(volume)
        pod.volume_mounts.append(mount)
    backend = TrainJobBackend(
        pod=pod,
        devices=args.gpus or None,
        nodes=args.nodes,
        # The engine's runtime, or its CPU variant (runtimes/: `<runtime>-cpu`).
        runtime=args.runtime or (face.RUNTIME if args.gpus else f"{face.RUNTIME}-cpu"),
        image=args.image,
        timeout=args.timeout or None,
        run_id=args.run_id,
        task_name=args.task,
        job_name=name,
        namespace=args.namespace,
    )
    manifest = backend.manifest(resolved)

    written = getattr(resolved, "yaml_path", None) or resolved.settings_path
    print(f"# {choice.line()}", file=sys.stderr)
    print(
        f"# recipe {resolved.recipe}, config {getattr(resolved, 'config_name', None) or 'user file'}",
        file=sys.stderr,
    )
    print(f"# resolved settings (not written by --dry-run): {written}", file=sys.stderr)
    paths = [str(written), str(Path(args.model_dir).absolute()), str(Path(args.data).absolute())]
    missing = tj.unmounted_paths(paths, pod.volume_mounts)
    if missing:
        print(
            "# warning: not on a volume mounted in the node pods (pass --workspace-pvc): "
            + ", ".join(missing),
            file=sys.stderr,
        )
    yaml.safe_dump(manifest, sys.stdout, sort_keys=False)
    return 0
