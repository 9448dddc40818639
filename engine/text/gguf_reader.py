"""A GGUF file's header, metadata and tensor infos, read with every count, length and offset
bounded by the bytes that remain.

The ``gguf`` package's ``GGUFReader`` is not used to open files: it trusts every count and
length it reads (past the end of the file its reads come back empty, so a 49-byte file that
claims 2**63 array items loops for ever, and other damage surfaces as ``IndexError``,
``OverflowError``, a recursion error and the like), and it builds several numpy views per
metadata item, which took 6.5 of a 16.5 s start-up of the default model on a small CPU (its
49,152 tokens and 48,900 merges). :func:`read_buffer` walks the structure once, checks each
read, decodes each value as the reader's ``contents()`` does and maps each tensor's bytes as
the reader's ``data`` does (tests compare the two on every file both read), and says what is
wrong with a ``ModelLoadError`` (spec: ggml's docs/gguf.md)::

    "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
    kv_count     x  key str | value_type u32 | value
    tensor_count x  name str | n_dims u32 (1 to 4) | dims u64[n_dims] | ggml_type u32 | offset u64
    zero padding to general.alignment (u32, a power of two; default 32)
    tensor data: tensor i at data_offset + offset_i (a multiple of the alignment), n_bytes_i long

    str   = length u64 | UTF-8 bytes            array = item_type u32 | count u64 | items

Bounds beyond the file size: no nested arrays (llama.cpp refuses them too), and at most
``MAX_METADATA_ITEMS`` array items in all (real vocabularies and merges are well under a million
each).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.text.errors import ModelLoadError

ByteOrder = Literal["<", ">"]
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_METADATA_ITEMS = 1 << 23
MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dimension, type, offset
# The header fields, listed first among the metadata as the gguf reader lists them: a metadata
# key may not reuse them.
RESERVED_KEYS = ("GGUF.version", "GGUF.tensor_count", "GGUF.kv_count")

_V = GGUFValueType
SCALARS = {  # struct format and numpy type of each scalar value type
    _V.UINT8: ("B", np.uint8), _V.INT8: ("b", np.int8), _V.BOOL: ("?", np.bool_),
    _V.UINT16: ("H", np.uint16), _V.INT16: ("h", np.int16), _V.UINT32: ("I", np.uint32),
    _V.INT32: ("i", np.int32), _V.FLOAT32: ("f", np.float32), _V.UINT64: ("Q", np.uint64),
    _V.INT64: ("q", np.int64), _V.FLOAT64: ("d", np.float64),
}  # fmt: skip
SCALAR_SIZES = {kind: struct.calcsize(fmt) for kind, (fmt, _) in SCALARS.items()}
_Q = GGMLQuantizationType
# tensor types whose data is read as typed elements; the others (blocks) as bytes, [..., row bytes]
TYPED_TENSORS = {
    _Q.F16: np.float16, _Q.F32: np.float32, _Q.F64: np.float64, _Q.I8: np.int8,
    _Q.I16: np.int16, _Q.I32: np.int32, _Q.I64: np.int64,
}  # fmt: skip


@dataclass(frozen=True)
class TensorInfo:
    name: str
    tensor_type: GGMLQuantizationType
    shape: tuple[int, ...]  # GGML's order: the innermost dimension first
    offset: int  # of its data, from the start of the file
    n_bytes: int

    def data(self, buf: np.ndarray, byte_order: ByteOrder) -> np.ndarray:
        """Its data in ``buf`` (the whole file as uint8), shaped row-major as the gguf reader's
        ``ReaderTensor.data``: typed elements, or a block type's bytes per row."""
        raw = buf[self.offset : self.offset + self.n_bytes]
        dims = tuple(reversed(self.shape))
        typed = TYPED_TENSORS.get(self.tensor_type)
        if typed is not None:
            return raw.view(np.dtype(typed).newbyteorder(byte_order)).reshape(dims)
        block, type_size = GGML_QUANT_SIZES[self.tensor_type]
        return raw.reshape(*dims[:-1], dims[-1] // block * type_size)


@dataclass(frozen=True)
class GGUFLayout:
    """What the walk read: the header, every metadata value and where each tensor lies."""

    version: int
    kv_count: int
    tensor_count: int
    alignment: int
    data_offset: int
    data_end: int  # 0 without tensors
    byte_order: ByteOrder
    metadata: dict[str, Any]  # values as the gguf reader's ReaderField.contents() gives them
    tensors: tuple[TensorInfo, ...]


class _Cursor:
    """Reads forward through ``buf``; every read is checked against the bytes that remain."""

    def __init__(self, buf: bytes | mmap.mmap, where: str) -> None:
        self.buf, self.where, self.pos, self.end = buf, where, 0, len(buf)
        self.order: ByteOrder = "<"

    @property
    def remaining(self) -> int:
        return self.end - self.pos

    def fail(self, message: str) -> ModelLoadError:
        return ModelLoadError(f"{self.where}: malformed GGUF at byte {self.pos}: {message}")

    def need(self, n: int, what: str) -> None:
        if n > self.remaining:
            raise self.fail(f"{what} needs {n} bytes, {self.remaining} remain")

    def number(self, fmt: str, what: str) -> int:
        size = struct.calcsize(fmt)
        self.need(size, what)
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += size
        return int(value)

    def u32(self, what: str) -> int:
        return self.number("I", what)

    def u64(self, what: str) -> int:
        return self.number("Q", what)

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def string(self, what: str) -> bytes:
        n = self.u64(f"{what} length")
        self.need(n, what)
        out = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        return out

    def text(self, what: str) -> str:
        raw = self.string(what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not UTF-8") from exc

    def scalar(self, kind: GGUFValueType, what: str) -> Any:
        fmt = SCALARS[kind][0]
        self.need(SCALAR_SIZES[kind], what)
        (value,) = struct.unpack_from(self.order + fmt, self.buf, self.pos)
        self.pos += SCALAR_SIZES[kind]
        return value

    def scalars(self, kind: GGUFValueType, count: int, what: str) -> list[Any]:
        size = SCALAR_SIZES[kind] * count
        self.need(size, what)
        dtype = np.dtype(SCALARS[kind][1]).newbyteorder(self.order)
        values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
        self.pos += size
        return list(values)


def _header(c: _Cursor) -> tuple[int, int, int]:
    c.need(8, "magic and version")
    if bytes(c.buf[0:4]) != b"GGUF":
        raise c.fail("no GGUF magic")
    c.pos = 4
    (little,) = struct.unpack_from("<I", c.buf, 4)
    if little & 0xFFFF == 0:  # written on a big-endian machine (the reader's own test)
        c.order = ">"
    version = c.u32("version")
    if version not in SUPPORTED_VERSIONS:
        raise c.fail(f"GGUF version {version} is not supported ({SUPPORTED_VERSIONS})")
    tensor_count, kv_count = c.u64("tensor count"), c.u64("metadata count")
    if kv_count * MIN_KV_BYTES + tensor_count * MIN_TENSOR_INFO_BYTES > c.remaining:
        raise c.fail(
            f"{kv_count} metadata entries and {tensor_count} tensors cannot fit in "
            f"{c.remaining} bytes"
        )
    return version, tensor_count, kv_count


def _value_type(c: _Cursor, what: str) -> GGUFValueType:
    raw = c.u32(what)
    try:
        return GGUFValueType(raw)
    except ValueError:
        raise c.fail(f"{what} {raw} is not a GGUF value type") from None


class _Metadata:
    """Reads the key/value section; remembers general.alignment and the item total."""

    def __init__(self, c: _Cursor) -> None:
        self.c, self.items, self.alignment = c, 0, DEFAULT_ALIGNMENT
        self.values: dict[str, Any] = {}

    def read(self, count: int) -> None:
        for i in range(count):
            key = self.c.text(f"metadata key {i}")
            if key in self.values or key in RESERVED_KEYS:
                raise self.c.fail(f"metadata key {key!r} repeated or reserved")
            kind = _value_type(self.c, f"type of {key!r}")
            if key == "general.alignment":
                self.alignment = self._alignment(kind)
                self.values[key] = self.alignment
            else:
                self.values[key] = self._value(kind, key)

    def _alignment(self, kind: GGUFValueType) -> int:
        if kind != GGUFValueType.UINT32:
            raise self.c.fail(f"general.alignment is {kind.name}, not UINT32")
        value = self.c.u32("general.alignment")
        if value == 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise self.c.fail(f"general.alignment {value} is not a power of two <= {MAX_ALIGNMENT}")
        return value

    def _value(self, kind: GGUFValueType, key: str) -> Any:
        if kind == GGUFValueType.STRING:
            return self._string(key)
        if kind == GGUFValueType.ARRAY:
            return self._array(key)
        return self.c.scalar(kind, f"value of {key!r}")

    def _string(self, key: str) -> str:
        raw = self.c.string(f"string {key!r}")
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.c.fail(f"metadata {key!r}: cannot read value: {exc}") from exc

    def _array(self, key: str) -> list[Any]:
        c = self.c
        item = _value_type(c, f"item type of {key!r}")
        if item == GGUFValueType.ARRAY:
            raise c.fail(f"{key!r}: nested arrays are not supported")
        count = c.u64(f"item count of {key!r}")
        each = 8 if item == GGUFValueType.STRING else SCALAR_SIZES[item]  # a string: its length
        c.need(count * each, f"{count} {item.name} items of {key!r}")
        self.items += count
        if self.items > MAX_METADATA_ITEMS:
            raise c.fail(f"{key!r}: more than {MAX_METADATA_ITEMS} metadata array items in all")
        if item != GGUFValueType.STRING:
            return c.scalars(item, count, f"{count} {item.name} items of {key!r}")
        return [self._string(key) for _ in range(count)]


def _tensor_info(c: _Cursor, names: set[str], alignment: int) -> TensorInfo:
    """One tensor info, its offset still relative to the data section."""
    name = c.text("tensor name")
    if name in names:
        raise c.fail(f"tensor {name!r} repeated")
    names.add(name)
    n_dims = c.u32(f"dimension count of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = tuple(c.u64(f"dimension of {name!r}") for _ in range(n_dims))
    raw = c.u32(f"type of {name!r}")
    try:
        kind = GGMLQuantizationType(raw)
        block, type_size = GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        raise c.fail(f"tensor {name!r}: type {raw} is not a GGML type") from None
    if dims[0] % block:
        raise c.fail(f"tensor {name!r}: {dims[0]} columns are not whole {kind.name} blocks")
    offset = c.u64(f"offset of {name!r}")
    if offset % alignment:
        raise c.fail(f"tensor {name!r}: offset {offset} is not a multiple of {alignment}")
    elements = 1
    for d in dims:
        elements *= d
    return TensorInfo(name, kind, dims, offset, elements * type_size // block)


def _tensors(c: _Cursor, count: int, alignment: int) -> tuple[int, list[TensorInfo]]:
    """Tensor infos (offsets from the start of the file) and where the data section starts."""
    names: set[str] = set()
    infos = [_tensor_info(c, names, alignment) for _ in range(count)]
    data_offset = -(-c.pos // alignment) * alignment
    placed = []
    for t in infos:
        start = data_offset + t.offset
        if start + t.n_bytes > c.end:
            raise ModelLoadError(
                f"{c.where}: malformed GGUF: tensor data at {start} ({t.n_bytes} bytes) runs "
                f"past the end of the file ({c.end} bytes)"
            )
        placed.append(TensorInfo(t.name, t.tensor_type, t.shape, start, t.n_bytes))
    return data_offset, placed


def read_buffer(buf: bytes | mmap.mmap, where: str) -> GGUFLayout:
    """The header, metadata and tensor infos of a GGUF image in ``buf``, or a
    ``ModelLoadError`` naming what is wrong."""
    c = _Cursor(buf, where)
    version, tensor_count, kv_count = _header(c)
    meta = _Metadata(c)
    meta.read(kv_count)
    c.need(tensor_count * MIN_TENSOR_INFO_BYTES, f"{tensor_count} tensor infos")
    data_offset, tensors = _tensors(c, tensor_count, meta.alignment)
    header = dict(zip(RESERVED_KEYS, (version, tensor_count, kv_count), strict=True))
    data_end = max((t.offset + t.n_bytes for t in tensors), default=0)
    return GGUFLayout(
        version, kv_count, tensor_count, meta.alignment, data_offset, data_end, c.order,
        {**header, **meta.values}, tuple(tensors),
    )  # fmt: skip


def read_layout(path: Path) -> GGUFLayout:
    """``read_buffer`` over the file (memory-mapped: only the header region is read)."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return read_buffer(buf, str(path))
    except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"{path}: cannot read GGUF file: {exc}") from exc


GGUF_MAGIC = b"GGUF"


def is_gguf(path: str | Path) -> bool:
    """A file that starts with the GGUF magic (the suffix alone is not trusted)."""
    path = Path(path)
    if not path.is_file():
        return False
    with path.open("rb") as f:
        return f.read(4) == GGUF_MAGIC
