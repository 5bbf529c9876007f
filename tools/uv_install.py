"""`uv pip install` into this Python's environment, from the sources pip is configured with.

`make setup` installs with uv: it resolves and installs in parallel, a few times faster than pip. But uv reads no
pip configuration, and a machine's pip may be set to a mirror, a folder of local wheels (a CPU build of torch) or a
constraints file; uv given the same sources (and pip's rule of taking the best version from any index) installs the
same packages pip would. The images install the same way (images/*/Dockerfile). Arguments are passed on to
`uv pip install`; without `--python`, it installs into the environment of the Python that runs this file.

Then it byte-compiles the environment, as pip does at install and uv does not. Python writes no bytecode of its own
where PYTHONDONTWRITEBYTECODE is set (the images set it, and so do some machines), and then every process compiles
every module it imports from source each time it starts: `import torchtune` took 14 s that way and 5.7 s from
bytecode, on one machine, and each KFP step, training process and test pays it.
"""

from __future__ import annotations

import ast
import subprocess
import sys

# pip's settings (`pip config list` keys) that say where packages come from, and uv's option for each.
SOURCES = {
    "index-url": "--index-url",
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
# Which setting wins, last first: pip's environment variables (PIP_*), then a command's section, then [global].
PRECEDENCE = ("global", "install", ":env:")
TRUE = {"1", "true", "yes", "on"}


def pip_settings(listed: str) -> dict[str, str]:
    """The settings that apply to `pip install`, from `pip config list` (lines such as `global.find-links='/w'`)."""
    found: dict[str, dict[str, str]] = {}
    for line in listed.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section in PRECEDENCE and (key in SOURCES or key == "no-index"):
            found.setdefault(key, {})[section] = ast.literal_eval(value)
    return {key: by_section[max(by_section, key=PRECEDENCE.index)] for key, by_section in found.items()}


def uv_source_arguments(settings: dict[str, str]) -> list[str]:
    """uv's options for the same sources: pip separates the values of a list setting with whitespace."""
    words = ["--index-strategy", "unsafe-best-match"]
    if settings.get("no-index", "").lower() in TRUE:
        words.append("--no-index")
    for key, option in SOURCES.items():
        for value in settings.get(key, "").split():
            words += [option, value]
    return words


def compile_bytecode(python: str) -> None:
    """Byte-compile everything installed in `python`'s environment that has no current bytecode, on every core.
    Files this Python cannot compile (a package's test file in a newer syntax) are skipped, as pip skips them."""
    folders = subprocess.run(
        [
            python,
            "-c",
            "import sysconfig; print(sysconfig.get_path('purelib')); print(sysconfig.get_path('platlib'))",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    subprocess.run([python, "-m", "compileall", "-qq", "-j", "0", *sorted(set(folders))])


def main(arguments: list[str]) -> None:
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], check=True, capture_output=True, text=True
    ).stdout
    if "--python" in arguments:
        python, target = arguments[arguments.index("--python") + 1], []
    else:
        python, target = sys.executable, ["--python", sys.executable]
    uv = [sys.executable, "-m", "uv", "pip", "install", *target]
    installed = subprocess.run(uv + uv_source_arguments(pip_settings(listed)) + arguments)
    if installed.returncode == 0 and "--dry-run" not in arguments:
        compile_bytecode(python)
    sys.exit(installed.returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
