"""The ``kvgate`` console command; each subcommand module is imported only when used."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

ENGINE_MODULES = ("torch", "triton", "safetensors")  # the engine extra's (pyproject.toml)

# subcommand -> (module, help). The module exposes ``main(argv: list[str]) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "serve": ("gateway.commands.serve", "run the gateway (OpenAI-compatible chat API + admin API)"),
    "worker": ("gateway.commands.worker", "run one engine worker (internal API for gateways)"),
    "migrate": ("tenants.cli", "upgrade the tenant database schema to head"),
    "tenants": ("tenants.cli", "manage tenants, keys, system prompts and limits"),
    "secrets": ("tenants.secrets_cli", "secrets at rest: key status; reseal under a new key"),
    "usage": ("gateway.commands.usage", "usage reports and records from the ledger; retention"),
    "demo-model": ("engine.runtime.model.demo", "write the deterministic demo model to a dir"),
    "bench": ("bench.cli", "run a benchmark (kv, model, reuse, burst, blocksize, load, gateway)"),
}


def _usage() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = ["usage: kvgate <command> [options]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_usage())
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in COMMANDS:
        print(f"kvgate: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    try:
        module = importlib.import_module(COMMANDS[name][0])
    except ModuleNotFoundError as exc:
        if exc.name not in ENGINE_MODULES:
            raise
        from gateway.cluster.local import ENGINE_EXTRA

        print(f"kvgate {name}: the engine is not installed: pip install '{ENGINE_EXTRA}'")
        return 2
    return int(module.main([name, *rest]) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
