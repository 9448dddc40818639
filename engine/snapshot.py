"""Disk snapshots of pinned prompts' KV: written when a prompt is pinned, read at the next start.

One file per namespace (tenant cache salt), named by a digest of it::

    b"KVGSNAP1" | u64 header length | header (JSON) | payload | blake2b-256(header | payload)

    header   format, model and tokenizer fingerprints, dtype, block size, layout
             [layers, 2, block_size, kv_heads, head_dim], digest of the namespace, digest of the
             prompt's token ids, number of tokens and blocks, payload bytes
    payload  K/V of the prompt's full blocks, [blocks, layers, 2, block_size, kv_heads, head_dim]

A snapshot is used only when every header field matches the running engine and the request (a
file renamed to another tenant's name fails the namespace check; another prompt version has
other token ids); a truncated or corrupt file fails the length or checksum test. Anything else is
ignored with one log line (no salt, no prompt: the file name is a digest) and the prompt is
recomputed. Writes go to a temporary file in the same directory, fsynced, then renamed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

log = logging.getLogger(__name__)

MAGIC = b"KVGSNAP1"
FORMAT = 1
_LEN = struct.Struct("<Q")
_DIGEST = 32
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


class SnapshotStore:
    def __init__(self, directory: str | Path, identity: ModelIdentity) -> None:
        self.directory = Path(directory)
        self.identity = identity

    def path(self, namespace: str) -> Path:
        return self.directory / f"{namespace_digest(namespace)}.kvsnap"

    def _header(self, namespace: str, token_ids: Sequence[int], num_blocks: int) -> dict:
        ident = asdict(self.identity)
        ident["layout"] = list(self.identity.layout)
        return {
            "format": FORMAT,
            **ident,
            "namespace": namespace_digest(namespace),
            "prompt": prompt_digest(token_ids),
            "num_tokens": len(token_ids),
            "num_blocks": num_blocks,
        }

    def save(self, namespace: str, token_ids: Sequence[int], kv: torch.Tensor) -> Path:
        """Write the snapshot of ``token_ids``'s full blocks (``kv`` on the host) atomically."""
        expect = (kv.shape[0], *self.identity.layout)
        assert tuple(kv.shape) == expect, f"snapshot tensor {tuple(kv.shape)} != {expect}"
        payload = kv.contiguous().view(torch.uint8).numpy().tobytes()
        header = self._header(namespace, token_ids, kv.shape[0])
        header["payload_bytes"] = len(payload)
        head = json.dumps(header, sort_keys=True).encode()
        body = head + payload
        digest = hashlib.blake2b(body, digest_size=_DIGEST).digest()
        self.directory.mkdir(parents=True, exist_ok=True)
        target = self.path(namespace)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".kvsnap", dir=self.directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(MAGIC + _LEN.pack(len(head)) + body + digest)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return target

    def matches(self, namespace: str, token_ids: Sequence[int]) -> bool:
        """A snapshot of this prompt for this engine is on disk (header only; no checksum)."""
        try:
            with self.path(namespace).open("rb") as f:
                header = self._read_header(f)
        except (OSError, ValueError):
            return False
        return header is not None and self._mismatch(header, namespace, token_ids) is None

    def load(self, namespace: str, token_ids: Sequence[int]) -> torch.Tensor | None:
        """The K/V of ``token_ids``'s full blocks, or None (logged) when no usable snapshot."""
        path = self.path(namespace)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return _ignored(path, f"unreadable ({exc.__class__.__name__})")
        try:
            header, payload = self._parse(data)
        except ValueError as exc:
            return _ignored(path, str(exc))
        reason = self._mismatch(header, namespace, token_ids)
        if reason is not None:
            return _ignored(path, reason)
        dtype = getattr(torch, self.identity.dtype)
        flat = torch.frombuffer(bytearray(payload), dtype=torch.uint8).view(dtype)
        return flat.reshape(header["num_blocks"], *self.identity.layout)

    # ------------------------------------------------------------------ parsing

    @staticmethod
    def _read_header(f) -> dict | None:  # type: ignore[no-untyped-def]
        prefix = f.read(len(MAGIC) + _LEN.size)
        if len(prefix) < len(MAGIC) + _LEN.size or prefix[: len(MAGIC)] != MAGIC:
            return None
        (n,) = _LEN.unpack(prefix[len(MAGIC) :])
        if n > _MAX_HEADER:
            return None
        return json.loads(f.read(n))

    @staticmethod
    def _parse(data: bytes) -> tuple[dict, bytes]:
        start = len(MAGIC) + _LEN.size
        if len(data) < start + _DIGEST or data[: len(MAGIC)] != MAGIC:
            raise ValueError("not a snapshot file (magic or length)")
        (n,) = _LEN.unpack(data[len(MAGIC) : start])
        body, digest = data[start:-_DIGEST], data[-_DIGEST:]
        if n > min(_MAX_HEADER, len(body)):
            raise ValueError("truncated header")
        if hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
            raise ValueError("checksum mismatch (truncated or corrupt)")
        try:
            header = json.loads(body[:n])
        except ValueError:
            raise ValueError("unreadable header") from None
        payload = body[n:]
        if not isinstance(header, dict) or header.get("payload_bytes") != len(payload):
            raise ValueError("payload length mismatch")
        return header, payload

    def _mismatch(self, header: dict, namespace: str, token_ids: Sequence[int]) -> str | None:
        want = self._header(namespace, token_ids, len(token_ids) // self.identity.block_size)
        for field in ("format", "model", "tokenizer", "dtype", "block_size", "layout",
                      "namespace", "prompt", "num_tokens", "num_blocks"):  # fmt: skip
            if header.get(field) != want[field]:
                return f"{field} differs"
        return None


def _ignored(path: Path, reason: str) -> None:
    log.warning("kv snapshot %s ignored: %s; the prompt is recomputed", path.name, reason)
    return None
