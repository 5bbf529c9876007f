"""The file formats dataset-initialize reads: which format files are in (from their names, or `data_format`),
the `datasets` builder that reads it, and the column separator of delimited text (`data_csv_delimiter`)."""

from __future__ import annotations

from pathlib import PurePosixPath

from kfp_finetune.components._shared.data_formats import FORMATS
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger

log = get_logger(__name__)

FORMAT_PREFERENCE = ("parquet", "arrow", "json", "csv", "tsv", "text")  # typed formats first
FORMAT_ALIASES = {"jsonl": "json", "txt": "text"}  # data_format values that name a format by its file suffix
# The `datasets` packaged builder of a format whose name differs, and the column separator of delimited formats.
BUILDERS = {"tsv": "csv"}
DELIMITERS = {"csv": ",", "tsv": "\t"}
DELIMITER_NAMES = {"\\t": "\t", "tab": "\t"}  # data_csv_delimiter spellings of a tab a text field can carry
COMPRESSION_SUFFIXES = (".gz", ".bz2", ".xz", ".zst")
# Files beside the data that are not data (HF dataset cards, save_to_disk metadata).
NOT_DATA = ("README.md", ".gitattributes", "dataset_info.json", "state.json", "dataset_dict.json")


def suffix(path: str) -> str:
    pure = PurePosixPath(path)
    if pure.suffix in COMPRESSION_SUFFIXES:
        pure = pure.with_suffix("")
    return pure.suffix.lower()


def detect_format(paths: list[str], explicit: str = "") -> tuple[str, list[str]]:
    """The format of these files (a FORMATS value) and the data files among them."""
    candidates = [p for p in paths if PurePosixPath(p).name not in NOT_DATA]
    if explicit:
        explicit = FORMAT_ALIASES.get(explicit.strip().lower(), explicit.strip().lower())
        if explicit not in set(FORMATS.values()):
            raise ConfigError(
                f"data_format {explicit!r} is not one of json, jsonl, csv, tsv, parquet, arrow, text"
            )
        matching = [p for p in candidates if FORMATS.get(suffix(p)) == explicit]
        return explicit, matching or candidates
    formats = {FORMATS[suffix(p)] for p in candidates if suffix(p) in FORMATS}
    if not formats:
        raise ConfigError(
            f"no data files (json, jsonl, csv, tsv, parquet, arrow, txt) among: {', '.join(paths[:10])}; "
            "set data_format (json, csv, tsv, parquet, arrow or text) if the files have other extensions"
        )
    # The same data is often published in several formats (e.g. jsonl + parquet): take the most exact one.
    fmt = next(f for f in FORMAT_PREFERENCE if f in formats)
    if len(formats) > 1:
        log.warning(
            "found %s files; reading the %s ones (set data_format to one of %s to choose)",
            sorted(formats), fmt, ", ".join(sorted(formats)),
        )  # fmt: skip
    return fmt, [p for p in candidates if FORMATS.get(suffix(p)) == fmt]


def column_separator(fmt: str, given: str = "") -> str | None:
    """The column separator for files of format `fmt` (None where it has none): `given` (data_csv_delimiter: one
    character, or `\\t` / `tab` for a tab), else `,` for CSV and a tab for TSV."""
    if fmt not in DELIMITERS:
        return None
    if not given:
        return DELIMITERS[fmt]
    delimiter = DELIMITER_NAMES.get(given.strip().lower(), given)
    if len(delimiter) != 1 or delimiter in '"\r\n':
        raise ConfigError(
            f"data_csv_delimiter must be one character such as ; or | (\\t for a tab), got {given!r}"
        )
    return delimiter
