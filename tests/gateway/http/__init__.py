"""Tests of gateway/http."""
