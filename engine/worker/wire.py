"""The worker protocol's payloads: engine objects <-> JSON-able values, and stream frames.

Token ids travel as JSON integer arrays (never as text). A generate stream is one HTTP/1.1
response of newline-terminated compact JSON frames::

    {"n": [ids], "c": cached, "m": [times]}\n       first output (token ids, cached tokens, timings)
    {"n": [ids]}\n ...                              deltas (+ "lp": logprobs when asked)
    {"n": [ids], "f": 1, "r": reason, "t": [all]}\n  final output
    {"e": {"type": ..., "message": ...}}\n          refused at admission, or the engine stopped

Errors are sent by class name and rebuilt on the caller's side as the same engine error, so
the gateway's error mapping does not know whether the engine is local or remote.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from engine import errors as engine_errors
from engine.kv import CacheScope, CacheStats, PinHandle, PriorityRange
from engine.outputs import RequestMetrics, RequestOutput, TokenLogprob
from engine.params import SamplingParams

DEVICE, HOST = "device", "host"
PIN_TIERS = (DEVICE, HOST)  # where a pinned prompt lives (engine/kv/types.py PinHandle.tier)

_dumps = json.JSONEncoder(separators=(",", ":"), ensure_ascii=True).encode
_loads = json.JSONDecoder().decode

# Errors rebuilt by name on the caller's side; anything else becomes EngineError.
_ERRORS: dict[str, type[Exception]] = {
    cls.__name__: cls
    for cls in (
        engine_errors.EngineError,
        engine_errors.EngineOverloaded,
        engine_errors.PromptTooLong,
        engine_errors.PinRejected,
        engine_errors.RequestAborted,
        engine_errors.EngineDead,
        engine_errors.EngineClosed,
        engine_errors.DuplicateRequestId,
        ValueError,
    )
}


class WireError(Exception):
    """A payload that does not follow the protocol (a bug or a version mismatch)."""


def encode(obj: Any) -> bytes:
    return _dumps(obj).encode()


def decode(data: bytes | str) -> Any:
    try:
        return _loads(data.decode() if isinstance(data, bytes) else data)
    except ValueError as exc:
        raise WireError(f"bad frame: {exc}") from None


def frame(obj: Any) -> bytes:
    return _dumps(obj).encode() + b"\n"


# -- sampling parameters (every field, so new ones pass through without protocol changes) -------
def params_to_wire(params: SamplingParams) -> dict[str, Any]:
    return {f.name: getattr(params, f.name) for f in dataclasses.fields(params)}


def params_from_wire(data: dict[str, Any]) -> SamplingParams:
    known = {f.name for f in dataclasses.fields(SamplingParams)}
    unknown = set(data) - known
    if unknown:
        raise ValueError(f"unknown sampling parameters: {sorted(unknown)}")
    fields = dict(data)
    if "stop_token_ids" in fields:
        fields["stop_token_ids"] = tuple(int(t) for t in fields["stop_token_ids"])
    if "logit_bias" in fields:
        fields["logit_bias"] = tuple((int(t), float(b)) for t, b in fields["logit_bias"])
    return SamplingParams(**fields)


def priorities_to_wire(ranges: tuple[PriorityRange, ...]) -> list[list[Any]]:
    return [[r.start, r.end, r.priority] for r in ranges]


def priorities_from_wire(data: list[list[Any]]) -> tuple[PriorityRange, ...]:
    return tuple(PriorityRange(int(s), None if e is None else int(e), int(p)) for s, e, p in data)


def scope_to_wire(scope: CacheScope) -> list[Any]:
    """``[salt as hex, shared tokens]`` (the salt is a digest: binary, sent as hex)."""
    return [scope.salt_bytes.hex(), scope.shared_tokens]


def scope_from_wire(data: Any) -> CacheScope | None:
    if data is None:
        return None
    salt, shared = data
    return CacheScope(bytes.fromhex(str(salt)), int(shared))


# -- outputs -----------------------------------------------------------------------------------
def output_to_wire(out: RequestOutput, *, first: bool) -> dict[str, Any]:
    """Token deltas; the first and the final frame also carry the cached-token count and the
    timings, the final one its finish reason and every generated token (a check on the sum)."""
    d: dict[str, Any] = {"n": list(out.new_token_ids)}
    if first or out.finished:
        m = out.metrics
        d["c"] = out.num_cached_tokens
        d["m"] = [
            m.arrival_time,
            m.first_scheduled_time,
            m.first_token_time,
            m.finish_time,
            m.num_preemptions,
        ]
    if out.finished:
        d.update(f=1, r=out.finish_reason, t=list(out.token_ids))
        if out.error is not None:
            d["err"] = error_to_wire(out.error)
    if out.new_logprobs is not None:
        d["lp"] = [[lp.token_id, lp.logprob, [list(t) for t in lp.top]] for lp in out.new_logprobs]
    return d


def logprobs_from_wire(data: list[Any] | None) -> tuple[TokenLogprob, ...] | None:
    if data is None:
        return None
    return tuple(
        TokenLogprob(int(tid), float(lp), tuple((int(a), float(b)) for a, b in top))
        for tid, lp, top in data
    )


def metrics_from_wire(m: list[Any]) -> RequestMetrics:
    return RequestMetrics(m[0], m[1], m[2], m[3], int(m[4]))


# -- errors ------------------------------------------------------------------------------------
def error_to_wire(exc: BaseException) -> dict[str, Any]:
    d: dict[str, Any] = {"type": type(exc).__name__, "message": str(exc)}
    param = getattr(exc, "param", None)
    if param is not None:
        d["param"] = param
    reason = getattr(exc, "reason", None)
    if reason is not None:
        d["reason"] = reason
    return d


def error_from_wire(data: dict[str, Any]) -> Exception:
    cls = _ERRORS.get(str(data.get("type")), engine_errors.EngineError)
    message = str(data.get("message", ""))
    if cls is engine_errors.PromptTooLong:
        return engine_errors.PromptTooLong(message, param=data.get("param"))
    if cls is engine_errors.PinRejected:
        return engine_errors.PinRejected(message, reason=data.get("reason"))
    return cls(message)


# -- cache stats and pins ----------------------------------------------------------------------
def stats_to_wire(stats: CacheStats) -> dict[str, int]:
    return dataclasses.asdict(stats)


def stats_from_wire(data: dict[str, Any]) -> CacheStats:
    return CacheStats(**{f.name: int(data[f.name]) for f in dataclasses.fields(CacheStats)})


def pin_to_wire(handle: PinHandle) -> dict[str, Any]:
    return {
        "pin_id": handle.pin_id,
        "namespace": handle.namespace,
        "block_ids": list(handle.block_ids),
        "num_tokens": handle.num_tokens,
        "tier": handle.tier,
    }


def pin_from_wire(data: dict[str, Any]) -> PinHandle:
    tier = str(data.get("tier", DEVICE))  # absent: a worker from before the host tier
    if tier not in PIN_TIERS:
        raise WireError(f"unknown pin tier: {tier!r}")
    return PinHandle(
        int(data["pin_id"]),
        str(data["namespace"]),
        tuple(int(b) for b in data["block_ids"]),
        int(data["num_tokens"]),
        tier,
    )
