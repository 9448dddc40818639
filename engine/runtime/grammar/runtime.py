"""The runner's grammar side: per-request matchers (``matchers.py``) and the step's masks
(``masks.py``). One step::

    begin(rows)      sync every constrained row's matcher, start filling its mask (worker thread)
    forward          runs meanwhile
    sampler          PendingMask.wait() just before it reads the logits; masked rows sampled
    advance(tokens)  sampled tokens consumed; rows whose grammar ended are returned

A step with no constrained row does nothing here beyond noticing that (``begin`` returns None).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from llguidance import LLMatcher

from engine.constraints.compiler import CompileStats, compiler_for
from engine.params import SamplingParams
from engine.runtime.grammar.masks import MaskFiller, MaskStats, PendingMask
from engine.runtime.grammar.matchers import GrammarEnd, GrammarStates
from engine.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class GrammarStep:
    rows: list[tuple[int, LLMatcher]]  # (sampled-row index, its matcher)
    mask: PendingMask
    begin_seconds: float  # engine-thread time of begin (sync and hand-off)


@dataclass(frozen=True)
class GrammarStats:
    compile: CompileStats
    masks: MaskStats
    matchers: int  # live per-request records
    builds: int  # records built (requests, plus rebuilds after a preemption)


class GrammarRuntime:
    def __init__(
        self,
        tokenizer: Tokenizer,
        eos_token_ids: Sequence[int],
        vocab_size: int,
        device: torch.device,
    ) -> None:
        """``vocab_size``: the model's (the logits' width), which may pad the tokenizer's."""
        self.compiler = compiler_for(tokenizer)
        self._vocab = vocab_size
        self.states = GrammarStates(self.compiler, eos_token_ids)
        self._eos = tuple(eos_token_ids)
        self._device = device
        self._filler: MaskFiller | None = None  # built with the first constrained step
        self._idle = MaskStats()

    def begin(
        self,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        histories: Sequence[Sequence[int]],
        num_generated: Sequence[int],
    ) -> GrammarStep | None:
        """Start the step's masks; None (and no mask work) when no row is constrained."""
        if all(p.grammar is None for p in params):
            if len(self.states):
                self.states.sync(request_ids, params, histories, num_generated)  # drops all
            return None
        start = time.perf_counter()
        rows = self.states.sync(request_ids, params, histories, num_generated)
        pending = self.filler.start(rows, params)
        return GrammarStep(rows, pending, time.perf_counter() - start)

    def advance(
        self,
        step: GrammarStep,
        request_ids: Sequence[str],
        params: Sequence[SamplingParams],
        tokens: Sequence[int],
    ) -> dict[int, GrammarEnd]:
        start = time.perf_counter()
        ends = self.states.advance(request_ids, params, tokens, step.rows)
        spent = step.begin_seconds + time.perf_counter() - start
        self.filler.stats.host_seconds.append(spent)
        return ends

    @property
    def filler(self) -> MaskFiller:
        if self._filler is None:
            words = self.compiler.ll_tokenizer.vocab_size
            self._filler = MaskFiller(words, self._vocab, self._eos, self._device)
        return self._filler

    def stats(self) -> GrammarStats:
        masks = self._filler.stats if self._filler is not None else self._idle
        return GrammarStats(self.compiler.stats(), masks, len(self.states), self.states.builds)

    def check_integrity(self) -> None:
        self.states.check_integrity()
