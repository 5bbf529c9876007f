"""The contract between steps: one typed dataclass per kind of artifact metadata a component writes or reads.

Every component writes its artifacts' metadata with `to_metadata()` and reads an input's with
`from_metadata(metadata, input_name=...)`, so a key's name and type are stated once, here. The keys are the ones
compiled pipelines and users' own steps already read: renaming one is a breaking change.

`from_metadata` fails with a `ContractError` that names the input, the key and the output to connect when a
required key is missing or a key has the wrong type. Keys this library does not know (written by a user's step or
a newer version) are kept in `extra` and written back by `to_metadata()`, so nothing is lost on the way through.
Numbers are accepted as KFP hands them on (its metadata is a protobuf Struct: every number a float), so an int
key may arrive as 3.0. A field whose value is None is left out of `to_metadata()`: those keys are written only
when they apply (e.g. `text_column` for text data).

    kind                class           written by                        read by
    dataset split       DatasetSplit    dataset-initialize train / eval   torchtune-finetune, evaluate
    base model          BaseModel       model-initialize model            torchtune-finetune, evaluate
    tuned model         TunedModel      torchtune-finetune model          evaluate, export, sweep
    training config     TrainConfig     torchtune-finetune train_config   (the UI)
    metrics             EvalMetrics     evaluate / torchtune-finetune     export, sweep
    evaluation samples  EvalSamples     evaluate samples                  (the UI, users' steps)
    exported model      ExportedModel   export exported                   (users' steps)
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from kfp_finetune.components._shared.errors import ContractError


@dataclass
class ArtifactInput:
    """An input artifact as a step sees it: its metadata (from the producing step) and its file."""

    metadata: dict
    path: str = ""

    @classmethod
    def of(cls, artifact: Any) -> ArtifactInput | None:
        """From a KFP artifact (anything with `.metadata` and `.path`); None stays None (an unconnected input)."""
        return cls(dict(artifact.metadata), artifact.path) if artifact is not None else None


def _empty(value: Any) -> bool:
    """A key a step wrote without a value (None, "", blanks, [] or {}) connects nothing: as if it were missing."""
    if isinstance(value, str):
        return not value.strip()
    return value is None or value == [] or value == {}


@dataclass(kw_only=True)
class _Metadata:
    """What every kind shares: reading and writing the flat metadata mapping, and the unknown keys."""

    #: The output to connect, as the error says it: "connect it to <PRODUCER> output".
    PRODUCER: ClassVar[str] = ""
    #: Keys without which the metadata is not this kind's (every reader needs them).
    REQUIRED: ClassVar[tuple[str, ...]] = ("workspace_path",)

    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def producer(cls, input_name: str) -> str:
        return cls.PRODUCER

    @classmethod
    def from_metadata(cls, metadata: typing.Mapping[str, Any], *, input_name: str):
        """The typed view of an input's metadata; ContractError naming `input_name` when it does not fit."""
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls) if f.name != "extra"]
        for key in cls.REQUIRED:
            if _empty(metadata.get(key)):
                raise cls.missing(key, input_name)
        values = {}
        for name in names:
            if name in metadata:
                values[name] = _checked(
                    metadata[name], hints[name], name, input_name, cls.producer(input_name)
                )
        extra = {k: v for k, v in metadata.items() if k not in names}
        return cls(**values, extra=json.loads(json.dumps(extra)))

    @classmethod
    def missing(cls, key: str, input_name: str) -> ContractError:
        """The error for an input whose metadata lacks `key` (or has it empty)."""
        return ContractError(
            f"{input_name} artifact has no {key} in its metadata: connect it to {cls.producer(input_name)} output"
        )

    def require(self, key: str, *, input_name: str) -> Any:
        """The value of `key`; ContractError when it is missing or empty (a key only some readers need)."""
        value = getattr(self, key)
        if _empty(value):
            raise self.missing(key, input_name)
        return value

    def to_metadata(self) -> dict[str, Any]:
        """The metadata to write: unknown keys first, then every field that is not None (JSON-safe values).
        A value of the wrong type is a bug in the writing step: TypeError."""
        hints = typing.get_type_hints(type(self))
        known = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "extra":
                continue
            ok, value = _fits(value, hints[f.name])
            if not ok:
                raise TypeError(
                    f"{type(self).__name__}.{f.name} must be {_type_name(hints[f.name])}, not {value!r}"
                )
            if value is not None:
                known[f.name] = value
        return json.loads(json.dumps({**self.extra, **known}))


@dataclass(kw_only=True)
class DatasetSplit(_Metadata):
    """One split dataset-initialize wrote into the workspace (its `train` and `eval` outputs)."""

    PRODUCER: ClassVar[str] = "dataset-initialize's train"
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # a fine-tune with its own dataset source needs no files

    workspace_path: str = ""  # the split's folder, relative to the workspace
    data_files: list[str] = field(default_factory=list)  # parquet shards, workspace-relative
    format: str = "parquet"
    split: str = ""  # train | eval
    source_split: str = ""  # the source's split it came from ("" when cut from train)
    num_rows: int | None = None
    columns: list[str] = field(default_factory=list)
    dataset_type: str = ""  # instruct | chat | text | multimodal | classification
    data_style: str = ""  # input_output | alpaca | openai | sharegpt | text | classification
    conversation_style: str | None = None  # chat data only
    conversation_column: str | None = None  # chat data only
    text_column: str | None = None  # text data only
    column_map: dict[str, str] = field(default_factory=dict)
    source_uri: str = ""
    revision: str = ""
    commit_sha: str = ""
    files: list[dict] = field(default_factory=list)  # {path, size, sha256} per shard
    total_bytes: int = 0
    reused_existing_copy: bool = False
    # Tokenized once with the base model's tokenizer (train split, when dataset-initialize got the base model):
    token_stats: dict | None = None  # row lengths in tokens: count, p50, p90, p99, max, prompt_max
    max_seq_len: int | None = None  # the pack length (chosen by _shared/seq_len unless the user set one)
    packs: list[dict] = field(default_factory=list)  # {path (workspace-relative), size, sha256, num_packs}
    tokenizer_fingerprint: str | None = None  # _shared/packing.tokenizer_fingerprint of the tokenizer used
    pack_fingerprint: str | None = None  # tokenizer + template + max_seq_len: the fine-tune step checks it
    pack_template: dict | None = (
        None  # the torchtune dataset node (without data location) rows were tokenized by
    )
    # Multimodal data only: the images are embedded in the shards (`datasets` Image structs {bytes, path}).
    image_column: str | None = None  # the column of each row's list of images
    image_tag: str | None = (
        None  # the placeholder in the text standing for the row's images in order ("": none)
    )
    num_images: int | None = None  # images in the split
    image_bytes: int | None = None  # their encoded bytes, together
    # Classification data only: the label column holds class ids 0..num_labels-1 (a `datasets` ClassLabel).
    label_column: str | None = None
    num_labels: int | None = None  # classes, in train and eval alike
    label_names: list[str] | None = (
        None  # class names, index = class id (left out when the data gives ids only)
    )
    label_counts: dict[str, int] | None = None  # rows per class id (the id as text), for the class balance

    @classmethod
    def producer(cls, input_name: str) -> str:
        return "dataset-initialize's eval" if "eval" in input_name else cls.PRODUCER

    def torchtune_hints(self) -> dict[str, str]:
        """How torchtune should read the data, as dataset-initialize found it (only the settings it knows)."""
        keys = ("dataset_type", "data_style", "conversation_style", "conversation_column", "text_column")
        return {k: getattr(self, k) for k in keys if getattr(self, k)}

    def reading_hints(self) -> dict[str, str]:
        """How any engine should read the rows: torchtune_hints, and a multimodal split's image_tag ("" is one)."""
        hints = self.torchtune_hints()
        if self.image_tag is not None:
            hints["image_tag"] = self.image_tag
        return hints


@dataclass(kw_only=True)
class BaseModel(_Metadata):
    """An HF-layout model model-initialize copied into the workspace (its `model` output).

    `workspace_path` is relative to the workspace (or absolute, for a cache used in place)."""

    PRODUCER: ClassVar[str] = "model-initialize's model"

    workspace_path: str = ""
    source_uri: str = ""
    repo_id: str = ""
    revision: str = ""
    commit_sha: str = ""
    model_type: str = ""
    weight_format: str = ""
    num_files: int = 0
    total_bytes: int = 0
    files: list[dict] = field(default_factory=list)
    reused_existing_copy: bool = False
    # model cache facts (hit, entry, bytes_fetched, bytes_copied, workspace_copy, evicted)
    cache: dict | None = None

    @property
    def pinned_revision(self) -> str:
        """The commit when the source has one, else the revision asked for."""
        return self.commit_sha or self.revision


@dataclass(kw_only=True)
class TunedModel(_Metadata):
    """The checkpoint torchtune-finetune hands on (its `model` output); all paths workspace-relative.

    `workspace_path` is the merged model, or the adapter when only an adapter was saved."""

    PRODUCER: ClassVar[str] = "torchtune-finetune's model"
    REQUIRED: ClassVar[tuple[str, ...]] = ()  # export needs only merged_path / adapter_path

    workspace_path: str = ""
    run_dir: str = ""
    merged_path: str = ""  # "" when only the adapter was saved
    adapter_path: str = ""  # "" for a full fine-tune
    metrics_file: str = ""  # the DiskLogger file, logs/metrics.txt
    base_model: str = ""  # repo id, or the base model's folder
    base_model_path: str = ""
    base_model_revision: str = ""
    dataset_source: str = ""
    eval_data_path: str = ""
    recipe: str = ""
    config: str = ""  # torchtune's config name, or "user file"
    method: str = ""  # lora | qlora | dora | full
    engine: str = ""  # the engine that trained it (_shared/engines.py); "" from before engines were recorded
    model_image: str = ""  # the image that trained it, where evaluate and export load it
    task: str = (
        ""  # what it learned (engines.task_of): classification, image-text-to-text, or "" (text generation)
    )
    backend: str = ""  # local | trainjob
    device: str = ""  # what training ran on (cpu | cuda): evaluate's device auto follows it
    dtype: str = ""  # training's precision (bf16 | fp32 | ...): evaluate on a GPU uses it
    epochs: int | None = None
    steps: int | None = None  # logged training steps
    files: dict[str, dict] = field(default_factory=dict)  # path in the run folder -> {size, sha256}
    total_bytes: int = 0
    final_loss: float | None = None
    min_loss: float | None = None
    tokens_per_second: float | None = None
    sweep_metric: str | None = None  # set by sweep on its best_model
    sweep_trial: int | None = None

    @property
    def model_path(self) -> str:
        """The HF model folder to load: the merged weights, else what workspace_path points to."""
        return self.merged_path or self.workspace_path


@dataclass(kw_only=True)
class TrainConfig(_Metadata):
    """torchtune-finetune's `train_config` output: the resolved YAML and the launch files beside it."""

    PRODUCER: ClassVar[str] = "torchtune-finetune's train_config"
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    recipe: str = ""
    config: str = ""
    files: list[str] = field(default_factory=list)
    #: What the resolver chose where the user set nothing (defaults.py): [{setting, value, reason, warning}, ...];
    #: `warning` entries change nothing: the user's own settings plan a run that may not learn (choices.py).
    defaults: list[dict] = field(default_factory=list)


@dataclass(kw_only=True)
class EvalSamples(_Metadata):
    """evaluate's `samples` output: the scored eval rows (JSON lines) in the workspace's eval folder."""

    PRODUCER: ClassVar[str] = "evaluate's samples"

    workspace_path: str = ""
    format: str = "jsonl"
    num_rows: int = 0
    columns: list[str] = field(default_factory=list)


#: Metric names (or parts of them) for which lower is better; every other metric is better higher.
LOWER_IS_BETTER = ("loss", "perplexity", "ppl", "bits_per_byte")


def lower_is_better(metric: str) -> bool:
    """Whether a smaller value of `metric` is better (losses, perplexity, bits per byte)."""
    return any(part in metric for part in LOWER_IS_BETTER)


@dataclass(kw_only=True)
class EvalMetrics(_Metadata):
    """A Metrics output: flat metric name -> number. evaluate writes tuned_*, base_*, delta_* and `passed`
    (1.0 or 0.0); torchtune-finetune's `metrics` output has the same shape (final_loss, tokens_per_second ...).
    Keys that are not numbers stay in `extra`."""

    PRODUCER: ClassVar[str] = "evaluate's metrics"
    REQUIRED: ClassVar[tuple[str, ...]] = ()

    values: dict[str, float] = field(default_factory=dict)

    @classmethod
    def from_metadata(cls, metadata: typing.Mapping[str, Any], *, input_name: str) -> EvalMetrics:
        values = {k: float(v) for k, v in metadata.items() if _is_number(v)}
        extra = {k: v for k, v in metadata.items() if k not in values}
        return cls(values=values, extra=json.loads(json.dumps(extra)))

    def to_metadata(self) -> dict[str, Any]:
        return json.loads(json.dumps({**self.extra, **self.values}))

    @property
    def passed(self) -> bool:
        """evaluate's quality gate verdict (False when there is none)."""
        return bool(self.values.get("passed", 0.0))

    def numeric(self) -> dict[str, float]:
        """The finite numbers, sorted by name (what a model card shows)."""
        return {k: v for k, v in sorted(self.values.items()) if math.isfinite(v)}

    def metric(self, metric: str, *, input_name: str) -> float:
        """The value of `metric`; ContractError naming the metrics there are when it is not one of them."""
        if metric not in self.values:
            known = ", ".join(sorted(self.values))
            raise ContractError(
                f"{input_name} has no metric {metric!r} (it has {known or 'none'}): connect it to "
                f"{self.PRODUCER} output"
            )
        return self.values[metric]


@dataclass(kw_only=True)
class ExportedModel(_Metadata):
    """export's `exported` output: where the model went and what was published (files with size and sha256)."""

    PRODUCER: ClassVar[str] = "export's exported"
    REQUIRED: ClassVar[tuple[str, ...]] = ("destination",)

    destination: str = ""  # never with credentials
    format: str = ""  # merged | adapter | both
    dtype: str = ""
    state: str = ""  # created | resumed | unchanged | replaced
    files: dict[str, dict] = field(default_factory=dict)  # path in the export -> {size, sha256}
    num_files: int = 0
    total_bytes: int = 0
    uploaded_files: int = 0
    manifest_sha256: str = ""
    base_model: str = ""
    base_model_revision: str = ""
    method: str = ""
    dataset_source: str = ""
    metrics: dict[str, float] = field(default_factory=dict)
    layout: dict[str, str] = field(default_factory=dict)  # folder in the export ("" = root) -> what it holds
    commit_sha: str = ""  # hf:// only
    image_digest: str = ""  # oci:// only: the pushed manifest's digest
    run_id: str = ""
    run_name: str = ""


# --- checking one value against its field's type --------------------------------------------------------------


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _checked(value: Any, hint: Any, key: str, input_name: str, producer: str) -> Any:
    ok, converted = _fits(value, hint)
    if not ok:
        shown = json.dumps(value, default=str)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ContractError(
            f"{input_name}'s metadata key {key!r} should be {_type_name(hint)}, not {shown}: connect it to "
            f"{producer} output"
        )
    return converted


def _fits(value: Any, hint: Any) -> tuple[bool, Any]:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return type(None) in args, None
        for arg in args:
            if arg is not type(None):
                ok, converted = _fits(value, arg)
                if ok:
                    return True, converted
        return False, value
    if hint is Any:
        return True, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        if isinstance(value, float) and value.is_integer():
            return True, int(value)
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        return _is_number(value), float(value) if _is_number(value) else value
    if hint is str:
        return isinstance(value, str), value
    if origin is list or hint is list:
        if not isinstance(value, list):
            return False, value
        if args:
            items = [_fits(item, args[0]) for item in value]
            return all(ok for ok, _ in items), [converted for _, converted in items]
        return True, value
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            return False, value
        if args:
            items = {k: _fits(v, args[1]) for k, v in value.items()}
            return all(ok for ok, _ in items.values()), {k: converted for k, (_, converted) in items.items()}
        return True, value
    raise TypeError(f"contract field type {hint!r} is not handled")  # a bug in this module


def _type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in args)
    names = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}
    if hint in names:
        return names[hint]
    if origin is list or hint is list:
        return "a list" + (
            f" of {_type_name(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else ""
        )
    if origin is dict or hint is dict:
        return "a mapping"
    return str(hint)
