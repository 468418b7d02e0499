"""Image references in records: resolving them, checking them cheaply, and decoding them.

A record's image value is `None` (no image), one item, or a list of items, where an item is

* a path string: absolute, or relative to the entry's image root;
* raw encoded bytes (PNG, JPEG, ...);
* a mapping `{"bytes": b"...", "path": ...}` as Hugging Face datasets stores images: the bytes are
  used when present, else the path.

Checking opens each image and verifies its header and structure with PIL without decoding the pixels;
decoding happens later, on access to a row.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import PIL.Image
import PIL.ImageOps

EMBEDDED_IMAGE_PATH = ""
"""The `image_paths` value of an image whose bytes are embedded in the data file."""


@dataclass(frozen=True)
class ImageRef:
    """A resolved reference to one image.

    Attributes:
        path (`str | None`): Absolute path of the image file, or `None` for embedded bytes.
        data (`bytes | None`): Encoded image bytes, or `None` for a file.
    """

    path: str | None = None
    data: bytes | None = None

    @property
    def display_path(self) -> str:
        """The path for logs: the absolute path, or `EMBEDDED_IMAGE_PATH` for embedded bytes."""
        return self.path if self.path is not None else EMBEDDED_IMAGE_PATH

    def storage(self) -> dict:
        """The `{"bytes", "path"}` mapping stored in the dataset's `images` column."""
        return {"bytes": self.data, "path": self.path}


def _item_to_ref(item: object, image_root: str, position: str) -> ImageRef:
    if isinstance(item, str):
        if not item.strip():
            raise ValueError(f"{position} is an empty path; give a file path, or null for a text-only record")
        return ImageRef(path=os.path.abspath(os.path.join(image_root, os.path.expanduser(item))))
    if isinstance(item, (bytes, bytearray)):
        return ImageRef(data=bytes(item))
    if isinstance(item, dict):
        extra = set(item) - {"bytes", "path"}
        if extra:
            raise ValueError(
                f"{position} is a mapping with unexpected keys {sorted(extra)}; use 'bytes' and/or 'path'"
            )
        if item.get("bytes") is not None:
            return _item_to_ref(item["bytes"], image_root, f"{position}['bytes']")
        if item.get("path") is not None:
            return _item_to_ref(item["path"], image_root, f"{position}['path']")
        raise ValueError(f"{position} has neither 'bytes' nor 'path'; store the image bytes or a file path")
    raise ValueError(
        f"{position} has type {type(item).__name__} ({item!r:.60}); expected a path string, image bytes or a "
        "{'bytes': ..., 'path': ...} mapping"
    )


def image_refs_from_value(value: object, image_root: str) -> list[ImageRef]:
    """Turn a record's image value into resolved references.

    Args:
        value (`object`): `None`, an item, or a list of items (see the module docstring).
        image_root (`str`): Absolute folder that relative paths resolve against.

    Returns:
        `list[ImageRef]`: One reference per image; empty for `None` or an empty list.

    Raises:
        ValueError: An item has the wrong type or is empty; the message names the item.
    """
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return [_item_to_ref(item, image_root, f"item {k}") for k, item in enumerate(value)]
    return [_item_to_ref(value, image_root, "the value")]


def check_image(ref: ImageRef) -> str | None:
    """Check that an image exists and that PIL can open and verify it, without decoding its pixels.

    Args:
        ref (`ImageRef`): The image.

    Returns:
        `str | None`: `None` when the image is fine, else a short reason such as `"file not found"`.
    """
    if ref.path is not None and not os.path.isfile(ref.path):
        return "file not found"
    try:
        source = io.BytesIO(ref.data) if ref.data is not None else ref.path
        with PIL.Image.open(source) as image:
            image.verify()
    except Exception as exc:  # PIL raises many types (OSError, SyntaxError, ValueError, ...) for bad files
        kind = "file" if ref.path is not None else "embedded bytes"
        return f"unreadable {kind} ({type(exc).__name__}: {' '.join(str(exc).split())})"
    return None


def check_images(refs: Iterable[ImageRef], cache: dict[str, str | None], max_workers: int = 8) -> None:
    """Check many image files at once, filling `cache` with one result per path.

    Paths already in `cache` are not checked again. Embedded bytes are not cached; check them with
    `check_image`.

    Args:
        refs (`Iterable[ImageRef]`): The images; those without a path are ignored.
        cache (`dict[str, str | None]`): Maps a path to the result of `check_image`; updated in place.
        max_workers (`int`, *optional*, defaults to `8`): Threads that open files concurrently.
    """
    todo = sorted({ref.path for ref in refs if ref.path is not None and ref.path not in cache})
    if len(todo) < 16 or max_workers <= 1:
        results = [check_image(ImageRef(path=path)) for path in todo]
    else:
        with ThreadPoolExecutor(max_workers=max_workers) as pool:
            results = list(pool.map(lambda path: check_image(ImageRef(path=path)), todo))
    cache.update(zip(todo, results))


def load_image(source: str | os.PathLike | bytes | bytearray | dict | PIL.Image.Image) -> PIL.Image.Image:
    """Decode one image into an RGB PIL image.

    EXIF orientation is applied, as the dataset's lazy decoding does.

    Args:
        source (`str | os.PathLike | bytes | bytearray | dict | PIL.Image.Image`): A file path, encoded bytes,
            a `{"bytes": ..., "path": ...}` mapping (bytes win when present), or an already decoded image.

    Returns:
        `PIL.Image.Image`: The image in mode `"RGB"`, fully loaded (no file is left open).

    Raises:
        FileNotFoundError: The path does not exist.
        PIL.UnidentifiedImageError: The data is not an image PIL can read.
        TypeError: `source` has another type.
    """
    if isinstance(source, dict):
        if source.get("bytes") is not None:
            source = source["bytes"]
        elif source.get("path") is not None:
            source = source["path"]
        else:
            raise TypeError("image mapping has neither 'bytes' nor 'path'")
    if isinstance(source, PIL.Image.Image):
        image = source
    elif isinstance(source, (bytes, bytearray)):
        image = PIL.Image.open(io.BytesIO(bytes(source)))
    elif isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as handle:
            image = PIL.Image.open(io.BytesIO(handle.read()))
    else:
        raise TypeError(
            f"cannot load an image from {type(source).__name__}; pass a path, bytes or a PIL image"
        )
    image.load()
    if image.getexif().get(PIL.Image.ExifTags.Base.Orientation) is not None:
        image = PIL.ImageOps.exif_transpose(image)
    return image if image.mode == "RGB" else image.convert("RGB")
