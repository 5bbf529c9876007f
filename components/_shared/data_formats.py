"""Data file formats by file suffix: the one table (dataset-initialize reads every one; torchtune's dataset builders
read the typed ones through `datasets`, _shared/torchtune/dataset_node.py)."""

#: File suffix -> the format, named as `datasets`' packaged builder that reads it (tsv: the csv builder with a tab).
FORMATS = {
    ".jsonl": "json",
    ".json": "json",
    ".csv": "csv",
    ".tsv": "tsv",
    ".parquet": "parquet",
    ".arrow": "arrow",
    ".txt": "text",
}
