"""Tests of gateway/prompts."""
