"""Where dataset-initialize reads rows from: format detection, loading a split expression with the `datasets`
library, and where each loaded row came from (file and line), so validation errors point into the user's files.

Every loaded row carries its position in the source (`SOURCE_ROW`) until validation is done; `Loaded.where`
turns that position into "train.jsonl line 7" or "data.parquet row 3" (row_locations.py).

Messages name the settings as a pipeline user sets them (`data_format`, `data_subset`, `data_csv_delimiter`,
`data_eval_split`, `data_eval_fraction`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kfp_finetune.components._shared import storage, unset
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.dataset_initialize.cards import DATASET_CARD, config_splits, hub_config_names
from kfp_finetune.components.dataset_initialize.formats import (
    BUILDERS,
    DELIMITERS,
    column_separator,
    detect_format,
)
from kfp_finetune.components.dataset_initialize.row_locations import Locator, open_binary

log = get_logger(__name__)

DEFAULT_EVAL_FRACTION = 0.05  # held out when data_eval_fraction is unset (-1) and no data_eval_split is named
SOURCE_ROW = "__source_row"  # the row's index in the source split(s), kept until validation


class DatasetValidationError(ValueError):
    """The data does not fit the dataset type; the message names the columns and first bad rows."""


def held_out_fraction(eval_split: str, eval_fraction: float) -> float:
    """The fraction of the training rows to hold out: data_eval_fraction as set, or when it is unset (-1)
    DEFAULT_EVAL_FRACTION, none when a data_eval_split is named. Only a fraction the user set conflicts with a
    named split."""
    fraction = unset.value("data_eval_fraction", eval_fraction)
    if fraction is None:
        return 0.0 if eval_split else DEFAULT_EVAL_FRACTION
    if not 0 <= fraction < 1:
        raise ConfigError(
            f"data_eval_fraction must be in [0, 1), or -1 for {DEFAULT_EVAL_FRACTION:g} when no data_eval_split "
            f"is named (got {eval_fraction})"
        )
    if eval_split and fraction:
        raise ConfigError(
            f"data_eval_split={eval_split!r} and data_eval_fraction={fraction:g} both choose the held-out rows: "
            "set one of them (data_eval_fraction=-1 holds out none when a split is named)"
        )
    return fraction


def split_names(expression: str) -> list[str]:
    """The split names of a `datasets` split expression (`train[:10%]+test` -> train, test), in order."""
    names = [re.split(r"[\[(]", part, maxsplit=1)[0].strip() for part in expression.split("+")]
    return list(dict.fromkeys(names))


@dataclass
class Loaded:
    """Rows of a split expression with a `SOURCE_ROW` column, and `where(source_row)` naming file and line."""

    ds: object  # datasets.Dataset
    where: Callable[[int], str]


class Source:
    """Loads splits from one source; files from s3/https are fetched once into `raw` (the entry's stable partial
    folder in the workspace, so a retried step keeps what it verified; default: `scratch/raw`).

    A folder whose dataset card (README.md) declares configs is read as `datasets` reads a Hub repo: the config
    named `subset` (else its default one) gives the data files and their splits."""

    def __init__(
        self,
        uri: str,
        listing: storage.Listing,
        data_format: str,
        subset: str,
        scratch: Path,
        raw: Path | None = None,
        csv_delimiter: str = "",
    ):
        self.uri, self.listing, self.subset, self.scratch = uri, listing, subset, scratch
        self.raw = raw or scratch / "raw"
        self.is_hub = listing.uri.scheme == "hf"
        self.config_splits: dict[str, list[str]] | None = None  # split -> files of the chosen config
        self.format, self.data_files = "", []
        if not self.is_hub:
            self.config_splits = config_splits(uri, listing, subset, scratch)
            paths = [f.path for f in listing.files]
            if self.config_splits is not None:
                paths = sorted({p for files in self.config_splits.values() for p in files})
            self.format, self.data_files = detect_format(paths, data_format)
        self.delimiter = column_separator(self.format, csv_delimiter)
        self._local_root: Path | None = None

    def _root(self) -> Path:
        if self._local_root is None:
            if self.listing.uri.scheme == "file":  # read in place; a single file is listed by its name
                path = Path(self.listing.uri.path)
                self._local_root = path if path.is_dir() else path.parent
            else:
                self._local_root = self.raw
                storage.download(self.listing, self.data_files, self._local_root)
        return self._local_root

    def load(self, expression: str, num_proc: int) -> Loaded:
        """The rows of a split expression (`train`, `train[:3000]`, `train[90%:]+test`).

        Whole named splits are loaded (the `datasets` cache holds them anyway), numbered, then sliced here, so
        a row's number is its place in its source files whatever the slice.
        """
        import datasets
        import numpy as np

        try:
            instruction = datasets.ReadInstruction.from_spec(expression)
        except (ValueError, AssertionError) as exc:
            raise ValueError(f"{self.uri}: split {expression!r}: {exc}") from exc
        splits, offsets, files, offset = {}, {}, {}, 0
        for name in split_names(expression):
            splits[name], files[name] = self._load_split(name, num_proc)
            offsets[name] = offset
            offset += len(splits[name])
        parts = []
        for part in instruction.to_absolute({name: len(ds) for name, ds in splits.items()}):
            ds = splits[part.splitname]
            numbers = np.arange(offsets[part.splitname], offsets[part.splitname] + len(ds), dtype=np.int64)
            parts.append(ds.add_column(SOURCE_ROW, numbers).select(range(part.from_, part.to)))
        ds = parts[0] if len(parts) == 1 else datasets.concatenate_datasets(parts)
        if len(ds) == 0:
            raise DatasetValidationError(f"{self.uri}: split {expression!r} is empty (no rows)")
        lengths = {n: len(d) for n, d in splits.items()}
        locator = Locator(self.format, offsets, lengths, files, self.scratch, self.delimiter or ",")
        return Loaded(ds, locator.where)

    def _load_split(self, split: str, num_proc: int) -> tuple[object, list[str]]:
        """One whole named split and the files it was read from, in order (none for the Hub)."""
        import datasets

        datasets.disable_progress_bars()  # per-batch bars garble step logs; we log per split and shard
        cache_dir = str(self.scratch / "cache")
        num_proc = num_proc if num_proc > 1 else None
        try:
            if self.is_hub:
                return self._load_hub_split(split, cache_dir, num_proc), []
            root = self._root()
            data_files = self._files_by_split(root)
            if split not in data_files:
                raise ConfigError(
                    f"{self.uri}: split {split!r}: the files form the split(s) {', '.join(sorted(map(str, data_files)))} "
                    f"({self._split_naming()}); set data_train_split / data_eval_split to one of them"
                )
            if self.listing.uri.scheme == "file":  # read in place: checked again now, not only when listed
                local = storage.LocalRoot(Path(self.listing.uri.path), self.listing.uri.shown)
                for file in data_files[split]:
                    local.resolve(Path(file))
            try:
                if self.format == "json":
                    streamed = _read_json_lines(data_files[split], Path(cache_dir) / f"{split}.arrow")
                    if streamed is not None:
                        return streamed, data_files[split]
                options = {"delimiter": self.delimiter} if self.delimiter else {}
                # `datasets` gives each process whole files, and warns when given more processes than files.
                procs = min(num_proc or 1, len(data_files[split]))
                ds = datasets.load_dataset(
                    BUILDERS.get(self.format, self.format), data_files={split: data_files[split]}, split=split,
                    cache_dir=cache_dir, num_proc=procs if procs > 1 else None, **options,
                )  # fmt: skip
            except Exception as exc:  # the libraries' errors name no file: find the file, line and byte
                raise _unreadable(self.uri, split, self.format, data_files[split], exc) from exc
            if self.delimiter and len(ds.column_names) == 1:
                _check_one_column(self.uri, data_files[split][0], ds.column_names[0], self.delimiter)
            return ds, data_files[split]
        except ValueError as exc:
            if "corresponds to no data" in str(exc):
                raise DatasetValidationError(f"{self.uri}: split {split!r} is empty (no rows)") from exc
            if "Unknown split" in str(exc) or "Bad split" in str(exc):
                raise ValueError(f"{self.uri}: split {split!r}: {exc}") from exc
            if (configs := hub_config_names(str(exc))) is not None:
                names = ", ".join(configs)
                if self.subset:
                    raise ConfigError(
                        f"data_subset={self.subset!r} is not a config of {self.uri}: choose one of {names}"
                    ) from exc
                raise ConfigError(
                    f"{self.uri} has {len(configs)} configs ({names}): set data_subset to one of them"
                ) from exc
            raise

    def _files_by_split(self, root: Path) -> dict[str, list[str]]:
        """{split: local files}: the chosen config's, else split names from file/folder names as in `datasets`
        (train*, validation*/dev*, test*/eval*; a single file or unnamed files form the `train` split)."""
        if self.config_splits is None:
            return _files_by_split([str(root / p) for p in self.data_files], root)
        chosen = set(self.data_files)
        return {
            split: [str(root / p) for p in files if p in chosen]
            for split, files in self.config_splits.items()
        }

    def _split_naming(self) -> str:
        if self.config_splits is None:
            return "named as in `datasets`: train*, validation*/dev*, test*/eval*"
        return f"the `data_files` of its {DATASET_CARD} config"

    def _load_hub_split(self, split: str, cache_dir: str, num_proc: int | None):
        """A split read by `datasets` from the hub, its downloaded files checked against the listing's sha256 /
        git blob id; damaged files are fetched and the split read once more, then refused (IntegrityError)."""
        import datasets

        for attempt in (1, 2):
            try:
                # Retried as a whole: files already in the cache are not fetched again.
                ds, error = (
                    storage.with_retries(
                        lambda: datasets.load_dataset(
                            self.listing.uri.repo_id,
                            self.subset or None,
                            revision=self.listing.commit_sha,
                            data_dir=self.listing.uri.path or None,
                            split=split,
                            cache_dir=cache_dir,
                            token=os.environ.get("HF_TOKEN") or False,
                            num_proc=num_proc,
                        ),
                        what=f"load {self.uri} split {split!r}",
                    ),
                    None,
                )
            except Exception as exc:  # a damaged file may fail to parse: check the files before reporting it
                ds, error = None, exc
            damaged = storage.verify_hub_cache(self.listing)
            if error is not None and (short := storage.hub_truncation(error, self.listing)):
                damaged.append(short)
            if not damaged:
                if error is not None:
                    raise error
                return ds
            if attempt == 2:
                raise damaged[0] from error
            log.warning("%s; fetching %d damaged file(s) again", damaged[0], len(damaged))
            shutil.rmtree(cache_dir, ignore_errors=True)  # the split prepared from them
        raise AssertionError("unreachable")


def _check_one_column(uri: str, file: str, header: str, delimiter: str) -> None:
    """Refuse a delimited file whose header reads as one column but splits on another common separator."""
    other = next((d for d in (",", ";", "\t", "|") if d != delimiter and d in header), None)
    if other is not None:
        shown = "\\t" if other == "\t" else other
        raise DatasetValidationError(
            f"{uri}: {Path(file).name} line 1: the header {header!r} is one column when split on "
            f"{delimiter!r}, but it has {other!r} in it: set data_csv_delimiter={shown} if that separates "
            "the columns"
        )


def _read_json_lines(files: list[str], arrow_path: Path):
    """JSON Lines files as a `datasets.Dataset` on a memory-mapped Arrow file, or None when pyarrow cannot read
    them as one table (not JSON Lines, a field or type that changes after the first block, files that differ):
    then the caller uses the `datasets` JSON builder, which handles those.

    pyarrow's streaming reader parses block by block in C++ straight into the Arrow file: about 3x faster than the
    `datasets` JSON builder, which also re-parses rows in Python to infer types. Same types either way (that
    builder parses with pyarrow too), and memory stays flat as with `load_dataset`. Needs pyarrow >= 20.
    """
    import datasets
    import pyarrow as pa
    import pyarrow.json as pa_json

    arrow_path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    try:
        with pa.OSFile(str(arrow_path), "wb") as sink:
            for file in files:
                for batch in pa_json.open_json(file):
                    if writer is None:
                        writer = pa.ipc.new_stream(sink, batch.schema)
                    writer.write_batch(batch)
            if writer is None:
                return None  # no rows: the datasets builder reports the empty split
            writer.close()
    except (pa.ArrowInvalid, ValueError) as error:
        log.info(
            "reading %s with the datasets JSON builder (%s)", ", ".join(files), str(error).splitlines()[0]
        )
        return None
    return datasets.Dataset.from_file(str(arrow_path))


def _files_by_split(files: list[str], root: Path) -> dict[str, list[str]]:
    """Group `files` into splits with the `datasets` library's own file-name conventions."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    if len(files) == 1:
        return {"train": files}
    resolved = DataFilesDict.from_patterns(get_data_patterns(str(root)), base_path=str(root))
    chosen = {os.path.realpath(f): f for f in files}
    result = {}
    for split, split_files in resolved.items():
        matched = sorted({chosen[r] for r in map(os.path.realpath, split_files) if r in chosen})
        if matched:
            result[split] = matched
    return result or {"train": sorted(files)}


# --- why a file cannot be read ---------------------------------------------------------------------------------


def _unreadable(uri: str, split: str, fmt: str, files: list[str], error: Exception) -> DatasetValidationError:
    """The error for files the `datasets` / pyarrow readers refused, naming the file and the line or byte
    offset of the first problem (found by reading the files again, only after a failure) and the fix."""
    for file in files:
        problem = _first_problem(file, fmt)
        if problem:
            return DatasetValidationError(f"{uri}: {Path(file).name}{problem}")
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
    names = ", ".join(Path(f).name for f in files)
    return DatasetValidationError(
        f"{uri}: split {split!r}: the {fmt} reader cannot read {names} ({type(error).__name__}: {reason}): "
        f"check that the files are valid {fmt}, or set data_format"
        + (" (and data_csv_delimiter for another column separator)" if fmt in DELIMITERS else "")
    )


def _first_problem(file: str, fmt: str) -> str | None:
    """`" line N: what; fix"` (or `": what; fix"`) for the first thing that makes `file` unreadable, or None."""
    if fmt in ("parquet", "arrow"):
        return _binary_problem(file, fmt)
    try:
        with open_binary(file) as stream:
            data = stream.read()
    except (OSError, EOFError, ValueError) as err:  # gzip/bz2/xz/zstd: truncated or corrupt stream
        return f": cannot be decompressed ({err}): the file is truncated or corrupt; write it again"
    if not data.strip():
        return " is empty (no rows): remove it or write rows into it"
    offset = 0
    for number, line in enumerate(data.splitlines(keepends=True), start=1):
        try:
            line.decode("utf-8")
        except UnicodeDecodeError as err:
            return (
                f" line {number} (byte offset {offset + err.start}): not UTF-8 text "
                f"({line[err.start : err.start + 4]!r}): save the file as UTF-8"
            )
        offset += len(line)
    if fmt != "json":
        if fmt in DELIMITERS and not data.splitlines()[0].strip():
            return " line 1: the CSV header is blank: put the column names on the first line"
        return None
    text = data.decode("utf-8")
    if text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as err:
            return f" line {err.lineno} column {err.colno}: not valid JSON ({err.msg}): fix the JSON array"
        bad = next((i for i, row in enumerate(rows) if not isinstance(row, dict)), None)
        if bad is not None:
            return f" row {bad}: {type(rows[bad]).__name__}, not a JSON object: every row must be an object"
        return None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            return (
                f" line {number} column {err.colno}: not valid JSON ({err.msg}): JSON Lines needs one complete "
                "JSON object per line"
            )
        if not isinstance(row, dict):
            return f" line {number}: a JSON {type(row).__name__}, not an object: JSON Lines needs one object per line"
    return None


def _binary_problem(file: str, fmt: str) -> str | None:
    import pyarrow as pa

    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            parquet = pq.ParquetFile(file)
            for group in range(parquet.num_row_groups):
                parquet.read_row_group(group)
        else:
            with pa.memory_map(file) as source:
                try:
                    pa.ipc.open_stream(source).read_all()
                except pa.ArrowInvalid:
                    source.seek(0)
                    pa.ipc.open_file(source).read_all()
    except (pa.ArrowException, OSError) as err:
        size = os.path.getsize(file)
        return (
            f" ({size} bytes) is not a readable {fmt} file ({err}): it is truncated or corrupt, or not "
            f"{fmt}; write it again (or set data_format)"
        )
    return None
