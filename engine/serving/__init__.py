"""Serving: the engine step machine and sync ``Engine`` (``engine.py``), the asyncio
``AsyncEngine`` and the ``kvgate worker`` process (``worker/``).
"""
