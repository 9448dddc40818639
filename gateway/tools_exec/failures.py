"""A tool call that did not give an answer the model can use: its code and details become the
``tool`` message (gateway/tools_exec/runner.py lists the codes)."""

from __future__ import annotations

import json
from typing import Any


class ToolFailure(Exception):
    def __init__(self, code: str, **details: Any) -> None:
        super().__init__(code)
        self.code = code
        self.details = details

    def content(self) -> str:
        return json.dumps({"error": self.code, **self.details})
