"""Listings that stay bounded (`error list`, `task list`, `pr list`, `events`): rows are read a page at a time by
keyset (``WHERE key after the last row seen ... LIMIT page``, the same SQL on SQLite and PostgreSQL), so a listing's
memory does not grow with the number of rows, and ``limit`` rows at most are read (``None``: all of them).

``Listing.more`` says, once the rows are read, whether the limit left rows out (one extra row is asked for)."""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Iterator, Sequence

from agent import AgentError

PAGE = 500
DEFAULT_LIMIT = 100


class Listing:
    """``SELECT columns FROM source`` filtered by ``where`` (``(condition with one ?, value)`` pairs; a pair whose
    value is None or empty is left out), ordered by ``order``: one or two ``(sql expression, row key,
    descending)``; the last must be unique. ``tail``: the LAST ``limit`` rows of that order (still in that order),
    as `events` shows the newest events oldest first (one key only). ``convert``: applied to each row yielded."""

    def __init__(self, ledger, columns: str, source: str, where: Sequence[tuple[str, Any]],
                 order: Sequence[tuple[str, str, bool]], limit: int | None, tail: bool = False, page: int = PAGE,
                 convert: Callable[[dict], dict] | None = None):
        if tail and len(order) != 1:
            raise ValueError("a tail listing orders by one key")
        if limit is not None and limit < 1:
            raise ValueError("limit is None (all rows) or >= 1")
        self.ledger, self.columns, self.source = ledger, columns, source
        kept = [(cond, value) for cond, value in where if value is not None and value != ""]
        self.where, self.params = [c for c, _ in kept], [v for _, v in kept]
        self.order, self.limit, self.tail, self.page, self.convert = list(order), limit, tail, page, convert
        self.more = False

    def _sql(self, where: list[str], n: int, order=None, columns: str | None = None, offset: int = 0) -> str:
        order = order or self.order
        return (f"SELECT {columns or self.columns} FROM {self.source}"
                + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY " + ", ".join(f"{expr}{' DESC' if desc else ''}" for expr, _, desc in order)
                + f" LIMIT {int(n)}" + (f" OFFSET {int(offset)}" if offset else ""))

    def _after(self, row: dict) -> tuple[str, list]:
        """The condition for rows after ``row`` in this order (index-friendly: a range on the first key)."""
        (e1, k1, d1), *rest = self.order
        op1 = "<" if d1 else ">"
        if not rest:
            return f"{e1} {op1} ?", [row[k1]]
        (e2, k2, d2), = rest
        op2 = "<" if d2 else ">"
        return f"{e1} {op1}= ? AND ({e1} {op1} ? OR {e2} {op2} ?)", [row[k1], row[k1], row[k2]]

    def _start(self) -> tuple[list[str], list]:
        """For a tail: the condition to start at the ``limit``-th row from the end (and whether there are more)."""
        expr, key, desc = self.order[0]
        found = self.ledger.all(self._sql(self.where, 2, [(expr, key, not desc)], f"{expr} AS {key}",
                                          offset=int(self.limit) - 1), tuple(self.params))
        if not found:
            return [], []
        self.more = len(found) > 1
        return [f"{expr} {'<=' if desc else '>='} ?"], [found[0][key]]

    def __iter__(self) -> Iterator[dict]:
        left = self.limit
        where, params = list(self.where), list(self.params)
        if self.tail and left is not None:
            extra, values = self._start()
            where, params, left = where + extra, params + values, None
        after: tuple[str, list] | None = None
        while left is None or left > 0:
            n = self.page if left is None else (left + 1 if left <= self.page else self.page)  # +1: any more?
            cond, values = ([after[0]], after[1]) if after else ([], [])
            rows = self.ledger.all(self._sql(where + cond, n), tuple(params + values))
            if left is not None and len(rows) > left:
                self.more = True
                rows = rows[:left]
            yield from (map(self.convert, rows) if self.convert else rows)
            if len(rows) < n or not rows:
                return
            if left is not None:
                left -= len(rows)
            after = self._after(rows[-1])


def iter_events(ledger, task_id: int | None = None, since: str | None = None, limit: int | None = None) -> Listing:
    """Events in id order; with ``limit``, the newest ``limit`` of them (``since``: at or after that time)."""
    return Listing(ledger, "*", "events", [("task_id = ?", task_id), ("ts >= ?", since)], [("id", "id", False)],
                   limit, tail=True, convert=_payload)


def _payload(row: dict) -> dict:
    row["payload"] = json.loads(row["payload"] or "{}")
    return row


_RELATIVE = re.compile(r"(\d{1,6})\s*([smhdw])")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


def since_ts(text: str, now: datetime | None = None) -> str:
    """``--since``: a duration back from now (``30m``, ``6h``, ``2d``, ``1w``) or an ISO date/time (UTC unless it
    names a zone) as the ledger's sortable timestamp text."""
    value = text.strip()
    m = _RELATIVE.fullmatch(value)
    if m:
        at = (now or datetime.now(timezone.utc)) - timedelta(**{_UNITS[m[2]]: int(m[1])})
    else:
        try:
            at = datetime.fromisoformat(value.replace("Z", "+00:00") if value.endswith("Z") else value)
        except ValueError:
            raise AgentError(f"--since {text!r}: expected a duration (30m, 6h, 2d, 1w) or an ISO date/time "
                             "(2024-05-01, 2024-05-01T10:00)") from None
        at = at.replace(tzinfo=timezone.utc) if at.tzinfo is None else at.astimezone(timezone.utc)
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
