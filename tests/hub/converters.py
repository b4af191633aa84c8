"""A user converter for tests, loaded by import path like a user's own."""

from __future__ import annotations

from typing import Any


class ExplodeOn:
    """Raises on messages whose ``n`` equals ``value``: a buggy converter."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        if message.get("n") == self.value:
            raise ValueError(f"cannot convert n={self.value}")
        return message
