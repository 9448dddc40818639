"""The model runtime (torch): model loading, kernels, the runner, sampling, KV tiers and
snapshots.
"""
