"""Tenant store: the source of truth for tenants, API keys, system prompts, limits and audit.

Entry points: ``tenants.store.TenantStore`` (one transaction per unit of work, change events
after commit), the session-taking functions in ``runtime`` / ``service`` / ``queries``,
``tenants.migrate`` (schema), ``tenants.events`` (EventBus, RedisEventBridge), ``tenants.cli``.
Importing this package has no side effects.
"""
