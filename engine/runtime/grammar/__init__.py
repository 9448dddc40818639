"""Grammar-constrained decoding on llguidance.

Torch-free here (the gateway imports this package to check grammars before admission):
``check_grammar`` and the per-tokenizer compile cache (``compiler.py``). The runner's side,
which imports torch, is ``engine.runtime.grammar.runtime`` (per-request matchers in
``matchers.py``, the step's masks in ``masks.py``).
"""

from engine.runtime.grammar.compiler import (
    CompiledGrammar,
    CompileStats,
    GrammarCompiler,
    check_grammar,
    compiler_for,
)

__all__ = ["CompileStats", "CompiledGrammar", "GrammarCompiler", "check_grammar", "compiler_for"]
