"""Multimodal rows (dataset_type `multimodal`): instruct or chat rows with an image column, checked image by image
and written with the image bytes embedded, so the trainer pod needs only the parquet shards.

A row's image column holds, one value or a list of them (KEP-2401's MultimodalDataset; the `datasets` Image
feature): a path relative to `image_dir` (a folder inside the source), an `{bytes, path}` struct as the Image
feature stores it in parquet, or raw bytes. Its text holds one `image_tag` per image, in order, as torchtune's
`format_content_with_images` requires (an empty `image_tag`: no placeholders; the images come before the first user
turn, torchtune's behaviour without a tag). Every problem is named by file and line with its fix, all rows checked
before any is written: an image path that is absolute or climbs out of `image_dir` (remote names never escape
their destination), a missing file, bytes that are not a readable image, a tag count that differs from the images.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kfp_finetune.components._shared import storage
from kfp_finetune.components._shared.errors import ConfigError
from kfp_finetune.components._shared.logs import get_logger
from kfp_finetune.components.dataset_initialize.sources import SOURCE_ROW, DatasetValidationError

log = get_logger(__name__)

IMAGE_COLUMN = "images"  # written: a list of `datasets` Image structs {bytes, path} per row (TRL's name)
#: Source column names read without a data_column_map entry: TRL / the Cauldron's `images`, torchtune's `image`.
IMAGE_SOURCE_NAMES = ("images", "image")
MAX_REPORTED_ROWS = 5
_PROBLEM = "__image_problem"
#: Signatures of the formats vision processors read, checked only where Pillow is not installed.
_MAGIC = {
    "PNG": (b"\x89PNG\r\n\x1a\n",),
    "JPEG": (b"\xff\xd8\xff",),
    "GIF": (b"GIF87a", b"GIF89a"),
    "BMP": (b"BM",),
}
VALUE_FIX = (
    "give a path (relative to data_image_dir), image bytes, an {bytes, path} struct, or a list of them"
)


def image_source_column(columns: list[str], column_map: dict[str, str]) -> str | None:
    """The source column holding the images: data_column_map's `images` (or torchtune's key `image`), else a
    column named `images` or `image`."""
    mapped = column_map.get("images") or column_map.get("image")
    if mapped:
        return mapped if mapped in columns else None
    return next((name for name in IMAGE_SOURCE_NAMES if name in columns), None)


def checked_image_dir(image_dir: str) -> PurePosixPath:
    """`image_dir` as a relative folder inside the source; absolute or `..` names are refused."""
    folder = PurePosixPath(image_dir.strip() or ".")
    if folder.is_absolute() or ".." in folder.parts or "\\" in image_dir:
        raise ConfigError(
            f"data_image_dir={image_dir!r} must be a folder inside the dataset source, relative to it (e.g. "
            "`images`): absolute paths and `..` are refused"
        )
    return folder


@dataclass
class ImageStats:
    num_images: int = 0
    image_bytes: int = 0
    rows_with_images: int = 0


def _items(value) -> list | None:
    """The row's images as a list (None: no image); None for a value of no image form."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    ok = all(
        isinstance(item, str | bytes) or (isinstance(item, dict) and {"bytes", "path"} >= item.keys())
        for item in items
    )
    return items if ok else None


def _relative_path(name: str) -> PurePosixPath | None:
    """A path named in the data as a path under image_dir, or None when it is absolute or climbs out of it."""
    path = PurePosixPath(name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or (len(name) > 1 and name[1] == ":"):
        return None
    return path


def referenced_paths(ds, image_dir: PurePosixPath) -> list[str]:
    """The source-relative paths of the image files the rows name (escaping ones left out: refused later)."""
    wanted = set()
    for batch in ds.select_columns([IMAGE_COLUMN]).iter(batch_size=1000):
        for value in batch[IMAGE_COLUMN]:
            for item in _items(value) or []:
                name = item if isinstance(item, str) else item.get("path") if isinstance(item, dict) else None
                embedded = isinstance(item, dict) and item.get("bytes") is not None
                relative = _relative_path(name) if isinstance(name, str) and not embedded else None
                if relative is not None:
                    wanted.add((image_dir / relative).as_posix())
    return sorted(wanted)


def image_folder(listing: storage.Listing, raw: Path, image_dir: PurePosixPath, wanted: list[str]) -> Path:
    """The local folder the source-relative image paths are read from: a local source's own folder (read in
    place), else `raw`, where the listed images among `wanted` are downloaded (and verified) first."""
    if listing.uri.scheme == "file":
        root = Path(listing.uri.path)
        return root if root.is_dir() else root.parent
    listed = set(listing.by_path())
    present = [p for p in wanted if p in listed]
    if present:
        log.info("fetching %d image file(s) under %s", len(present), image_dir.as_posix())
        storage.download(listing, present, raw)
    return raw


class _Images:
    """Reads and checks one row's images; `root` is the folder source-relative paths start from."""

    def __init__(self, root: Path, image_dir: PurePosixPath, local: storage.LocalRoot | None, tag: str):
        self.root, self.image_dir, self.local, self.tag = root, image_dir, local, tag

    def read(self, name: str) -> tuple[bytes | None, str]:
        relative = _relative_path(name)
        if relative is None:
            return None, (
                f"image path {name!r} is absolute or leaves data_image_dir: name it relative to "
                f"data_image_dir ({self.image_dir.as_posix()}), inside the dataset source"
            )
        path = self.root / self.image_dir / relative
        if self.local is not None:
            path = Path(self.local.resolve(path))  # a link out of the source folder is refused (LinkEscape)
        if not path.is_file():
            shown = (self.image_dir / relative).as_posix()
            return (
                None,
                f"image file {shown} is missing: add it to the source, or fix the path (data_image_dir)",
            )
        return path.read_bytes(), ""

    def row(self, value, text: str) -> tuple[list[dict], str]:
        """The row's images as {bytes, path} structs, and its first problem ("" when none)."""
        items = _items(value)
        if items is None:
            return [], f"images is {type(value).__name__}: {VALUE_FIX}"
        images = []
        for number, item in enumerate(items):
            if isinstance(item, bytes):
                data, name, problem = item, None, ""
            elif isinstance(item, dict) and item.get("bytes") is not None:
                data, name, problem = item["bytes"], item.get("path"), ""
            else:
                name = item.get("path") if isinstance(item, dict) else item
                if not isinstance(name, str) or not name:
                    return [], f"image {number} has neither bytes nor a path: {VALUE_FIX}"
                data, problem = self.read(name)
            if problem:
                return [], problem
            unreadable = not_an_image(data)
            if unreadable:
                shown = f"image {number}" + (f" ({name})" if name else "")
                return [], f"{shown} {unreadable}: replace it with a PNG, JPEG, GIF, WebP or BMP file"
            images.append({"bytes": data, "path": name})
        tags = text.count(self.tag) if self.tag else len(images)
        if tags != len(images):
            return [], (
                f"the text holds {tags} {self.tag!r} tag(s) for {len(images)} image(s): put one {self.tag!r} "
                "where each image belongs, in order (or set data_image_tag to the placeholder the data uses)"
            )
        return images, ""


def not_an_image(data: bytes) -> str:
    """Why `data` is not a readable image ("" when it is): decoded in full by Pillow (a truncated file fails
    too); without Pillow, the signature of a PNG, JPEG, GIF, WebP or BMP file."""
    try:
        from PIL import Image
    except ImportError:
        known = any(data.startswith(m) for magic in _MAGIC.values() for m in magic)
        webp = data[:4] == b"RIFF" and data[8:12] == b"WEBP"
        return "" if known or webp else f"is not an image ({len(data)} bytes starting {data[:8]!r})"
    try:
        with Image.open(io.BytesIO(data)) as image:
            image.load()
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as err:
        return f"is not a readable image ({len(data)} bytes; {type(err).__name__}: {err})"
    return ""


def row_text(batch: dict, row: int, style: str) -> str:
    """The row's text the image tags are counted in: every message, or every instruct column."""
    if style in ("openai", "sharegpt"):
        column, key = ("messages", "content") if style == "openai" else ("conversations", "value")
        return "\n".join(m[key] for m in batch[column][row])
    names = ("instruction", "input", "output") if style == "alpaca" else ("input", "output")
    return "\n".join(batch[n][row] or "" for n in names if n in batch)


def embed_images(
    ds,
    *,
    split: str,
    style: str,
    where: Callable[[int], str],
    listing: storage.Listing,
    raw: Path,
    image_dir: str,
    image_tag: str,
) -> tuple[object, ImageStats]:
    """`ds` (validated rows with `SOURCE_ROW`) with its image column replaced by the image bytes, as the
    `datasets` Image feature stores them; DatasetValidationError naming the first bad rows when any is bad."""
    import datasets

    folder = checked_image_dir(image_dir)
    undecoded = _undecoded(ds.features[IMAGE_COLUMN])
    if undecoded is not None:  # parquet written by `datasets` with an Image feature: read its {bytes, path}
        ds = ds.cast_column(IMAGE_COLUMN, undecoded)
    root = image_folder(listing, raw, folder, referenced_paths(ds, folder))
    local = storage.LocalRoot(root, listing.uri.shown) if listing.uri.scheme == "file" else None
    reader = _Images(root, folder, local, image_tag)

    def embed(batch: dict) -> dict:
        images, problems = [], []
        for row, value in enumerate(batch[IMAGE_COLUMN]):
            found, problem = reader.row(value, row_text(batch, row, style))
            images.append(found)
            problems.append(problem or None)
        return {IMAGE_COLUMN: images, _PROBLEM: problems}

    item = datasets.Features({"bytes": datasets.Value("binary"), "path": datasets.Value("string")})
    features = datasets.Features({**ds.features, IMAGE_COLUMN: [item], _PROBLEM: datasets.Value("string")})
    # Small batches: a batch of decoded images is held in memory at once.
    ds = ds.map(embed, batched=True, batch_size=64, features=features, desc=f"checking {split} images")
    bad = ds.filter(lambda problems: [p is not None for p in problems], input_columns=_PROBLEM, batched=True)
    if len(bad):
        first = bad.select(range(min(MAX_REPORTED_ROWS, len(bad))))
        named = [f"{where(r)}: {p}" for r, p in zip(first[SOURCE_ROW], first[_PROBLEM], strict=True)]
        raise DatasetValidationError(
            f"{split}: {len(bad)} of {len(ds)} rows have images that cannot be used; first: "
            + "; ".join(named)
            + ". Fix or remove these rows (or their image files) in the source and run again."
        )
    ds = ds.remove_columns(_PROBLEM).cast_column(IMAGE_COLUMN, datasets.Sequence(datasets.Image()))
    stats = image_stats(ds)
    if split == "train" and not stats.num_images:
        raise DatasetValidationError(
            f"{split}: data_type multimodal, but no row has an image (column {IMAGE_COLUMN!r} is empty in "
            f"all {len(ds)} rows): use data_type instruct or chat for text-only data"
        )
    log.info(
        "%s: %d image(s), %.1f MiB, in %d of %d rows, embedded into the shards",
        split, stats.num_images, stats.image_bytes / 2**20, stats.rows_with_images, len(ds),
    )  # fmt: skip
    return ds, stats


def _undecoded(feature):
    """The same Image feature (or list of them) read as {bytes, path} structs, not decoded; None for another."""
    import datasets

    if isinstance(feature, datasets.Image):
        return datasets.Image(decode=False)
    if isinstance(getattr(feature, "feature", None), datasets.Image):
        return datasets.Sequence(datasets.Image(decode=False))
    return None


def image_stats(ds) -> ImageStats:
    """Counts of the embedded images, from Arrow (no image is decoded)."""
    import pyarrow.compute as pc

    stats = ImageStats()
    for batch in ds.select_columns([IMAGE_COLUMN]).with_format("arrow").iter(batch_size=1000):
        lists = batch.column(IMAGE_COLUMN)
        lengths = pc.fill_null(pc.list_value_length(lists), 0)
        stats.num_images += pc.sum(lengths).as_py() or 0
        stats.rows_with_images += pc.sum(pc.greater(lengths, 0).cast("int64")).as_py() or 0
        flat = pc.list_flatten(lists)
        if len(flat):
            stats.image_bytes += pc.sum(pc.binary_length(pc.struct_field(flat, "bytes"))).as_py() or 0
    return stats


def split_metadata(manifest: dict, info: dict) -> dict:
    """The multimodal keys of a split's metadata (none for text-only data)."""
    if "image_column" not in manifest:
        return {}
    return {"image_column": manifest["image_column"], "image_tag": manifest["image_tag"],
            "num_images": info.get("num_images", 0), "image_bytes": info.get("image_bytes", 0)}  # fmt: skip


def dropped_images_hint(columns: list[str]) -> str:
    """A log line for instruct / chat data with an image column that is dropped ("" when none)."""
    found = [c for c in IMAGE_SOURCE_NAMES if c in columns]
    if not found:
        return ""
    return f"column {found[0]!r} looks like images: set data_type=multimodal to keep them"
