"""The training-shard record format written and counted without TensorFlow (the Beam job's side;
recpipe.features.records parses it in tf.data).

A record is one column-wise batch: a tf.train.Example whose features hold one serialized
TensorProto each (``NAME`` for [n] columns, ``NAME/values`` + ``NAME/row_lengths`` for ragged
ones). Encoded here straight in protobuf's wire format (the few fields these messages use), and
framed as TFRecord (length, masked CRC-32C of it, data, masked CRC-32C of the data). A test parses
what this writes with TensorFlow, and reads TensorFlow's files back here.
"""
from __future__ import annotations

import struct
from typing import Iterator, NamedTuple

import google_crc32c
import numpy as np

from recpipe.common import fsio
from recpipe.features.canonical import LABEL_KEY

__all__ = ["Ragged", "RecordError", "encode_batch", "frame_parts", "frame_record", "write_records", "read_records",
           "count_rows"]

# TensorFlow's DataType enum values of the dtypes a record holds.
_DTYPES = {np.dtype(np.float32): 1, np.dtype(np.int64): 9}
_LEN, _VARINT = 2, 0  # protobuf wire types


class RecordError(ValueError):
    """A shard file that is not the TFRecord layout this module writes (truncated, corrupt)."""


class Ragged(NamedTuple):
    """A ragged int64 column: flat values and one length per row."""
    values: np.ndarray
    row_lengths: np.ndarray

    @property
    def flat_values(self) -> np.ndarray:
        return self.values

    def to_list(self) -> list[list]:
        ends = np.cumsum(self.row_lengths)
        return [self.values[e - n:e].tolist() for n, e in zip(self.row_lengths.tolist(), ends.tolist())]


# ------------------------------------------------------------------ protobuf wire format
def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    return _head(number, len(payload)) + payload


def _head(number: int, length: int) -> bytes:
    """A length-delimited field's key and length, for a payload of `length` bytes that follows it."""
    return _varint(number << 3 | _LEN) + _varint(length)


def _tensor_parts(arr: np.ndarray) -> tuple[bytes, memoryview | bytes]:
    """A TensorProto of a 1-D array as its small head (dtype, shape, the content field's key and length)
    and the array's little-endian bytes, a view of it (b"" when it is empty: proto3 leaves the field out)."""
    arr = np.ascontiguousarray(arr)
    if arr.dtype not in _DTYPES or arr.ndim != 1:
        raise TypeError(f"a record column is a 1-D float32 or int64 array, got {arr.dtype} of shape {arr.shape}")
    size = _varint(1 << 3 | _VARINT) + _varint(len(arr)) if len(arr) else b""  # proto3 leaves out zeros
    head = _varint(1 << 3 | _VARINT) + _varint(_DTYPES[arr.dtype]) + _field(2, _field(2, size))
    if not len(arr):
        return head, b""
    content = memoryview(arr.astype(arr.dtype.newbyteorder("<"), copy=False)).cast("B")
    return head + _head(4, len(content)), content


def encode_batch(columns: dict) -> bytes:
    """{name: [n] array (or anything np.asarray takes) | Ragged} -> one serialized Example.

    Every message's length is known before its bytes, so the arrays' bytes are copied once, into the result."""
    pieces: list = []
    total = 0
    for name, col in columns.items():
        if isinstance(col, Ragged):
            parts = {f"{name}/values": col.values, f"{name}/row_lengths": col.row_lengths}
        else:
            parts = {name: np.asarray(col)}
        for key, arr in parts.items():
            head, content = _tensor_parts(arr)
            tensor = len(head) + len(content)
            to_tensor = _head(1, tensor)                                     # BytesList.value
            to_list = _head(1, len(to_tensor) + tensor)                      # Feature.bytes_list
            feature = len(to_list) + len(to_tensor) + tensor
            name_field, to_feature = _field(1, key.encode("utf-8")), _head(2, feature)
            entry = len(name_field) + len(to_feature) + feature              # Features.feature (map entry)
            to_entry = _head(1, entry)
            pieces += [to_entry + name_field + to_feature + to_list + to_tensor + head, content]
            total += len(to_entry) + entry
    return b"".join([_head(1, total), *pieces])                              # Example.features


def _fields(buf: memoryview) -> Iterator[tuple[int, int | memoryview]]:
    """(field number, value) of one message's fields: ints for varints, views for length-delimited."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = _read_varint(buf, pos)
        kind = key & 7
        if kind == _VARINT:
            value, pos = _read_varint(buf, pos)
        elif kind == _LEN:
            n, pos = _read_varint(buf, pos)
            value, pos = buf[pos:pos + n], pos + n
        elif kind in (1, 5):  # fixed64 / fixed32: not in these messages, skipped
            pos += 8 if kind == 1 else 4
            continue
        else:
            raise RecordError(f"protobuf wire type {kind} at byte {pos}")
        if pos > end:
            raise RecordError("a protobuf field runs past the end of its message")
        yield key >> 3, value


def _read_varint(buf: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise RecordError("a protobuf varint runs past the end of its message")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _column_rows(example: bytes, name: str) -> int:
    """The length of column `name` of an encoded batch, read from its TensorProto's shape only."""
    for no, features in _fields(memoryview(example)):
        if no != 1:
            continue
        for no2, entry in _fields(features):
            fields = dict(_fields(entry)) if no2 == 1 else {}
            if bytes(fields.get(1, b"")) != name.encode("utf-8"):
                continue
            bytes_list = dict(_fields(fields[2]))[1]
            tensor = dict(_fields(dict(_fields(bytes_list))[1]))
            dims = [dict(_fields(d)).get(1, 0) for no3, d in _fields(tensor.get(2, memoryview(b""))) if no3 == 2]
            if len(dims) != 1:
                raise RecordError(f"column {name!r} has {len(dims)} dimensions, expected 1")
            return int(dims[0])
    raise RecordError(f"a record has no column {name!r}")


# ------------------------------------------------------------------ TFRecord framing
def _masked_crc(data) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def frame_parts(data: bytes) -> tuple[bytes, bytes, bytes]:
    """A TFRecord of `data` as (its head: length and the length's masked CRC-32C, data, the data's masked
    CRC-32C): written one after the other they are frame_record(data), with no copy of data."""
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc(length)), data, struct.pack("<I", _masked_crc(data))


def frame_record(data: bytes) -> bytes:
    """One TFRecord of `data`: frame_parts joined."""
    return b"".join(frame_parts(data))


def write_records(path: str, records: list[bytes]) -> None:
    """A TFRecord file of `records` (uncompressed), on any filesystem recpipe.common.fsio knows."""
    fsio.write_bytes(path, b"".join(frame_record(r) for r in records))


def read_records(path: str) -> Iterator[bytes]:
    """The records of an uncompressed TFRecord file, each checked against both of its CRCs."""
    fs, p = fsio.resolve(path)
    with fs.open_input_stream(p) as f:
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise RecordError(f"{path}: truncated record header")
            (n,), (crc,) = struct.unpack("<Q", head[:8]), struct.unpack("<I", head[8:])
            if crc != _masked_crc(head[:8]):
                raise RecordError(f"{path}: corrupt record length")
            data, tail = f.read(n), f.read(4)
            if len(data) < n or len(tail) < 4:
                raise RecordError(f"{path}: truncated record")
            if struct.unpack("<I", tail)[0] != _masked_crc(data):
                raise RecordError(f"{path}: record data fails its CRC")
            yield data


def count_rows(paths: list[str]) -> int:
    """The rows in shard files, from each record's label column (what is on disk, not what a runner
    reported)."""
    return sum(_column_rows(r, LABEL_KEY) for path in paths for r in read_records(path))
