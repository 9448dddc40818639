"""ModelRunner: loads a model, owns the paged KV cache, executes scheduled batches.

``execute(batch)`` runs one ragged forward over every request's new tokens and returns one
sampled token per request with ``sample=True`` (``None`` for the others), in batch order.

On CUDA, loading is: weights -> KV sizing (``profile_kv_bytes``: one step of maximum size) ->
KV cache -> ``warm_up`` (every Triton kernel variant compiled) -> ``capture_graphs`` (decode
CUDA graphs per batch bucket); only then does the engine exist and report ready.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.core.batch import FinalToken, Sampled, ScheduledBatch
from engine.core.kv.transfers import TransferPlan
from engine.outputs import TokenLogprob
from engine.params import SamplingParams
from engine.runtime.cuda_graphs import (
    Capture,
    DecodeGraphs,
    StaticInputs,
    cuda_capture,
    graph_buckets,
)
from engine.runtime.device import (
    bind_device,
    choose_dtype,
    choose_kv_dtype,
    describe,
    keep_freed_heap,
    release_freed_heap,
    resolve_device,
)
from engine.runtime.grammar.runtime import GrammarRuntime
from engine.runtime.kernels import check_step
from engine.runtime.kernels.cpu import qgemm
from engine.runtime.kernels.metadata import AttentionMetadata
from engine.runtime.model.config import ModelConfig
from engine.runtime.model.decoder import Decoder, KVCache
from engine.runtime.model.inputs import StepInputs, build_step_inputs
from engine.runtime.model.kv_memory import (
    allocate_kv_caches,
    block_bytes,
    kv_budget_bytes,
    profiled_kv_bytes,
    read_cuda_memory,
)
from engine.runtime.model.loader import load_model
from engine.runtime.sampling import Sampler
from engine.runtime.tiers.host_pool import HostKVPool
from engine.runtime.warmup import StepLimits, WarmupReport, profile_batch, run_warmup
from engine.text.errors import ModelLoadError
from engine.text.tokenizer import Tokenizer

log = logging.getLogger(__name__)
# EngineConfig.weights -> the activations of a linear whose weight is in GGUF blocks
ACTIVATIONS = {
    "auto": qgemm.FLOAT32,
    "dequantized": qgemm.FLOAT32,  # (no weight stays in blocks)
    "blocks-int16": qgemm.INT16,
    "blocks-int8": qgemm.INT8,
}

__all__ = ["ModelRunner", "resolve_device"]


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
        self.step_cost = model_config.step_cost()
        self.sampler = Sampler()  # carries per-request penalty counts between steps
        self.grammar = GrammarRuntime(tokenizer, self.eos_token_ids, self.vocab_size, device)
        per_block = block_bytes(model_config, config.block_size, kv_caches[0][0].dtype)
        host_blocks = config.host_kv_bytes // per_block
        self.host_pool = HostKVPool(kv_caches, host_blocks) if host_blocks else None
        self.num_host_blocks = host_blocks
        self.block_bytes = per_block
        self.graphs: DecodeGraphs | None = None  # captured by capture_graphs (CUDA)
        self.startup: dict[str, float] = {}  # seconds of warm-up and graph capture

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, config: EngineConfig | None = None
    ) -> ModelRunner:
        """``model_dir``: an HF model directory or a ``.gguf`` file."""
        config = config or EngineConfig()
        device = resolve_device(config.device)
        bind_device(device)  # Triton launches on the thread's current device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        blocks = config.weights != "dequantized" and qgemm.load() is not None
        gguf = Path(model_dir).is_file()  # load_model's rule: a file is a GGUF
        requested = choose_dtype(config.dtype, device, gguf=gguf)
        model = load_model(model_dir, requested, str(device), blocks)
        model_config, tokenizer = model.config, model.tokenizer
        dtype = choose_kv_dtype(config.kv_dtype, model.dtype, device)  # all but the linears
        log.info(describe(device, model.dtype, config.dtype, dtype, gguf=gguf))
        activations = ACTIVATIONS[config.weights]  # where a weight is in blocks
        decoder = Decoder(model_config, model.weights, dtype, str(device), activations=activations)
        del model  # the weights as loaded: the decoder holds what it uses
        if device.type == "cpu":
            release_freed_heap()  # what loading freed goes back to the OS
            keep_freed_heap()  # from here on, what steps free is kept for the next step
        per_block = block_bytes(model_config, config.block_size, dtype)
        if device.type == "cuda" and config.kv_cache_bytes is None:
            budget = profile_kv_bytes(config, model_config, decoder, device)
        else:
            budget = kv_budget_bytes(config, device)
        num_blocks = budget // per_block
        if num_blocks < 1:
            raise ModelLoadError(
                f"KV cache budget holds no block of {per_block} bytes "
                f"(block_size {config.block_size}); raise kv_cache_bytes or "
                "KVGATE_GPU_MEMORY_UTILIZATION"
            )
        kv = allocate_kv_caches(model_config, num_blocks, config.block_size, dtype, device)
        runner = cls(config, model_config, decoder, tokenizer, kv, device)
        if device.type == "cuda":
            runner.warm_up()
            if config.cuda_graphs:
                runner.capture_graphs()
        return runner

    def limits(self) -> StepLimits:
        return step_limits(self.config, self.model_config, self.num_blocks)

    def warm_up(self) -> WarmupReport:
        """Run the warm-up steps (every kernel variant compiled), then clear the KV cache."""
        report = run_warmup(self._forward_synced, self.limits())
        for k, v in self.kv_caches:
            k.zero_()
            v.zero_()
        log.info("warm-up: %d steps in %.1f s", report.steps, report.seconds)
        self.startup.update(warmup_s=report.seconds, warmup_steps=report.steps)
        return report

    def capture_graphs(self, capture: Capture | None = None) -> float:
        """Capture the decode CUDA graphs (``capture``: a test's stand-in); returns seconds."""
        start = time.perf_counter()
        buckets = graph_buckets(self.config.max_num_seqs)
        static = StaticInputs.allocate(
            max(buckets), self.max_model_len, self.block_size, self.device
        )
        graphs = DecodeGraphs(self._forward, static, buckets)
        graphs.capture(capture or cuda_capture(self.device))
        self.graphs = graphs
        seconds = time.perf_counter() - start
        self.startup.update(graphs_s=seconds, graph_buckets=len(buckets))
        log.info("CUDA graphs: %d decode buckets up to %d in %.1f s", len(buckets),
                 max(buckets), seconds)  # fmt: skip
        return seconds

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        return self.decoder.forward(input_ids, positions, meta, self.kv_caches, logits_indices)

    def _forward_synced(self, batch: ScheduledBatch) -> None:
        self.compute_logits(batch)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def transfer(self, plan: TransferPlan) -> int:
        """Copies between the device KV cache and the host tier, before the step's forward."""
        assert self.host_pool is not None, "transfer plan without a host tier"
        return self.host_pool.run(self.kv_caches, plan)

    def prepare(self, batch: ScheduledBatch) -> StepInputs:
        """The step's tensors, validated once for all layers (``check_step``)."""
        inputs = build_step_inputs(
            batch, self.block_size, self.num_blocks, self.max_model_len, self.device
        )
        k_cache, v_cache = self.kv_caches[0]
        meta = check_step(inputs.meta, k_cache, v_cache, int(inputs.input_ids.shape[0]))
        return replace(inputs, meta=meta)

    def compute_logits(self, batch: ScheduledBatch) -> tuple[StepInputs, torch.Tensor]:
        """Forward only: float32 logits of the sampling rows (tests compare these with HF)."""
        bind_device(self.device)  # steps may run on another thread than the load
        inputs = self.prepare(batch)
        return inputs, self._logits(inputs)

    def _logits(self, inputs: StepInputs) -> torch.Tensor:
        """Plain decode steps replay a CUDA graph when one was captured for their size."""
        logits = self.graphs.run(inputs) if self.graphs is not None else None
        if logits is None:
            logits = self._forward(
                inputs.input_ids, inputs.positions, inputs.meta, inputs.logits_indices
            )
        return logits

    def execute(self, batch: ScheduledBatch) -> list[Sampled | None]:
        """One token per sampling seq (a ``TokenLogprob`` when its request asked for logprobs; a
        ``FinalToken`` around it when the request's grammar ends there). The constrained rows'
        masks are computed on the host while the forward runs."""
        if batch.is_empty:
            return []
        bind_device(self.device)  # steps may run on another thread than the load
        inputs = self.prepare(batch)
        seqs = [batch.seqs[i] for i in inputs.sampled_seqs]
        ids = [s.request_id for s in seqs]
        params = [s.sampling for s in seqs]
        n_gen = [s.num_generated for s in seqs]
        histories = [s.history for s in seqs]
        grammar = self.grammar.begin(ids, params, histories, n_gen)
        logits = self._logits(inputs)
        mask = grammar.mask if grammar is not None else None
        result = self.sampler(logits, params, n_gen, histories, ids, mask)
        ends = {}
        if grammar is not None:
            ends = self.grammar.advance(grammar, ids, params, result.tokens)
        out: list[Sampled | None] = [None] * len(batch.seqs)
        logprobs = result.logprobs or [None] * len(seqs)
        rows = zip(inputs.sampled_seqs, result.tokens, logprobs, strict=True)
        for j, (i, token, lp) in enumerate(rows):
            value: int | TokenLogprob = token if lp is None else lp
            out[i] = FinalToken(value, ends[j]) if j in ends else value
        return out


def step_limits(config: EngineConfig, model: ModelConfig, num_blocks: int) -> StepLimits:
    return StepLimits(
        block_size=config.block_size,
        num_blocks=num_blocks,
        max_model_len=model.max_position_embeddings,
        max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_seqs=config.max_num_seqs,
        vocab_size=model.vocab_size,
        gqa_group=model.num_heads // model.num_kv_heads,
    )


def profile_kv_bytes(
    config: EngineConfig, model: ModelConfig, decoder: Decoder, device: torch.device
) -> int:
    """KV bytes within ``config.gpu_memory_utilization`` after one step of maximum size (forward
    and sampling) on a temporary cache just large enough for it."""
    bs = config.block_size
    limits = step_limits(config, model, num_blocks=1 << 30)
    batch = profile_batch(limits)
    num_blocks = sum(-(-seq.end_pos // bs) for seq in batch.seqs)
    limits = step_limits(config, model, num_blocks)
    batch = profile_batch(limits)
    kv = allocate_kv_caches(model, num_blocks, bs, decoder.dtype, device)
    inputs = build_step_inputs(batch, bs, num_blocks, model.max_position_embeddings, device)
    logits = decoder.forward(
        inputs.input_ids, inputs.positions, inputs.meta, kv, inputs.logits_indices
    )
    sampling = [SamplingParams(temperature=1.0, top_p=0.9, seed=0)] * logits.shape[0]
    Sampler()(logits, sampling, [0] * logits.shape[0])
    torch.cuda.synchronize(device)
    reading = read_cuda_memory(device, num_blocks * block_bytes(model, bs, decoder.dtype))
    del kv, logits
    torch.cuda.empty_cache()
    budget = profiled_kv_bytes(reading, config.gpu_memory_utilization)
    log.info(
        "KV sizing: %.2f GiB of %.2f GiB device memory at utilization %.2f (peak of a %d-token "
        "step %.2f GiB, other use %.2f GiB)", budget / 2**30, reading.total / 2**30,
        config.gpu_memory_utilization, config.max_num_batched_tokens,
        reading.torch_peak / 2**30, reading.non_torch / 2**30,
    )  # fmt: skip
    return budget
