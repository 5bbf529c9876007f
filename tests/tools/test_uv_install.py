"""`make setup`'s uv install takes its sources from pip's configuration, as pip itself would read it."""

import os
import subprocess
import sys
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
