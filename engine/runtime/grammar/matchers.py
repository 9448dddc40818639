"""Per-request grammar state: one llguidance matcher per constrained request (no torch).

A matcher has consumed exactly the request's generated tokens when its next mask is computed.
The runner keeps that true in two places:

- ``sync`` (before a step's mask): a record serves a request while the request's token list is
  the same list object, its prompt length unchanged and its grammar the same digest. It catches
  up by consuming the generated tokens it has not seen (a rebuilt record: all of them) and rolls
  back any it saw that the request no longer has. Records of requests not sampled in this step
  are dropped, like the penalty and bias records: a preempted request recomputes its K/V and,
  when it samples again, gets a fresh matcher that replays its generated tokens (microseconds
  per token), so preemption and recompute need no bookkeeping of their own.
- ``advance`` (after sampling): every sampled token of a constrained row is consumed, except one
  that ends the request anyway (an EOS id without ``ignore_eos``, a ``stop_token_ids`` entry).
  A matcher that is stopped after it (nothing but EOS may follow) ends the request with finish
  "stop"; one in an error state (a resource limit hit mid-output) ends it with the error.
"""

from __future__ import annotations

from collections.abc import Sequence

from llguidance import LLMatcher

from engine.constraints.compiler import CompiledGrammar, GrammarCompiler
from engine.params import SamplingParams


class _Record:
    __slots__ = ("compiled", "consumed", "gen_start", "history", "matcher")

    def __init__(self, compiled: CompiledGrammar, history: Sequence[int], n_gen: int) -> None:
        self.compiled = compiled
        self.matcher = compiled.matcher()
        self.history = history  # the request's own token list (append-only)
        self.gen_start = len(history) - n_gen  # prompt length
        self.consumed = 0  # generated tokens consumed so far

    def serves(self, digest: str, history: Sequence[int], n_gen: int) -> bool:
        return (
            digest == self.compiled.digest
            and history is self.history
            and len(history) - n_gen == self.gen_start
        )

    def catch_up(self, n_gen: int) -> None:
        """Consume (or roll back) until exactly ``n_gen`` generated tokens are consumed."""
        if self.consumed > n_gen:
            self.matcher.rollback(self.consumed - n_gen)
        elif self.consumed < n_gen:
            start = self.gen_start + self.consumed
            self.matcher.consume_tokens(list(self.history[start : self.gen_start + n_gen]))
        self.consumed = n_gen


# A row's end: None = the grammar is complete (finish "stop"), str = the matcher's error.
GrammarEnd = str | None


class GrammarStates:
    """The matchers of the requests being sampled, carried by the runner from step to step."""

    def __init__(self, compiler: GrammarCompiler, eos_token_ids: Sequence[int]) -> None:
        self.compiler = compiler
        self.eos_token_ids = frozenset(eos_token_ids)
        self._records: dict[str, _Record] = {}
        self.builds = 0  # records built (a statistic: once per request, again after a drop)

    def __len__(self) -> int:
        return len(self._records)

    def sync(
        self,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        num_generated: Sequence[int],
    ) -> list[tuple[int, LLMatcher]]:
        """(row, matcher) of every constrained row, each matcher caught up with its request's
        generated tokens. Records of requests not in these rows are dropped. Raises
        ``GrammarRejected`` for a grammar that does not compile (admission checks that first)."""
        live: dict[str, _Record] = {}
        rows: list[tuple[int, LLMatcher]] = []
        batch = zip(request_ids, params, histories, num_generated, strict=True)
        for i, (rid, p, hist, n) in enumerate(batch):
            if p.grammar is None:
                continue
            digest = p.grammar.digest
            record = self._records.get(rid)
            if record is None or not record.serves(digest, hist, n):
                record = _Record(self.compiler.compile(p.grammar), hist, n)
                self.builds += 1
            record.catch_up(n)
            live[rid] = record
            rows.append((i, record.matcher))
        self._records = live
        return rows

    def advance(
        self,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        tokens: Sequence[int],
        rows: Sequence[tuple[int, LLMatcher]],
    ) -> dict[int, GrammarEnd]:
        """Consume each constrained row's sampled token; the rows whose grammar ends here."""
        ends: dict[int, GrammarEnd] = {}
        for i, matcher in rows:
            p, token, rid = params[i], tokens[i], request_ids[i]
            if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
                self._records.pop(rid, None)  # the scheduler ends the request on this token
                continue
            ok = matcher.consume_token(token)
            self._records[rid].consumed += 1
            if not ok or matcher.is_error():
                ends[i] = matcher.get_error() or f"token {token} rejected by the grammar"
            elif matcher.is_stopped():
                ends[i] = None
            if i in ends:
                self._records.pop(rid, None)
        return ends

    def check_integrity(self) -> None:
        """Every record's matcher accepts its consumed tokens from the start state (replayed on
        a fresh matcher) and is in the same accepting / stopped state."""
        for rid, rec in self._records.items():
            start = rec.gen_start
            tokens = list(rec.history[start : start + rec.consumed])
            fresh = rec.compiled.matcher()
            assert fresh.consume_tokens(tokens), f"{rid}: tokens the grammar rejects"
            assert fresh.is_accepting() == rec.matcher.is_accepting(), f"{rid}: state drifted"
            assert fresh.is_stopped() == rec.matcher.is_stopped(), f"{rid}: state drifted"
