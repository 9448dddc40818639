"""``UsageRecord``: what the ledger keeps of one chat request (one spool line, one row).

Times are integers (epoch microseconds, UTC) so a record encodes the same on every replay and
its (request_id, at) key conflicts with itself in the database (tenants/usage_models.py).
"""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

OUTCOMES = ("answered", "refused", "cancelled", "shutdown", "failed")


class UsageRecord(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    at_us: int  # arrival, epoch microseconds UTC
    tenant_id: str
    key_id: str | None
    end_user: str | None
    model: str
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    choices: int = 1
    stream: bool = False
    status: int = 200
    outcome: str = "answered"
    error: str | None = None
    finish_reason: str | None = None
    ttft_ms: float | None = None
    duration_ms: float = 0.0
    worker: str | None = None
    prompt_version: int | None = None
    spend_nanos: int = 0
    tool_calls: int = 0  # tenant tool calls the gateway ran in the request (its tool loop)

    @property
    def at(self) -> datetime:
        return datetime.fromtimestamp(self.at_us / 1_000_000, UTC)

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


def outcome_of(status: int, error: str | None) -> str:
    """How a request ended, from its recorded status: answered (200), cancelled (the client went
    away: 499), shutdown (cut by the shutdown deadline), refused (4xx), failed (other 5xx)."""
    if status == 200:
        return "answered"
    if status == 499:
        return "cancelled"
    if error == "server_shutdown":
        return "shutdown"
    return "refused" if status < 500 else "failed"


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(UsageRecord)


def encode_line(rec: UsageRecord) -> bytes:
    return ENCODER.encode(rec) + b"\n"


def decode_lines(data: bytes) -> tuple[list[UsageRecord], int]:
    """The records of a spool file's bytes, and how many lines did not decode (a torn last line
    after a crash, or a damaged one): those are skipped, never fatal."""
    out: list[UsageRecord] = []
    bad = 0
    for line in data.split(b"\n"):
        if not line:
            continue
        try:
            out.append(DECODER.decode(line))
        except msgspec.DecodeError:
            bad += 1
    return out, bad
