"""KV tiers beyond the device pool (torch side): the host KV pool and disk snapshots.

The bookkeeping (which key lives where) is pure Python in engine/core/kv/host_tier.py and
engine/core/kv/tiering.py; these modules move and store the bytes.
"""
