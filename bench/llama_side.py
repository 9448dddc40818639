"""llama.cpp's side of ``bench/cpu_peer.py``, run by an interpreter that has llama-cpp-python
(never kvgate's environment): ``python llama_side.py SPEC`` prints one JSON line of figures,
measured as ``bench/cpu_side.py`` measures kvgate's. Standard library and llama_cpp only."""

import json
import sys
import time


def rss_mb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def first_token(llm, tokens):
    """Seconds to the first greedy token; llama-cpp-python reuses the longest common prefix
    with the previous prompt (the tenant prompt stays in its context)."""
    t0 = time.perf_counter()
    gen = llm.generate(tokens, temp=0.0)
    next(gen)
    elapsed = time.perf_counter() - t0
    gen.close()
    return elapsed


def decode(llm, tokens, count):
    """Greedy tokens/s after the first token, EOS not stopping it."""
    gen = llm.generate(tokens, temp=0.0)
    next(gen)
    t0 = time.perf_counter()
    for _ in range(count - 1):
        next(gen)
    rate = (count - 1) / (time.perf_counter() - t0)
    gen.close()
    return rate


def main(spec):
    from llama_cpp import Llama

    before = rss_mb()
    start = time.perf_counter()
    llm = Llama(
        model_path=spec["model"],
        n_ctx=4096,
        n_threads=spec["threads"],
        n_threads_batch=spec["threads"],
        verbose=False,
    )
    startup = time.perf_counter() - start
    rss = rss_mb() - before
    system, turns = spec["system"], spec["turns"]
    first_token(llm, system + turns[-1])  # warm: the tenant prompt in its context
    ttft = sorted(first_token(llm, system + t) for t in turns[: spec["timed_turns"]])
    single = decode(llm, system + turns[spec["timed_turns"]], spec["decode_tokens"])
    return {
        "startup_s": startup,
        "rss_mb": rss,
        "ttft_s": ttft[len(ttft) // 2],
        "decode_tok_s": single,
        "aggregate_tok_s": single,  # one sequence at a time through this API
    }


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
