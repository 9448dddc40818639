"""The model runtime (torch): model loading, kernels, the runner, sampling, KV tiers and
snapshots.

Loading this package is where a process starts to be an engine: everything in the engine that
imports torch lives below it, so its variables are exported here, before torch loads (the
engine's boundary modules, which the gateway imports, never change the environment):

    KVGATE_CPU_ISA=avx2   torch's and oneDNN's ISA caps (cpu_isa.py), read at the first CPU kernel
    OMP_WAIT_POLICY       PASSIVE unless set (omp_policy.py), read when torch loads libgomp
"""

from __future__ import annotations

from engine.runtime import cpu_isa as _cpu_isa
from engine.runtime import omp_policy as _omp_policy

_cpu_isa.export_torch_caps()
_omp_policy.export()
