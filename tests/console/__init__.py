"""The admin console in a real browser."""
