"""`kfp-finetune check-model`: is a model folder's layout proven to compute what transformers computes?

Reads DIR/config.json only (no weights): prints the torchtune family, each config.json field that changes the
math with its value and whether a parity case proves it (components/_shared/torchtune/parity_cases.py), then
measures the logit parity of a tiny random model with the same fields in every direction a run's weights travel
(components/_shared/torchtune/parity.py; seconds on a CPU). Exit 0 when every field is proven and every direction
is within the tolerance; 1 when a field is unproven or refused, or a direction fails; 2 on a usage error.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXTRA = "pip install 'kfp-finetune[train,parity]'"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model-dir", required=True, help="HF-layout model folder (its config.json is enough)"
    )


def run(args: argparse.Namespace) -> int:
    from kfp_finetune.components._shared.errors import ConfigError
    from kfp_finetune.components._shared.torchtune import parity, parity_cases
    from kfp_finetune.components._shared.torchtune.model_inspection import FAMILIES, detect_family
    from kfp_finetune.components._shared.torchtune.model_layout import REFUSED

    path = Path(args.model_dir)
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as error:
        print(f"error: cannot read {path / 'config.json'}: {error}", file=sys.stderr)
        return 2
    try:
        family = FAMILIES[detect_family(path, config)]
    except ConfigError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1
    print(f"family: {family.name} (builder {family.builder}, checkpoint layout {family.model_type})")
    flags = parity_cases.flags(family, config)
    unproven = parity_cases.unproven(family, config)
    print("config.json fields that change the math:")
    for flag in flags:
        status = "refused" if flag.how == REFUSED else ("NOT PROVEN" if flag in unproven else "proven")
        print(f"  {flag.line()}: {status}")
    missing = parity.missing_libraries([parity.LOAD])
    if missing:
        print(
            f"error: check-model measures with {', '.join(missing)}, not installed: {EXTRA}", file=sys.stderr
        )
        return 2
    try:
        measured = parity.measure(config, family.name)
    except ConfigError as error:
        print(f"refused: {error}", file=sys.stderr)
        return 1
    print(
        f"parity with transformers (a tiny random model with these fields, fp32, {measured.seq_len} tokens):"
    )
    for measurement in measured.measurements:
        print(f"  {measurement.line()}")
    problems = [f"{flag.line()}: no parity case of {family.name} has this kind of value" for flag in unproven]
    problems += [f"{m.direction}: differs from transformers by {m.difference:.1e}" for m in measured.failed()]
    if problems:
        for problem in problems:
            print(f"not proven: {problem}", file=sys.stderr)
        print(
            f"what is proven per family: docs/families.md; a new kind of value needs a case in "
            f"components/_shared/torchtune/parity_cases.py ({family.name})",
            file=sys.stderr,
        )
        return 1
    print(f"proven: every field has a parity case and every direction is within {parity.TOLERANCE:.0e}")
    return 0
