"""Tests of gateway/telemetry."""
