"""`make setup`'s uv install takes its sources from pip's configuration, as pip itself would read it."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

from tools.uv_install import pip_settings, uv_source_arguments

REPO = Path(__file__).resolve().parents[2]


def test_the_environment_beats_a_commands_section_which_beats_global():
    listed = "\n".join(
        [
            ":env:.find-links='/from/env'",
            "global.constraint='/etc/constraints.txt'",
            "global.extra-index-url='file:///mirror/simple https://extra.example/simple'",
            "global.find-links='/from/global'",
            "global.index-url='https://global.example/simple'",
            "install.index-url='https://install.example/simple'",
            "install.timeout='60'",
            "download.find-links='/from/download'",
        ]
    )
    settings = pip_settings(listed)
    assert settings == {
        "find-links": "/from/env",
        "constraint": "/etc/constraints.txt",
        "extra-index-url": "file:///mirror/simple https://extra.example/simple",
        "index-url": "https://install.example/simple",
    }
    assert uv_source_arguments(settings) == [
        "--index-strategy",
        "unsafe-best-match",
        "--index-url",
        "https://install.example/simple",
        "--extra-index-url",
        "file:///mirror/simple",
        "--extra-index-url",
        "https://extra.example/simple",
        "--find-links",
        "/from/env",
        "--constraint",
        "/etc/constraints.txt",
    ]


def test_no_index_carries_over_and_nothing_configured_leaves_uvs_defaults():
    assert "--no-index" in uv_source_arguments(pip_settings(":env:.no-index='yes'"))
    assert "--no-index" not in uv_source_arguments(pip_settings("global.no-index='false'"))
    assert uv_source_arguments(pip_settings("")) == ["--index-strategy", "unsafe-best-match"]


def test_settings_are_read_from_real_pips_config_list(tmp_path):
    """pip's own `config list` output, from a config file and PIP_* variables, parses to what they say."""
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nextra-index-url = file:///a/simple\n  file:///b/simple\nindex-url = https://g.example/simple\n"
        "find-links = /g\nconstraint = /g.txt\n"
        "[install]\nindex-url = https://i.example/simple\nextra-index-url = file:///a/simple file:///b/simple\n"
        "find-links = /i\nconstraint = /i.txt\n"
    )
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    environment |= {"PIP_CONFIG_FILE": str(config), "PIP_FIND_LINKS": "/env-wheels"}
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert pip_settings(listed) == {
        "index-url": "https://i.example/simple",
        "extra-index-url": "file:///a/simple file:///b/simple",
        "find-links": "/env-wheels",
        "constraint": "/i.txt",
    }


def test_make_setup_installs_through_it():
    makefile = (REPO / "Makefile").read_text()
    assert "tools/uv_install.py --quiet torch==$(TORCH_VERSION) -e '.[$(2)]'" in makefile


def write_wheel(folder: Path, name: str, source: str) -> Path:
    """A one-module wheel, written as the wheel format lays it out (PEP 427): no build backend, no index."""
    dist_info = f"{name}-1.0.dist-info"
    files = {
        f"{name}.py": source,
        f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
        f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist_info}/RECORD"])
    wheel = folder / f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


def test_what_it_installs_is_byte_compiled_where_python_would_write_no_bytecode(tmp_path):
    """uv writes no bytecode and the images (and some machines) set PYTHONDONTWRITEBYTECODE, under which Python
    never writes it either: without the installer's compile, every process would compile every import anew."""
    target = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(target)], check=True)
    python = target / "bin" / "python"
    wheel = write_wheel(tmp_path, "tiny_module", "VALUE = 42\n")
    environment = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    installer = [sys.executable, str(REPO / "tools" / "uv_install.py"), "--quiet", "--no-index"]
    subprocess.run([*installer, "--python", str(python), str(wheel)], env=environment, check=True)
    located = subprocess.run(
        [
            str(python),
            "-c",
            "import importlib.util, tiny_module; print(importlib.util.cache_from_source(tiny_module.__file__))",
        ],
        env=environment,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(located).is_file(), "the installed module has no bytecode"
