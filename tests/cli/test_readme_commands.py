"""Every shell command in README.md and docs/*.md runs, or its offline equivalent does, so a documented command
that does not exist or crashes fails CI.

Each ```bash / ```sh block runs in order in its own sandbox (exports and `cd` carry over within a block). A
command is dispatched on its program; a program without a handler below fails the test, so a new kind of command
in the docs needs a handler here. Offline equivalents, where a command needs a cluster or a registry:

- `kfp-finetune upload/run/schedule`: against the KFP API stand-in (tests/support/kfp_standin.py) at KFP_HOST;
  `run --wait/--follow` on a run the stand-in moves to SUCCEEDED one step per status read.
- `kfp-finetune run-local`: the tiny model and 60 alpaca rows instead of the user's paths, every other parameter
  as written (issue 23's case: a run with every default on little data learns, passes the gate on evidence and
  exports the tuned model). A gated-out model kept and not exported: tests/pipelines/test_ecosystem_pipeline.py.
- `make <target>`: `make -n` (the target exists and expands); `make demo` runs in tests/cli/test_cli.py, `make test`
  in CI.
- `docker push <tag>`: the tag is one `make images` builds for that registry.
- `kubectl apply -k <dir>`: the kustomization builds (`kubectl kustomize`); `kubectl create …`: client-side dry run;
  `kubectl patch <kind> …`: `--local` on a minimal object of that kind; read-only `get/describe/auth`: the verb
  exists (`--help`), since their answer is the user's cluster.
- `kustomize edit set image OLD=NEW`: OLD is an image of the kustomization in the current folder.
- `kustomize edit add component DIR`: DIR is a kustomize Component, and the kustomization in the current folder
  builds with it (`kubectl kustomize`, where kubectl is installed).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from kfp_finetune.components._shared.torchtune.run_length import MIN_OPTIMIZER_STEPS
from kfp_finetune.components.torchtune_finetune.weights import same_weights
from tests.support.kfp_standin import KfpStandin
from tests.support.little_data import alpaca_rows

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"bash", "sh", "shell"}
BIN = Path(sys.executable).parent
TOKEN = "readme-token-7f3a"


@dataclass
class Block:
    document: Path
    line: int
    commands: list[str]  # continuation lines joined

    @property
    def id(self) -> str:
        name = self.document.relative_to(REPO) if self.document.is_relative_to(REPO) else self.document.name
        return f"{name}:{self.line}"


def shell_blocks(document: Path) -> list[Block]:
    blocks, current, pending = [], None, ""
    for number, line in enumerate(document.read_text().splitlines(), 1):
        fence = re.match(r"^\s*```(\w*)", line)
        if fence and current is None:
            current = Block(document, number, []) if fence[1] in SHELL_FENCES else Block(document, -1, [])
        elif fence:
            if current.line > 0:
                blocks.append(current)
            current = None
        elif current is not None and current.line > 0:
            pending += line.rstrip().removesuffix("\\") + (" " if line.rstrip().endswith("\\") else "")
            if not line.rstrip().endswith("\\"):
                if pending.strip() and not pending.strip().startswith("#"):
                    current.commands.append(pending.strip())
                pending = ""
    return blocks


BLOCKS = [block for document in DOCUMENTS for block in shell_blocks(document)]


def test_the_documents_have_commands():
    assert any("kfp-finetune run-local" in c for b in BLOCKS for c in b.commands)
    assert any(b.document.parent.name == "docs" for b in BLOCKS)


@dataclass
class Sandbox:
    tmp: Path
    kfp: KfpStandin
    tiny: dict
    env: dict = field(default_factory=dict)
    cwd: Path = REPO

    def run(self, argv: list[str], **kwargs) -> subprocess.CompletedProcess:
        result = subprocess.run(
            argv, cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=600, **kwargs
        )
        assert result.returncode == 0, (
            f"{shlex.join(argv)} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
        return result


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory, tiny_llama):
    """The tiny model and 60 alpaca rows: the least data a run with every default is planned to learn from."""
    data = alpaca_rows(tmp_path_factory.mktemp("readme-data") / "train.jsonl", 60)
    return {"model": tiny_llama, "data": data}


@pytest.mark.slow
@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_documented_commands_run(block, tmp_path, tiny_inputs):
    run_block(block, tmp_path, tiny_inputs)


def test_a_command_without_an_offline_equivalent_fails(tmp_path):
    """No silent skips: a documented command the test does not know fails it."""
    document = tmp_path / "README.md"
    document.write_text("Install:\n\n```bash\nhelm install kfp-finetune \\\n  ./chart  # the chart\n```\n")
    (block,) = shell_blocks(document)
    assert block.commands[0].split() == ["helm", "install", "kfp-finetune", "./chart", "#", "the", "chart"]
    with pytest.raises(AssertionError, match="no offline equivalent for `helm`"):
        run_block(block, tmp_path, {})


def run_block(block: Block, tmp_path: Path, tiny_inputs: dict) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / ".kfp-token").write_text(TOKEN)
    env = {
        "PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(home), "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1", "KUBECONFIG": str(tmp_path / "no-kubeconfig"), "TMPDIR": str(tmp_path),
    }  # fmt: skip
    # This worker's share of the cores for torch's threads (tests/conftest.py): without it, a run-local step's
    # training spins as many threads as the machine has cores against the other worker's.
    if "OMP_NUM_THREADS" in os.environ:
        env["OMP_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"]
    with KfpStandin(token=TOKEN, multi_user=True) as kfp:
        sandbox = Sandbox(tmp_path, kfp, tiny_inputs, env)
        for command in block.commands:
            argv = shlex.split(command, comments=True)
            handler = HANDLERS.get(argv[0])
            assert handler, (
                f"{block.id}: no offline equivalent for `{argv[0]}` in tests/cli/test_readme_commands.py"
            )
            handler(sandbox, argv, command)


# --- handlers -----------------------------------------------------------------------------------------------


def export(sandbox: Sandbox, argv: list[str], command: str) -> None:
    """Evaluated by bash (`$(cat ~/.kfp-token)`); a cluster address becomes the KFP stand-in's."""
    out = sandbox.run(["bash", "-c", f"{command}\nenv -0"]).stdout
    sandbox.env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
    if "KFP_HOST" in sandbox.env:
        sandbox.env["KFP_HOST"] = sandbox.kfp.url


def kfp_finetune(sandbox: Sandbox, argv: list[str], command: str) -> None:
    sandbox.cwd = sandbox.tmp  # the commands may write files (nightly.yaml); keep them out of the checkout
    args = [a.replace("/tmp/", f"{sandbox.tmp}/") for a in argv[1:]]
    if args[0] == "run-local":
        return run_local(sandbox, args)
    if args[0] in ("upload", "run", "schedule"):
        assert sandbox.env.get("KFP_HOST") == sandbox.kfp.url, "the docs export KFP_HOST first"
        if "--params-file" in args:
            params = {
                "data_uri": "hf://org/data",
                "model_uri": "hf://org/model",
                "export_destination": "s3://b/m",
            }
            (sandbox.cwd / args[args.index("--params-file") + 1]).write_text(yaml.safe_dump(params))
        if args[0] != "upload" and not sandbox.kfp.pipelines:  # run/schedule use what upload created
            sandbox.run([str(BIN / "kfp-finetune"), "upload", "finetune-pipeline", "--namespace", "team-a"])
        if args[0] == "run" and {"--wait", "--follow"} & set(args):
            # The stand-in moves the run one step per status read; the CLI asks without pausing.
            sandbox.kfp.plan_next_run(
                ("RUNNING", {"dataset-initialize": "RUNNING"}),
                ("SUCCEEDED", {"dataset-initialize": "SUCCEEDED"}),
            )
            args += ["--poll-interval", "0"]
    out = sandbox.run([str(BIN / "kfp-finetune"), *args]).stdout
    if "--follow" in args:
        assert "task dataset-initialize: SUCCEEDED" in out and "run: SUCCEEDED" in out, out


def run_local(sandbox: Sandbox, args: list[str]) -> None:
    """The run trains at least the floor of optimizer steps, evaluates the tuned model better than the base on the
    held-out rows, passes the gate on evidence (the interval's lower bound above 0) and exports the tuned model;
    the terminal output is short and what it names is kept."""
    values = {"model_uri": str(sandbox.tiny["model"]), "data_uri": str(sandbox.tiny["data"])}
    values["export_destination"] = str(sandbox.tmp / "exported")
    args = [f"{a.split('=')[0]}={values[a.split('=')[0]]}" if a.split("=")[0] in values else a for a in args]
    if "--output" in args:
        args[args.index("--output") + 1] = str(sandbox.tmp / "local_outputs")
    out = sandbox.run([str(BIN / "kfp-finetune"), *args]).stdout
    assert len(out.splitlines()) < 100, out
    steps = int(out.split("training: loss ")[1].split(" in ")[1].split(" steps")[0])
    assert steps >= MIN_OPTIMIZER_STEPS, out
    eval_loss = next(line for line in out.splitlines() if line.strip().startswith("eval_loss")).split()
    assert float(eval_loss[2]) < float(eval_loss[1]), out  # tuned below base on the held-out rows
    low = float(out.split("eval_loss", 1)[1].split("[", 1)[1].split(",", 1)[0])
    assert "quality gate: passed: the model was exported" in out and low > 0, out
    base, exported = sandbox.tiny["model"], sandbox.tmp / "exported"
    assert list(exported.glob("*.safetensors")) and same_weights(exported, base) == 0
    kept = sandbox.tmp / "local_outputs" / "tuned-model" / "torchtune-finetune"
    assert (kept / "adapter" / "adapter_model.safetensors").is_file(), out
    assert same_weights(kept / "merged", base) == 0  # the step merged the adapter after training
    reports = sandbox.tmp / "local_outputs" / "reports"
    assert {p.name for p in reports.iterdir()} == {"train_report.html", "eval_report.html"}
    summary = out[out.index("\nkfp-finetune: ") :].splitlines()
    shown = [m[2] for line in summary if (m := re.match(r"  ([a-z ()/-]+): +(\S+)$", line))]
    assert "full log" in out and shown and all((sandbox.cwd / p).exists() for p in shown), out
    assert not (sandbox.tmp / "local_outputs" / "workspace").exists()


def make(sandbox: Sandbox, argv: list[str], command: str) -> None:
    sandbox.run(["make", "-n", "-C", str(REPO), *argv[1:]])


def docker(sandbox: Sandbox, argv: list[str], command: str) -> None:
    assert argv[1] == "push", command
    registry = argv[2].rsplit("/", 1)[0]
    built = sandbox.run(["make", "-n", "-C", str(REPO), "images", f"IMAGE_REGISTRY={registry}"]).stdout
    assert f"-t {argv[2]} " in built + " ", f"`make images` does not build {argv[2]}:\n{built}"


def cd(sandbox: Sandbox, argv: list[str], command: str) -> None:
    sandbox.cwd = (sandbox.cwd / argv[1]).resolve()
    assert sandbox.cwd.is_dir(), command


def kustomize(sandbox: Sandbox, argv: list[str], command: str) -> None:
    kustomization = yaml.safe_load((sandbox.cwd / "kustomization.yaml").read_text())
    if argv[1:4] == ["edit", "set", "image"]:
        assert argv[4].split("=")[0] in [i["name"] for i in kustomization.get("images", [])], command
        return
    assert argv[1:4] == ["edit", "add", "component"], command
    component = sandbox.cwd / argv[4]
    assert yaml.safe_load((component / "kustomization.yaml").read_text())["kind"] == "Component", command
    if shutil.which("kubectl"):
        # An overlay of the current folder's kustomization plus the component, beside it rather than in it.
        overlay = sandbox.tmp / "with-component"
        overlay.mkdir(exist_ok=True)
        paths = {"resources": [sandbox.cwd], "components": [component]}
        relative = {key: [os.path.relpath(p, overlay) for p in value] for key, value in paths.items()}
        (overlay / "kustomization.yaml").write_text(yaml.safe_dump(relative))
        sandbox.run(["kubectl", "kustomize", str(overlay)])


def kubectl(sandbox: Sandbox, argv: list[str], command: str) -> None:
    if shutil.which("kubectl") is None:  # CI's machine has it; a user's laptop may not
        pytest.skip(f"kubectl is not installed: cannot check `{command}` offline")
    verb = argv[1]
    if verb == "apply":
        target = argv[argv.index("-k") + 1]
        built = sandbox.run(["kubectl", "kustomize", str(sandbox.cwd / target)]).stdout
        assert list(yaml.safe_load_all(built)), command
    elif verb == "create":
        sandbox.run([*argv, "--dry-run=client", "-o", "yaml"])
    elif verb == "patch":
        kind, name = argv[2], argv[3]
        manifest = sandbox.tmp / f"{kind}.yaml"
        manifest.write_text(
            yaml.safe_dump({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
        )
        assert kind == "serviceaccount", command
        patch = argv[argv.index("-p") + 1]
        patched = yaml.safe_load(
            sandbox.run(
                ["kubectl", "patch", "--local", "-f", str(manifest), "-p", patch, "-o", "yaml"]
            ).stdout
        )
        assert patched["imagePullSecrets"], command
    elif verb in ("get", "describe", "auth"):
        sandbox.run(["kubectl", *argv[1 : 3 if verb == "auth" else 2], "--help"])
    else:
        pytest.fail(
            f"no offline equivalent for `kubectl {verb}`: add one to tests/cli/test_readme_commands.py"
        )


HANDLERS = {
    "export": export,
    "kfp-finetune": kfp_finetune,
    "make": make,
    "docker": docker,
    "cd": cd,
    "kustomize": kustomize,
    "kubectl": kubectl,
}
