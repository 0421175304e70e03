"""Embedding lifecycle: how one day's run admits, keeps and evicts a vocabulary's values (pure, no Beam).

A vocabulary is a table of slots; a slot's position is the value's ID (its embedding row). The
state (VocabState), kept in the transform artifact's vocab/NAME.json, is per slot the value (None
for a free slot: its ID maps no value), the train rows counted since it was admitted and the last
day it was seen, plus the recent counts of values not admitted yet (`pending`).

Day t's run, from the previous day's state and day t's train counts (config `vocab`):
1. Keep or evict: a value seen on day t is kept (last seen = t, its count grows). A value whose last
   day seen is t - evict_unseen_days or earlier is evicted: its slot is freed, and its occurrences
   map to OOV until it is admitted again (possibly into another slot).
2. Admit: a value seen on day t that has no slot is admitted when its train rows over the last
   window_days days (day t and the pending counts of the days before) reach min_count.
3. Bound (max_size slots in all): kept values never lose their slot and never change ID. New values
   compete for the free slots, freed ones first (lowest ID first), then new IDs up to max_size, in
   order of their windowed count, ties by value. Losers stay pending.
4. Pending: what a value not admitted was seen on the days still inside tomorrow's window.
With window_days 1 and no eviction this is the plain incremental vocabulary (IDs of known values
never change; new values with count >= min_count appended, most frequent first, up to max_size).
Days are integers, days since 1970-01-01 (recpipe.common.days).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from recpipe.features.config import VocabSpec

__all__ = ["VocabState", "advance_vocabulary"]


@dataclass(frozen=True)
class VocabState:
    values: list[Optional[str]]                 # slot -> value; None: a free slot
    counts: list[int]                           # slot -> train rows since admitted (0 when free)
    last_seen: list[Optional[int]]              # slot -> last day seen (None when free or not known)
    pending: list[tuple[str, int, int]] = field(default_factory=list)  # (value, day, rows), not admitted
    day: Optional[int] = None                   # the day of the run that wrote it

    def live(self) -> int:
        """Slots holding a value."""
        return sum(v is not None for v in self.values)


def advance_vocabulary(prev: Optional[VocabState], today: Iterable[tuple[str, int]], day: Optional[int],
                       spec: VocabSpec) -> VocabState:
    """Day `day`'s vocabulary from the previous state (None: the first day) and the day's
    (value, train rows) counts; see the module docstring for the rules. `day` None: a run with no day
    (no dt= partition, no --day), only for a vocabulary that neither evicts nor admits over a window."""
    seen = {v: c for v, c in today if c > 0}
    values = list(prev.values) if prev else []
    counts = list(prev.counts) if prev else []
    last = list(prev.last_seen) if prev else []
    # the last day seen of values an older artifact did not date (eviction needs a day: preprocess.run_day)
    unknown_day = prev.day if prev is not None and prev.day is not None else day - 1 if day is not None else None
    known: dict[str, int] = {}
    for i, v in enumerate(values):
        if v is None:
            continue
        rows = seen.get(v, 0)
        if rows:
            last[i], counts[i] = day, counts[i] + rows
        elif spec.evict_unseen_days is not None and (last[i] if last[i] is not None else unknown_day) \
                <= day - spec.evict_unseen_days:
            values[i], counts[i], last[i] = None, 0, None
            continue
        known[v] = i
    earlier: dict[str, int] = {}
    for v, d, rows in (prev.pending if prev else []):
        if day - spec.window_days < d < day and v not in known:
            earlier[v] = earlier.get(v, 0) + rows
    fresh = [(v, rows + earlier.get(v, 0)) for v, rows in seen.items() if v not in known]
    eligible = sorted(((v, c) for v, c in fresh if c >= spec.min_count), key=lambda vc: (-vc[1], vc[0]))
    holes = [i for i, v in enumerate(values) if v is None]
    room = len(holes) + (max(spec.max_size - len(values), 0) if spec.max_size is not None else len(eligible))
    admitted = eligible[:room]
    for (v, c), i in zip(admitted, holes):
        values[i], counts[i], last[i] = v, c, day
    for v, c in admitted[len(holes):]:
        values.append(v)
        counts.append(c)
        last.append(day)
    taken = {v for v, _ in admitted}
    pending: list[tuple[str, int, int]] = []
    if spec.window_days > 1:  # what tomorrow's window (days > day + 1 - window_days) still needs
        pending = [(v, d, rows) for v, d, rows in (prev.pending if prev else [])
                   if day + 1 - spec.window_days < d < day and v not in known and v not in taken]
        pending += sorted((v, day, rows) for v, rows in seen.items() if v not in known and v not in taken)
    return VocabState(values, counts, last, pending, day)
