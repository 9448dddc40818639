"""``kvgate worker [--host H] [--port P] [--model DIR] [--id ID]``: one engine worker process.

A model that does not load ends the worker with one line naming the file and the problem
(exit 1): the weight-free checks run first, before torch is imported.

The engine settings are the gateway's (``KVGATE_MODEL``, ``KVGATE_BLOCK_SIZE``,
``KVGATE_KV_CACHE_BYTES``, ``KVGATE_PIN_CAP_FRACTION``, ``KVGATE_DEVICE``, ...); the internal API
is authenticated with ``KVGATE_WORKER_TOKEN`` (required).
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence

from engine.text.errors import ModelLoadError
from gateway.cluster.local import check_local_model, engine_missing, run_worker
from gateway.settings import Settings, SettingsError


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="kvgate worker", description="run one engine worker")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8100, help="listen port (0: any free port)")
    p.add_argument("--model", help="model directory (default: KVGATE_MODEL, else the demo model)")
    p.add_argument("--id", help="worker id for placement (default: KVGATE_WORKER_ID, host:port)")
    p.add_argument("--exit-with-stdin", action="store_true", help="stop when stdin closes")
    p.add_argument("--unix", help="also serve on this Unix domain socket path")
    return p.parse_args(list(argv))


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv[1:])  # argv[0] is "worker"
    missing = engine_missing()
    if missing is not None:
        print(f"kvgate worker: {missing}", file=sys.stderr)
        return 2
    try:
        settings = Settings.from_env(os.environ)
    except SettingsError as exc:
        print(f"kvgate worker: configuration error: {exc}", file=sys.stderr)
        return 2
    token = settings.cluster.worker_token
    if not token:
        print("kvgate worker: KVGATE_WORKER_TOKEN must be set", file=sys.stderr)
        return 2
    model_dir = args.model or settings.model.path
    if model_dir is None:
        from gateway.commands.serve import ensure_demo_model

        model_dir = str(ensure_demo_model(settings.server.var_dir))
    worker_id = args.id or settings.cluster.worker_id or f"{socket.gethostname()}:{args.port}"
    try:
        check_local_model(model_dir, settings.model.dtype)  # before torch is imported: fails fast
        run_worker(
            model_dir,
            token,
            worker_id,
            settings.model.engine_overrides(),
            host=args.host,
            port=args.port,
            exit_with_stdin=args.exit_with_stdin,
            unix_path=args.unix,
        )
    except ModelLoadError as exc:  # what only loading finds (a tensor's shape, say)
        print(f"kvgate worker: the model does not load: {exc}", file=sys.stderr)
        return 1
    return 0
