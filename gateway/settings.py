"""Gateway configuration: ``KVGATE_*`` environment variables over an optional TOML file.

Every variable is declared once in ``VARIABLES`` (name, parser, default, meaning); the frozen
per-component settings read only from the merged source. Precedence: environment > TOML file
(``KVGATE_CONFIG``) > default. In the TOML file a variable is written without the prefix, lower
case (``redis_url = "redis://..."``), at top level or in any table. A bad value fails start-up with
a ``SettingsError`` naming the variable.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from engine.config import PROCESS_VARIABLES, ConfigFieldError, EngineConfig
from gateway.usage.config import UsageSettings
from gateway.usage.prices import parse_price_table
from tenants.db import redact_url
from tenants.errors import ConfigError
from tenants.settings import TenantStoreSettings

PREFIX = "KVGATE_"
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
T = TypeVar("T")


class SettingsError(ValueError):
    """A configuration value is invalid; the message names the variable."""


def _str(raw: str) -> str:
    return raw


def _int(raw: str) -> int:
    return int(raw)


def _optional(parse: Callable[[str], T]) -> Callable[[str], T | None]:
    """``parse``, with the empty value meaning unset (None)."""

    def parse_optional(raw: str) -> T | None:
        return parse(raw) if raw else None

    return parse_optional


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("must be in 0..65535")
    return value


def _positive_float(raw: str) -> float:
    value = float(raw)
    if value <= 0:
        raise ValueError("must be > 0")
    return value


def _float_in(low: float, high: float, *, low_open: bool = False) -> Callable[[str], float]:
    def parse(raw: str) -> float:
        value = float(raw)
        if not (low < value if low_open else low <= value) or value > high:
            raise ValueError(f"must be in {'(' if low_open else '['}{low}, {high}]")
        return value

    return parse


_opt_str = _optional(_str)
_opt_int = _optional(_int)
_fraction = _float_in(0.0, 1.0)
_opt_share = _optional(_float_in(0.0, 1.0, low_open=True))


def _int_ge1(raw: str) -> int:
    value = int(raw)
    if value < 1:
        raise ValueError("must be >= 1")
    return value


def _int_in(low: int, high: int) -> Callable[[str], int]:
    def parse(raw: str) -> int:
        value = int(raw)
        if not low <= value <= high:
            raise ValueError(f"must be in {low}..{high}")
        return value

    return parse


WORKER_TOKEN_MIN = 32  # characters: the worker API is the engine itself, reachable by network


def _worker_token(raw: str) -> str | None:
    if not raw:
        return None
    if len(raw) < WORKER_TOKEN_MIN:
        raise ValueError(
            f"must be at least {WORKER_TOKEN_MIN} characters; generate one: openssl rand -hex 32"
        )
    return raw


def _cidrs(raw: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c.strip()) for c in raw.split(",") if c.strip())


def is_loopback(host: str) -> bool:
    """Whether a listen address reaches only this machine ("localhost", 127.0.0.0/8, ::1);
    any other name, and the wildcard addresses, may be reachable from elsewhere."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _bool(raw: str) -> bool:
    lowered = raw.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _choice(*options: str) -> Callable[[str], str]:
    def parse(raw: str) -> str:
        if raw not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return raw

    return parse


@dataclass(frozen=True)
class Variable:
    name: str  # full name, e.g. KVGATE_PORT
    parse: Callable[[str], Any]
    default: str | None  # as text, parsed like any other value; None: the component decides
    meaning: str


# The engine's knobs: one variable per EngineConfig field, ``KVGATE_<FIELD>``, its parser from the
# field's type, its default and meaning from the field's declaration (engine/config.py); the
# value is checked once, by EngineConfig (``engine_config``). Where the gateway decides a
# field's default itself, ``ENGINE_DEFAULTS`` says so.
_BY_TYPE: dict[str, Callable[[str], Any]] = {
    "int": _int,
    "int | None": _opt_int,
    "float": float,
    "bool": _bool,
    "str": _str,
    "str | None": _opt_str,
}
ENGINE_DEFAULTS = {
    "kv_snapshot_dir": (
        "",
        "pinned prompts' KV saved here, restored at start; unset: <KVGATE_VAR_DIR>/kv-snapshots; "
        "off: none",
    ),
}


def engine_variable(f: dataclasses.Field[Any]) -> Variable:
    default, meaning = ENGINE_DEFAULTS.get(f.name, (_as_text(f.default), f.metadata["help"]))
    return Variable(PREFIX + f.name.upper(), _BY_TYPE[str(f.type)], default, meaning)


def _as_text(default: Any) -> str:
    if default is None:
        return ""
    return str(default).lower() if isinstance(default, bool) else str(default)


ENGINE_VARIABLES = (
    *(engine_variable(f) for f in dataclasses.fields(EngineConfig)),
    *(Variable(p.name, _str, p.default, p.meaning) for p in PROCESS_VARIABLES),
)


VARIABLES: tuple[Variable, ...] = (
    Variable("KVGATE_CONFIG", _opt_str, "", "optional TOML file with any of these variables"),
    Variable("KVGATE_HOST", _str, "127.0.0.1", "listen address of `kvgate serve`"),
    Variable("KVGATE_PORT", _port, "8000", "listen port of `kvgate serve`"),
    Variable("KVGATE_METRICS_HOST", _str, "127.0.0.1", "listen address of the /metrics listener"),
    Variable(
        "KVGATE_METRICS_PORT",
        _port,
        "9464",
        "port of the /metrics listener (never the public port); 0: no metrics listener",
    ),
    Variable("KVGATE_VAR_DIR", _str, "var", "embedded state: SQLite file, demo model"),
    Variable(
        "KVGATE_SHUTDOWN_TIMEOUT_S", _positive_float, "10", "graceful shutdown: streams may finish"
    ),
    Variable("KVGATE_MAX_BODY_BYTES", _int, "1048576", "largest accepted request body"),
    Variable(
        "KVGATE_HEADER_TIMEOUT_S", _positive_float, "10", "a request's headers must arrive within"
    ),
    Variable("KVGATE_BODY_TIMEOUT_S", _positive_float, "30", "a request's body must arrive within"),
    Variable("KVGATE_MODEL", _opt_str, "", "HF model dir or .gguf file; unset: the default"),
    Variable(
        "KVGATE_DEFAULT_MODEL",
        _choice("smollm2-135m-instruct", "demo"),
        "smollm2-135m-instruct",
        "KVGATE_MODEL unset: SmolLM2-135M-Instruct (downloaded once to var/models/), or the "
        "random demo model",
    ),
    Variable("KVGATE_MODEL_NAME", _opt_str, "", "model id served by /v1/models; unset: dir name"),
    *ENGINE_VARIABLES,
    Variable("KVGATE_DEFAULT_MAX_TOKENS", _int_ge1, "256", "max_tokens when a request gives none"),
    # Sampling defaults for requests that leave a parameter out (model-specific values belong
    # here, e.g. the model card's recommended temperature).
    Variable("KVGATE_DEFAULT_TEMPERATURE", _float_in(0.0, 2.0), "1.0", "temperature if unset"),
    Variable("KVGATE_DEFAULT_TOP_P", _float_in(0.0, 1.0, low_open=True), "1.0", "top_p if unset"),
    Variable(
        "KVGATE_DEFAULT_REPETITION_PENALTY",
        _float_in(0.0, 10.0, low_open=True),
        "1.0",
        "repetition_penalty if unset (1.0: off)",
    ),
    Variable(
        "KVGATE_DEFAULT_FREQUENCY_PENALTY",
        _float_in(-2.0, 2.0),
        "0.0",
        "frequency_penalty if unset",
    ),
    Variable("KVGATE_REDIS_URL", _opt_str, "", "Redis for limits and sessions; unset: in process"),
    Variable("KVGATE_REDIS_PREFIX", _str, "kvgate:", "prefix of every Redis key the gateway uses"),
    Variable(
        "KVGATE_RATELIMIT_FAIL_MODE",
        _choice("open", "closed"),
        "open",
        "Redis unreachable: open = in-process limiter, closed = 503",
    ),
    Variable("KVGATE_REDIS_TIMEOUT_S", _positive_float, "0.25", "Redis connect/command timeout"),
    Variable(
        "KVGATE_REDIS_RETRY_S", _positive_float, "1.0", "while failed over: Redis retry interval"
    ),
    Variable(
        "KVGATE_LEASE_TTL_S",
        _positive_float,
        "30",
        "concurrency lease TTL, renewed every third of it while the request runs",
    ),
    Variable(
        "KVGATE_RATELIMIT_FAILOVER_SHARE",
        _opt_share,
        "",
        "Redis down: share of each limit this replica enforces; unset: 1 / replicas seen",
    ),
    Variable("KVGATE_VISITOR_RPM", _int_ge1, "20", "widget visitor requests/minute default"),
    Variable("KVGATE_VISITOR_TPM", _int_ge1, "20000", "widget visitor tokens/minute default"),
    Variable("KVGATE_VISITOR_MAX_CONCURRENCY", _int_ge1, "2", "widget visitor concurrency default"),
    Variable(
        "KVGATE_TRUSTED_PROXIES",
        _cidrs,
        "",
        "CIDRs whose X-Forwarded-For is believed (client address of widget visitors)",
    ),
    Variable(
        "KVGATE_VISITOR_IPV6_PREFIX",
        _int_in(1, 128),
        "64",
        "IPv6 visitors are counted per network of this prefix length (128: per address)",
    ),
    Variable("KVGATE_ADMIN_TOKEN", _opt_str, "", "admin bearer token; unset: generated, printed"),
    Variable("KVGATE_KEY_CACHE_TTL_S", _positive_float, "5", "API key -> tenant cache lifetime"),
    Variable(
        "KVGATE_ADMIN_SESSION_IDLE_S",
        _positive_float,
        "1800",
        "admin console session: signed out after this long without a request",
    ),
    Variable(
        "KVGATE_ADMIN_SESSION_MAX_S",
        _positive_float,
        "43200",
        "admin console session: signed out this long after sign-in, active or not",
    ),
    Variable(
        "KVGATE_ADMIN_WRITES_PER_MINUTE",
        _int_ge1,
        "60",
        "admin API writes per minute and principal (429 beyond; burst: the whole minute's)",
    ),
    Variable(
        "KVGATE_ADMIN_SIGN_IN_FAILURES_PER_MINUTE",
        _int_ge1,
        "10",
        "failed admin sign-ins per minute and client address; beyond: its sign-ins are 429s",
    ),
    Variable(
        "KVGATE_DB_TIMEOUT_S",
        _positive_float,
        "3",
        "deadline of every tenant-DB call on the request path (checkout, statement, unit of work)",
    ),
    Variable(
        "KVGATE_DB_STALE_MAX_S",
        _positive_float,
        "900",
        "DB unreachable: known keys/tenants served from last-known-good for at most this long",
    ),
    Variable(
        "KVGATE_DB_RETRY_S", _positive_float, "1", "DB marked down: one trial per this interval"
    ),
    Variable(
        "KVGATE_WIDGET_DEMO",
        _choice("auto", "true", "false"),
        "auto",
        "serve the widget demo page /widget/demo; auto: on in the embedded default on a "
        "loopback address only",
    ),
    Variable(
        "KVGATE_WIDGET_SESSION_RPM",
        _int_ge1,
        "600",
        "session tokens one server key may issue per minute (POST /v1/widget/sessions)",
    ),
    Variable(
        "KVGATE_WIDGET_MAX_BODY_BYTES",
        _int_ge1,
        "262144",
        "largest chat request body from widget traffic (public keys; decoded size)",
    ),
    Variable(
        "KVGATE_TOOL_ALLOWED_HOSTS",
        _str,
        "",
        "tenant tools: hosts (host or host:port, comma-separated) that may use http and "
        "non-public addresses; every other tool URL is https to a public address",
    ),
    Variable("KVGATE_TOOL_TIMEOUT_S", _positive_float, "5", "tenant tools: deadline of one call"),
    Variable(
        "KVGATE_TOOL_TURN_TIMEOUT_S",
        _positive_float,
        "30",
        "tenant tools: deadline of every tool call of one chat turn together",
    ),
    Variable(
        "KVGATE_TOOL_MAX_RESPONSE_BYTES", _int_ge1, "65536", "tenant tools: largest tool answer"
    ),
    Variable(
        "KVGATE_TOOL_MAX_CALLS_PER_ROUND",
        _int_ge1,
        "8",
        "tenant tools: calls the gateway runs in one round (the model's further calls of that "
        "round are answered with an error instead)",
    ),
    Variable(
        "KVGATE_TOOL_BREAKER_FAILURES",
        _int_ge1,
        "5",
        "tenant tools: failures in a row (no connection, 5xx, timeout) that open a tool's circuit",
    ),
    Variable(
        "KVGATE_TOOL_BREAKER_RESET_S",
        _positive_float,
        "30",
        "tenant tools: an open circuit lets one trial call through after this long",
    ),
    Variable("KVGATE_LOG_LEVEL", _choice("debug", "info", "warning", "error"), "info", "log level"),
    Variable("KVGATE_LOG_JSON", _bool, "true", "JSON log lines (false: console format)"),
    Variable("KVGATE_SERVICE_NAME", _str, "kvgate-gateway", "OTel service.name"),
    Variable(
        "KVGATE_BACKEND",
        _choice("kvgate", "vllm"),
        "kvgate",
        "engine kind behind KVGATE_WORKERS: kvgate workers, or vLLM servers (docs/vllm.md)",
    ),
    Variable(
        "KVGATE_WORKERS",
        _opt_str,
        "",
        "engine workers (http://h:p,...), or vLLM servers' base URLs; unset: one local worker",
    ),
    Variable(
        "KVGATE_KV_EVENTS",
        _opt_str,
        "",
        "vLLM: each server's KV-event endpoint (tcp://h:p, optionally |tcp://h:replay-port), in "
        "KVGATE_WORKERS order; unset: GET /kv_event_sources of each server",
    ),
    Variable(
        "KVGATE_WORKER_TOKEN",
        _worker_token,
        "",
        f"shared secret of the gateway-worker API ({WORKER_TOKEN_MIN}+ characters: "
        "openssl rand -hex 32); unset: kvgate serve's local worker gets a generated one",
    ),
    Variable("KVGATE_WORKER_ID", _opt_str, "", "`kvgate worker`: placement id; unset: host:port"),
    Variable("KVGATE_WORKER_HEALTH_S", _positive_float, "1", "worker health-check interval"),
    Variable(
        "KVGATE_WORKER_CONNECT_TIMEOUT_S", _positive_float, "300", "start-up wait for a worker"
    ),
    Variable("KVGATE_SPILL_QUEUE_S", _positive_float, "0.5", "queue delay that spills requests"),
    Variable("KVGATE_REPLICA_RPS", _positive_float, "2", "tenant requests/s per pinned replica"),
    Variable("KVGATE_LOAD_WINDOW_S", _positive_float, "10", "tenant load statistics window"),
    Variable(
        "KVGATE_BACKEND_MAX_INFLIGHT",
        _int_in(0, 1_000_000),
        "64",
        "this gateway's requests in flight per replica (about the server's max_num_seqs / the "
        "gateways); more wait in the gateway, dispatched by tenant fair share; 0: no bound",
    ),
    Variable(
        "KVGATE_BACKEND_PRIORITY",
        _bool,
        "false",
        "the vLLM servers run --scheduling-policy priority: requests carry vLLM's priority "
        "(interactive 0, batch 1)",
    ),
    Variable(
        "KVGATE_VLLM_REWARM_RECENT_S",
        _float_in(0.0, 86_400.0),
        "30",
        "vLLM: a kept tenant prompt whose blocks a server evicted is warmed again only if the "
        "tenant had a request there within this many seconds (and the server is idle); "
        "0: never warmed again",
    ),
    Variable("KVGATE_USAGE_LEDGER", _bool, "true", "usage ledger: one record per chat request"),
    Variable(
        "KVGATE_USAGE_SPOOL_DIR",
        _opt_str,
        "",
        "usage records' local spool (one per gateway process); "
        "unset: <KVGATE_VAR_DIR>/usage-spool/port-<KVGATE_PORT>; at start, the spools under "
        "<KVGATE_VAR_DIR>/usage-spool of processes that are gone are adopted and replayed",
    ),
    Variable("KVGATE_USAGE_FLUSH_S", _positive_float, "0.1", "usage batch interval (fsync + DB)"),
    Variable("KVGATE_USAGE_BATCH", _int_ge1, "500", "usage records per batch at most"),
    Variable(
        "KVGATE_USAGE_DB_TIMEOUT_S", _positive_float, "10", "one usage batch's database deadline"
    ),
    Variable(
        "KVGATE_USAGE_RETENTION_DAYS",
        _opt_int,
        "",
        "raw usage records kept this many days (PostgreSQL: whole months); unset: kept",
    ),
    Variable(
        "KVGATE_CONVERSATION_RETENTION_DAYS",
        _opt_int,
        "30",
        "stored responses and conversations kept this many days after their last turn "
        "(a tenant's conversation_retention_days overrides it)",
    ),
    Variable(
        "KVGATE_CONVERSATION_PURGE_S",
        _positive_float,
        "3600",
        "interval of the retention purge of stored conversations",
    ),
    Variable(
        "KVGATE_USAGE_PRICES",
        _opt_str,
        "",
        'USD per 1M tokens per model: JSON {"m": {"input", "cached_input", "output"}} or @file',
    ),
    Variable("KVGATE_BUDGET_TIMEZONE", _str, "UTC", "time zone of budget days and months"),
    Variable(
        "KVGATE_BUDGET_FAIL_MODE",
        _choice("closed", "open"),
        "closed",
        "budget state unknown (Redis or database down): refuse (closed) or admit (open)",
    ),
    # Read by tenants/settings.py (TenantStoreSettings.from_env); listed so the TOML file and
    # the configuration table know them.
    Variable("KVGATE_DATABASE_URL", _str, None, "tenant DB; unset: SQLite under var/"),
    Variable("KVGATE_ADMIN_TOKEN_SHA256", _str, None, "admin token given as its SHA-256 hex"),
    Variable("KVGATE_TENANT_EVENT_CHANNEL", _str, None, "Redis pub/sub channel of tenant events"),
    Variable("KVGATE_DEFAULT_RPM", _str, None, "tenant default requests/minute (600)"),
    Variable("KVGATE_DEFAULT_TPM", _str, None, "tenant default tokens/minute (200000)"),
    Variable("KVGATE_DEFAULT_MAX_CONCURRENCY", _str, None, "tenant default concurrency (16)"),
    Variable("KVGATE_DEFAULT_MAX_OUTPUT_TOKENS", _str, None, "tenant default output cap (1024)"),
    Variable("KVGATE_KEY_LAST_USED_FLUSH_S", _str, None, "key last_used_at flush interval (30)"),
    Variable(
        "KVGATE_SECRETS_KEY",
        _str,
        None,
        "key sealing stored MCP bearer tokens and tool signing secrets: 32+ characters "
        "(openssl rand -hex 32), the same on every gateway of a database; NEW,OLD while "
        "rotating; unset: <KVGATE_VAR_DIR>/secrets.key with SQLite, required otherwise",
    ),
)
_BY_NAME = {v.name: v for v in VARIABLES}


def _flatten_toml(data: Mapping[str, Any], out: dict[str, str]) -> None:
    for key, value in data.items():
        if isinstance(value, Mapping):
            _flatten_toml(value, out)
            continue
        name = PREFIX + key.upper()
        if name not in _BY_NAME:
            raise SettingsError(f"KVGATE_CONFIG: unknown setting {key!r}")
        out[name] = str(value).lower() if isinstance(value, bool) else str(value)


def load_source(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """Merged raw values: defaults < TOML file < environment (only KVGATE_* and OTEL_* names)."""
    env = os.environ if env is None else env
    merged = {v.name: v.default for v in VARIABLES if v.default is not None}
    path = env.get("KVGATE_CONFIG")
    if path:
        try:
            with Path(path).open("rb") as fh:
                _flatten_toml(tomllib.load(fh), merged)
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"KVGATE_CONFIG: cannot read {path}: {exc}") from exc
    merged.update({k: v for k, v in env.items() if k.startswith((PREFIX, "OTEL_"))})
    return merged


def value(source: Mapping[str, str], name: str) -> Any:
    var = _BY_NAME[name]
    raw = source.get(name, var.default)
    if raw is None:
        return None
    try:
        return var.parse(raw.strip())
    except ValueError as exc:
        raise SettingsError(f"{name}: invalid value {_shown(name, raw)} ({exc})") from None


def _shown(name: str, raw: str) -> str:
    """A rejected value as an error may quote it: never a secret, URLs without passwords."""
    if "TOKEN" in name or "SECRET" in name:
        return "(not shown)"
    if name.endswith("_URL"):
        return repr(redact_url(raw))
    return repr(raw)


@dataclass(frozen=True)
class ServerSettings:
    host: str
    port: int
    var_dir: Path
    shutdown_timeout_s: float
    max_body_bytes: int
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9464  # 0: no metrics listener
    header_timeout_s: float = 10.0  # first byte of a request -> end of its headers (else 408)
    body_timeout_s: float = 30.0  # end of the headers -> end of the body (else 408)

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> ServerSettings:
        return cls(
            host=value(src, "KVGATE_HOST"),
            port=value(src, "KVGATE_PORT"),
            var_dir=Path(value(src, "KVGATE_VAR_DIR")),
            shutdown_timeout_s=value(src, "KVGATE_SHUTDOWN_TIMEOUT_S"),
            max_body_bytes=value(src, "KVGATE_MAX_BODY_BYTES"),
            metrics_host=value(src, "KVGATE_METRICS_HOST"),
            metrics_port=value(src, "KVGATE_METRICS_PORT"),
            header_timeout_s=value(src, "KVGATE_HEADER_TIMEOUT_S"),
            body_timeout_s=value(src, "KVGATE_BODY_TIMEOUT_S"),
        )


@dataclass(frozen=True)
class ModelSettings:
    path: str | None  # None: the demo model, generated under var_dir on first start
    name: str | None
    default_max_tokens: int
    engine: EngineConfig  # every KVGATE_<FIELD> of the engine, checked by EngineConfig
    # Sampling parameters a request leaves out (gateway/chat/views.py ``sampling_params``).
    default_temperature: float = 1.0
    default_top_p: float = 1.0
    default_repetition_penalty: float = 1.0
    default_frequency_penalty: float = 0.0

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> ModelSettings:
        return cls(
            path=value(src, "KVGATE_MODEL"),
            name=value(src, "KVGATE_MODEL_NAME"),
            default_max_tokens=value(src, "KVGATE_DEFAULT_MAX_TOKENS"),
            engine=engine_config(src),
            default_temperature=value(src, "KVGATE_DEFAULT_TEMPERATURE"),
            default_top_p=value(src, "KVGATE_DEFAULT_TOP_P"),
            default_repetition_penalty=value(src, "KVGATE_DEFAULT_REPETITION_PENALTY"),
            default_frequency_penalty=value(src, "KVGATE_DEFAULT_FREQUENCY_PENALTY"),
        )

    @property
    def block_size(self) -> int:
        return self.engine.block_size

    @property
    def dtype(self) -> str:
        return self.engine.dtype

    def engine_overrides(self) -> dict[str, Any]:
        """The engine's configuration as keywords (``EngineConfig`` fields, every one)."""
        return {f.name: getattr(self.engine, f.name) for f in dataclasses.fields(EngineConfig)}


def engine_config(src: Mapping[str, str]) -> EngineConfig:
    """The engine's configuration from its ``KVGATE_<FIELD>`` variables, checked once (by
    ``EngineConfig``): a refused value is a ``SettingsError`` naming its variable."""
    given = {
        f.name: value(src, PREFIX + f.name.upper())
        for f in dataclasses.fields(EngineConfig)
        if f.name not in ENGINE_DEFAULTS
    }
    try:
        return EngineConfig(**given, kv_snapshot_dir=_snapshot_dir(src))
    except ConfigFieldError as exc:
        raise SettingsError(f"{PREFIX}{exc.field.upper()}: {exc.problem}") from None


def _snapshot_dir(src: Mapping[str, str]) -> str | None:
    raw = value(src, "KVGATE_KV_SNAPSHOT_DIR")
    if raw is None:
        return str(Path(value(src, "KVGATE_VAR_DIR")) / "kv-snapshots")
    return None if raw.lower() == "off" else raw


@dataclass(frozen=True)
class RateLimitSettings:
    redis_url: str | None = field(repr=False)  # may hold a password
    redis_prefix: str
    fail_open: bool
    redis_timeout_s: float
    redis_retry_s: float
    lease_ttl_s: float
    failover_share: float | None = None  # None: 1 / live replicas seen in Redis
    visitor_rpm: int = 20  # defaults of tenants whose visitor_* limits are NULL
    visitor_tpm: int = 20_000
    visitor_max_concurrency: int = 2
    trusted_proxies: tuple[IPNetwork, ...] = ()
    visitor_ipv6_prefix: int = 64  # IPv6 visitors grouped by network (gateway/access/visitor.py)

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> RateLimitSettings:
        return cls(
            redis_url=value(src, "KVGATE_REDIS_URL"),
            redis_prefix=value(src, "KVGATE_REDIS_PREFIX"),
            fail_open=value(src, "KVGATE_RATELIMIT_FAIL_MODE") == "open",
            redis_timeout_s=value(src, "KVGATE_REDIS_TIMEOUT_S"),
            redis_retry_s=value(src, "KVGATE_REDIS_RETRY_S"),
            lease_ttl_s=value(src, "KVGATE_LEASE_TTL_S"),
            failover_share=value(src, "KVGATE_RATELIMIT_FAILOVER_SHARE"),
            visitor_rpm=value(src, "KVGATE_VISITOR_RPM"),
            visitor_tpm=value(src, "KVGATE_VISITOR_TPM"),
            visitor_max_concurrency=value(src, "KVGATE_VISITOR_MAX_CONCURRENCY"),
            trusted_proxies=value(src, "KVGATE_TRUSTED_PROXIES"),
            visitor_ipv6_prefix=value(src, "KVGATE_VISITOR_IPV6_PREFIX"),
        )


@dataclass(frozen=True)
class AuthSettings:
    admin_token: str | None = field(repr=False)  # a secret: never in a printed or logged repr
    key_cache_ttl_s: float
    session_idle_s: float = 1800.0  # admin console sessions (gateway/admin/session.py)
    session_max_s: float = 43200.0
    writes_per_minute: int = 60  # admin writes per principal (gateway/admin/throttle.py)
    sign_in_failures_per_minute: int = 10  # failed sign-ins per client address

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> AuthSettings:
        return cls(
            admin_token=value(src, "KVGATE_ADMIN_TOKEN"),
            key_cache_ttl_s=value(src, "KVGATE_KEY_CACHE_TTL_S"),
            session_idle_s=value(src, "KVGATE_ADMIN_SESSION_IDLE_S"),
            session_max_s=value(src, "KVGATE_ADMIN_SESSION_MAX_S"),
            writes_per_minute=value(src, "KVGATE_ADMIN_WRITES_PER_MINUTE"),
            sign_in_failures_per_minute=value(src, "KVGATE_ADMIN_SIGN_IN_FAILURES_PER_MINUTE"),
        )


@dataclass(frozen=True)
class TelemetrySettings:
    log_level: str
    log_json: bool
    service_name: str
    otlp_endpoint: str | None  # OTEL_EXPORTER_OTLP_ENDPOINT (the standard OTel name)

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> TelemetrySettings:
        return cls(
            log_level=value(src, "KVGATE_LOG_LEVEL"),
            log_json=value(src, "KVGATE_LOG_JSON"),
            service_name=value(src, "KVGATE_SERVICE_NAME"),
            otlp_endpoint=src.get("OTEL_EXPORTER_OTLP_ENDPOINT") or None,
        )


@dataclass(frozen=True)
class WidgetSettings:
    demo: bool  # serve /widget/demo (creates a demo tenant and widget key on first visit)
    session_rpm: int = 600  # session tokens per minute and server key
    # Chat bodies of widget traffic, decoded: parsing JSON holds the event loop (and the GIL)
    # in proportion to the number of values, so public keys get a smaller bound than servers.
    max_body_bytes: int = 256 << 10

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> WidgetSettings:
        mode = value(src, "KVGATE_WIDGET_DEMO")
        # "auto": on only in the embedded default (no KVGATE_DATABASE_URL configured) listening
        # on a loopback address; anyone who reaches the page can chat through the demo tenant,
        # so a gateway reachable from elsewhere serves it only when asked to ("true").
        embedded = not src.get("KVGATE_DATABASE_URL")
        local = is_loopback(value(src, "KVGATE_HOST"))
        return cls(
            demo=mode == "true" or (mode == "auto" and embedded and local),
            session_rpm=value(src, "KVGATE_WIDGET_SESSION_RPM"),
            max_body_bytes=value(src, "KVGATE_WIDGET_MAX_BODY_BYTES"),
        )


@dataclass(frozen=True)
class ToolSettings:
    """Tools the gateway runs for tenants (gateway/chat/tools/run/, docs/tools.md)."""

    allowed_hosts: str = ""
    timeout_s: float = 5.0
    turn_timeout_s: float = 30.0
    max_response_bytes: int = 64 << 10
    max_calls_per_round: int = 8
    breaker_failures: int = 5
    breaker_reset_s: float = 30.0

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> ToolSettings:
        return cls(
            allowed_hosts=value(src, "KVGATE_TOOL_ALLOWED_HOSTS"),
            timeout_s=value(src, "KVGATE_TOOL_TIMEOUT_S"),
            turn_timeout_s=value(src, "KVGATE_TOOL_TURN_TIMEOUT_S"),
            max_response_bytes=value(src, "KVGATE_TOOL_MAX_RESPONSE_BYTES"),
            max_calls_per_round=value(src, "KVGATE_TOOL_MAX_CALLS_PER_ROUND"),
            breaker_failures=value(src, "KVGATE_TOOL_BREAKER_FAILURES"),
            breaker_reset_s=value(src, "KVGATE_TOOL_BREAKER_RESET_S"),
        )


@dataclass(frozen=True)
class ConversationSettings:
    """Stored responses and conversations (gateway/responses/, tenants/conversation_store.py)."""

    retention_days: int | None = 30  # None: kept
    purge_s: float = 3600.0

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> ConversationSettings:
        days = value(src, "KVGATE_CONVERSATION_RETENTION_DAYS")
        if days is not None and days < 1:
            raise SettingsError("KVGATE_CONVERSATION_RETENTION_DAYS: must be >= 1")
        return cls(retention_days=days, purge_s=value(src, "KVGATE_CONVERSATION_PURGE_S"))


@dataclass(frozen=True)
class DatabaseSettings:
    """How the gateway waits on the tenant database (docs/operations.md)."""

    timeout_s: float = 3.0
    stale_max_s: float = 900.0
    retry_s: float = 1.0

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> DatabaseSettings:
        return cls(
            timeout_s=value(src, "KVGATE_DB_TIMEOUT_S"),
            stale_max_s=value(src, "KVGATE_DB_STALE_MAX_S"),
            retry_s=value(src, "KVGATE_DB_RETRY_S"),
        )


@dataclass(frozen=True)
class ClusterSettings:
    """Engine workers and tenant placement (gateway/cluster/)."""

    backend: str = "kvgate"  # or "vllm": KVGATE_WORKERS are vLLM servers
    workers: str | None = None  # None: `kvgate serve` starts one local worker
    kv_events: str | None = None  # vLLM: KV-event endpoints in KVGATE_WORKERS order
    worker_token: str | None = field(default=None, repr=False)
    worker_id: str | None = None
    health_s: float = 1.0
    connect_timeout_s: float = 300.0
    spill_queue_s: float = 0.5
    replica_rps: float = 2.0
    load_window_s: float = 10.0
    backend_max_inflight: int = 64  # per replica, this gateway's (gateway/cluster/dispatch.py)
    backend_priority: bool = False  # vLLM's priority field sent (--scheduling-policy priority)
    rewarm_recent_s: float = 30.0  # vLLM: re-warms only for tenants this recent (0: none)

    @classmethod
    def from_source(cls, src: Mapping[str, str]) -> ClusterSettings:
        return cls(
            backend=value(src, "KVGATE_BACKEND"),
            workers=value(src, "KVGATE_WORKERS"),
            kv_events=value(src, "KVGATE_KV_EVENTS"),
            worker_token=value(src, "KVGATE_WORKER_TOKEN"),
            worker_id=value(src, "KVGATE_WORKER_ID"),
            health_s=value(src, "KVGATE_WORKER_HEALTH_S"),
            connect_timeout_s=value(src, "KVGATE_WORKER_CONNECT_TIMEOUT_S"),
            spill_queue_s=value(src, "KVGATE_SPILL_QUEUE_S"),
            replica_rps=value(src, "KVGATE_REPLICA_RPS"),
            load_window_s=value(src, "KVGATE_LOAD_WINDOW_S"),
            backend_max_inflight=value(src, "KVGATE_BACKEND_MAX_INFLIGHT"),
            backend_priority=value(src, "KVGATE_BACKEND_PRIORITY"),
            rewarm_recent_s=value(src, "KVGATE_VLLM_REWARM_RECENT_S"),
        )


def _usage_settings(src: Mapping[str, str], var_dir: Path, port: int) -> UsageSettings:
    spool = value(src, "KVGATE_USAGE_SPOOL_DIR")
    retention = value(src, "KVGATE_USAGE_RETENTION_DAYS")
    if retention is not None and retention < 1:
        raise SettingsError("KVGATE_USAGE_RETENTION_DAYS: must be >= 1")
    try:
        prices = parse_price_table(value(src, "KVGATE_USAGE_PRICES") or "")
    except (OSError, ValueError) as exc:
        raise SettingsError(f"KVGATE_USAGE_PRICES: {exc}") from None
    tz_name = value(src, "KVGATE_BUDGET_TIMEZONE")
    try:
        tz = ZoneInfo(tz_name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(f"KVGATE_BUDGET_TIMEZONE: unknown time zone {tz_name!r}") from None
    return UsageSettings(
        enabled=value(src, "KVGATE_USAGE_LEDGER"),
        # one per listening port: replicas on one host never share a spool; a restart on any
        # port adopts what a gone process left under the root (gateway/usage/spool.py)
        spool_dir=Path(spool) if spool else var_dir / "usage-spool" / f"port-{port}",
        spool_root=var_dir / "usage-spool",
        flush_s=value(src, "KVGATE_USAGE_FLUSH_S"),
        batch_size=value(src, "KVGATE_USAGE_BATCH"),
        db_deadline_s=value(src, "KVGATE_USAGE_DB_TIMEOUT_S"),
        retry_s=value(src, "KVGATE_DB_RETRY_S"),
        retention_days=retention,
        prices=prices,
        budget_timezone=tz,
        budget_fail_open=value(src, "KVGATE_BUDGET_FAIL_MODE") == "open",
    )


@dataclass(frozen=True)
class Settings:
    """Everything ``create_app`` needs, validated once at start."""

    server: ServerSettings
    model: ModelSettings
    ratelimit: RateLimitSettings
    auth: AuthSettings
    telemetry: TelemetrySettings
    tenants: TenantStoreSettings
    cluster: ClusterSettings = ClusterSettings()
    widget: WidgetSettings = WidgetSettings(demo=False)
    database: DatabaseSettings = DatabaseSettings()
    usage: UsageSettings = field(default_factory=UsageSettings)
    tools: ToolSettings = ToolSettings()
    conversations: ConversationSettings = ConversationSettings()

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        src = load_source(env)
        server = ServerSettings.from_source(src)
        widget = WidgetSettings.from_source(src)  # before the embedded database URL is filled in
        if not src.get("KVGATE_DATABASE_URL"):
            src["KVGATE_DATABASE_URL"] = f"sqlite+aiosqlite:///{server.var_dir}/kvgate.db"
        try:
            # Empty means unset (the tenant store reads presence, not emptiness).
            tenants = TenantStoreSettings.from_env({k: v for k, v in src.items() if v != ""})
        except ConfigError as exc:
            raise SettingsError(str(exc)) from None
        return cls(
            server=server,
            model=ModelSettings.from_source(src),
            ratelimit=RateLimitSettings.from_source(src),
            auth=AuthSettings.from_source(src),
            telemetry=TelemetrySettings.from_source(src),
            tenants=tenants,
            cluster=ClusterSettings.from_source(src),
            widget=widget,
            database=DatabaseSettings.from_source(src),
            usage=_usage_settings(src, server.var_dir, server.port),
            tools=ToolSettings.from_source(src),
            conversations=ConversationSettings.from_source(src),
        )


def configuration_table() -> str:
    """Markdown table of every variable (for the README)."""
    rows = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for v in VARIABLES:
        default = f"`{v.default}`" if v.default else "unset"
        rows.append(f"| `{v.name}` | {default} | {v.meaning} |")
    rows.append("| `OTEL_EXPORTER_OTLP_ENDPOINT` | unset | OTLP/HTTP trace export endpoint |")
    return "\n".join(rows)
