"""Image + text rows for the tiny vision-language model (hf_models.py `gemma3_vlm`): KEP-2401's MultimodalDataset
layout, a folder with the data file and the image files it names under `images/` (dataset-initialize's
image_dir), one `<image>` tag in each question where its picture belongs.

Each picture is a square of one colour (a little jitter per pixel, so no two files are equal) and each answer
names the colour, so what the model learns is read from the image: the question is the same for every row.
Seeded: the same arguments write the same files.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

#: The colours and the word each answer names, RGB.
COLOURS = {
    "red": (220, 30, 30),
    "green": (30, 200, 40),
    "blue": (30, 40, 220),
    "white": (240, 240, 240),
}
QUESTION = "<image>\nWhat colour is this picture?"
IMAGE_DIR = "images"


def picture(rgb: tuple[int, int, int], rng: random.Random, size: int = 32) -> bytes:
    """A `size` x `size` PNG of one colour, each pixel jittered a little."""
    from PIL import Image

    image = Image.new("RGB", (size, size))
    image.putdata(
        [tuple(max(0, min(255, c + rng.randint(-12, 12))) for c in rgb) for _ in range(size * size)]
    )
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def write_pictures(folder: str | Path, count: int = 120, seed: int = 0) -> Path:
    """`count` instruct rows {"input", "output", "images"} in `folder`/train.jsonl, their pictures in
    `folder`/images/; returns the folder (the dataset source)."""
    rng = random.Random(seed)
    folder = Path(folder)
    (folder / IMAGE_DIR).mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(count):
        name = rng.choice(sorted(COLOURS))
        file = f"{name}-{i}.png"
        (folder / IMAGE_DIR / file).write_bytes(picture(COLOURS[name], rng))
        rows.append({"input": QUESTION, "output": name, "images": [file]})
    (folder / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder
