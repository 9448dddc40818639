"""Admin shapes of operators' transcripts (tenants/transcripts.py; gateway/admin/transcripts.py)."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class TranscriptAccessIn(BaseModel):
    """PUT /tenants/{id}/transcript-access."""

    model_config = ConfigDict(extra="forbid", strict=True)

    enabled: bool


class TranscriptAccessOut(BaseModel):
    enabled: bool


class TranscriptSummaryOut(BaseModel):
    """One stored conversation as the list shows it."""

    id: str
    end_user: str  # the owner without its kind: a session's end user, an address, a key id
    owner_kind: str  # user | addr | key
    started_at: datetime
    updated_at: datetime
    turns: int
    input_tokens: int
    output_tokens: int
    total_tokens: int
    spend_usd: float


class TranscriptPageOut(BaseModel):
    data: list[TranscriptSummaryOut]
    next_cursor: str | None


class TranscriptEntryOut(BaseModel):
    """One item of a conversation: a message (its text), a tool call or a tool's output."""

    id: str
    type: str
    role: str  # user | assistant | system | developer | tool
    text: str
    created_at: datetime


class TranscriptOut(BaseModel):
    conversation: TranscriptSummaryOut
    entries: list[TranscriptEntryOut]
