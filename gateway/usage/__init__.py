"""The usage ledger: one record per authenticated chat request, spooled to a local append-only
file, written to the database in batches, rolled up per hour and day; prices, spend, budgets,
and the admin routes that read it (docs/operations.md: what is durable when)."""
