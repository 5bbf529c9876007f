"""What each dataset type needs, and the check of every row against it.

Errors name the source file and its own line for the first bad rows (see sources.Loaded.where), and the fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from kfp_finetune.components._shared.data_formats import TEXT_DATASET_TYPES
from kfp_finetune.components.dataset_initialize import labels
from kfp_finetune.components.dataset_initialize.images import IMAGE_COLUMN, image_source_column
from kfp_finetune.components.dataset_initialize.sources import SOURCE_ROW, DatasetValidationError

DATASET_TYPES = (*TEXT_DATASET_TYPES, "multimodal", "classification")
MAX_REPORTED_ROWS = 5
#: Chat roles of each style as torchtune 0.6.1's message transforms read them (OpenAIToMessages keeps the role,
#: ShareGPTToMessages maps human/gpt), under torchtune's names.
CHAT_ROLES = {
    "openai": {"system": "system", "user": "user", "assistant": "assistant"},
    "sharegpt": {"system": "system", "human": "user", "gpt": "assistant"},
}
#: Tool turns: torchtune 0.6.1's `Role` has only `ipython` for them, which its chat datasets cannot train
#: (validate_messages wants an assistant turn right after a user turn; ShareGPTToMessages has no tool role).
TOOL_ROLES = {"tool", "ipython", "function", "function_call", "observation"}
TOOL_KEYS = ("tool_calls", "function_call")
TOOL_FIX = "torchtune 0.6.1 trains only system, user and assistant turns (take the tool turns out)"


@dataclass
class Schema:
    """What a dataset type needs: `style` names the variant; `columns` the canonical column names written."""

    style: str
    columns: tuple[str, ...]
    optional: tuple[str, ...] = ()
    images: bool = False  # multimodal: the rows also carry IMAGE_COLUMN (checked and embedded by images.py)


def resolve_schema(dataset_type: str, columns: list[str], column_map: dict[str, str]) -> tuple[Schema, dict]:
    """The schema for `dataset_type` given the source columns, and the rename {source: canonical}.

    `column_map` maps canonical names to source column names, as in torchtune ({"input": "question"}).
    Multimodal rows are instruct or chat rows (whichever columns they have) plus an image column.
    """
    if dataset_type not in DATASET_TYPES:
        raise ValueError(f"data_type {dataset_type!r} is not one of {', '.join(DATASET_TYPES)}")
    if dataset_type == "multimodal":
        image = image_source_column(columns, column_map)
        if image is None:
            mapped = column_map.get("images") or column_map.get("image")
            raise DatasetValidationError(
                f"multimodal data needs an image column ({'mapped to ' + repr(mapped) if mapped else '`images` or `image`'}); "
                f"the data has {columns}. Map another name with data_column_map, e.g. {{'images': 'picture'}}."
            )
        chat = any(column_map.get(c, c) in columns for c in ("messages", "conversations"))
        schema, rename = resolve_schema("chat" if chat else "instruct", columns, column_map)
        if image in rename:
            raise DatasetValidationError(
                f"column {image!r} holds the images and also {rename[image]!r}: map each to its own column"
            )
        schema.images = True
        return schema, {**rename, image: IMAGE_COLUMN}

    def source(canonical: str) -> str:
        return column_map.get(canonical, canonical)

    if dataset_type == "instruct":
        alpaca = source("instruction") in columns
        schema = Schema("alpaca", ("instruction", "output"), ("input", "system")) if alpaca else Schema(
            "input_output", ("input", "output"), ("system",)
        )  # fmt: skip
    elif dataset_type == "chat":
        if source("messages") in columns:
            schema = Schema("openai", ("messages",))
        elif source("conversations") in columns:
            schema = Schema("sharegpt", ("conversations",))
        else:
            raise DatasetValidationError(
                f"chat data needs a `messages` (OpenAI) or `conversations` (ShareGPT) column; the data has "
                f"{columns}. Map another name with data_column_map, e.g. {{'messages': 'dialog'}}."
            )
    elif dataset_type == "classification":  # labels.py: text (+ text_pair) and a class id or name per row
        schema = Schema("classification", (*labels.TEXT_COLUMNS, labels.LABEL_COLUMN), labels.OPTIONAL_TEXT)
    else:
        schema = Schema("text", ("text",))
    missing = [
        repr(c) + (f" (mapped to {source(c)!r})" if source(c) != c else "")
        for c in schema.columns
        if source(c) not in columns
    ]
    if missing:
        raise DatasetValidationError(
            f"{dataset_type} data ({schema.style}) needs column(s) {', '.join(missing)}; the data has {columns}. "
            "Map other names with data_column_map, e.g. "
            + (
                "{'text': 'review', 'label': 'stars'}."
                if dataset_type == "classification"
                else "{'input': 'question', 'output': 'answer'}."
            )
        )
    wanted = schema.columns + tuple(c for c in schema.optional if source(c) in columns)
    shared = {source(c): [w for w in wanted if source(w) == source(c)] for c in wanted}
    shared = {column: names for column, names in shared.items() if len(names) > 1}
    if shared:
        column, names = next(iter(shared.items()))
        raise DatasetValidationError(
            f"data_column_map maps {' and '.join(map(repr, names))} to the same source column {column!r}: each "
            f"column of {dataset_type} data needs its own source column; the data has {columns}"
        )
    return schema, {source(c): c for c in wanted}


def _message_problem(messages, style: str) -> str | None:
    """Why torchtune cannot train on this conversation, or None. Its rules (torchtune.data.validate_messages,
    0.6.1): a system turn only first, each assistant turn right after a user turn, no two user turns in a row;
    and as ours, like the instruct columns: an assistant turn to learn from, none of them blank."""
    role_key, text_key = ("role", "content") if style == "openai" else ("from", "value")
    roles = CHAT_ROLES[style]
    if messages is None:
        return "is null"
    if not isinstance(messages, list) or not messages:
        return "is not a non-empty list of messages"
    previous = None
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or role_key not in message:
            return f"message {i} lacks {role_key!r}/{text_key!r}"
        role = message[role_key]
        if role in TOOL_ROLES or any(message.get(key) for key in TOOL_KEYS):
            what = (
                f"{role_key} {role!r}" if role in TOOL_ROLES else next(k for k in TOOL_KEYS if message.get(k))
            )
            return f"message {i} is a tool turn ({what}): {TOOL_FIX}"
        if role not in roles:
            return f"message {i} has {role_key} {role!r} (expected one of {sorted(roles)})"
        if not isinstance(message.get(text_key), str):
            return f"message {i} {text_key} is {type(message.get(text_key)).__name__}, not a string"
        turn = roles[role]
        if turn == "system" and i > 0:
            return f"message {i} is a system turn after the first message: put the system turn first"
        if turn == "assistant" and previous != "user":
            return f"message {i} ({role}) does not follow a user turn: turns must alternate user, assistant"
        if turn == "user" and previous == "user":
            return f"messages {i - 1} and {i} are both user turns: turns must alternate user, assistant"
        if turn == "assistant" and not message[text_key].strip():
            return f"message {i} ({role}) is empty: there is nothing to learn from it"
        previous = turn
    if "assistant" not in {roles[m[role_key]] for m in messages}:
        return "has no assistant turn: there is nothing to learn from (add the answer, or remove the row)"
    return None


def validate(ds, schema: Schema, split: str, where: Callable[[int], str], batch_size: int = 1000) -> None:
    """Check types and every row; raise DatasetValidationError naming the first bad rows' files and lines.

    `ds` carries the `SOURCE_ROW` column; `where` turns its values into "file line N".
    """
    import pyarrow as pa

    if len(ds) == 0:
        raise DatasetValidationError(f"the {split} split is empty")
    if schema.style == "classification":  # labels are not strings: labels.py checks text and label row by row
        _refuse_non_utf8(ds, [c for c in ("text", "text_pair") if c in ds.column_names and _is_string(ds, c)],
                         split, where)  # fmt: skip
        labels.check_rows(ds, split, where, batch_size)
        return
    present = [c for c in schema.columns + schema.optional if c in ds.column_names]
    chat = schema.style in ("openai", "sharegpt")
    for column in present:
        arrow_type = ds.data.schema.field(column).type
        if chat and column in schema.columns:
            ok = pa.types.is_list(arrow_type) or pa.types.is_large_list(arrow_type)
        else:
            ok = (
                pa.types.is_string(arrow_type)
                or pa.types.is_large_string(arrow_type)
                or pa.types.is_null(arrow_type)
            )
        if not ok:
            wants_list = chat and column in schema.columns
            bad_count, bad = _wrong_type_rows(ds, column, wants_list, where, batch_size)
            # pyarrow's JSON type: values of different types in one column (a number among strings)
            mixed = getattr(arrow_type, "extension_name", "") == "arrow.json"
            raise DatasetValidationError(
                f"{split}: column {column!r} has type {'mixed (JSON)' if mixed else arrow_type}, expected "
                f"{'a list of messages' if wants_list else 'strings'}: {bad_count} of {len(ds)} rows hold "
                "another type; first: "
                + "; ".join(bad)
                + ". Fix these rows in the source files, or map another "
                "column to it with data_column_map"
            )
    strings = [c for c in present if not (chat and c in schema.columns)]
    _refuse_non_utf8(ds, strings, split, where)
    if not chat:
        bad_count, bad = _blank_string_rows(ds, [c for c in schema.columns if c in present], where)
    else:
        bad_count, bad = _bad_message_rows(ds, present, schema, where, batch_size)
    if bad:
        raise DatasetValidationError(
            f"{split}: {bad_count} of {len(ds)} rows are not valid {schema.style} data; first: "
            + "; ".join(bad)
            + ". Fix or remove these rows in the source and run again."
        )


def _refuse_non_utf8(ds, columns: list[str], split: str, where: Callable[[int], str]) -> None:
    bad_count, bad = _non_utf8_rows(ds, columns, where)
    if bad:
        raise DatasetValidationError(
            f"{split}: {bad_count} of {len(ds)} rows hold text that is not UTF-8; first: "
            + "; ".join(bad)
            + ". Save the source files as UTF-8 and run again."
        )


def _is_string(ds, column: str) -> bool:
    import pyarrow as pa

    arrow_type = ds.data.schema.field(column).type
    return pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)


def _wrong_type_rows(
    ds, column: str, wants_list: bool, where: Callable[[int], str], batch_size: int
) -> tuple[int, list[str]]:
    """Rows whose value in `column` is not a string (or, `wants_list`, a list), nulls aside (checked later):
    the column's type says only that some row differs, e.g. pyarrow's JSON type for a value that is a number
    at one line of thousands."""
    wanted = list if wants_list else str
    bad: list[str] = []
    bad_count = 0
    for batch in ds.select_columns([column, SOURCE_ROW]).iter(batch_size=batch_size):
        for value, source_row in zip(batch[column], batch[SOURCE_ROW], strict=True):
            if value is not None and not isinstance(value, wanted):
                bad_count += 1
                if len(bad) < MAX_REPORTED_ROWS:
                    bad.append(f"{where(source_row)}: {column} is {type(value).__name__} {_shown(value)}")
    return bad_count, bad


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _non_utf8_rows(
    ds, columns: list[str], where: Callable[[int], str], batch_size: int = 100_000
) -> tuple[int, list[str]]:
    """Values of string columns that are not valid UTF-8 (pyarrow's JSON reader does not check; the rows would
    be written to parquet as they are and fail in training). Arrow's full validation finds them in C++."""
    import pyarrow as pa

    bad: list[str] = []
    bad_count = 0
    if not columns:
        return bad_count, bad
    for batch in ds.select_columns([*columns, SOURCE_ROW]).with_format("arrow").iter(batch_size=batch_size):
        for column in columns:
            values = batch.column(column)
            try:
                values.validate(full=True)
                continue
            except pa.ArrowInvalid:
                pass
            for row in range(len(values)):
                try:
                    values[row].as_py()
                except UnicodeDecodeError:
                    bad_count += 1
                    if len(bad) < MAX_REPORTED_ROWS:
                        bad.append(
                            f"{where(batch.column(SOURCE_ROW)[row].as_py())}: {column} is not UTF-8 text"
                        )
    return bad_count, bad


def _blank_string_rows(
    ds, columns: list[str], where: Callable[[int], str], batch_size: int = 100_000
) -> tuple[int, list[str]]:
    """Null or blank values in required string columns, found with Arrow kernels (types are checked already;
    optional string columns may hold anything of that type)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad: list[str] = []
    bad_count = 0
    for batch in ds.select_columns([*columns, SOURCE_ROW]).with_format("arrow").iter(batch_size=batch_size):
        problems = []
        for column in columns:
            values = batch.column(column)
            null = pc.is_null(values)
            if pa.types.is_null(values.type):
                blank = null
            else:
                blank = pc.and_(
                    pc.invert(null), pc.equal(pc.utf8_trim_whitespace(pc.fill_null(values, "x")), "")
                )
            problems.append((column, null, blank))
        any_bad = problems[0][1]
        for _, null, blank in problems:
            any_bad = pc.or_(any_bad, pc.or_(null, blank))
        rows = pc.indices_nonzero(any_bad).to_pylist()
        bad_count += len(rows)
        for row in rows[: max(0, MAX_REPORTED_ROWS - len(bad))]:
            column, null, _ = next(p for p in problems if p[1][row].as_py() or p[2][row].as_py())
            location = where(batch.column(SOURCE_ROW)[row].as_py())
            bad.append(f"{location}: {column} {'is null' if null[row].as_py() else 'is empty'}")
    return bad_count, bad


def _bad_message_rows(
    ds, present: list[str], schema: Schema, where: Callable[[int], str], batch_size: int
) -> tuple[int, list[str]]:
    bad: list[str] = []
    bad_count = 0
    for batch in ds.select_columns([*present, SOURCE_ROW]).iter(batch_size=batch_size):
        for offset in range(len(batch[SOURCE_ROW])):
            for column in present:
                value = batch[column][offset]
                if column in schema.optional:
                    problem = None if value is None or isinstance(value, str) else "is not a string"
                else:
                    problem = _message_problem(value, schema.style)
                if problem:
                    bad_count += 1
                    if len(bad) < MAX_REPORTED_ROWS:
                        bad.append(f"{where(batch[SOURCE_ROW][offset])}: {column} {problem}")
                    break
    return bad_count, bad
