"""A tenant's prompt as tokens: its system prompt as its own token segment (``tenant_prefix``),
pinned in the engines (``pins``), large prompts and grammars prepared off the event loop
(``tokenize_pool``).
"""
