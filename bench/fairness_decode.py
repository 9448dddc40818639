"""``kvgate bench fairness --only decode``: a victim tenant's decode rate beside an attacker
decoding over a long cached context vs beside one with a short context.

Both tenants run closed loop with more requests than the engine has running slots
(``--decode-slots``), so both are backlogged and the fair scheduler decides how the slots and
steps are shared. The victim's prompts are short; every attacker prompt is one shared prefix of
``--decode-context`` tokens (computed once before the run, then attached from the prefix cache)
plus a short tail, against the same shape with a ``--decode-short-context`` prefix. Reported: the
victim's output tokens per second of engine step time over ``--decode-steps`` steps (after
``--decode-warmup``), and the same per unit of modelled cost (engine/core/step_cost.py). Each
pair runs twice in this invocation: the counters charging the model's cost (the engine as it
is) and charging one per token (what they did), ``--decode-repeats`` times interleaved; the
ratio long / short is what to read (the machine is shared: absolute times are noise; process
CPU time is reported beside wall time, less moved by other programs on the host).
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bench.common import cpu_isa, cpu_model, model_dir
from engine.core.batch import ScheduledBatch
from engine.core.step_cost import StepCost
from engine.params import SamplingParams
from engine.serving.engine import Engine

CHARGED = ("cost", "tokens")  # the counters' unit: the model's StepCost, or one per token


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--decode-context", type=int, default=5000, help="attacker's cached tokens")
    p.add_argument("--decode-short-context", type=int, default=64)
    p.add_argument("--decode-slots", type=int, default=16, help="max_num_seqs")
    p.add_argument("--decode-prompt", type=int, default=32, help="victim's prompt tokens")
    p.add_argument("--decode-output", type=int, default=16, help="output tokens per request")
    p.add_argument("--decode-warmup", type=int, default=24, help="steps before measuring")
    p.add_argument("--decode-steps", type=int, default=48, help="steps measured")
    p.add_argument("--decode-repeats", type=int, default=2)


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """The fairness runs' engine: CPU, float32, 4,096 KV blocks (of 128 K/V values per token
    and layer: the reference geometry's 2 KV heads of 64), the step budget of ``--budget``."""
    return {
        "block_size": args.block_size,
        "device": "cpu",
        "dtype": "float32",
        "kv_cache_bytes": 4096 * 2 * args.layers * args.block_size * 128 * 4,
        "max_num_batched_tokens": args.budget,
    }


def config(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "context": args.decode_context, "short_context": args.decode_short_context,
        "slots": args.decode_slots, "victim_prompt": args.decode_prompt, "attacker_tail": 16,
        "output": args.decode_output, "warmup_steps": args.decode_warmup,
        "steps": args.decode_steps, "repeats": args.decode_repeats,
        "requests_per_tenant": 2 * args.decode_slots, "cpu": cpu_model(), "isa": cpu_isa(),
    }  # fmt: skip


class Loop:
    """The two closed-loop tenants on one engine; ``step`` records what the victim got."""

    def __init__(self, args: argparse.Namespace, context: int, charged: str) -> None:
        self.eng = Engine.from_pretrained(
            model_dir(args.layers, args.model_dir),
            **engine_options(args),
            max_num_seqs=args.decode_slots,
        )
        fair = self.eng.scheduler.fair
        self.model_cost = fair.cost
        if charged == "tokens":
            fair.cost = StepCost()  # the counters as they were: one per computed token
        self.args = args
        self.rng = random.Random(context)
        self.prefix = self._ids(context)
        self.params = SamplingParams(max_tokens=args.decode_output, ignore_eos=True)
        self.eng.generate([self.prefix], SamplingParams(max_tokens=1), namespace="attacker")
        self.modelled: dict[str, float] = {}
        self.count = itertools.count()

    def _ids(self, n: int) -> list[int]:
        return [self.rng.randrange(10, 150_000) for _ in range(n)]

    def submit(self, tenant: str) -> None:
        tail = self._ids(self.args.decode_prompt if tenant == "victim" else 16)
        ids = tail if tenant == "victim" else self.prefix + tail
        rid = f"{tenant}-{next(self.count)}"
        self.eng.add_request(ids, self.params, namespace=tenant, request_id=rid, tenant=tenant)

    @contextmanager
    def costed(self) -> Iterator[None]:
        """Adds the modelled cost of each scheduled chunk to its tenant's entry in ``modelled``
        (whatever the counters charge)."""
        sched = self.eng.scheduler
        schedule = sched.schedule

        def wrapped() -> ScheduledBatch:
            batch = schedule()
            for s in batch.seqs:
                tenant = s.request_id.split("-")[0]
                cost = self.model_cost.chunk(s.start_pos, len(s.token_ids), s.sample)
                self.modelled[tenant] = self.modelled.get(tenant, 0.0) + cost
            return batch

        sched.schedule = wrapped  # type: ignore[method-assign]
        try:
            yield
        finally:
            sched.schedule = schedule  # type: ignore[method-assign]

    def step(self) -> tuple[float, float, int]:
        """One engine step: its wall and process CPU seconds, the victim's tokens; finished
        requests replaced."""
        t0, c0 = time.perf_counter(), time.process_time()
        outs = self.eng.step()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        got = 0
        for out in outs:
            tenant = out.request_id.split("-")[0]
            got += len(out.new_token_ids) if tenant == "victim" else 0
            if out.finished:
                self.submit(tenant)
        return wall, cpu, got

    def served(self) -> dict[str, int]:
        """Tokens the engine computed for each tenant so far."""
        return {t: s.served_tokens for t, s in self.eng.scheduler.fair.tenants.items()}

    def run(self) -> dict[str, Any]:
        args = self.args
        for _ in range(2 * args.decode_slots):
            self.submit("victim")
            self.submit("attacker")
        for _ in range(args.decode_warmup):
            self.step()
        seconds, cpu_seconds, tokens = 0.0, 0.0, 0
        before = self.served()
        with self.costed():
            for _ in range(args.decode_steps):
                wall, cpu, got = self.step()
                seconds, cpu_seconds, tokens = seconds + wall, cpu_seconds + cpu, tokens + got
        after = self.served()
        return {
            "victim_tok_s": tokens / seconds,
            "victim_tok_per_cpu_s": tokens / cpu_seconds,
            "victim_tokens_per_cost": tokens / sum(self.modelled.values()),
            "victim_rows_per_step": tokens / args.decode_steps,
            "seconds": round(seconds, 2),
            "cpu_seconds": round(cpu_seconds, 2),
            "served_tokens": {t: after[t] - before[t] for t in after},
            "modelled_cost": {t: round(c) for t, c in self.modelled.items()},
        }


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """Every (charged, context) pair ``--decode-repeats`` times, interleaved; per charged unit
    the victim's rate beside the long context over its rate beside the short one (median,
    min-max over the repeats), in seconds, in CPU seconds and in modelled cost."""
    contexts = {"short": args.decode_short_context, "long": args.decode_context}
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {k: [] for k in contexts} for c in CHARGED
    }
    for _ in range(args.decode_repeats):
        for charged in CHARGED:
            for name, context in contexts.items():
                run = Loop(args, context, charged).run()
                runs[charged][name].append(run)
                print(f"decode {charged} {name}: {run}", flush=True)
    out: dict[str, Any] = {}
    for charged, pair in runs.items():
        out[charged] = {
            "long_over_short_tok_s": _ratios(pair, "victim_tok_s"),
            "long_over_short_tok_per_cpu_s": _ratios(pair, "victim_tok_per_cpu_s"),
            "long_over_short_modelled": _ratios(pair, "victim_tokens_per_cost"),
            "runs": pair,
        }
        print(f"decode {charged}: { ({k: v for k, v in out[charged].items() if k != 'runs'}) }")
    return out


def _ratios(pair: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any]:
    ratios = sorted(
        long[key] / short[key] for short, long in zip(pair["short"], pair["long"], strict=True)
    )
    return {"median": round(statistics.median(ratios), 3), "min_max": [ratios[0], ratios[-1]]}


def goals(res: dict[str, Any]) -> dict[str, Any]:
    """The victim's decode rate beside the long context over beside the short one (median over
    the repeats; the goal: at least 0.8 in wall seconds), per unit the counters charge."""
    if "decode" not in res:
        return {}
    out: dict[str, Any] = {}
    for charged in CHARGED:
        got = res["decode"][charged]
        for key, name in (("tok_s", ""), ("tok_per_cpu_s", "_cpu"), ("modelled", "_modelled")):
            out[f"decode_{charged}_charged_long_over_short{name}"] = got[f"long_over_short_{key}"][
                "median"
            ]
    out["decode_at_least_0_8"] = out["decode_cost_charged_long_over_short"] >= 0.8
    return out
