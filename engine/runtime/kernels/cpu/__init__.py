"""Native CPU kernels (C, compiled on first use); see ``gemm.py``."""
