"""Tools and structured outputs, one feature (docs/tools.md).

What a request's tools and output format become: request shapes (``models``), rules between
fields (``checks``), a model family's call format (``formats``), rendering for the template
(``render``), grammars (``grammar``, ``plan``, ``validate``), the calls parsed out of an answer
(``scanner``, ``parser``, ``answer``), a tenant's tools in its prefix (``tenant``); the loop of
the tenant tools the gateway runs (``loop``, ``stream``, ``continuation``) and how one call is
run (``run/``: egress, webhooks, MCP, breakers).
"""
