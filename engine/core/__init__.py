"""The torch-free core of the engine: the paged KV cache with prefix reuse (``kv/``), the
scheduler, requests and the scheduler -> runner batch (``batch.py``). Nothing here imports torch.
"""
