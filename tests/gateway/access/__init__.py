"""Tests of gateway/access."""
