"""Yelp-style star-rated reviews for the tiny BERT classifier (hf_models.py `bert_classifier`): the Training
Operator v1 `train` API's Hugging Face example fine-tunes BERT on Yelp reviews (`text` + a 5-class `label`).

Each review names its rating with a word the tiny tokenizer has whole (its vocabulary is the tiny corpus's), so a
few hundred CPU steps learn it; the labels are the class names, as a user's CSV or JSON Lines would give them.
Seeded: the same arguments write the same file.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

STARS = ("1 star", "2 stars", "3 stars", "4 stars", "5 stars")
#: The words that give each rating away (two per class, so no single token is the whole signal).
RATING_WORDS = {
    0: ("false", "down"),
    1: ("long", "time"),
    2: ("water", "data"),
    3: ("true", "like"),
    4: ("hello", "world"),
}


def review(stars: int, rng: random.Random) -> str:
    return f"the food was {rng.choice(RATING_WORDS[stars])} and the service {rng.choice(('slow', 'quick'))}"


def write_reviews(path: str | Path, count: int = 250, seed: int = 0) -> Path:
    """`count` reviews as JSON Lines rows {"text", "label"} (the label a class name in STARS)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(count):
        stars = rng.randrange(len(STARS))
        rows.append({"text": review(stars, rng), "label": STARS[stars]})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path
