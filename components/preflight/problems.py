"""One problem pre-flight found: the pipeline parameter to change, and what is wrong with it and the fix."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    parameter: str
    message: str

    def __str__(self) -> str:
        return f"{self.parameter}: {' '.join(self.message.split())}"  # one line, whatever the cause's layout
