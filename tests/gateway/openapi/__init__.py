"""Tests of gateway/openapi."""
