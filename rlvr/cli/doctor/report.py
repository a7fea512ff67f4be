"""One line of `rlvr doctor`'s report."""

from __future__ import annotations

from dataclasses import dataclass

OK, MISSING, WARNING, ERROR = "ok", "missing", "warning", "error"
FAILING = (MISSING, ERROR)


@dataclass(frozen=True)
class Line:
    status: str
    item: str
    detail: str

    def __str__(self) -> str:
        return f"  {self.status:<8} {self.item:<22} {self.detail}"
