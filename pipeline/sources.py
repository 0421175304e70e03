"""Finding and inspecting the Parquet click-log files of one preprocessing run.

Everything here reads only file listings and Parquet footers, so a missing column, a file that is
not Parquet, a truncated file or an empty input fails at launch with the file's name, before any
Beam worker starts. Only files whose footers are alike are read whole, to tell a copy (same_files).
"""
from __future__ import annotations

import fnmatch
import glob as globlib
import hashlib
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Sequence

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from recpipe.features.canonical import NULL_KIND, SchemaError, check_schema, merged_kind
from recpipe.features.config import Config
from recpipe.common.errors import RecpipeError
from recpipe.common.fsio import resolve

__all__ = ["InputError", "InputFile", "list_input_files", "inspect_inputs", "open_parquet", "partition_day",
           "partition_days", "same_files"]

_PARTITION_DAY = re.compile(r"(?:^|/)dt=([0-9]{4}-[0-9]{2}-[0-9]{2})(?:/|$)")


class InputError(RecpipeError, ValueError):
    """The input cannot be used; the message names the path."""


@dataclass(frozen=True)
class InputFile:
    path: str
    num_rows: int
    first_row: int  # global row number of this file's first row (files in path order)
    footer: tuple = ()  # what a copy of the file shares: its footer's size and row groups' rows and bytes


def _is_glob(p: str) -> bool:
    return any(c in p for c in "*?[")


def partition_days(files: list[str]) -> list[str]:
    """The dt=YYYY-MM-DD partitions the input files are in, sorted, each once (none: [])."""
    return sorted({m.group(1) for f in files for m in [_PARTITION_DAY.search(posixpath.dirname(f.replace(os.sep, "/")))]
                   if m})


def partition_day(files: list[str]) -> str | None:
    """The latest dt=YYYY-MM-DD partition the input files are in (None when none is)."""
    days = partition_days(files)
    return days[-1] if days else None


def _glob_match(path: str, pattern: str) -> bool:
    """Whether a remote path matches a glob as glob.glob(recursive=True) matches a local one: `*`, `?`
    and `[...]` within one path part, `**` as a whole part for any number of parts (none too), and a
    part starting with '.' only by a pattern part that does (fnmatch's `*` also crosses '/')."""
    def match(parts: list[str], pats: list[str]) -> bool:
        if not pats:
            return not parts
        if pats[0] == "**":
            return any(match(parts[i:], pats[1:]) for i in range(len(parts) + 1)
                       if not any(p.startswith(".") for p in parts[:i]))
        return bool(parts) and fnmatch.fnmatchcase(parts[0], pats[0]) and \
            (pats[0].startswith(".") or not parts[0].startswith(".")) and match(parts[1:], pats[1:])
    return match(path.split("/"), pattern.split("/"))


# Names of what Spark and Hive leave beside a table's data in its folder (an uncommitted task's
# `_temporary/`, `.hive-staging_*`, `_SUCCESS`): a folder listing skips every file and folder named so,
# as Spark, Hive and pyarrow.dataset do.
_HIDDEN = (".", "_")


def _parquet_files(folder: str) -> list[str]:
    """The `.parquet` files below a local folder, none in or under a hidden one (never walked)."""
    files = []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(_HIDDEN)]
        files += [os.path.join(root, n) for n in names if n.endswith(".parquet") and not n.startswith(_HIDDEN)]
    return files


def _marker(path: str, pattern: str) -> bool:
    """Whether a glob's match is a file named `_...` or `.…` (a writer's `_SUCCESS`, a `.crc` checksum)
    that the pattern's last part does not name as such: Spark's reader skips them in a glob too."""
    name = posixpath.basename(path.replace(os.sep, "/"))
    return name.startswith(_HIDDEN) and not posixpath.basename(pattern.replace(os.sep, "/")).startswith(name[0])


def list_input_files(spec: str) -> list[str]:
    """A directory (searched recursively, e.g. dt=YYYY-MM-DD/ partitions; its `.parquet` files but those
    whose name, or a folder's they are in, starts with `_` or `.`: see _HIDDEN), a glob (every file it
    matches but a `_SUCCESS`-like marker: see _marker), or one file."""
    if "://" not in spec:
        if _is_glob(spec):
            files = [f for f in globlib.glob(spec, recursive=True) if os.path.isfile(f) and not _marker(f, spec)]
        elif os.path.isdir(spec):
            files = _parquet_files(spec)
        elif os.path.isfile(spec):
            files = [spec]
        else:
            raise InputError(f"{spec}: no such file or directory")
        files = sorted(os.path.abspath(f) for f in files)
    else:
        scheme, rest = spec.split("://", 1)
        base = rest if not _is_glob(rest) else posixpath.dirname(rest.split("*")[0].split("?")[0].split("[")[0])
        fs, path = pafs.FileSystem.from_uri(f"{scheme}://{base}")
        info = fs.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise InputError(f"{spec}: no such file or directory")
        if info.type == pafs.FileType.File:
            found = [path]
        else:
            found = [i.path for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
                     if i.type == pafs.FileType.File]
        prefix = f"{scheme}://"
        if _is_glob(rest):
            found = [p for p in found if (_glob_match(p, rest.split("/", 1)[-1]) or _glob_match(p, rest))
                     and not _marker(p, rest)]
        elif info.type != pafs.FileType.File:
            found = [p for p in found if p.endswith(".parquet")
                     and not any(part.startswith(_HIDDEN) for part in posixpath.relpath(p, path).split("/"))]
        files = sorted(prefix + p for p in found)
    if not files:
        raise InputError(f"{spec}: no Parquet files found")
    return files


def open_parquet(path: str, read_dictionary: Sequence[str] = ()) -> pq.ParquetFile:
    """The file, its INT96 timestamps (as Hive, Impala and older Spark write them) read in microseconds:
    pyarrow's default, nanoseconds, wraps a value past 2262 (Hive's 9999-12-31 sentinel) silently.
    Its string and binary columns named in `read_dictionary` are read dictionary-encoded (other columns
    named are read as they are)."""
    fs, p = resolve(path)
    try:
        pf = pq.ParquetFile(fs.open_input_file(p), coerce_int96_timestamp_unit="us")
        schema = pf.schema_arrow
        encoded = [c for c in read_dictionary if c in schema.names and _is_bytes(schema.field(c).type)]
        if not encoded:
            return pf
        return pq.ParquetFile(fs.open_input_file(p), metadata=pf.metadata, coerce_int96_timestamp_unit="us",
                              read_dictionary=encoded)
    except FileNotFoundError:
        raise InputError(f"{path}: file disappeared") from None
    except Exception as e:  # pyarrow raises ArrowInvalid/OSError subclasses for damaged files
        raise InputError(f"{path}: not a readable Parquet file ({type(e).__name__}: {' '.join(str(e).split())})") \
            from None


def _is_bytes(tp: pa.DataType) -> bool:
    return any(f(tp) for f in (pa.types.is_string, pa.types.is_binary, pa.types.is_large_string,
                               pa.types.is_large_binary, pa.types.is_dictionary))


def _kind_text(kind: str, schema, col: str) -> str:
    """A column's kind, with the file's own type where a user would not guess it: timestamps and dates
    are read as float seconds since the epoch (UTC), decimals as float."""
    tp = schema.field(col).type
    if pa.types.is_timestamp(tp) or pa.types.is_date(tp):
        return f"{kind} ({tp}, read as seconds since the epoch)"
    return f"{kind} ({tp})" if pa.types.is_decimal(tp) else kind


def inspect_inputs(files: list[str], cfg: Config) -> tuple[dict[str, str], list[InputFile]]:
    """Check every file's footer against the config; return (raw schema, files with row offsets). A
    column of Arrow type null (all values missing) takes the kind of the files that type it; it stays
    NULL_KIND if no file does."""
    raw_schema: dict[str, str] | None = None
    source: dict[str, str] = {}  # the first file that typed each column
    out: list[InputFile] = []
    offset = 0
    for path in files:
        pf = open_parquet(path)
        kinds = check_schema(pf.schema_arrow, cfg, path)
        if raw_schema is None:
            raw_schema = dict.fromkeys(kinds, NULL_KIND)
        for col, kind in kinds.items():
            if kind == NULL_KIND:
                continue
            if raw_schema[col] == NULL_KIND:
                raw_schema[col], source[col] = kind, path
                continue
            merged = merged_kind(raw_schema[col], kind)
            if merged is None:
                raise SchemaError(f"{path}: column {col!r} is {_kind_text(kind, pf.schema_arrow, col)} but "
                                  f"{_kind_text(raw_schema[col], open_parquet(source[col]).schema_arrow, col)} in "
                                  f"{source[col]}")
            raw_schema[col] = merged
        meta = pf.metadata
        n = meta.num_rows
        footer = (meta.serialized_size, n, *((meta.row_group(i).num_rows, meta.row_group(i).total_byte_size)
                                             for i in range(meta.num_row_groups)))
        out.append(InputFile(path, n, offset, footer))
        offset += n
    if offset == 0:
        raise InputError(f"{files[0] if len(files) == 1 else str(len(files)) + ' files'}: input has no rows")
    assert raw_schema is not None
    return raw_schema, out


def same_files(inputs: list[InputFile]) -> list[list[InputFile]]:
    """Groups of two or more input files with the same bytes: a file written twice upstream (a retried
    task, a backfill re-run beside the first run's output), whose rows would all be read twice. Only
    files with rows whose footers agree (InputFile.footer) are read, once each, to compare their bytes."""
    alike: dict[tuple, list[InputFile]] = {}
    for f in inputs:
        if f.num_rows:
            alike.setdefault(f.footer, []).append(f)
    groups: list[list[InputFile]] = []
    for candidates in alike.values():
        if len(candidates) < 2:
            continue
        by_digest: dict[str, list[InputFile]] = {}
        for f in candidates:
            by_digest.setdefault(_digest(f.path), []).append(f)
        groups.extend(g for g in by_digest.values() if len(g) > 1)
    return groups


def _digest(path: str, chunk: int = 16 << 20) -> str:
    fs, p = resolve(path)
    h = hashlib.sha256()
    with fs.open_input_stream(p) as stream:
        while True:
            block = stream.read(chunk)
            if not block:
                return h.hexdigest()
            h.update(block)
