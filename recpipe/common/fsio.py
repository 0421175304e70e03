"""Small file helpers over pyarrow.fs, so artifacts work on local paths and any URL pyarrow knows."""
from __future__ import annotations

import json
import math
import os
import posixpath
import uuid
from typing import Any

import pyarrow.fs as pafs

__all__ = ["resolve", "join", "makedirs", "exists", "write_text", "read_text", "write_bytes", "read_bytes",
           "read_json", "write_json", "json_safe", "replace_bytes", "list_files", "remove", "remove_dir",
           "SubPath"]


def resolve(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), os.path.abspath(path)


def join(base: str, *parts: str) -> str:
    if "://" in base:
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def makedirs(path: str) -> None:
    fs, p = resolve(path)
    fs.create_dir(p, recursive=True)


def exists(path: str) -> bool:
    fs, p = resolve(path)
    return fs.get_file_info(p).type != pafs.FileType.NotFound


def write_bytes(path: str, data: bytes) -> None:
    fs, p = resolve(path)
    with fs.open_output_stream(p) as out:
        out.write(data)


def read_bytes(path: str) -> bytes:
    fs, p = resolve(path)
    with fs.open_input_stream(p) as inp:
        return inp.read()


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def read_json(path: str) -> Any:
    """The JSON `path` holds. A file that does not (cut short, hand-edited, another format) is a ValueError
    naming it and where it breaks, where json's own error named neither the file nor its purpose."""
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: not UTF-8 text (byte {e.start})") from None


def write_json(path: str, data: Any, *, indent: int = 1, sort_keys: bool = True, only_if_changed: bool = False) -> bool:
    """Write `data` as JSON; atomically (temp file + rename) on local paths. With only_if_changed, a
    file that already holds the same text is left untouched (a rerun changes nothing). Returns
    whether the file was written. NaN and infinities are written as null (json_safe): bare NaN is not
    JSON, and jq, browsers and most parsers outside Python refuse the whole file."""
    text = json.dumps(json_safe(data), indent=indent, sort_keys=sort_keys, allow_nan=False)
    return replace_bytes(path, text.encode("utf-8"), only_if_changed=only_if_changed)


def json_safe(data: Any) -> Any:
    """`data` with every NaN or infinite float, in any dict, list or tuple, replaced by None (null)."""
    if isinstance(data, float):
        return data if math.isfinite(data) else None
    if isinstance(data, dict):
        return {k: json_safe(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [json_safe(v) for v in data]
    return data


def replace_bytes(path: str, data: bytes, *, only_if_changed: bool = False) -> bool:
    """Write `data`; atomically (temp file + rename) on local paths. With only_if_changed, a file that
    already holds the same bytes is left untouched (a rerun changes nothing). Returns whether the file
    was written."""
    if only_if_changed and exists(path) and read_bytes(path) == data:
        return False
    if "://" in path:
        write_bytes(path, data)
        return True
    tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return True


def remove(path: str) -> None:
    fs, p = resolve(path)
    fs.delete_file(p)


def remove_dir(path: str) -> None:
    """A folder and everything in it (nothing when it is not there)."""
    fs, p = resolve(path)
    if fs.get_file_info(p).type != pafs.FileType.NotFound:
        fs.delete_dir(p)


def file_sizes(directory: str, suffix: str = "") -> dict[str, int]:
    """{name: bytes} of the files directly in `directory` whose names end with `suffix`, from one listing
    (no file is opened); {} when it does not exist. Hidden and '_'-prefixed names (temp and marker files)
    are skipped."""
    fs, p = resolve(directory)
    if fs.get_file_info(p).type != pafs.FileType.Directory:
        return {}
    return {i.base_name: i.size for i in fs.get_file_info(pafs.FileSelector(p))
            if i.type == pafs.FileType.File and i.base_name.endswith(suffix) and not i.base_name.startswith((".", "_"))}


def list_files(directory: str, suffix: str = "") -> list[str]:
    """The paths of the files file_sizes names, sorted."""
    return sorted(join(directory, n) for n in file_sizes(directory, suffix))


class SubPath:
    """A path inside an artifact folder, as a read-only attribute of the folder's class:
    `config_path = SubPath("config.yaml")` reads as `fsio.join(self.root, "config.yaml")`."""

    def __init__(self, *parts: str):
        self.parts = parts

    def __get__(self, obj, owner=None):
        return self if obj is None else join(obj.root, *self.parts)
