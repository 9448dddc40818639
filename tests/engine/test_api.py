"""engine/api.py: the options object, its keyword form, the in-process pin ticket."""

from __future__ import annotations

import dataclasses
from typing import get_type_hints

import pytest

from engine.api import (
    DEFAULT_OPTIONS,
    GenerateFields,
    GenerateOptions,
    LocalPin,
    PinStatus,
)
from engine.core.kv import CacheScope, PinHandle, PriorityRange


def test_the_keyword_form_names_exactly_the_option_fields() -> None:
    fields = {f.name for f in dataclasses.fields(GenerateOptions)}
    assert set(get_type_hints(GenerateFields)) == fields


def test_keywords_replace_fields_of_the_given_options() -> None:
    scope = CacheScope(b"end-user", 4)
    base = GenerateOptions("tenant", "r1", interim=False)
    opts = GenerateOptions.of(base, cache_scope=scope, priorities=[PriorityRange(0, 4, 90)])
    assert opts == GenerateOptions("tenant", "r1", (PriorityRange(0, 4, 90),), False, scope)
    assert GenerateOptions.of(None) is DEFAULT_OPTIONS and GenerateOptions.of(base) is base
    assert hash(opts) == hash(dataclasses.replace(opts))  # a tuple, even from a list
    with pytest.raises(TypeError):
        GenerateOptions.of(base, tenant_weight=2)  # type: ignore[call-arg]


def test_a_local_pin_reports_its_handle() -> None:
    host = LocalPin("acme", PinHandle(3, "salt", (), 32, "host"))
    assert host.owner == "acme" and host.namespace == "salt"
    assert host.status() == PinStatus(0, 32, "host", None)
    device = LocalPin("acme", PinHandle(4, "salt", (1, 2), 32))
    assert device.status() == PinStatus(2, 32, "device", None)
