"""Disk snapshots of pinned prompts' KV: written when a prompt is pinned, read at the next start.

One file per namespace (tenant cache salt), named by a digest of it::

    b"KVGSNAP2" | u64 header length | header (JSON) | payload | MAC
    MAC      blake2b-256 keyed with the installation's snapshot key (engine/runtime/snapshot_key.py)
             over everything before it
    header   format, model and tokenizer fingerprints, dtype, block size, layout
             [layers, 2, block_size, kv_heads, head_dim], digest of the namespace, digest of the
             prompt's token ids, number of tokens and blocks, payload bytes
    payload  K/V of the prompt's full blocks, [blocks, layers, 2, block_size, kv_heads, head_dim]

Loading checks, in this order, before any byte of the file is used: the file's size equals what
the running engine's layout implies for the prompt (blocks x bytes per block; a larger file is
never read), then the MAC (whoever can write the directory but lacks the key cannot forge a
tenant's KV, and a checksum recomputed without the key fails), then every header field against
the engine and the request (a file renamed to another tenant's name fails the namespace check;
another prompt version has other token ids). A file failing the size or MAC test is removed; any
refusal is one log line (no salt, no prompt: the file name is a digest) and the prompt is
recomputed. Writes go to a temporary file in the same directory, fsynced, then renamed.
"""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import logging
import math
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAGIC = b"KVGSNAP2"
FORMAT = 2
_LEN = struct.Struct("<Q")
_PREFIX = len(MAGIC) + _LEN.size
_MAC = 32
_CHUNK = 8 << 20
_MAX_HEADER = 1 << 16
_FULL_HASH_LIMIT = 512 << 20  # weight files above it: size + first and last 8 MiB
_EDGE = 8 << 20


@dataclass(frozen=True)
class ModelIdentity:
    """What a snapshot's K/V depends on, besides the prompt and its namespace."""

    model: str  # fingerprint of the config and weight files
    tokenizer: str  # fingerprint of the tokenizer files
    dtype: str
    block_size: int
    layout: tuple[int, ...]  # layers, 2, block_size, kv_heads, head_dim


def _digest(data: bytes, person: bytes) -> str:
    return hashlib.blake2b(data, digest_size=16, person=person).hexdigest()


def prompt_digest(token_ids: Sequence[int]) -> str:
    return _digest(b",".join(str(int(t)).encode() for t in token_ids), b"kvgate-prompt")


def namespace_digest(namespace: str) -> str:
    return _digest(namespace.encode(), b"kvgate-snap-ns")


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    size = path.stat().st_size
    h.update(f"{path.name}:{size}".encode())
    with path.open("rb") as f:
        if size <= _FULL_HASH_LIMIT:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        else:
            h.update(f.read(_EDGE))
            f.seek(size - _EDGE)
            h.update(f.read(_EDGE))
    return h.hexdigest()


_WEIGHTS = (".safetensors", ".bin", ".gguf", ".pt")
_TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
              "tokenizer.model", "special_tokens_map.json", "chat_template.jinja")  # fmt: skip


def fingerprint(model_path: str | Path) -> tuple[str, str]:
    """(model, tokenizer) fingerprints of an HF directory or a ``.gguf`` file."""
    path = Path(model_path)
    if path.is_file():  # GGUF: config, weights and tokenizer in one file
        one = _file_digest(path)
        return one, one
    model = hashlib.sha256()
    tok = hashlib.sha256()
    for f in sorted(p for p in path.iterdir() if p.is_file()):
        if f.name == "config.json" or f.suffix in _WEIGHTS:
            model.update(_file_digest(f).encode())
        elif f.name in _TOKENIZER:
            tok.update(_file_digest(f).encode())
    return model.hexdigest(), tok.hexdigest()


class _Refused(ValueError):
    """The file is not an intact snapshot written with this installation's key."""


class SnapshotStore:
    def __init__(self, directory: str | Path, identity: ModelIdentity, key: bytes) -> None:
        self.directory = Path(directory)
        self.identity = identity
        self._key = key

    def path(self, namespace: str) -> Path:
        return self.directory / f"{namespace_digest(namespace)}.kvsnap"

    @property
    def block_bytes(self) -> int:
        """Payload bytes of one block in the running engine's layout and dtype."""
        dtype: torch.dtype = getattr(torch, self.identity.dtype)
        return math.prod(self.identity.layout) * dtype.itemsize

    def _mac(self) -> hashlib.blake2b:
        return hashlib.blake2b(key=self._key, digest_size=_MAC, person=b"kvgate-snapshot")

    def _header(
        self, namespace: str, token_ids: Sequence[int], num_blocks: int
    ) -> dict[str, object]:
        ident = asdict(self.identity)
        ident["layout"] = list(self.identity.layout)
        return {
            "format": FORMAT,
            **ident,
            "namespace": namespace_digest(namespace),
            "prompt": prompt_digest(token_ids),
            "num_tokens": len(token_ids),
            "num_blocks": num_blocks,
            "payload_bytes": num_blocks * self.block_bytes,
        }

    def save(self, namespace: str, token_ids: Sequence[int], kv: torch.Tensor) -> Path:
        """Write the snapshot of ``token_ids``'s full blocks (``kv`` on the host) atomically."""
        expect = (kv.shape[0], *self.identity.layout)
        assert tuple(kv.shape) == expect, f"snapshot tensor {tuple(kv.shape)} != {expect}"
        payload = kv.contiguous().view(torch.uint8).numpy().tobytes()
        header = self._header(namespace, token_ids, kv.shape[0])
        assert header["payload_bytes"] == len(payload)
        head = json.dumps(header, sort_keys=True).encode()
        body = MAGIC + _LEN.pack(len(head)) + head + payload
        mac = self._mac()
        mac.update(body)
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        target = self.path(namespace)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".kvsnap", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(body + mac.digest())
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def remove(self, namespace: str) -> bool:
        """Delete the namespace's snapshot; whether there was one."""
        try:
            self.path(namespace).unlink()
        except FileNotFoundError:
            return False
        return True

    def matches(self, namespace: str, token_ids: Sequence[int]) -> bool:
        """A snapshot of this prompt for this engine is on disk: header and size only, no MAC
        (a file that passes here but is not intact is refused, and removed, when loaded)."""
        want = len(token_ids) // self.identity.block_size * self.block_bytes
        try:
            with self.path(namespace).open("rb") as f:
                prefix = f.read(_PREFIX)
                n = _header_length(prefix)
                if os.fstat(f.fileno()).st_size != _PREFIX + n + want + _MAC:
                    return False
                header = json.loads(f.read(n))
        except (OSError, ValueError):
            return False
        return isinstance(header, dict) and self._mismatch(header, namespace, token_ids) is None

    def load(self, namespace: str, token_ids: Sequence[int]) -> torch.Tensor | None:
        """The K/V of ``token_ids``'s full blocks, or None (logged) when no usable snapshot."""
        path = self.path(namespace)
        num_blocks = len(token_ids) // self.identity.block_size
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return None
        except OSError as exc:
            _ignored(path, f"unreadable ({exc.__class__.__name__})")
            return None
        try:
            with f:
                header, payload = self._read_verified(f, num_blocks * self.block_bytes)
        except OSError as exc:
            _ignored(path, f"unreadable ({exc.__class__.__name__})")
            return None
        except _Refused as exc:
            path.unlink(missing_ok=True)  # not ours or damaged: never kept, never trusted
            _ignored(path, f"{exc}; removed")
            return None
        reason = self._mismatch(header, namespace, token_ids)
        if reason is not None:
            _ignored(path, reason)
            return None
        dtype = getattr(torch, self.identity.dtype)
        flat = torch.frombuffer(payload, dtype=torch.uint8).view(dtype)
        return flat.reshape(num_blocks, *self.identity.layout)

    # ------------------------------------------------------------------ parsing

    def _read_verified(
        self, f: io.BufferedReader, payload_bytes: int
    ) -> tuple[dict[str, object], bytearray]:
        """Header and payload of an intact file of exactly the expected size, MAC checked
        before either is used; ``_Refused`` otherwise."""
        prefix = f.read(_PREFIX)
        try:
            n = _header_length(prefix)
        except ValueError as exc:
            raise _Refused(str(exc)) from None
        size, expect = os.fstat(f.fileno()).st_size, _PREFIX + n + payload_bytes + _MAC
        if size != expect:
            raise _Refused(f"size {size} is not the {expect} bytes the layout implies")
        mac = self._mac()
        mac.update(prefix)
        head = f.read(n)
        mac.update(head)
        payload = bytearray(payload_bytes)
        view = memoryview(payload)
        for at in range(0, payload_bytes, _CHUNK):
            part = view[at : at + _CHUNK]
            if f.readinto(part) != len(part):
                raise _Refused("truncated while read")
            mac.update(part)
        if not hmac.compare_digest(mac.digest(), f.read(_MAC)):
            raise _Refused("MAC mismatch (forged, another installation's key, or corrupt)")
        try:
            header = json.loads(head)
        except ValueError:
            raise _Refused("unreadable header") from None
        if not isinstance(header, dict) or header.get("payload_bytes") != payload_bytes:
            raise _Refused("payload size differs from the layout")
        return header, payload

    def _mismatch(
        self, header: dict[str, object], namespace: str, token_ids: Sequence[int]
    ) -> str | None:
        want = self._header(namespace, token_ids, len(token_ids) // self.identity.block_size)
        for field in ("format", "model", "tokenizer", "dtype", "block_size", "layout",
                      "namespace", "prompt", "num_tokens", "num_blocks"):  # fmt: skip
            if header.get(field) != want[field]:
                return f"{field} differs"
        return None


def _header_length(prefix: bytes) -> int:
    if len(prefix) < _PREFIX or prefix[: len(MAGIC)] != MAGIC:
        raise ValueError(f"not a snapshot file of format {FORMAT} (magic)")
    n: int
    (n,) = _LEN.unpack(prefix[len(MAGIC) :])
    if n > _MAX_HEADER:
        raise ValueError("header too long")
    return n


def _ignored(path: Path, reason: str) -> None:
    log.warning("kv snapshot %s ignored: %s; the prompt is recomputed", path.name, reason)
