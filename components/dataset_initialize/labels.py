"""Sequence-classification rows (dataset_type `classification`): a text column (and optionally a second one for
sentence pairs) and a label column, as the Training Operator's Hugging Face path trains them with
`AutoModelForSequenceClassification` (its example: Yelp reviews, `text` + a 5-class `label`).

Labels are class ids (integers 0..K-1, no gaps) or class names (strings, numbered in sorted order, or in the order
`label_names` gives). The shards hold integer ids with the `datasets` ClassLabel feature, so the trainer gets the
name table with the data; the split metadata records it too, with the rows per class. Every bad row is named by
file and line with its fix, all rows checked before any is written.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.dataset_initialize.sources import SOURCE_ROW, DatasetValidationError, Loaded

log = get_logger(__name__)

TEXT_COLUMNS = ("text",)
OPTIONAL_TEXT = ("text_pair",)  # the second sentence of pair tasks (the tokenizer's `text_pair` argument)
LABEL_COLUMN = "label"
MAX_REPORTED_ROWS = 5
LABEL_FIX = "give each row a class id (0, 1, ...) or a class name"
_BALANCE_SHOWN = 20  # classes named in the balance log line; a long tail is summed


def check_parameters(dataset_type: str, num_labels: int | None, label_names: list | None) -> list[str]:
    """num_labels / label_names as given (None / []: unset), refused where they cannot apply."""
    names = list(label_names or [])
    if dataset_type != "classification":
        if num_labels is not None or names:
            raise ConfigError(
                f"num_labels / label_names apply to data_type classification only (got {dataset_type!r}): "
                "leave them unset (-1, [])"
            )
        return names
    if num_labels is not None and num_labels < 2:
        raise ConfigError(
            f"num_labels must be at least 2 (a classifier needs two classes), or -1 (got {num_labels})"
        )
    bad = [n for n in names if not isinstance(n, str) or not n.strip()]
    duplicates = sorted(n for n, c in Counter(n for n in names if isinstance(n, str)).items() if c > 1)
    if bad or duplicates:
        raise ConfigError(
            "label_names must be distinct, non-empty class names (index = class id): "
            + (f"not names: {bad[:5]}" if bad else f"listed twice: {duplicates[:5]}")
        )
    if names and num_labels is not None and len(names) != num_labels:
        raise ConfigError(
            f"label_names lists {len(names)} classes but num_labels is {num_labels}: make them agree"
        )
    return names


def _row_problems(text, pair, label, has_pair: bool) -> list[str]:
    problems = []
    for column, value in (("text", text), ("text_pair", pair)) if has_pair else (("text", text),):
        if value is None:
            problems.append(f"{column} is null")
        elif not isinstance(value, str):
            problems.append(f"{column} is {type(value).__name__} {_shown(value)}, not text")
        elif not value.strip():
            problems.append(f"{column} is empty")
    if label is None:
        problems.append("label is null")
    elif isinstance(label, bool):  # before int: a bool is an int to Python, not a class to the user
        problems.append(f"label is a boolean ({label}): {LABEL_FIX}")
    elif isinstance(label, float) and not label.is_integer():
        problems.append(f"label {label!r} is not a whole number: {LABEL_FIX}")
    elif isinstance(label, int | float) and label < 0:
        problems.append(f"label {label!r} is negative: class ids count from 0")
    elif isinstance(label, str) and not label.strip():
        problems.append("label is empty")
    elif not isinstance(label, int | float | str):
        problems.append(f"label is {type(label).__name__} {_shown(label)}: {LABEL_FIX}")
    return problems


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_rows(ds, split: str, where: Callable[[int], str], batch_size: int = 10_000) -> None:
    """Every row's text (and text_pair) and label; all problems of a row, the first rows named together."""
    has_pair = "text_pair" in ds.column_names
    columns = ["text", *(["text_pair"] if has_pair else []), LABEL_COLUMN, SOURCE_ROW]
    bad: list[str] = []
    bad_count = 0
    for batch in ds.select_columns(columns).iter(batch_size=batch_size):
        pairs = batch["text_pair"] if has_pair else [None] * len(batch["text"])
        for text, pair, label, row in zip(
            batch["text"], pairs, batch[LABEL_COLUMN], batch[SOURCE_ROW], strict=True
        ):
            problems = _row_problems(text, pair, label, has_pair)
            if problems:
                bad_count += 1
                if len(bad) < MAX_REPORTED_ROWS:
                    bad.append(f"{where(row)}: {', '.join(problems)}")
    if bad:
        raise DatasetValidationError(
            f"{split}: {bad_count} of {len(ds)} rows are not valid classification data; first: "
            + "; ".join(bad)
            + ". Fix or remove these rows in the source and run again."
        )


def _value(label):
    """A checked label as a class id (int) or name (str)."""
    return int(label) if isinstance(label, int | float) else label


@dataclass
class _Seen:
    """The labels of one split: rows per label, and the first source rows of each (to name them)."""

    counts: Counter = field(default_factory=Counter)
    rows: dict = field(default_factory=dict)

    @classmethod
    def of(cls, ds, batch_size: int = 10_000) -> _Seen:
        seen = cls()
        for batch in ds.select_columns([LABEL_COLUMN, SOURCE_ROW]).iter(batch_size=batch_size):
            for label, row in zip(batch[LABEL_COLUMN], batch[SOURCE_ROW], strict=True):
                value = _value(label)
                seen.counts[value] += 1
                first = seen.rows.setdefault(value, [])
                if len(first) < MAX_REPORTED_ROWS:
                    first.append(row)
        return seen

    def named(self, values, where: Callable[[int], str]) -> list[str]:
        return [f"{where(r)}: label {v!r}" for v in values for r in self.rows[v]][:MAX_REPORTED_ROWS]


@dataclass
class LabelTable:
    """The classes: `names[i]` is class i's name (empty when the data gives ids only), `ids` maps a source label
    (id or name) to its class id."""

    num_labels: int
    names: list[str]
    ids: dict

    def counts(self, seen: _Seen) -> dict[str, int]:
        """Rows per class id (every class, zero included), keyed by the id as text (JSON keys)."""
        by_id = Counter({self.ids[v]: c for v, c in seen.counts.items()})
        return {str(i): by_id.get(i, 0) for i in range(self.num_labels)}


def source_names(ds) -> list[str]:
    """Class names the source declares for integer labels (a `datasets` ClassLabel feature, as the Hub's Yelp
    reviews have), else []."""
    import datasets

    feature = ds.features.get(LABEL_COLUMN)
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else []


def label_table(
    train, held_out, *, where: Callable[[int], str], eval_where: Callable[[int], str] | None,
    num_labels: int | None, label_names: list[str],
) -> tuple[LabelTable, dict[str, _Seen]]:  # fmt: skip
    """The class table of the checked train (and eval) rows; DatasetValidationError naming the rows when the
    labels mix ids and names, leave gaps, or the eval split holds a class the train split lacks."""
    seen = {"train": _Seen.of(train)}
    if held_out is not None:
        seen["eval"] = _Seen.of(held_out)
    wheres = {"train": where, "eval": eval_where or where}
    kinds = {split: {type(v) for v in s.counts} for split, s in seen.items()}
    if len(set().union(*kinds.values())) > 1:
        numbers = sum(c for s in seen.values() for v, c in s.counts.items() if isinstance(v, int))
        names = sum(c for s in seen.values() for v, c in s.counts.items() if isinstance(v, str))
        odd = int if numbers < names else str  # name the rows of the rarer kind
        shown = [
            line
            for split, s in seen.items()
            for line in s.named([v for v in s.counts if type(v) is odd], wheres[split])
        ]
        raise DatasetValidationError(
            f"the labels mix class ids ({numbers} row(s)) and class names ({names} row(s)); first of the "
            f"{'ids' if odd is int else 'names'}: {'; '.join(shown[:MAX_REPORTED_ROWS])}. Use one kind in every "
            "row (and split)"
        )
    train_values = set(seen["train"].counts)
    if "eval" in seen and (only_eval := sorted(set(seen["eval"].counts) - train_values, key=str)):
        raise DatasetValidationError(
            f"eval: {sum(seen['eval'].counts[v] for v in only_eval)} row(s) hold label(s) "
            f"{', '.join(map(repr, only_eval[:10]))} that no train row has (the model cannot learn them); first: "
            + "; ".join(seen["eval"].named(only_eval, wheres["eval"]))
            + ". Move some of those rows into the train split, or remove them"
        )
    table = _ids_table(seen, wheres, train_values, num_labels, label_names) if all(
        isinstance(v, int) for v in train_values
    ) else _names_table(seen["train"], where, train_values, num_labels, label_names)  # fmt: skip
    if table.num_labels < 2:
        raise DatasetValidationError(
            f"every train row has the label {next(iter(train_values))!r}: a classifier needs at least two classes"
        )
    return table, seen


def _ids_table(seen, wheres, values: set, num_labels: int | None, label_names: list[str]) -> LabelTable:
    """Integer labels: classes 0..K-1, every one with train rows (K: num_labels, len(label_names), or max + 1)."""
    k = num_labels or len(label_names) or max(values) + 1
    too_big = sorted(v for v in values if v >= k)
    if too_big:
        given = f"num_labels={num_labels}" if num_labels else f"label_names lists {len(label_names)} classes"
        raise DatasetValidationError(
            f"{given}, but the train rows hold class id(s) {too_big[:10]}; first: "
            + "; ".join(seen["train"].named(too_big, wheres["train"]))
            + ". Class ids are 0..num_labels-1: raise num_labels (or -1: from the data), or fix the rows"
        )
    missing = [i for i in range(k) if i not in values]
    if missing:
        raise DatasetValidationError(
            f"the class ids must be 0..{k - 1} without gaps, but no train row has class id(s) "
            f"{', '.join(map(str, missing[:20]))}{' ...' if len(missing) > 20 else ''}: renumber the classes "
            "0..K-1 (or give class names as strings instead of ids)"
            + (f", or lower num_labels ({num_labels})" if num_labels else "")
        )
    return LabelTable(k, list(label_names), {i: i for i in range(k)})


def _names_table(
    train: _Seen, where, values: set, num_labels: int | None, label_names: list[str]
) -> LabelTable:
    """String labels: classes in label_names order when given (every name in it must have train rows), else
    sorted, so the same data always gets the same ids."""
    names = label_names or sorted(values)
    unknown = sorted(values - set(names))
    if unknown:
        raise DatasetValidationError(
            f"train rows hold class name(s) {unknown[:10]} that label_names {label_names} lacks; first: "
            + "; ".join(train.named(unknown, where))
            + ". Add them to label_names (or leave it empty: the names sorted), or fix the rows"
        )
    absent = [n for n in names if n not in values]
    if absent:
        raise DatasetValidationError(
            f"label_names lists {absent[:10]}, which no train row has (the model cannot learn them): remove them "
            "from label_names, or add rows"
        )
    if num_labels is not None and num_labels != len(names):
        raise DatasetValidationError(
            f"num_labels={num_labels}, but the train rows hold {len(names)} class names ({names[:10]}): set "
            f"num_labels={len(names)} or -1 (from the data)"
        )
    return LabelTable(len(names), list(names), {n: i for i, n in enumerate(names)})


def with_class_ids(ds, table: LabelTable):
    """The rows with their labels as class ids, typed as a `datasets` ClassLabel (its names: the class names, or
    the ids as text when the data has none), which parquet stores as int64 plus the name table."""
    import datasets

    ids = table.ids
    ds = ds.map(
        lambda labels: {LABEL_COLUMN: [ids[_value(v)] for v in labels]}, input_columns=LABEL_COLUMN, batched=True,
        features=datasets.Features({**ds.features, LABEL_COLUMN: datasets.Value("int64")}), desc="class ids",
    )  # fmt: skip
    names = table.names or [str(i) for i in range(table.num_labels)]
    return ds.cast_column(LABEL_COLUMN, datasets.ClassLabel(names=names))


def log_balance(split: str, table: LabelTable, counts: dict[str, int]) -> None:
    """One line of rows per class, so a skewed split shows in the step log."""
    total = sum(counts.values()) or 1
    ordered = sorted(counts.items(), key=lambda item: -item[1])
    shown = [
        f"{i}{f' ({table.names[int(i)]})' if table.names else ''}: {c} ({100 * c / total:.1f}%)"
        for i, c in ordered[:_BALANCE_SHOWN]
    ]
    if len(ordered) > _BALANCE_SHOWN:
        shown.append(
            f"{len(ordered) - _BALANCE_SHOWN} more classes: {sum(c for _, c in ordered[_BALANCE_SHOWN:])}"
        )
    largest, smallest = ordered[0][1], ordered[-1][1]
    skew = f"; largest / smallest class {largest / smallest:.1f}x" if smallest else ""
    log.info("%s class balance, %d classes: %s%s", split, table.num_labels, ", ".join(shown), skew)


def manifest_keys(table: LabelTable) -> dict:
    return {"label_column": LABEL_COLUMN, "num_labels": table.num_labels, "label_names": table.names}


def split_metadata(manifest: dict, info: dict) -> dict:
    """The classification keys of a split's metadata (none for other data); label_names left out when the data
    gives ids only."""
    if "label_column" not in manifest:
        return {}
    return {"label_column": manifest["label_column"], "num_labels": manifest["num_labels"],
            "label_names": manifest["label_names"] or None, "label_counts": info.get("label_counts")}  # fmt: skip


def class_ids(
    train: Loaded, held_out: Loaded | None, num_labels: int | None, label_names: list[str]
) -> tuple[Loaded, Loaded | None, LabelTable, dict[str, dict[str, int]]]:
    """Both checked splits with class ids for labels, their class table, and the rows per class of each split
    (logged). Names: `label_names`, else those a ClassLabel source column declares, else the string labels'."""
    table, seen = label_table(
        train.ds, held_out.ds if held_out else None, where=train.where,
        eval_where=held_out.where if held_out else None, num_labels=num_labels,
        label_names=label_names or source_names(train.ds),
    )  # fmt: skip
    train = Loaded(with_class_ids(train.ds, table), train.where)
    held_out = Loaded(with_class_ids(held_out.ds, table), held_out.where) if held_out else None
    counts = {split: table.counts(s) for split, s in seen.items()}
    for split, split_counts in counts.items():
        log_balance(split, table, split_counts)
    return train, held_out, table, counts
