"""The distribution: a wheel that carries the mapped packages and the console script, with the pinned stack."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (path,) = out.glob("kfp_finetune-*.whl")
    return path


@pytest.mark.slow
def test_wheel_maps_components_and_pipelines_into_the_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for expected in (
        "kfp_finetune/cli.py",
        "kfp_finetune/components/_shared/workspace.py",
        "kfp_finetune/components/_shared/torchtune/resolve.py",
        "kfp_finetune/pipelines/__init__.py",
        "kfp_finetune/tiny/model.py",
    ):
        assert expected in names
    assert not any(name.startswith(("tests/", "components/", "pipelines/")) for name in names)
    dist_info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
    entry_points = zipfile.ZipFile(wheel).read(f"{dist_info}/entry_points.txt").decode()
    assert "kfp-finetune = kfp_finetune.cli:main" in entry_points


@pytest.mark.slow
def test_installed_wheel_imports_without_the_source_tree(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
    )
    probe = "import kfp_finetune.components._shared.torchtune.config as c, kfp_finetune.pipelines; print(c.__file__)"
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip().startswith(str(target))


def test_pinned_stack():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base, train = set(project["dependencies"]), set(project["optional-dependencies"]["train"])
    assert {"kfp==2.17.0", "kfp-kubernetes==2.17.0", "kubeflow-trainer-api==2.3.0"} <= base
    # torchtune is pinned once, in `launch` (the component image installs it alone, without dependencies).
    assert project["optional-dependencies"]["launch"] == ["torchtune==0.6.1"]
    assert {"kfp-finetune[launch]", "torchao==0.15.0", "torchdata==0.11.0"} <= train
    pins = [dep for extra in project["optional-dependencies"].values() for dep in extra if "torchtune" in dep]
    assert pins == ["torchtune==0.6.1"], "one torchtune pin"
    assert not any(dep.startswith("torch") for dep in base), "compiling pipelines must not need torch"
    torch_spec = next(dep for dep in train if dep.startswith("torch>") or dep.startswith("torch<"))
    from packaging.specifiers import SpecifierSet

    assert "2.13.0" in SpecifierSet(torch_spec.removeprefix("torch")), (
        "CI installs torch 2.13.0 from local disk"
    )
