"""What a request's output must match: the grammar the sampler enforces (plain Python; no torch).

The gateway turns OpenAI's ``response_format`` and ``tools`` into one ``Grammar``; it travels in
``SamplingParams.grammar`` to whichever engine serves the request (a worker too: the worker
protocol encodes it as it is), where the grammar engine (engine/runtime/grammar/) compiles it
once per digest and masks the logits of the request's rows each step.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

# json_schema: ``source`` is a JSON Schema document (JSON text); lark: a Lark-syntax grammar in
# the grammar engine's dialect (``%json{...}`` embeds a schema); regex: the whole output.
GrammarKind = Literal["json_schema", "lark", "regex"]


@dataclass(frozen=True, slots=True)
class Grammar:
    kind: GrammarKind
    source: str

    @property
    def digest(self) -> str:
        """Identifies the compiled grammar (the compile cache's key on every engine)."""
        return hashlib.blake2b(f"{self.kind}\0{self.source}".encode(), digest_size=16).hexdigest()
