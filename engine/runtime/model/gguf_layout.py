"""A bounded walk over a GGUF file's header, metadata and tensor infos, before the reader.

The ``gguf`` package's reader trusts every count and length it reads: past the end of the file
its reads come back empty, so a 49-byte file that claims 2**63 array items loops for ever, and
other damage surfaces as ``IndexError``, ``OverflowError``, a recursion error and the like.
``check_layout`` walks the same structure with every count, length and offset checked against
the bytes that remain, and says what is wrong with a ``ModelLoadError``; a file it accepts is
one the reader can index without reading past the end (spec: ggml's docs/gguf.md)::

    "GGUF" | version u32 (2 or 3) | tensor_count u64 | kv_count u64
    kv_count     x  key str | value_type u32 | value
    tensor_count x  name str | n_dims u32 (1 to 4) | dims u64[n_dims] | ggml_type u32 | offset u64
    zero padding to general.alignment (u32, a power of two; default 32)
    tensor data: tensor i at data_offset + offset_i (a multiple of the alignment), n_bytes_i long

    str   = length u64 | UTF-8 bytes            array = item_type u32 | count u64 | items

Bounds beyond the file size: no nested arrays (llama.cpp refuses them too), and at most
``MAX_METADATA_ITEMS`` array items in all (the reader keeps one small array object per item;
real vocabularies and merges are well under a million each).
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engine.runtime.model.config import ModelLoadError

SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_METADATA_ITEMS = 1 << 23
MIN_KV_BYTES = 8 + 4 + 1  # empty key, value type, one-byte value
MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # empty name, n_dims, one dimension, type, offset
# The reader's own names for the header fields: a metadata key may not reuse them.
RESERVED_KEYS = frozenset({"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"})

SCALAR_SIZES = {
    GGUFValueType.UINT8: 1,
    GGUFValueType.INT8: 1,
    GGUFValueType.BOOL: 1,
    GGUFValueType.UINT16: 2,
    GGUFValueType.INT16: 2,
    GGUFValueType.UINT32: 4,
    GGUFValueType.INT32: 4,
    GGUFValueType.FLOAT32: 4,
    GGUFValueType.UINT64: 8,
    GGUFValueType.INT64: 8,
    GGUFValueType.FLOAT64: 8,
}


@dataclass(frozen=True)
class GGUFLayout:
    """What the walk found: where the tensor data starts and where the last tensor ends."""

    version: int
    kv_count: int
    tensor_count: int
    alignment: int
    data_offset: int
    data_end: int  # 0 without tensors


class _Cursor:
    """Reads forward through ``buf``; every read is checked against the bytes that remain."""

    def __init__(self, buf: bytes | mmap.mmap, where: str) -> None:
        self.buf, self.where, self.pos, self.end = buf, where, 0, len(buf)
        self.order = "<"

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
    """Walks the key/value section; remembers general.alignment and the item total."""

    def __init__(self, c: _Cursor) -> None:
        self.c, self.items, self.alignment = c, 0, DEFAULT_ALIGNMENT
        self.keys: set[str] = set(RESERVED_KEYS)

    def walk(self, count: int) -> None:
        for i in range(count):
            key = self.c.text(f"metadata key {i}")
            if key in self.keys:
                raise self.c.fail(f"metadata key {key!r} repeated or reserved")
            self.keys.add(key)
            kind = _value_type(self.c, f"type of {key!r}")
            if key == "general.alignment":
                self.alignment = self._alignment(kind)
            else:
                self._value(kind, key)

    def _alignment(self, kind: GGUFValueType) -> int:
        if kind != GGUFValueType.UINT32:
            raise self.c.fail(f"general.alignment is {kind.name}, not UINT32")
        value = self.c.u32("general.alignment")
        if value == 0 or value & (value - 1) or value > MAX_ALIGNMENT:
            raise self.c.fail(f"general.alignment {value} is not a power of two <= {MAX_ALIGNMENT}")
        return value

    def _value(self, kind: GGUFValueType, key: str) -> None:
        c = self.c
        if kind == GGUFValueType.STRING:
            c.skip(c.u64(f"{key!r} length"), f"string {key!r}")
        elif kind == GGUFValueType.ARRAY:
            self._array(key)
        else:
            c.skip(SCALAR_SIZES[kind], f"value of {key!r}")

    def _array(self, key: str) -> None:
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
            c.skip(count * each, f"{count} {item.name} items of {key!r}")
            return
        for _ in range(count):
            c.skip(c.u64(f"string length in {key!r}"), f"string in {key!r}")


def _tensor_info(c: _Cursor, names: set[str], alignment: int) -> tuple[int, int]:
    """One tensor info; its (offset, n_bytes) relative to the data section."""
    name = c.text("tensor name")
    if name in names:
        raise c.fail(f"tensor {name!r} repeated")
    names.add(name)
    n_dims = c.u32(f"dimension count of {name!r}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise c.fail(f"tensor {name!r} has {n_dims} dimensions (1 to {MAX_DIMS})")
    dims = [c.u64(f"dimension of {name!r}") for _ in range(n_dims)]
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
    return offset, elements * type_size // block


def _tensors(c: _Cursor, count: int, alignment: int) -> tuple[int, int]:
    """Tensor infos; (data_offset, end of the last tensor's bytes) within the file."""
    names: set[str] = set()
    spans = [_tensor_info(c, names, alignment) for _ in range(count)]
    data_offset = -(-c.pos // alignment) * alignment
    data_end = 0
    for offset, n_bytes in spans:
        end = data_offset + offset + n_bytes
        if end > c.end:
            raise ModelLoadError(
                f"{c.where}: malformed GGUF: tensor data at {data_offset + offset} "
                f"({n_bytes} bytes) runs past the end of the file ({c.end} bytes)"
            )
        data_end = max(data_end, end)
    return data_offset, data_end


def check_buffer(buf: bytes | mmap.mmap, where: str) -> GGUFLayout:
    """The layout of a GGUF image in ``buf``, or a ``ModelLoadError`` naming what is wrong."""
    c = _Cursor(buf, where)
    version, tensor_count, kv_count = _header(c)
    meta = _Metadata(c)
    meta.walk(kv_count)
    c.need(tensor_count * MIN_TENSOR_INFO_BYTES, f"{tensor_count} tensor infos")
    data_offset, data_end = _tensors(c, tensor_count, meta.alignment)
    return GGUFLayout(version, kv_count, tensor_count, meta.alignment, data_offset, data_end)


def check_layout(path: Path) -> GGUFLayout:
    """``check_buffer`` over the file (memory-mapped: only the header region is read)."""
    try:
        with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return check_buffer(buf, str(path))
    except (OSError, ValueError) as exc:  # ValueError: an empty file cannot be mapped
        raise ModelLoadError(f"{path}: cannot read GGUF file: {exc}") from exc
