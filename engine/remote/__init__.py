"""Engines the gateway reaches over the network and does not run itself (vLLM servers)."""
