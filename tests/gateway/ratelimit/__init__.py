"""Tests of gateway/ratelimit."""
