"""What training data looks like: the kinds of text rows every engine trains on, and data file formats by file suffix
(the one table: dataset-initialize reads every one; the engines read the typed ones through `datasets`)."""

#: The kinds of rows a text-generation fine-tune trains on (dataset-initialize also writes others, e.g. multimodal).
TEXT_DATASET_TYPES = ("instruct", "chat", "text")

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
