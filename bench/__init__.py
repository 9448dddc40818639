"""kvgate's benchmarks (``kvgate bench <name>``; bench/cli.py).

``engine`` is imported before any benchmark loads torch, so a benchmark's process runs with the
settings ``kvgate serve`` gets: OpenMP's wait policy (engine/runtime/omp_policy.py) and torch's
ISA cap (engine/runtime/cpu_isa.py) are read when torch loads.
"""

import engine  # noqa: F401
