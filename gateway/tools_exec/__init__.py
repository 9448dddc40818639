"""Tools the gateway runs for a tenant: egress-safe HTTP, webhooks, MCP, the tool loop."""
