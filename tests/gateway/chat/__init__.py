"""Tests of gateway/chat."""
