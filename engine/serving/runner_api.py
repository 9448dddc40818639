"""What ``EngineCore`` needs of a model runner: the boundary between the step machine and the model.

``ModelRunner`` (engine/runtime/runner.py) implements it; so do the tests' runners
(tests/engine/_sched_helpers.py). The type checker holds ``ModelRunner`` to it wherever an engine
is built from one. A host tier is optional: a runner with one also has ``num_host_blocks`` and
``block_bytes`` (read with a default of 0).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from engine.core.batch import Sampled, ScheduledBatch
from engine.core.kv.transfers import TransferPlan
from engine.core.step_cost import StepCost

if TYPE_CHECKING:
    from engine.text.tokenizer import Tokenizer  # the runtime: loaded with the runner


class Runner(Protocol):
    @property
    def num_blocks(self) -> int:
        """KV blocks on the device (the prefix cache's pool)."""
        ...

    @property
    def max_model_len(self) -> int: ...

    @property
    def vocab_size(self) -> int: ...

    @property
    def eos_token_ids(self) -> Iterable[int]: ...

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def step_cost(self) -> StepCost:
        """What a scheduled chunk costs this model (its geometry): the fair share's unit."""
        ...

    def execute(self, batch: ScheduledBatch) -> Sequence[Sampled | None]:
        """One sampled token per sequence of ``batch`` (None where it does not sample)."""
        ...

    def transfer(self, plan: TransferPlan) -> int:
        """Perform the step's device <-> host copies; the microseconds they took."""
        ...
