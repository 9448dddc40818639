"""Untrusted GGUF files: every truncation, byte flip or lying count is one ModelLoadError, at once.

The hang guards (``pytest.mark.timeout``) are generous: they catch a loop that never ends, not
a slow machine; nothing here measures speed.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from engine.runtime.model.gguf import GGUFFile
from engine.runtime.model.gguf_weights import load_gguf
from engine.text.errors import ModelLoadError
from engine.text.gguf_reader import MAX_METADATA_ITEMS, read_buffer
from engine.text.gguf_tokenizer import gguf_tokenizer
from tests.engine.model.gguf_factory import write_tiny_gguf

FUZZ = settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
STRING, ARRAY, UINT8, UINT32 = 8, 9, 0, 4


def _str(text: bytes) -> bytes:
    return struct.pack("<Q", len(text)) + text


def _header(tensors: int, kvs: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, tensors, kvs)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    path = write_tiny_gguf(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    load_gguf(path, "auto", "cpu")  # the untouched file is a real, loadable model
    return path.read_bytes()


def _load(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "m.gguf"
    path.write_bytes(data)
    load_gguf(path, "auto", "cpu")


@pytest.mark.timeout(60)
def test_a_49_byte_file_claiming_2_63_array_items_is_refused_at_once(tmp_path: Path) -> None:
    # One metadata entry "a": an array of 2**63 UINT8 items, and nothing after it.
    data = _header(0, 1) + _str(b"a") + struct.pack("<IIQ", ARRAY, UINT8, 1 << 63)
    assert len(data) == 49
    with pytest.raises(ModelLoadError, match=r"items of 'a' needs \d+ bytes, 0 remain"):
        _load(tmp_path, data)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "data, says",
    [
        (_header(0, 1) + _str(b"a") + struct.pack("<IIQ", ARRAY, STRING, 1 << 40), "STRING items"),
        (_header(0, 1 << 60), "cannot fit"),
        (_header(1 << 60, 0), "cannot fit"),
        (_header(0, 1) + struct.pack("<Q", 1 << 62) + bytes(8), "metadata key 0 needs"),
        (_header(0, 1) + _str(b"a") + struct.pack("<IQ", STRING, 1 << 62), "string 'a' needs"),
        (_header(0, 1) + _str(b"a") + struct.pack("<II", ARRAY, ARRAY) + bytes(8), "nested"),
        (_header(0, 1) + _str(b"a") + struct.pack("<I", 77) + bytes(8), "not a GGUF value type"),
        (_header(0, 1) + _str(b"\xff") + struct.pack("<IB", UINT8, 0), "not UTF-8"),
        (_header(0, 2) + (_str(b"a") + struct.pack("<IB", UINT8, 0)) * 2, "repeated"),
        (_header(0, 1) + _str(b"GGUF.version") + struct.pack("<IB", UINT8, 0), "reserved"),
        (_header(0, 1) + _str(b"general.alignment") + struct.pack("<II", UINT32, 3), "power"),
        (_header(0, 1) + _str(b"general.alignment") + struct.pack("<IB", UINT8, 1), "UINT32"),
        (b"GGUF" + struct.pack("<IQQ", 1, 0, 0), "version 1"),
    ],
)
def test_lying_counts_lengths_and_types_are_refused(tmp_path: Path, data: bytes, says: str) -> None:
    with pytest.raises(ModelLoadError, match=says):
        _load(tmp_path, data)


def _tensor_info(name: bytes, dims: list[int], kind: int, offset: int) -> bytes:
    packed = struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
    return _str(name) + packed + struct.pack("<IQ", kind, offset)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "info, says",
    [
        (_tensor_info(b"t", [4, 1 << 40], 0, 0), "runs past the end"),  # F32
        (_tensor_info(b"t", [4], 0, 1 << 62), "runs past the end"),
        (_tensor_info(b"t", [4], 0, 3), "not a multiple of 32"),
        (_tensor_info(b"t", [1, 1, 1, 1, 1], 0, 0), "5 dimensions"),
        (_tensor_info(b"t", [4], 99, 0), "not a GGML type"),
        (_tensor_info(b"t", [5], 8, 0), "not whole Q8_0 blocks"),
    ],
)
def test_tensor_infos_outside_the_file_are_refused(tmp_path: Path, info: bytes, says: str) -> None:
    data = _header(1, 0) + info
    data += bytes(-len(data) % 32) + bytes(64)  # padding, then 64 bytes of "tensor data"
    with pytest.raises(ModelLoadError, match=says):
        _load(tmp_path, data)


@pytest.mark.timeout(600)
def test_every_truncation_of_a_real_gguf_is_refused(tmp_path: Path, tiny: bytes) -> None:
    path = tmp_path / "cut.gguf"
    for n in range(len(tiny)):
        path.write_bytes(tiny[:n])
        with pytest.raises(ModelLoadError):
            GGUFFile.open(path)


@pytest.mark.timeout(600)
@FUZZ
@given(data=st.data())
def test_random_damage_to_a_real_gguf_loads_or_is_refused(
    tmp_path: Path, tiny: bytes, data: st.DataObject
) -> None:
    damaged = bytearray(tiny)
    for _ in range(data.draw(st.integers(1, 4), label="edits")):
        at = data.draw(st.integers(0, len(tiny) - 1), label="at")
        if data.draw(st.booleans(), label="count"):  # a count, length or offset that lies
            value = data.draw(st.sampled_from([1 << 63, (1 << 64) - 1, len(tiny), 1 << 32]))
            damaged[at : at + 8] = struct.pack("<Q", value)[: len(tiny) - at]
        else:
            damaged[at] ^= data.draw(st.integers(1, 255), label="xor")
    try:
        _load(tmp_path, bytes(damaged))
        event("loaded")
    except ModelLoadError:  # the one allowed failure: any other exception fails the test
        event("refused")


# -- the header / metadata parser on generated files -------------------------------------------
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?"}
SCALARS.update({10: "<Q", 11: "<q", 12: "<d"})


@st.composite
def _value(draw: st.DrawFn, depth: int = 0) -> tuple[int, bytes]:
    """(value type, encoded value) of any GGUF type, arrays of arrays included."""
    kind = draw(st.sampled_from([*SCALARS, STRING, *([ARRAY] if depth < 2 else [])]))
    if kind == STRING:
        return kind, _str(draw(st.binary(max_size=12)))
    if kind in SCALARS:
        return kind, struct.pack(SCALARS[kind], draw(st.sampled_from([0, 1, 32, 64])))
    items = [draw(_value(depth + 1)) for _ in range(draw(st.integers(0, 3)))]
    item_kind = items[0][0] if items else draw(st.sampled_from([*SCALARS, STRING]))
    body = b"".join(v for k, v in items if k == item_kind)
    count = sum(k == item_kind for k, _ in items)
    return ARRAY, struct.pack("<IQ", item_kind, count) + body


@st.composite
def _gguf_image(draw: st.DrawFn) -> bytes:
    kvs = [
        _str(draw(st.sampled_from([b"a", b"b", b"general.alignment", b"\xc3"]))) + struct.pack(
            "<I", kind
        ) + body
        for kind, body in draw(st.lists(_value(), max_size=4))
    ]  # fmt: skip
    tensors = [
        _tensor_info(b"t%d" % i, dims, draw(st.sampled_from([0, 1, 8, 2, 30])), offset)
        for i, (dims, offset) in enumerate(
            draw(st.lists(st.tuples(st.lists(st.integers(0, 64), max_size=4),
                                    st.sampled_from([0, 32, 64, 1 << 40])), max_size=3))
        )
    ]  # fmt: skip
    head = _header(len(tensors), len(kvs)) + b"".join(kvs) + b"".join(tensors)
    image = bytearray(head + bytes(-len(head) % 32) + bytes(draw(st.integers(0, 256))))
    for _ in range(draw(st.integers(0, 3))):  # then damage it
        at = draw(st.integers(0, len(image) - 1))
        image[at : at + 8] = draw(st.binary(min_size=1, max_size=8))
    return bytes(image[: draw(st.integers(0, len(image)))])


@pytest.mark.timeout(600)
@FUZZ
@given(image=_gguf_image())
def test_what_the_parser_reads_is_what_the_gguf_packages_reader_reads(
    tmp_path: Path, image: bytes
) -> None:
    """A differential test: every image ours accepts (so one the package's reader cannot run
    past the end of), the ``gguf`` package's GGUFReader reads to the same metadata values and
    tensors; and ours refuses with ModelLoadError only."""
    try:
        layout = read_buffer(image, "fuzz.gguf")
    except ModelLoadError:
        event("refused")
        return
    event("read")
    path = tmp_path / "fuzz.gguf"
    path.write_bytes(image)
    opened = GGUFFile.open(path)
    assert opened.metadata == layout.metadata and len(opened.tensors) == layout.tensor_count
    assert layout.data_end <= len(image) and len(layout.metadata) == layout.kv_count + 3
    _same_as_the_package_reader(path, opened)


def _same_as_the_package_reader(path: Path, opened: GGUFFile) -> None:
    reader = GGUFReader(str(path))
    assert list(opened.metadata) == list(reader.fields)
    assert opened.metadata == {key: f.contents() for key, f in reader.fields.items()}
    assert list(opened.tensors) == [t.name for t in reader.tensors]
    for theirs in reader.tensors:
        ours = opened.tensors[theirs.name]
        assert (ours.tensor_type, ours.shape) == (theirs.tensor_type, tuple(theirs.shape.tolist()))
        assert ours.data.dtype == theirs.data.dtype and ours.data.shape == theirs.data.shape
        assert np.array_equal(ours.data, theirs.data, equal_nan=ours.data.dtype.kind == "f")


def test_a_real_gguf_reads_as_the_gguf_package_reads_it(tiny: bytes, tmp_path: Path) -> None:
    path = tmp_path / "tiny.gguf"
    path.write_bytes(tiny)
    opened = GGUFFile.open(path)
    assert opened.tensors and len(opened.metadata["tokenizer.ggml.tokens"]) > 100
    _same_as_the_package_reader(path, opened)


def test_the_item_cap_counts_every_array(tmp_path: Path) -> None:
    half = MAX_METADATA_ITEMS // 2 + 1
    entry = struct.pack("<IIQ", ARRAY, UINT8, half) + bytes(half)
    data = _header(0, 2) + _str(b"a") + entry + _str(b"b") + entry
    with pytest.raises(ModelLoadError, match="metadata array items in all"):
        _load(tmp_path, data)


# -- tokenizer metadata -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_meta(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    path = write_tiny_gguf(tmp_path_factory.mktemp("meta") / "tiny.gguf")
    return GGUFFile.open(path).metadata


T = "tokenizer.ggml."


@pytest.mark.parametrize(
    "changes, says",
    [
        ({T + "tokens": "abc"}, r"tokens is not a list"),
        ({T + "tokens": []}, r"tokens is empty"),
        ({T + "tokens": [1, 2, 3], T + "token_type": None}, r"tokens\[0\] = 1 is not"),
        ({T + "token_type": [1, 1]}, r"token_type has 2 entries for 261 tokens"),
        ({T + "token_type": ["x"] * 261}, r"token_type\[0\] = 'x'"),
        ({T + "merges": ["Ġt"]}, r"merges\[0\] = 'Ġt' is not two tokens"),
        ({T + "merges": ["Ġ t", "Ġ zz"]}, r"merges\[1\] = 'Ġ zz'"),
        ({T + "merges": ["Ġ q"]}, r"merges\[0\]"),  # both known, "Ġq" is not a token
        ({T + "merges": 5}, r"merges is not a list"),
        ({T + "merges": [7]}, r"merges\[0\] = 7"),
        ({T + "eos_token_id": "x"}, r"eos_token_id is not an integer"),
        ({T + "bos_token_id": [1]}, r"bos_token_id is not an integer"),
        ({T + "pre": ["gpt2"]}, r"pre is not a string"),
        ({"tokenizer.chat_template": 5}, r"chat_template is not a string"),
        ({T + "model": "llama", T + "scores": ["x"] * 261}, r"scores\[0\] = 'x'"),
        ({T + "model": "llama", T + "tokens": ["a" * 513], T + "token_type": None}, "513 char"),
    ],
)
def test_malformed_tokenizer_metadata_is_a_model_load_error(
    tiny_meta: dict[str, object], changes: dict[str, object], says: str
) -> None:
    meta = {**tiny_meta, **changes}
    meta = {k: v for k, v in meta.items() if v is not None}
    with pytest.raises(ModelLoadError, match=says):
        gguf_tokenizer(meta, "x.gguf")
