"""Grammar-constrained decoding on llguidance, the runner's side (imports torch): per-request
matchers (``matchers.py``), the step's masks (``masks.py``), the runner's entry
(``runtime.py``). Compiling a grammar, and the per-tokenizer compile cache, are torch-free and
shared with the gateway: engine/constraints/compiler.py.
"""
