"""ModelRunner: loads a model, owns the paged KV cache, executes scheduled batches.

``execute(batch)`` runs one ragged forward over every request's new tokens and returns one
sampled token per request with ``sample=True`` (``None`` for the others), in batch order.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engine.batch import ScheduledBatch
from engine.config import EngineConfig
from engine.model.config import ModelConfig, ModelLoadError
from engine.model.decoder import Decoder, KVCache
from engine.model.inputs import StepInputs, build_step_inputs
from engine.model.kv_memory import allocate_kv_caches, block_bytes, kv_budget_bytes
from engine.model.loader import load_model
from engine.model.tokenizer import Tokenizer
from engine.outputs import TokenLogprob
from engine.sampling import Sampler


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ModelRunner:
    def __init__(
        self,
        config: EngineConfig,
        model_config: ModelConfig,
        decoder: Decoder,
        tokenizer: Tokenizer,
        kv_caches: list[KVCache],
        device: torch.device,
    ) -> None:
        self.config = config
        self.model_config = model_config
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.kv_caches = kv_caches
        self.device = device
        self.block_size = config.block_size
        self.num_blocks = int(kv_caches[0][0].shape[0])
        self.max_model_len = model_config.max_position_embeddings
        self.vocab_size = model_config.vocab_size
        self.eos_token_ids: tuple[int, ...] = tokenizer.eos_token_ids
        self.sampler = Sampler()  # carries per-request penalty counts between steps

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, config: EngineConfig | None = None
    ) -> ModelRunner:
        """``model_dir``: an HF model directory or a ``.gguf`` file."""
        config = config or EngineConfig()
        device = resolve_device(config.device)
        model = load_model(model_dir, config.dtype, str(device))
        model_config, dtype, tokenizer = model.config, model.dtype, model.tokenizer
        decoder = Decoder(model_config, model.weights, dtype, str(device))
        per_block = block_bytes(model_config, config.block_size, dtype)
        num_blocks = kv_budget_bytes(config, device) // per_block
        if num_blocks < 1:
            raise ModelLoadError(
                f"KV cache budget holds no block of {per_block} bytes "
                f"(block_size {config.block_size}); raise kv_cache_bytes"
            )
        kv = allocate_kv_caches(model_config, num_blocks, config.block_size, dtype, device)
        return cls(config, model_config, decoder, tokenizer, kv, device)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        return build_step_inputs(
            batch, self.block_size, self.num_blocks, self.max_model_len, self.device
        )

    def compute_logits(self, batch: ScheduledBatch) -> tuple[StepInputs, torch.Tensor]:
        """Forward only: float32 logits of the sampling rows (tests compare these with HF)."""
        inputs = self.prepare(batch)
        logits = self.decoder.forward(
            inputs.input_ids, inputs.positions, inputs.meta, self.kv_caches, inputs.logits_indices
        )
        return inputs, logits

    def execute(self, batch: ScheduledBatch) -> list[int | TokenLogprob | None]:
        """One token per sampling seq (a ``TokenLogprob`` when its request asked for logprobs)."""
        if batch.is_empty:
            return []
        inputs, logits = self.compute_logits(batch)
        seqs = [batch.seqs[i] for i in inputs.sampled_seqs]
        result = self.sampler(
            logits,
            [s.sampling for s in seqs],
            [s.num_generated for s in seqs],
            [s.history for s in seqs],
            [s.request_id for s in seqs],
        )
        out: list[int | TokenLogprob | None] = [None] * len(batch.seqs)
        logprobs = result.logprobs or [None] * len(seqs)
        for i, token, lp in zip(inputs.sampled_seqs, result.tokens, logprobs, strict=True):
            out[i] = token if lp is None else lp
        return out
