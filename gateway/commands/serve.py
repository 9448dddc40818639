"""``kvgate serve [--host H] [--port P]``: run the gateway until SIGINT/SIGTERM.

With no configuration at all this is the embedded default, ready to use:

    var/kvgate.db                SQLite tenant store, migrated to head on first start
    var/models/                  the default model, SmolLM2-135M-Instruct, downloaded once
                                 (gateway/commands/default_model.py); offline or
    KVGATE_DEFAULT_MODEL=demo: var/demo-model/              the deterministic demo model, written
    on first start var/admin-token.sha256       hash of the admin token generated on first start
                                 (the token itself is printed once, then never again)
    var/secrets.key              the key sealing stored MCP bearer tokens and tool signing
                                 secrets, generated once (KVGATE_SECRETS_KEY instead)
    in-process rate limiter      (KVGATE_REDIS_URL unset)

Prometheus metrics are served on a listener of their own (KVGATE_METRICS_HOST, default
127.0.0.1, and KVGATE_METRICS_PORT, default 9464; 0 disables it), never on the public port.

The model is checked first (``local_model``): a missing or malformed model file ends the start
with one line naming the file and the problem, exit 1, before a database is migrated, an admin
token printed or a worker started. The engine opens when the app starts (gateway/app.py
``cleanup_ctx``): the local worker that serves it is started then; when it does not start or
answer, ``kvgate serve`` says why in one message and exits 1, the worker stopped.

Shutdown is graceful (gateway/lifecycle/drain.py): listening stops at once, in-flight chat requests
get KVGATE_SHUTDOWN_TIMEOUT_S to finish; shortly before that deadline the ones still running end
with a shutdown error (an SSE error event then ``[DONE]`` for streams), and the process exits
within the timeout plus about a second.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import secrets
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from engine.text.errors import ModelLoadError
from gateway.commands.default_model import default_model_env
from gateway.settings import Settings, SettingsError
from tenants.sealing import SecretsKeyError
from tenants.secret_keys import SecretsSettings

if TYPE_CHECKING:  # the rest is imported once the model is checked: a failed start stays quick
    from aiohttp import web

TOKEN_FILE = "admin-token.sha256"


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="kvgate serve", description="run the kvgate gateway")
    parser.add_argument("--host", help="listen address (default: KVGATE_HOST, 127.0.0.1)")
    parser.add_argument("--port", type=int, help="listen port (default: KVGATE_PORT, 8000)")
    return parser.parse_args(list(argv))


def admin_token_env(env: Mapping[str, str], var_dir: Path) -> tuple[dict[str, str], str | None]:
    """Environment with an admin token: configured, remembered, or generated now.

    Returns the environment and the token when one was generated (to print once)."""
    out = dict(env)
    if out.get("KVGATE_ADMIN_TOKEN") or out.get("KVGATE_ADMIN_TOKEN_SHA256"):
        return out, None
    path = var_dir / TOKEN_FILE
    if path.is_file():
        out["KVGATE_ADMIN_TOKEN_SHA256"] = path.read_text().strip()
        return out, None
    token = f"kvgadm_{secrets.token_urlsafe(32)}"
    var_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(hashlib.sha256(token.encode()).hexdigest() + "\n")
    path.chmod(0o600)
    out["KVGATE_ADMIN_TOKEN_SHA256"] = hashlib.sha256(token.encode()).hexdigest()
    return out, token


def ensure_demo_model(var_dir: Path) -> Path:
    """The demo model under ``var_dir``, written once. Written to a private directory and
    renamed into place, so replicas starting together never load a half-written model."""
    import shutil
    import tempfile

    from gateway.cluster.local import write_demo_model

    path = var_dir / "demo-model"
    if path.is_dir():
        return path
    print(f"kvgate serve: writing the demo model to {path}", file=sys.stderr)
    var_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".demo-model-", dir=var_dir))
    write_demo_model(tmp)
    try:
        tmp.rename(path)
    except OSError:  # another process renamed its copy first: same bytes, keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def local_model(settings: Settings) -> str | None:
    """The model the local worker serves: KVGATE_MODEL, or the demo model (written under the var
    dir once), checked first with the loaders' own weight-free checks (headers, metadata, files
    present: ``check_local_model``), so a model that cannot load is a ``ModelLoadError`` in well
    under a second instead of a worker traceback after start-up. None when KVGATE_WORKERS names
    the workers: they hold the model."""
    if settings.cluster.workers:
        return settings.model.path
    from gateway.cluster.local import check_local_model

    model_dir = settings.model.path or str(ensure_demo_model(settings.server.var_dir))
    check_local_model(model_dir, settings.model.dtype)
    return model_dir


def _engine_missing() -> str | None:
    """Why the local worker cannot run here (the engine extra is not installed), or None."""
    from gateway.cluster.local import engine_missing

    return engine_missing()


def prepare_database(url: str, secrets_key: SecretsSettings | None = None) -> None:
    """SQLite (the embedded default) migrates itself; PostgreSQL needs ``kvgate migrate``.
    ``secrets_key``: where the key is, should a migration seal stored secrets."""
    if url.startswith("sqlite"):
        from tenants.migrate import upgrade_to_head

        asyncio.run(upgrade_to_head(url, secrets_key))


def _serve_metrics(app: web.Application, settings: Settings) -> None:
    """/metrics on its own listener (KVGATE_METRICS_HOST:KVGATE_METRICS_PORT; port 0: none)."""
    from gateway.context import TELEMETRY
    from gateway.telemetry import MetricsListener, metrics_listener

    server = settings.server
    if server.metrics_port:
        listener = MetricsListener(server.metrics_host, server.metrics_port)
        app.cleanup_ctx.append(metrics_listener(listener, app[TELEMETRY].metrics.render))
        print(f"kvgate serve: metrics on {server.metrics_host}:{server.metrics_port}", flush=True)


def environment(args: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, str]:
    """The environment settings are read from, with ``--host`` / ``--port`` as ``KVGATE_HOST`` /
    ``KVGATE_PORT``: what depends on the listen address (the widget demo's ``auto``: loopback
    only; the usage spool's default directory, one per port) sees the real one."""
    env = dict(environ)
    if args.host:
        env["KVGATE_HOST"] = args.host
    if args.port is not None:
        env["KVGATE_PORT"] = str(args.port)
    return env


def main(argv: Sequence[str]) -> int:
    args = _parse_args(argv[1:])  # argv[0] is "serve"
    try:
        environ = environment(args, os.environ)
        base = Settings.from_env(environ)
        var_dir = base.server.var_dir
        if not base.cluster.workers and (missing := _engine_missing()) is not None:
            print(f"kvgate serve: KVGATE_WORKERS is unset and {missing}", file=sys.stderr)
            return 2
        env = default_model_env(environ, var_dir)
        model_dir = local_model(Settings.from_env(env))
        # after the model check: a token generated before a failed start would be lost (its
        # hash is kept, the token never printed)
        env, new_token = admin_token_env(env, var_dir)
        settings = Settings.from_env(env)
    except SettingsError as exc:
        print(f"kvgate serve: configuration error: {exc}", file=sys.stderr)
        return 2
    except ModelLoadError as exc:
        print(f"kvgate serve: the model does not load: {exc}", file=sys.stderr)
        return 1
    from gateway.app import create_app
    from gateway.cluster.bootstrap import ClusterUnavailable
    from gateway.cluster.local import LocalWorkerError
    from gateway.http import run_app
    from gateway.lifecycle.drain import grace_s
    from gateway.ratelimit import LimiterUnavailable
    from gateway.telemetry import configure_logging

    configure_logging(settings.telemetry)
    try:
        prepare_database(settings.tenants.database_url, settings.tenants.secrets)
    except SecretsKeyError as exc:
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 1
    if new_token is not None:
        print(f"kvgate serve: admin token (shown once, keep it): {new_token}", flush=True)
    app = create_app(settings, model_dir=model_dir, local_worker=True)
    _serve_metrics(app, settings)
    host = args.host or settings.server.host
    port = settings.server.port if args.port is None else args.port
    try:
        run_app(  # gateway/http.py: web.run_app with read deadlines and quote-free errors
            app,
            host=host,
            port=port,
            header_timeout_s=settings.server.header_timeout_s,
            body_timeout_s=settings.server.body_timeout_s,
            # The drain (on_shutdown) already waited for the chat requests and cut the late ones;
            # aiohttp only closes what is left (it waits up to this twice: finish, then cancel).
            shutdown_timeout=grace_s(settings.server.shutdown_timeout_s) / 2,
            handler_cancellation=True,
            access_log=None,
            print=lambda msg: print(f"kvgate serve: {msg}", flush=True),
        )
    except LimiterUnavailable:  # KVGATE_RATELIMIT_FAIL_MODE=closed and no Redis at start
        print(redis_start_error(settings.ratelimit.redis_url), file=sys.stderr)
        return 1
    except (LocalWorkerError, ClusterUnavailable) as exc:  # the engine did not open (stopped)
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 1
    except SecretsKeyError as exc:  # no secrets key, or not this database's (start-up check)
        print(f"kvgate serve: {exc}", file=sys.stderr)
        return 1
    _exit_now(0)


def _exit_now(code: int) -> NoReturn:
    """Everything the app opened is closed (cleanup_ctx ran): skip the interpreter's own
    teardown, which takes seconds with torch loaded on a busy machine and would push the exit
    past the shutdown deadline that an orchestrator enforces with SIGKILL."""
    import logging

    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def redis_start_error(url: str | None) -> str:
    """One line naming the variable; the URL without its credentials."""
    from urllib.parse import urlsplit

    where = urlsplit(url or "").hostname or "?"
    port = urlsplit(url or "").port if url else None
    target = f"{where}:{port}" if port else where
    return (
        f"kvgate serve: KVGATE_REDIS_URL: Redis at {target} is unreachable and "
        "KVGATE_RATELIMIT_FAIL_MODE is closed (set it to open to start without Redis)"
    )
