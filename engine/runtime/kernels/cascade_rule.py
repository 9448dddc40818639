"""When the engine uses cascade (shared-prefix) attention: a rule on batch sizes only.

No Triton here: the runner's warm-up plans cascade steps on machines without it.
"""

from __future__ import annotations

CASCADE_MIN_SHARED_TOKENS = 256
CASCADE_MIN_SAVED_TOKENS = 4096
CASCADE_MAX_QUERY_PER_SEQ = 64
# Keys per KV split, at least (both passes): every split writes an fp32 partial for every query
# row it covers (then read back by the merge); in the shared pass 32 requests x 7 heads per KV
# head write as many bytes per split as ~110 shared keys x Hkv read, so shorter splits would move
# more partial bytes than K/V bytes. A suffix that needs one split merges the shared partials
# itself: two launches in all.
MIN_SPLIT_KEYS = 256


def use_cascade(
    num_shared_blocks: int, block_size: int, num_seqs: int, num_query_tokens: int
) -> bool:
    """True when cascade attention is expected to beat per-request attention for this batch.

    Cascade saves re-reading the shared prefix: (num_seqs - 1) * S token rows of K and V. It costs
    one or two extra launches (a few microseconds) and an fp32 partial output + log-sum-exp per
    query row and split, written then merged. So it is chosen when

    * S >= CASCADE_MIN_SHARED_TOKENS (256): a shorter prefix is read faster than the extra
      launches and partials cost;
    * (num_seqs - 1) * S >= CASCADE_MIN_SAVED_TOKENS (4096 token rows, e.g. 2 requests x 4k or
      17 requests x 256): enough traffic is saved to pay for the merge;
    * num_query_tokens <= CASCADE_MAX_QUERY_PER_SEQ * num_seqs (64 new tokens per request on
      average): requests with long chunks already reuse each prefix tile across a whole query
      tile in the extend kernel and are compute bound, so sharing the reads gains little there.

    The thresholds are estimates from these byte counts, not yet calibrated on a GPU;
    ``kvgate bench kernels`` measures cascade vs per-request decode at 32 x 2,048 tokens.
    """
    shared_tokens = num_shared_blocks * block_size
    return (
        num_seqs >= 2
        and shared_tokens >= CASCADE_MIN_SHARED_TOKENS
        and (num_seqs - 1) * shared_tokens >= CASCADE_MIN_SAVED_TOKENS
        and num_query_tokens <= CASCADE_MAX_QUERY_PER_SEQ * num_seqs
    )
