"""images/: the Dockerfiles are pinned, non-root and take their versions from pyproject.toml; the component
image's requirement set installs, imports and compiles without torch; the trainer's resolves; the registry overlay
retags the runtimes.

No container engine runs here, so the Dockerfiles are read statically and their requirement sets are checked
for real with the installer they run (uv, through tools/uv_install.py).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from kfp_finetune import __version__
from kfp_finetune.components._shared import images
from kfp_finetune.components._shared.torchtune import flex_attention

REPO = Path(__file__).resolve().parents[2]
DOCKERFILES = {
    "component": REPO / "images" / "component" / "Dockerfile",
    "trainer": REPO / "images" / "trainer" / "Dockerfile",
}
OVERLAY = REPO / "images" / "registry-overlay"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
IMAGE_USER = "1000"
SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|ACCESS_KEY|API_KEY|CREDENTIAL", re.IGNORECASE)


# --- A small Dockerfile reader -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    arguments: str
    line: int


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def env(self) -> dict[str, str]:
        values: dict[str, str] = {}
        for instruction in self.all("ENV"):
            for item in shlex.split(instruction.arguments):
                key, _, value = item.partition("=")
                values[key] = value
        return values

    def run_text(self) -> str:
        return "\n".join(i.arguments for i in self.all("RUN"))


def parse_dockerfile(text: str) -> list[Instruction]:
    """Instructions with their continuation lines joined; comments and blank lines dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction is ignored by Docker too
        if not pending:
            start = number
        continued = line.endswith("\\")
        pending.append(line[:-1].rstrip() if continued else line)
        if not continued:
            keyword, _, arguments = " ".join(part for part in pending if part).partition(" ")
            instructions.append(Instruction(keyword.upper(), arguments.strip(), start))
            pending = []
    assert not pending, "the Dockerfile ends inside a continued instruction"
    return instructions


def build_stages(path: Path) -> tuple[dict[str, str], list[Stage]]:
    """The global ARG defaults and the stages, with `${ARG}` in FROM replaced by its default."""
    instructions = parse_dockerfile(path.read_text())
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in instructions:
        if instruction.keyword == "FROM":
            words = instruction.arguments.split()
            base = re.sub(r"\$\{?(\w+)\}?", lambda m: global_args[m.group(1)], words[0])
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base, name, []))
        elif not stages:
            assert instruction.keyword == "ARG", f"{path}:{instruction.line}: only ARG may precede FROM"
            key, _, value = instruction.arguments.partition("=")
            global_args[key] = value
        else:
            stages[-1].instructions.append(instruction)
    return global_args, stages


def final_stage(name: str) -> Stage:
    return build_stages(DOCKERFILES[name])[1][-1]


# Where the images copy the installer the Makefile also uses (tools/uv_install.py: `uv pip install` from pip's sources).
INSTALLER = "/tmp/wheels/uv_install.py"


def install_commands(stage: Stage) -> list[list[str]]:
    """Every `pip ...` command in the stage's RUN instructions, as words after `pip`, and every run of the
    installer, as `install` and its words (it runs `uv pip install`)."""
    commands = []
    for run in stage.all("RUN"):
        lexer = shlex.shlex(run.arguments, posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*lexer, ";"]:
            if token.strip(";&|"):
                words.append(token)
                continue
            if words[:1] in (["pip"], ["pip3"]):
                commands.append(words[1:])
            elif words[1:3] == ["-m", "pip"]:
                commands.append(words[3:])
            elif words[1:2] == [INSTALLER]:
                commands.append(["install", *words[2:]])
            words = []
    return commands


def positional_arguments(pip_words: list[str]) -> list[str]:
    """What pip is asked to install or build: words that are neither options nor option values."""
    options_with_values = {"-c", "--constraint", "-w", "--wheel-dir"}
    result, skip = [], False
    for word in pip_words[1:]:
        if skip:
            skip = False
        elif word in options_with_values:
            skip = True
        elif not word.startswith("-"):
            result.append(word)
    return result


# --- The Dockerfiles -----------------------------------------------------------------------------------------


def test_reader_joins_continuations_and_substitutes_base_image_args(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(
        textwrap.dedent(
            """\
            # comment
            ARG BASE=python:3.12.12-slim-bookworm
            FROM ${BASE} AS build
            RUN set -eu; \\
                # comment inside
                pip wheel --no-deps --wheel-dir /w .
            FROM $BASE
            RUN python /tmp/wheels/uv_install.py --no-deps /w/x.whl && pip uninstall --yes uv
            ENV A=1 \\
                B="two words"
            USER 1000
            """
        )
    )
    global_args, stages = build_stages(dockerfile)
    assert global_args == {"BASE": "python:3.12.12-slim-bookworm"}
    assert [(s.base, s.name) for s in stages] == [
        ("python:3.12.12-slim-bookworm", "build"),
        (global_args["BASE"], None),
    ]
    assert stages[0].run_text() == "set -eu; pip wheel --no-deps --wheel-dir /w ."
    assert install_commands(stages[0]) == [["wheel", "--no-deps", "--wheel-dir", "/w", "."]]
    assert positional_arguments(install_commands(stages[0])[0]) == ["."]
    assert stages[1].env() == {"A": "1", "B": "two words"}
    assert install_commands(stages[1]) == [["install", "--no-deps", "/w/x.whl"], ["uninstall", "--yes", "uv"]]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_dockerfile_uses_only_known_instructions(image):
    # No ADD (it fetches URLs and unpacks archives) and nothing BuildKit-only: docker, podman and buildah build it.
    known = {"ARG", "FROM", "ENV", "RUN", "COPY", "USER", "WORKDIR", "LABEL"}
    instructions = parse_dockerfile(DOCKERFILES[image].read_text())
    assert instructions and {i.keyword for i in instructions} <= known
    assert not [i for i in instructions if i.arguments.startswith("--mount")], "RUN --mount needs BuildKit"


@pytest.mark.parametrize("image", DOCKERFILES)
def test_base_images_are_pinned_to_a_full_version_tag(image):
    _, stages = build_stages(DOCKERFILES[image])
    stage_names = {s.name for s in stages if s.name}
    for stage in stages:
        if stage.base in stage_names:
            continue
        repository, _, tag = stage.base.rpartition(":")
        assert repository and "/" not in tag, f"{stage.base} has no tag"
        assert tag != "latest" and re.match(r"\d+\.\d+\.\d+", tag), f"{stage.base}: pin a full version tag"


def test_trainer_base_torch_satisfies_the_train_extra():
    global_args, _ = build_stages(DOCKERFILES["trainer"])
    repository, _, tag = global_args["PYTORCH_IMAGE"].rpartition(":")
    assert repository == "pytorch/pytorch"
    torch_version = Version(tag.split("-")[0])
    (torch_requirement,) = [
        Requirement(r) for r in PYPROJECT["optional-dependencies"]["train"] if Requirement(r).name == "torch"
    ]
    assert torch_version in torch_requirement.specifier, (
        f"the trainer base image has torch {torch_version}; pyproject's train extra wants {torch_requirement}"
    )
    assert "-cuda" in tag, "the trainer image needs a CUDA build of torch"


def test_component_base_python_satisfies_requires_python():
    global_args, _ = build_stages(DOCKERFILES["component"])
    repository, _, tag = global_args["PYTHON_IMAGE"].rpartition(":")
    assert repository == "python"
    python_version = Version(re.match(r"\d+\.\d+\.\d+", tag).group(0))
    assert python_version in SpecifierSet(PYPROJECT["requires-python"])


# The one install that is not the project itself: the `launch` extra's requirements (the pinned torchtune), read
# from the installed project's metadata and installed without their dependencies, because torchtune needs
# torchdata, which needs torch, and the component image has none. The version still comes from pyproject.toml.
LAUNCH_REQUIREMENTS = "/tmp/wheels/launch.txt"
READ_LAUNCH_EXTRA = re.compile(
    r"python -c '[^']*requires\(\"kfp-finetune\"\)[^']*extra == \\\"launch\\\"[^']*' > "
    + re.escape(LAUNCH_REQUIREMENTS)
)


# The installer itself, uv at the Makefile's version, is installed by pip first and uninstalled last.
UV_INSTALL = ["install", "--no-cache-dir", "uv==${UV_VERSION}"]
UV_UNINSTALL = ["uninstall", "--yes", "--quiet", "uv"]


@pytest.mark.parametrize("image", DOCKERFILES)
def test_pip_installs_only_the_project_so_versions_come_from_pyproject(image):
    _, stages = build_stages(DOCKERFILES[image])
    commands = [words for stage in stages for words in install_commands(stage)]
    assert commands, "no pip command found"
    final = install_commands(stages[-1])
    assert final[0] == UV_INSTALL and final[-1] == UV_UNINSTALL, final
    for words in commands:
        if words in (UV_INSTALL, UV_UNINSTALL):
            continue
        assert words[0] in ("install", "wheel"), words
        if words[0] == "install" and LAUNCH_REQUIREMENTS in words:
            # Allowed exactly: the launch extra, without dependencies, from the file the project's metadata wrote.
            assert image == "component", f"{image}: only the component image installs the launch extra alone"
            assert [w for w in words if w.startswith("-")] == ["--no-cache", "--no-deps", "--requirement"]
            assert words[-2:] == ["--requirement", LAUNCH_REQUIREMENTS], words
            assert READ_LAUNCH_EXTRA.search(final_stage(image).run_text()), (
                f"{LAUNCH_REQUIREMENTS} must be written from kfp-finetune's `launch` extra metadata"
            )
            continue
        targets = positional_arguments(words)
        assert targets, words
        for target in targets:
            # Local paths to the project (its source or its wheel), never a package name from an index.
            assert target == "." or target.startswith(("/tmp/wheels/kfp_finetune-", "${wheel}[")), (
                f"{image}: `{' '.join(words)}` installs {target!r}: put dependencies in pyproject.toml"
            )
        other_sources = (
            "-r",
            "--requirement",
            "-i",
            "--index-url",
            "--extra-index-url",
            "-f",
            "--find-links",
        )
        assert not [w for w in words if w.startswith(other_sources)], words


@pytest.mark.parametrize("image", DOCKERFILES)
def test_images_install_with_the_makefiles_uv_through_the_installer_they_copy(image):
    stage = final_stage(image)
    uv_version = build_arguments(image)["UV_VERSION"]
    makefile = (REPO / "Makefile").read_text()
    assert uv_version == re.search(r"^UV_VERSION \?= (\S+)", makefile, re.MULTILINE).group(1)
    assert [c.arguments for c in stage.all("COPY") if not c.arguments.startswith("--from")] == [
        f"tools/uv_install.py {Path(INSTALLER).parent}/"
    ]
    assert [w[0] for w in install_commands(stage)].count("install") >= 2, "uv, then the project through it"


def test_trainer_keeps_the_base_images_torch():
    run_text = final_stage("trainer").run_text()
    (install,) = [
        w for w in install_commands(final_stage("trainer")) if w[0] == "install" and w != UV_INSTALL
    ]
    constraint = install[install.index("--constraint") + 1]
    assert f"> {constraint}" in run_text and '"torch==" + version("torch")' in run_text
    extras = build_arguments("trainer")["EXTRAS"].split(",")
    assert set(extras) <= set(PYPROJECT["optional-dependencies"]) and "train" in extras


def test_wheel_stage_copies_everything_the_package_is_built_from():
    setup_py = (REPO / "setup.py").read_text()
    package_folders = set(re.findall(r'"kfp_finetune[.\w]*": "(\w+)"', setup_py))
    assert package_folders == {"kfp_finetune", "components", "pipelines"}
    for image in DOCKERFILES:
        assert set(copied_sources(image)) == {
            "pyproject.toml",
            "setup.py",
            PYPROJECT["readme"],
            *package_folders,
        }


def copied_sources(image: str) -> list[str]:
    """Files and folders the wheel stage copies from the build context."""
    _, stages = build_stages(DOCKERFILES[image])
    (wheel_stage,) = [s for s in stages if s.name == "wheel"]
    return [source for copy in wheel_stage.all("COPY") for source in copy.arguments.split()[:-1]]


def copied_to_the_image(image: str) -> dict[str, str]:
    """Files the final stage copies from the build context (not from another stage), each to where it lands."""
    copies = [
        c.arguments.split() for c in final_stage(image).all("COPY") if not c.arguments.startswith("--from")
    ]
    return {source: words[-1] for words in copies for source in words[:-1]}


def test_dockerignore_admits_exactly_what_the_images_copy():
    lines = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "the build context is a whitelist"
    admitted = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    for image in DOCKERFILES:
        assert set(copied_sources(image)) | set(copied_to_the_image(image)) == admitted


@pytest.mark.parametrize("image", DOCKERFILES)
def test_runs_as_a_numeric_non_root_user_in_group_zero(image):
    stage = final_stage(image)
    (user,) = stage.all("USER")
    assert user.arguments == IMAGE_USER, "a numeric uid lets Kubernetes verify runAsNonRoot"
    assert f"useradd --uid {IMAGE_USER} --gid 0 " in stage.run_text()


@pytest.mark.parametrize("image", DOCKERFILES)
def test_hf_home_and_caches_are_under_the_users_writable_home(image):
    stage = final_stage(image)
    env = stage.env()
    home = env["HOME"]
    run_text = stage.run_text()
    # Owned by the user and by group 0 with group = user permissions: writable by uid 1000 and by any uid in group 0.
    assert f'chown -R {IMAGE_USER}:0 "$HOME"' in run_text
    assert 'chmod -R g=u "$HOME"' in run_text
    cache_variables = ["XDG_CACHE_HOME", "HF_HOME"]
    if image == "trainer":
        cache_variables += ["TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"]
    for variable in cache_variables:
        assert env[variable].startswith(home + "/"), f"{variable}={env[variable]} is outside {home}"
    assert stage.all("WORKDIR")[-1].arguments == home


@pytest.mark.parametrize("image", DOCKERFILES)
def test_no_secrets_are_baked_in(image):
    global_args, stages = build_stages(DOCKERFILES[image])
    names = set(global_args)
    for stage in stages:
        names |= set(stage.env())
        names |= {i.arguments.split("=", 1)[0] for i in stage.all("ARG")}
        for copy in stage.all("COPY"):
            assert not re.search(r"\.env\b|netrc|credentials|\.aws|token", copy.arguments, re.IGNORECASE)
    assert not [name for name in names if SECRET_NAME.search(name)]


def make_images_dry_run(*variables: str) -> list[str]:
    """The commands `make images` would run, with spaces normalised."""
    env = {
        k: v for k, v in os.environ.items() if k not in ("IMAGE_REGISTRY", "IMAGE_TAG", "IMAGE_BUILD_ARGS")
    }
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", "images", *variables],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return [" ".join(line.split()) for line in result.stdout.splitlines()]


def default_images(monkeypatch) -> list[str]:
    """images.py's defaults, without any override from the environment."""
    monkeypatch.delenv("KFP_FINETUNE_COMPONENT_IMAGE", raising=False)
    monkeypatch.delenv("KFP_FINETUNE_TRAINER_IMAGE", raising=False)
    monkeypatch.delenv("KFP_FINETUNE_TRANSFORMERS_TRAINER_IMAGE", raising=False)
    try:
        module = importlib.reload(images)
        return [module.COMPONENT_IMAGE, module.TRAINER_IMAGE, module.TRANSFORMERS_TRAINER_IMAGE]
    finally:
        monkeypatch.undo()
        importlib.reload(images)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_images_tags_the_images_the_components_use_by_default(monkeypatch):
    component_image, trainer_image, transformers_image = default_images(monkeypatch)
    engine_extras = "--build-arg EXTRAS=train,gpu,parity,transformers-engine,tracking,lm-eval-transformers"
    assert make_images_dry_run("CONTAINER_ENGINE=podman") == [
        f"podman build -f images/component/Dockerfile -t {component_image} .",
        f"podman build -f images/trainer/Dockerfile -t {trainer_image} .",
        f"podman build {engine_extras} -f images/trainer/Dockerfile -t {transformers_image} .",
    ]
    registry = "registry.example.com/ml"
    assert make_images_dry_run("CONTAINER_ENGINE=docker", f"IMAGE_REGISTRY={registry}") == [
        f"docker build -f images/component/Dockerfile -t {registry}/kfp-finetune-component:{__version__} .",
        f"docker build -f images/trainer/Dockerfile -t {registry}/kfp-finetune-trainer:{__version__} .",
        f"docker build {engine_extras} -f images/trainer/Dockerfile -t "
        f"{registry}/kfp-finetune-trainer-transformers:{__version__} .",
    ]


def test_the_transformers_engine_image_has_its_extra_and_not_lm_evals_transformers_4():
    """The engine needs transformers 5 (TRL 1.x); lm-eval's extra pins transformers<5: one image cannot hold both."""
    extras = trainer_extras("trainer-transformers").split(",")
    optional = PYPROJECT["optional-dependencies"]
    assert set(extras) <= set(optional) and "transformers-engine" in extras and "lm-eval" not in extras
    assert any(r.startswith("trl") for r in optional["transformers-engine"])
    # Its lm-eval is the one that imports beside transformers 5 (evaluate's lm_eval_tasks on that engine).
    assert "lm-eval-transformers" in extras and not any(
        "transformers" in r for r in optional["lm-eval-transformers"]
    )


# --- The registry overlay ------------------------------------------------------------------------------------


def test_registry_overlay_retags_the_runtimes_trainer_images(monkeypatch):
    overlay = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())
    assert overlay["resources"] == ["../../runtimes"]
    trainer_images = default_images(monkeypatch)[1:]
    assert [f"{image['name']}:{__version__}" for image in overlay["images"]] == trainer_images
    for image in overlay["images"]:
        assert image["newTag"] == __version__, "bump the example tag with the package version"


@pytest.mark.skipif(
    shutil.which("kubectl") is None, reason="kubectl (with its built-in kustomize) is not installed"
)
def test_registry_overlay_renders_with_the_new_image_everywhere_and_nothing_else_changed():
    def render(folder: Path) -> list[dict]:
        result = subprocess.run(
            ["kubectl", "kustomize", str(folder)], capture_output=True, text=True, check=True
        )
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    base, overlaid = render(REPO / "runtimes"), render(OVERLAY)
    images_ = yaml.safe_load((OVERLAY / "kustomization.yaml").read_text())["images"]
    retagged = {f"{i['name']}:{__version__}": f"{i['newName']}:{i['newTag']}" for i in images_}
    runtimes = [doc for doc in overlaid if doc["kind"] == "ClusterTrainingRuntime"]
    assert runtimes
    for runtime in runtimes:
        for job in runtime["spec"]["template"]["spec"]["replicatedJobs"]:
            for container in job["template"]["spec"]["template"]["spec"]["containers"]:
                assert container["image"] in retagged.values()
    base_text, overlaid_text = yaml.safe_dump_all(base), yaml.safe_dump_all(overlaid)
    for number, (old, new) in enumerate(retagged.items()):
        base_text, overlaid_text = (
            base_text.replace(old, f"IMAGE{number}"),
            overlaid_text.replace(new, f"IMAGE{number}"),
        )
    assert overlaid_text == base_text


# --- Requirement sets, installed and resolved for real -----------------------------------------------------

# Runs inside the component image's environment: import and compile everything, report what happened.
COMPILE_EVERYTHING = r"""
import importlib, importlib.util, json, pkgutil, sys
from pathlib import Path

from kfp import compiler
from kfp.dsl.base_component import BaseComponent

import kfp_finetune.components
import kfp_finetune.pipelines
from kfp_finetune.components._shared.images import COMPONENT_IMAGE

out = Path(sys.argv[1])
modules = [
    f"kfp_finetune.components.{m.name}.component"
    for m in pkgutil.iter_modules(kfp_finetune.components.__path__)
    if m.ispkg and importlib.util.find_spec(f"kfp_finetune.components.{m.name}.component")
]
modules += [m.name for m in pkgutil.walk_packages(kfp_finetune.pipelines.__path__, "kfp_finetune.pipelines.")]
compiled, seen, light_packages = [], set(), set()
for module_name in modules:
    module = importlib.import_module(module_name)
    for attribute, value in vars(module).items():
        if isinstance(value, BaseComponent) and id(value) not in seen:
            seen.add(id(value))
            compiler.Compiler().compile(value, str(out / f"{module_name}.{attribute}.yaml"))
            compiled.append(f"{module_name}.{attribute}")
            container = value.component_spec.implementation.container
            if container is not None and container.image == COMPONENT_IMAGE:
                light_packages.add(module_name.rsplit(".", 1)[0])
imported = []
for package in sorted(light_packages):
    for info in pkgutil.walk_packages(importlib.import_module(package).__path__, package + "."):
        importlib.import_module(info.name)
        imported.append(info.name)
print(json.dumps({
    "compiled": compiled,
    "component_image_packages": sorted(light_packages),
    "imported": imported,
    "torch_installed": importlib.util.find_spec("torch") is not None,
    "torch_loaded": "torch" in sys.modules,
}))
"""


def build_context(destination: Path) -> Path:
    """The files the Dockerfiles copy, as a build context would hold them."""
    destination.mkdir()
    for source in [*copied_sources("component"), *copied_to_the_image("component")]:
        path = REPO / source
        if path.is_dir():
            shutil.copytree(path, destination / source, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            (destination / source).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, destination / source)
    return destination


CHOOSE_TRANSFORMERS_ENGINE = """
import json, sys
from kfp_finetune.components._shared.transformers.face import serves
served, _ = serves(None, {"model_type": "qwen3_moe"})
heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "transformers"))
print(json.dumps({"served": served, "heavy": heavy}))
"""


UNCOMPILED_MODULES = """
import importlib.util, os, sys
for name in sys.argv[1:]:
    if not os.path.exists(importlib.util.find_spec(name).cached):
        print(name)
"""


def clean_environment() -> dict[str, str]:
    dropped = ("PYTHONPATH", "VIRTUAL_ENV", "KFP_FINETUNE_COMPONENT_IMAGE", "KFP_FINETUNE_TRAINER_IMAGE")
    return {k: v for k, v in os.environ.items() if k not in dropped}


def component_environment_instruction() -> str:
    """The component image's RUN instruction that builds its Python environment from the wheels in /tmp/wheels."""
    (run,) = [r.arguments for r in final_stage("component").all("RUN") if "pip install" in r.arguments]
    return run


def build_arguments(image: str) -> dict[str, str]:
    """The final stage's ARG defaults, which Docker gives RUN instructions as environment variables."""
    return dict(i.arguments.split("=", 1) for i in final_stage(image).all("ARG"))


@pytest.mark.slow
def test_component_image_environment_imports_compiles_and_resolves_a_cuda_run_without_torch(
    tmp_path, tiny_llama, tiny_dataset
):
    context = build_context(tmp_path / "context")
    venv = tmp_path / "venv"
    env = clean_environment()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    # The wheel stage, then the image's own install instruction run as written, in the venv: the project resolved
    # for real with its dependencies, and the launch extra (the pinned torchtune) without its dependencies.
    wheels = tmp_path / "wheels"
    subprocess.run(
        [str(python), "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", str(wheels), str(context)],
        check=True,
        env=env,
        capture_output=True,
        timeout=300,
    )
    for source in copied_to_the_image("component"):  # the installer, copied beside the wheels
        shutil.copy2(context / source, wheels)
    # As in the image, Python writes no bytecode: what the install did not compile stays uncompiled.
    no_bytecode = {"PYTHONDONTWRITEBYTECODE": final_stage("component").env()["PYTHONDONTWRITEBYTECODE"]}
    install = subprocess.run(
        ["sh", "-c", component_environment_instruction().replace("/tmp/wheels", str(wheels))],
        cwd=tmp_path,
        env={
            **env,
            **no_bytecode,
            **build_arguments("component"),
            "PATH": f"{venv / 'bin'}{os.pathsep}{env['PATH']}",
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    assert not wheels.exists(), "the instruction removes the wheels it installed"
    no_uv = subprocess.run([str(python), "-I", "-c", "import uv"], env=env, capture_output=True)
    assert no_uv.returncode != 0, "the instruction uninstalls the installer"
    installed = subprocess.run(
        [str(python), "-I", "-c", "from importlib.metadata import version; print(version('torchtune'))"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    (pinned,) = [Requirement(r) for r in PYPROJECT["optional-dependencies"]["launch"]]
    assert pinned.name == "torchtune" and installed.stdout.strip() in pinned.specifier
    # Byte-compiled at install, or every step would compile each module it imports from source, every time.
    uncompiled = subprocess.run(
        [
            str(python),
            "-I",
            "-B",
            "-c",
            UNCOMPILED_MODULES,
            "kfp",
            "kubernetes",
            "kfp_finetune.components._shared",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert uncompiled.stdout.split() == [], uncompiled.stdout
    # transformers' files too (launch-transformers, no dependencies): the launcher chooses and checks the
    # transformers engine for a model torchtune cannot serve, importing neither transformers nor torch.
    chosen = subprocess.run(
        [str(python), "-I", "-c", CHOOSE_TRANSFORMERS_ENGINE],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(chosen.stdout) == {"served": True, "heavy": []}, chosen.stdout
    out = tmp_path / "compiled"
    out.mkdir()
    result = subprocess.run(
        [str(python), "-I", "-c", COMPILE_EVERYTHING, str(out)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report["torch_installed"] and not report["torch_loaded"]
    no_torch = subprocess.run(
        [str(python), "-I", "-c", "import torch"], cwd=tmp_path, env=env, capture_output=True
    )
    assert no_torch.returncode != 0
    component_folders = sorted(p.parent.name for p in (REPO / "components").glob("*/component.py"))
    compiled_modules = {name.rsplit(".", 1)[0] for name in report["compiled"]}
    assert {f"kfp_finetune.components.{folder}.component" for folder in component_folders} <= compiled_modules
    assert len(list(out.glob("*.yaml"))) == len(report["compiled"])
    # The components that run on the component image import completely in it, implementation included.
    assert {
        "kfp_finetune.components.model_initialize",
        "kfp_finetune.components.preflight",
        "kfp_finetune.components.torchtune_finetune",
    } <= set(report["component_image_packages"])
    assert {f"{package}.component" for package in report["component_image_packages"]} < set(
        report["imported"]
    )
    # The fine-tune step's resolve path, as its launcher runs it: torchtune's files, no torch, a GPU run previewed.
    resolved = subprocess.run(
        [
            str(venv / "bin" / "kfp-finetune"),
            "resolve-config",
            "--model-dir",
            str(tiny_llama),
            "--data",
            str(tiny_dataset["train.jsonl"]),
            "--device",
            "cuda",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resolved.returncode == 0, resolved.stderr[-3000:]
    assert resolved.stdout.startswith("# recipe: lora_finetune_single_device\n"), resolved.stdout[:500]
    config = yaml.safe_load(resolved.stdout)
    # packed on CUDA: our builder (flex attention compiled as torchtune main does) over the family's torchtune one
    model = flex_attention.unwrap(config["model"])
    assert config["device"] == "cuda" and model["_component_"].startswith("torchtune.models.")
    assert config["model"]["_component_"] == flex_attention.COMPONENT


def trainer_extras(image: str) -> str:
    """The extras a trainer image installs: the Dockerfile's default, or the Makefile's for the engine image."""
    if image == "trainer":
        return build_arguments("trainer")["EXTRAS"]
    makefile = (REPO / "Makefile").read_text()
    return re.search(r"^TRANSFORMERS_TRAINER_EXTRAS \?= (\S+)", makefile, re.MULTILINE).group(1)


@pytest.mark.slow
@pytest.mark.parametrize("image", ["trainer", "trainer-transformers"])
def test_trainer_image_requirements_resolve_with_a_torch_in_range(image, tmp_path):
    """A trainer's extras resolve together as the image installs them (uv through the installer, a dry run:
    nothing is installed, no CUDA wheel is fetched)."""
    extras = trainer_extras(image)
    context = build_context(tmp_path / "context")
    # The trainer keeps its base image's torch; here the CPU build `make setup` installs stands in for it.
    makefile = (REPO / "Makefile").read_text()
    local_torch = re.search(r"^TORCH_VERSION \?= (\S+)", makefile, re.MULTILINE).group(1)
    constraint = tmp_path / "torch.txt"
    constraint.write_text(f"torch=={local_torch}\n")
    # Into an empty environment, so that everything the extras need is listed as to be installed.
    target = tmp_path / "empty"
    subprocess.run(
        [sys.executable, "-m", "uv", "venv", "--quiet", str(target)], check=True, env=clean_environment()
    )
    dry_run = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "uv_install.py"),
            "--dry-run",
            "--python",
            str(target / "bin" / "python"),
            "--constraint",
            str(constraint),
            f"{context}[{extras}]",
        ],
        env=clean_environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert dry_run.returncode == 0, dry_run.stderr[-3000:]
    # uv lists what it would install as ` + name==version` (or ` + name @ url` for the project itself).
    listed = re.findall(r"^ \+ (\S+)==(\S+)$", dry_run.stdout + dry_run.stderr, re.MULTILINE)
    resolved = {name.lower().replace("_", "-"): version for name, version in listed}
    assert "kfp-finetune" in dry_run.stderr and len(resolved) > 20, dry_run.stderr[-3000:]

    def requirements(extra: str) -> list[Requirement]:  # the extra's, with the project's own extras it names
        listed = [Requirement(r) for r in PYPROJECT["optional-dependencies"][extra]]
        nested = [r for r in listed if r.name == PYPROJECT["name"]]
        return [r for r in listed if r not in nested] + [
            n for r in nested for e in r.extras for n in requirements(e)
        ]

    wanted = [requirement for extra in extras.split(",") for requirement in requirements(extra)]
    assert "torchtune" in {r.name for r in wanted}
    for requirement in wanted:
        name = requirement.name.lower().replace("_", "-")
        assert name in resolved and Version(resolved[name]) in requirement.specifier, (
            requirement,
            resolved.get(name),
        )
    assert Version(resolved["torch"]).base_version == Version(local_torch).base_version
    assert not [name for name in resolved if name.startswith("nvidia-")], "a CUDA torch slipped in"
