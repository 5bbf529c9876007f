"""Maps the fixed top-level folders into one import package.

`components/` is served as `kfp_finetune.components` and `pipelines/` as `kfp_finetune.pipelines`
(DESIGN.md §2); pyproject.toml cannot express a package-dir mapping with discovered subpackages.
"""

from setuptools import find_packages, setup


def mapped_packages(package: str, folder: str) -> list[str]:
    return [package] + [f"{package}.{name}" for name in find_packages(folder)]


setup(
    packages=[
        *find_packages(include=["kfp_finetune", "kfp_finetune.*"]),
        *mapped_packages("kfp_finetune.components", "components"),
        *mapped_packages("kfp_finetune.pipelines", "pipelines"),
    ],
    package_dir={
        "kfp_finetune": "kfp_finetune",
        "kfp_finetune.components": "components",
        "kfp_finetune.pipelines": "pipelines",
    },
    package_data={"kfp_finetune.components": ["*/README.md"]},
)
