"""Tests of gateway/admin."""
