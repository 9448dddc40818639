"""``OMP_WAIT_POLICY``: how torch's OpenMP threads wait between parallel ops (imports no torch).

kvgate's CPU kernels (engine/runtime/kernels/cpu/) run on their own thread pool, as many threads
as torch has; torch's ops between them (embedding, residual adds, sampling) run on OpenMP's.
libgomp's default, ``ACTIVE``, keeps its threads spinning after each parallel op, on the cores
the next kernel's threads need: on a 2-core host, 16% of a 256-token prefill's CPU time was
libgomp spinning (perf), and ``PASSIVE`` (its threads sleep at once) cut that prefill from 134-150
to 98-110 ms (bench/results/vllm_peer.json has the shapes).

libgomp reads the variable once, when it is loaded (torch's import), so :func:`export` runs when the
engine's runtime is imported (engine/runtime/__init__.py); a value already set is kept, and a
process that imported torch before the runtime keeps libgomp's default. Child processes inherit it
(kvgate's workers should); a program that is not kvgate gets :func:`foreign_environ` (llama.cpp's
threads, for one, wait for each other after every op: sleeping there cut its decode to a quarter).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

ENV = "OMP_WAIT_POLICY"
POLICY = "PASSIVE"


_exported = False  # this process set the variable (it was not set before)


def export(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set ``OMP_WAIT_POLICY=PASSIVE`` unless the process already chose one."""
    global _exported
    if ENV not in environ:
        environ[ENV] = POLICY
        _exported = environ is os.environ


def foreign_environ() -> dict[str, str]:
    """This process's environment as it was given, for a child that is not kvgate: without the
    policy :func:`export` added (one the process was started with is kept)."""
    env = dict(os.environ)
    if _exported:
        env.pop(ENV, None)
    return env
