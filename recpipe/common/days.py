"""Days as the transform artifact counts them: integers, days since 1970-01-01 (a vocabulary
slot's last day seen), named 'YYYY-MM-DD' (the artifact's day, a run's --day)."""
from __future__ import annotations

import datetime as dt

__all__ = ["day_number", "day_name"]

_EPOCH = dt.date(1970, 1, 1).toordinal()


def day_number(day: str) -> int:
    """'YYYY-MM-DD' -> days since 1970-01-01."""
    return dt.date.fromisoformat(day).toordinal() - _EPOCH


def day_name(number: int) -> str:
    return dt.date.fromordinal(number + _EPOCH).isoformat()
