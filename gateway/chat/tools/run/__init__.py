"""How the gateway runs one tenant tool call: egress-safe HTTP (``egress``), signed webhooks
(``webhook``), MCP servers (``mcp``, ``mcp_http``), a breaker per tool (``breaker``), the call
with its span, log line and metric (``runner``); and the budget soft-threshold webhooks, which
go out through the same egress (``budget_webhook``)."""
