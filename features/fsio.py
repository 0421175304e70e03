"""Small file helpers over pyarrow.fs, so artifacts work on local paths and any URL pyarrow knows."""
from __future__ import annotations

import os
import posixpath

import pyarrow.fs as pafs

__all__ = ["resolve", "join", "makedirs", "exists", "write_text", "read_text", "write_bytes", "read_bytes"]


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
