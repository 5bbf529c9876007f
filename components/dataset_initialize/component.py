"""The dataset-initialize KFP component (signature + docstring; the implementation is initialize.py)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Model, Output

from kfp_finetune.components._shared.images import TRAINER_IMAGE


# The trainer image (run on a CPU pod): tokenizing and packing once, exactly as training does, goes through
# torchtune's tokenizers and templates, which need torch. The component image has neither.
@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def dataset_initialize(
    source_uri: str,
    workspace_path: str,
    train: Output[Dataset],
    eval: Output[Dataset],
    name: str = "",
    dataset_type: str = "instruct",
    column_map: dict = {},  # noqa: B006 (KFP needs a literal default)
    train_split: str = "train",
    eval_split: str = "",
    eval_fraction: float = -1.0,
    seed: int = 42,
    data_format: str = "",
    subset: str = "",
    csv_delimiter: str = "",
    rows_per_shard: int = 100000,
    num_proc: int = -1,
    s3_endpoint_url: str = "",
    task_id: str = "",
    base_model: Input[Model] = None,
    base_model_uri: str = "",
    max_seq_len: int = -1,
    train_on_input: str = "auto",
    new_system_prompt: str = "",
    batch_size: int = -1,
    gradient_accumulation_steps: int = -1,
    image_dir: str = "",
    image_tag: str = "<image>",
    num_labels: int = -1,
    label_names: list = [],  # noqa: B006 (KFP needs a literal default)
):
    """Bring a fine-tuning dataset into the run workspace as validated parquet shards.

    Loads the data with the `datasets` library, keeps the columns the dataset type needs under their
    canonical names (the step log lists the columns dropped), validates every row (types, nulls, empty
    values; the error names the first bad rows by source file and line — JSON Lines, CSV, txt — or row index
    within the file — parquet, arrow, JSON arrays), optionally holds out an eval split, and writes `train/` and
    `eval/` parquet shards plus a manifest to `<workspace>/datasets/<name>-<task>/` (`<task>`: 8 characters of a
    hash of `task_id`). Instruct rows with a per-row `system` column are written as OpenAI `messages` (system,
    user, assistant; alpaca's input follows the instruction after a blank line) with dataset_type `chat`, so training keeps the system prompt with the same
    masking. Plain-text files (`.txt`) give one row per line; blank lines are skipped. A folder whose dataset card
    (README.md) declares configs is read as `datasets` reads it: the config named by `subset` (or its default). The copy is renamed into place only when complete; a rerun
    with the same source content and parameters skips the work. A local folder's symlinks are followed only
    inside it: one pointing outside (another team's data file or folder) fails the step naming it, before any row
    is read. Credentials come only from the environment:
    HF_TOKEN for the Hugging Face Hub, AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (and
    AWS_ENDPOINT_URL) for S3 — set them from Kubernetes Secrets.

    Args:
        source_uri: Where the data is: a dataset repo `hf://<org>/<name>[/<data_dir>][@<revision>]`, or json,
            jsonl, csv, tsv, parquet, arrow or txt files at `s3://<bucket>/<prefix>`, `https://<host>/<file>`,
            `file:///<path>` or an absolute path (a file or a folder).
        workspace_path: The run workspace; pass `dsl.WORKSPACE_PATH_PLACEHOLDER`.
        name: Readable part of the folder name under `datasets/`; default: the repo, file or folder name of the
            source.
        dataset_type: `instruct` (columns `input` + `output`, or alpaca `instruction` + optional `input` +
            `output`; optional `system`), `chat` (OpenAI `messages` or ShareGPT `conversations`), `text`
            (`text`, or the lines of .txt files) or `multimodal` (instruct or chat rows plus an `images` or
            `image` column: per row a path under image_dir, image bytes, a `datasets` Image struct, or a list
            of them; the images are checked and embedded into the shards; not packed) or `classification`
            (`text`, optional `text_pair`, and `label`: class ids 0..K-1 or class names; written as class ids;
            not packed).
        column_map: Canonical column name to source column name, e.g. `{"input": "question", "output":
            "answer", "system": "persona"}` (multimodal: `{"images": "picture"}`; classification: `{"text": "review",
            "label": "stars"}`).
        train_split: Split expression for the training rows, e.g. `train`, `train[:3000]`, `train[:90%]`.
            For files, splits come from file names as in `datasets`: `train*`; `validation*` / `dev*`;
            `test*` / `eval*` (the `test` split); a single file or unnamed files are `train`.
        eval_split: Split expression for held-out rows, e.g. `test` or `train[90%:]`; empty for none.
        eval_fraction: Fraction of the training rows held out for evaluation (seeded shuffle); 0 for none; -1:
            0.05 when no eval_split is named, else none (only a fraction set with a split conflicts).
        seed: Seed of the eval_fraction shuffle; the same seed gives the same split.
        data_format: `json`, `jsonl`, `csv`, `tsv`, `parquet`, `arrow` or `text`; default: detected from the
            file names (parquet, then arrow, json, csv, tsv, txt when the files come in several formats).
        subset: Config (subset) of a dataset with several: a Hub repo's, or those a folder's README.md declares;
            empty: its default config.
        csv_delimiter: Column separator of CSV / TSV files: one character such as `;` or `|`, `\\t` for a
            tab; empty: `,` for .csv files, a tab for .tsv files.
        rows_per_shard: Maximum rows per written parquet shard.
        num_proc: Processes that parse the source files (JSON Lines are streamed by pyarrow) and tokenize the
            train split; -1: as many as the pod's CPU limit, the CPUs it may run on and its memory limit allow
            (the step log names the bound).
        s3_endpoint_url: S3 endpoint for MinIO / Ceph; default: AWS_ENDPOINT_URL from the environment, else AWS.
        task_id: KFP's id of this task; pass `dsl.PIPELINE_TASK_ID_PLACEHOLDER` (keeps two datasets whose
            sources end in the same name apart); empty: not under KFP.
        base_model: Optional model-initialize output: when connected, the train split is also tokenized once
            with this model's tokenizer, prompt template and masking (torchtune's own dataset builders, in
            num_proc processes) and its whole rows packed best-fit decreasing (packs ~99.9 % full) into
            memory-mappable Arrow beside the shards; the fine-tune step then trains on these packs without tokenizing on any rank when it resolves the
            same tokenizer, template, masking (train_on_input, new_system_prompt: pass it the same values) and
            max_seq_len. Needs torchtune in the image (else the step logs that no packs were written). A model
            whose attention takes no packed batches on GPUs (Gemma 2) gets no packs: its rows are only measured.
        base_model_uri: The base model's source (hf://, s3:// or a path), instead of base_model: only its
            config.json and tokenizer files are fetched (no weights) to tokenize and pack as with base_model, so
            this step need not wait for model-initialize; empty: none.
        max_seq_len: Length of the packs in tokens; -1: the 99th percentile of the tokenized row lengths
            (never set by the single longest row), rounded up to a multiple of 256, capped by the model's
            max_position_embeddings. Longer rows are cut; rows whose masked prompt fills it are left out of the
            packs and named by file and line; more than 1% of the rows is refused.
        train_on_input: Also train on the prompt tokens: true, false or auto (the base config's; usually only
            the response).
        new_system_prompt: A system prompt prepended to every example; empty: none.
        batch_size: The fine-tune's examples per device per step, when set (-1: unset): with
            gradient_accumulation_steps, a train split too small for one optimizer step is refused here.
        gradient_accumulation_steps: The fine-tune's steps per optimizer update, when set (-1: unset).
        image_dir: Multimodal: the folder inside the source that image paths are relative to; empty: the source's
            own folder. Absolute paths and `..` are refused.
        image_tag: Multimodal: the placeholder in the text standing for the row's images in order (one per
            image); empty: none, the images come before the first user turn.
        num_labels: Classification: the number of classes; -1: from the data (the data must hold every class).
        label_names: Classification: the class names in class-id order; empty: the string labels sorted.

    Returns:
        train: The manifest; metadata gives `workspace_path`, `data_files` (workspace-relative parquet shards),
            `num_rows`, `columns`, `dataset_type` (as written: `chat` for instruct rows with a system prompt),
            `data_style` (input_output, alpaca, openai, sharegpt, text), for chat `conversation_style` and `conversation_column`, for text `text_column`,
            `column_map`, `source_uri`, `revision`, `commit_sha`, `files` (path, size, sha256); with base_model
            also `token_stats` (count, p50, p90, p99, max, prompt_max), `max_seq_len`, `packs` (path, size,
            sha256, num_packs), `tokenizer_fingerprint`, `pack_fingerprint` and `pack_template`; multimodal
            data also `image_column`, `image_tag`, `num_images` and `image_bytes`; classification data also
            `label_column`, `num_labels`, `label_names` (index = class id) and `label_counts` (rows per class id).
        eval: The same for the held-out rows; `num_rows` is 0 and `data_files` empty when there are none.
    """
    from contextlib import ExitStack

    from kfp_finetune.components._shared import unset
    from kfp_finetune.components._shared.artifacts import entry_path
    from kfp_finetune.components._shared.contract import BaseModel
    from kfp_finetune.components._shared.errors import usage_errors
    from kfp_finetune.components._shared.model_files import config_and_tokenizer
    from kfp_finetune.components._shared.storage import StorageError, refuse_credentials
    from kfp_finetune.components.dataset_initialize.initialize import initialize_dataset
    from kfp_finetune.components.dataset_initialize.sources import held_out_fraction

    # ValueError: bad parameters, URIs (with credentials in them too), splits and rows (DatasetValidationError) are
    # all the user's to fix.
    with usage_errors(StorageError, ValueError), ExitStack() as stack:
        refuse_credentials(data_uri=source_uri, model_uri=base_model_uri, s3_endpoint_url=s3_endpoint_url)
        model_path = None
        if base_model is not None:
            relative = BaseModel.from_metadata(base_model.metadata, input_name="base_model").require(
                "workspace_path", input_name="base_model"
            )
            model_path = entry_path(workspace_path, relative)
        elif base_model_uri:
            endpoint = s3_endpoint_url or None
            model_path = stack.enter_context(config_and_tokenizer(base_model_uri, endpoint_url=endpoint))
        initialize_dataset(
            source_uri=source_uri,
            workspace_path=workspace_path,
            name=name,
            dataset_type=dataset_type,
            column_map=column_map,
            train_split=train_split,
            eval_split=eval_split,
            eval_fraction=held_out_fraction(eval_split, eval_fraction),
            seed=seed,
            data_format=data_format,
            subset=subset,
            csv_delimiter=csv_delimiter,
            rows_per_shard=rows_per_shard,
            num_proc=unset.value("num_proc", num_proc),
            s3_endpoint_url=s3_endpoint_url,
            task_id=task_id,
            output_train=train,
            output_eval=eval,
            base_model_path=model_path,
            max_seq_len=max_seq_len if max_seq_len > 0 else None,
            train_on_input=unset.switch("tune_train_on_input", train_on_input),
            new_system_prompt=unset.value("tune_new_system_prompt", new_system_prompt),
            batch_size=unset.value("tune_batch_size", batch_size),
            gradient_accumulation_steps=unset.value(
                "tune_gradient_accumulation_steps", gradient_accumulation_steps
            ),
            image_dir=image_dir,
            image_tag=image_tag,
            num_labels=unset.value("num_labels", num_labels),
            label_names=label_names,
        )
