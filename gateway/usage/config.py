"""``UsageSettings``: the ledger's configuration (read by gateway/settings.py from KVGATE_USAGE_*
and KVGATE_BUDGET_*; this module imports nothing of the gateway, so the ledger never imports the
settings module that imports it)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from zoneinfo import ZoneInfo

from gateway.usage.prices import Price


@dataclass(frozen=True)
class UsageSettings:
    enabled: bool = True
    spool_dir: Path = Path("var/usage-spool")
    # Spools of gone processes under it are adopted at start (gateway/usage/spool.py); None: none.
    spool_root: Path | None = None
    flush_s: float = 0.1  # a batch at least this often (and at batch_size records)
    batch_size: int = 500
    segment_bytes: int = 4 << 20
    retention_days: int | None = None  # None: records are kept
    prices: dict[str, Price] = field(default_factory=dict)
    price_refresh_s: float = 30.0
    db_deadline_s: float = 10.0  # one batch transaction
    retry_s: float = 1.0  # database down: one replay try per this interval
    budget_timezone: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    budget_fail_open: bool = False  # budget state unknown: refuse (default) or admit
    budget_refresh_s: float = 5.0  # budget definitions reloaded from the database
