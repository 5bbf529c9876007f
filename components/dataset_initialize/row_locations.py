"""Where a loaded row came from, in the user's files: `Locator` turns a row's position in the loaded splits
(sources.SOURCE_ROW) into "train.jsonl line 7" (JSON Lines, CSV, TSV, text: the file's own line number) or
"data.parquet row 3" (parquet, arrow, JSON arrays: the row index in that file). Work happens only for the rows a
message reports."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kfp_finetune.components.dataset_initialize.formats import BUILDERS, DELIMITERS


def open_binary(file: str):
    """A source file's bytes, decompressed as `datasets` would."""
    import fsspec

    return fsspec.open(file, "rb", compression=_compression(file)).open()


def _compression(file: str) -> str | None:
    return {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd"}.get(PurePosixPath(file).suffix)


@dataclass
class Locator:
    """Maps a `SOURCE_ROW` number back to its split, file and line. Work happens only for reported rows."""

    format: str
    offsets: dict[str, int]  # split -> number of its first row
    lengths: dict[str, int]
    files: dict[str, list[str]]  # split -> files in load order (the `datasets` builders keep that order)
    scratch: Path
    delimiter: str  # of CSV / TSV files

    def where(self, source_row: int) -> str:
        split = next(s for s, o in self.offsets.items() if o <= source_row < o + self.lengths[s])
        row = source_row - self.offsets[split]
        files = self.files[split]
        if not files:  # a Hub dataset: its files are the library's business
            return f"split {split!r} row {row}"
        for file in files:
            count = row + 1 if len(files) == 1 else self._rows_in(file)
            if row < count:
                return f"{Path(file).name} {self._line(file, row)}"
            row -= count
        raise AssertionError(f"source row {source_row} is past the end of split {split!r}")

    def _rows_in(self, file: str) -> int:
        import datasets

        if self.format == "parquet":
            import pyarrow.parquet as pq

            return pq.ParquetFile(file).metadata.num_rows
        if self.format == "text":
            with open_text(file) as lines:
                return sum(1 for _ in lines)
        options = {"delimiter": self.delimiter} if self.format in DELIMITERS else {}
        ds = datasets.load_dataset(
            BUILDERS.get(self.format, self.format), data_files=[file], split="train",
            cache_dir=str(self.scratch / "locate"), **options,
        )  # fmt: skip
        return len(ds)

    def _line(self, file: str, row: int) -> str:
        """`line N` (1-based) where the file is line-oriented, else `row N` (0-based) within the file."""
        if self.format == "text":
            return f"line {row + 1}"
        if self.format == "json" and _is_json_lines(file):
            with open_text(file) as lines:
                seen = -1
                for number, line in enumerate(lines, start=1):
                    seen += bool(line.strip())  # pyarrow and the datasets JSON builder skip blank lines
                    if seen == row:
                        return f"line {number}"
        if self.format in DELIMITERS:
            with open_text(file, newline="") as text:
                reader = csv.reader(text, delimiter=self.delimiter)
                next(reader, None)  # the header
                start, index = reader.line_num + 1, 0
                for record in reader:  # a quoted value may span lines: a record starts after the previous one
                    if record:  # pandas skips blank lines
                        if index == row:
                            return f"line {start}"
                        index += 1
                    start = reader.line_num + 1
        return f"row {row}"


def _is_json_lines(file: str) -> bool:
    with open_text(file) as lines:
        return next((not line.lstrip().startswith("[") for line in lines if line.strip()), False)


def open_text(file: str, newline: str | None = None) -> io.TextIOBase:
    """A source file as text, decompressed as `datasets` would."""
    return io.TextIOWrapper(
        open_binary(file),
        encoding="utf-8",
        errors="replace",  # counting lines only: a row with bytes that are not UTF-8 must still be found
        newline=newline,
    )
