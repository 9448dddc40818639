"""The host tier's and snapshots' cache stats become Prometheus series."""

from __future__ import annotations

import dataclasses

from engine.core.kv.types import CacheStats
from gateway.telemetry import GatewayMetrics


def _stats(**tier: int) -> CacheStats:
    base = {f.name: 0 for f in dataclasses.fields(CacheStats)}
    base.update(blocks_total=64, blocks_free=40, blocks_pinned=8)
    base.update(tier)
    return CacheStats(**base)


def test_tier_series_are_exported() -> None:
    stats = _stats(
        host_blocks_total=256,
        host_blocks_cached=30,
        host_blocks_pinned=12,
        host_hit_tokens=480,
        blocks_restored=30,
        bytes_restored=30 * 4096,
        transfer_us=2_500_000,
        snapshot_restores=3,
    )
    metrics = GatewayMetrics()
    metrics.watch(lambda: stats, None)
    text = metrics.render().decode()
    assert 'kvgate_kv_blocks{state="host_total"} 256.0' in text
    assert 'kvgate_kv_blocks{state="host_cached"} 30.0' in text
    assert 'kvgate_kv_blocks{state="host_pinned"} 12.0' in text
    assert 'kvgate_kv_blocks{state="pinned"} 8.0' in text
    assert "kvgate_kv_host_hit_tokens_total 480.0" in text
    assert f"kvgate_kv_bytes_restored_total {float(30 * 4096)}" in text
    assert "kvgate_kv_transfer_seconds_total 2.5" in text
    assert "kvgate_kv_snapshot_restores_total 3.0" in text
