"""Per-request sampling parameters (plain Python; no torch)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.constraints import Grammar


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0.0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    seed: int | None = None  # per-request seed: same seed, same prompt -> same tokens
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_p: float = 0.0  # drop tokens whose probability is below min_p x the top probability
    # OpenAI penalties over the tokens generated so far (not the prompt), in [-2, 2]:
    # logit -= presence * (count > 0) + frequency * count
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # Multiplicative (CTRL / HF) penalty over prompt and generated tokens; 1.0 = off.
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias added to its logit)
    # None: no logprobs. k >= 0: the sampled token's logprob and the k most likely (k <= 20),
    # from the model's raw distribution (log-softmax of the logits, before any processing);
    # under a grammar, over the tokens it allows at that step (docs/contracts.md, Grammars).
    logprobs: int | None = None
    # The output must match it (engine/constraints.py); None: unconstrained.
    grammar: Grammar | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0.0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if self.repetition_penalty <= 0.0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.logprobs is not None and not 0 <= self.logprobs <= 20:
            raise ValueError(f"logprobs must be in [0, 20], got {self.logprobs}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0 or self.top_k == 1
