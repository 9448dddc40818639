"""Tests of gateway/lifecycle."""
