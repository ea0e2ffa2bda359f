"""The ledger: what became of every span record, per sink, so nothing is lost silently.

Every record the pipeline drains is *offered* to each sink; each sink then reports it
*delivered* or *lost* with one reason from `REASONS`. Records lost before reaching any sink
(the hot path's full buffer, a worker killed before it sent its records) are lost for every
sink. So, per sink, once the pipeline has shut down::

    recorded = delivered + sum(lost.values()) + unconfirmed

"Unconfirmed" records were sent whole and the answer did not come before the deadline: the
collector may have them. They are said apart from the lost ones, never claimed lost.

Counting happens where records are drained or exported (a few additions per batch), never on
the training thread. `line` is the one line said at exit; `summary` goes into timers.json's
metadata (``otel_rl_ledger``).
"""

from __future__ import annotations

import threading
from typing import Protocol

__all__ = ["REASONS", "UNCONFIRMED", "Ledger", "Mirror"]

#: Not a loss: sent, no answer before the deadline (see the module's docstring).
UNCONFIRMED = "unconfirmed"

#: Why records did not reach a sink. "error" covers anything else (an exporter's bug).
REASONS = ("unreachable", "rejected", "timed out", "buffer full", "killed worker",
           "killed main", "disk full", "error", UNCONFIRMED)


class Mirror(Protocol):
    """Where a ledger copies its counts as they change (`mainledger.Mirror`: a shared file a
    surviving launcher reads when the process is killed); called under the ledger's lock."""

    def sinks(self, accounts: dict[str, _Account]) -> None: ...

    def account(self, account: _Account, lost: bool = False) -> None: ...

    def totals(self, ledger: Ledger, source: int | None = None) -> None: ...


class _Account:
    __slots__ = ("closed", "delivered", "detail", "index", "label", "lost", "offered", "sending",
                 "sending_at")

    def __init__(self, label: str, index: int) -> None:
        self.label = label
        self.index = index
        self.offered = 0
        self.delivered = 0
        #: Records of the request (or line) being sent now, not reported yet (`sending`).
        self.sending = 0
        #: A file sink's line being written now: its byte range in the file and what was
        #: delivered before it (a survivor looks at the file's size: `mainledger.count`).
        self.sending_at = (0, 0, 0)
        self.lost: dict[str, int] = {}
        #: One line per reason (the last seen) for the person reading the exit line.
        self.detail: dict[str, str] = {}
        #: Set once shutdown has settled this sink: what its thread reports later is ignored.
        self.closed = False


class Ledger:
    """Counts per sink; thread-safe (sinks report from their own threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sinks: dict[str, _Account] = {}
        #: Lost before reaching any sink: counts against every sink.
        self.upstream: dict[str, int] = {}
        self.upstream_detail: dict[str, str] = {}
        #: Losses that cannot be counted (a killed worker's last moments), said at exit.
        self.notes: list[str] = []
        #: Records handed in from other processes (workers' batches, cut-short copies), and
        #: of the upstream losses those never handed in (a killed worker's): with the
        #: process's own tally they say what it held when it died (`mainledger`).
        self.taken_in = 0
        self.outside = 0
        #: Of `taken_in`, per process id.
        self.sources: dict[int, int] = {}
        #: Under ``spans="auto"``: records the windows left out for good (never offered, not
        #: lost), and records they made up (continuations, window spans: offered, never
        #: recorded); so a survivor tells what the process held from what it left out.
        self.left_out = 0
        self.made_up = 0
        #: Records workers outside the process tree (Ray's) had reported recorded and not yet
        #: delivered here, as of their latest report; None: the run has no such workers.
        self.elsewhere: int | None = None
        #: Where every change is copied for a survivor to read (`mainledger.Mirror`), if any.
        self.mirror: Mirror | None = None

    def attach(self, mirror: Mirror) -> None:
        """Copy every count to `mirror` from now on (what was counted so far too)."""
        with self._lock:
            self.mirror = mirror
            mirror.sinks(self._sinks)
            for account in self._sinks.values():
                mirror.account(account, lost=True)
            mirror.totals(self)

    def add_sink(self, name: str, label: str) -> None:
        """Track sink `name`, shown as `label` (its endpoint or file)."""
        with self._lock:
            if name not in self._sinks:
                self._sinks[name] = _Account(label, len(self._sinks))
                if self.mirror is not None:
                    self.mirror.sinks(self._sinks)

    def offered(self, name: str, n: int) -> None:
        """`n` records were handed to sink `name`."""
        with self._lock:
            account = self._account(name)
            if not account.closed:
                account.offered += n
                if self.mirror is not None:
                    self.mirror.account(account)

    def delivered(self, name: str, n: int) -> None:
        with self._lock:
            account = self._account(name)
            if not account.closed:
                account.delivered += n
                account.sending = max(0, account.sending - n)
                if self.mirror is not None:
                    self.mirror.account(account)

    def recall(self, name: str, n: int, reason: str, detail: str) -> None:
        """`n` records counted delivered to `name` never arrived after all (a relaying
        worker's batches its parent died before reading): lost for `reason`."""
        with self._lock:
            account = self._account(name)
            if n <= 0 or account.closed:
                return
            account.delivered -= n  # (a send under way may report its delivery just after)
            account.lost[reason] = account.lost.get(reason, 0) + n
            account.detail[reason] = detail

    def sending(self, name: str, n: int, at: tuple[int, int] = (0, 0)) -> None:
        """`n` records are being sent to `name` now (a request, a line): until reported
        delivered or lost, a survivor reading the mirror calls them unconfirmed, unless `at`
        (a line's byte range in a file) lets it look."""
        with self._lock:
            account = self._account(name)
            if not account.closed:
                account.sending = n
                account.sending_at = (*at, account.delivered)
                if self.mirror is not None:
                    self.mirror.account(account)

    def taken(self, n: int, outside: int = 0, source: int | None = None,
              counted: bool = False) -> None:
        """`n` records were handed in from other processes (from process `source`, when
        known); `outside` upstream losses counted here were never records of this process
        (a killed worker's); `counted`: `source` died and its loss is counted here."""
        with self._lock:
            self.taken_in += n
            self.outside += outside
            if source is not None:
                self.sources[source] = -1 if counted else self.sources.get(source, 0) + n
            if self.mirror is not None:
                self.mirror.totals(self, source)

    def windowed(self, left_out: int, made_up: int) -> None:
        """The windows' running totals (see `left_out`, `made_up`), for the mirror."""
        with self._lock:
            self.left_out, self.made_up = left_out, made_up
            if self.mirror is not None:
                self.mirror.totals(self)

    def held_elsewhere(self, n: int | None) -> None:
        """Workers outside the process tree (Ray's) hold `n` records they reported and have not
        delivered yet: lost with this process if it is killed, since they deliver only to it
        (None: none deliver to it any more)."""
        with self._lock:
            self.elsewhere = n
            if self.mirror is not None:
                self.mirror.totals(self)

    def lost(self, reason: str, n: int, sink: str | None = None, detail: str = "") -> None:
        """`n` records did not reach `sink` (None: any sink) because of `reason`."""
        if n <= 0:
            return
        if reason not in REASONS:
            reason = "error"
        with self._lock:
            if sink is None:
                self.upstream[reason] = self.upstream.get(reason, 0) + n
                if detail:
                    self.upstream_detail[reason] = detail
                if self.mirror is not None:
                    self.mirror.totals(self)
                return
            account = self._account(sink)
            if account.closed:
                return
            account.lost[reason] = account.lost.get(reason, 0) + n
            account.sending = max(0, account.sending - n)
            if detail:
                account.detail[reason] = detail
            if self.mirror is not None:
                self.mirror.account(account, lost=True)

    def note(self, text: str) -> None:
        """A loss that cannot be counted, said in the exit line."""
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def settle(self, name: str, reason: str, detail: str = "", unconfirmed: int = 0) -> int:
        """Close sink `name`'s account: of what was offered and is neither delivered nor lost
        yet, `unconfirmed` were sent and await their answer, the rest is lost for `reason`
        (shutdown's deadline); later reports are ignored. Returns how many were lost."""
        with self._lock:
            account = self._account(name)
            if account.closed:
                return 0
            left = account.offered - account.delivered - sum(account.lost.values())
            unconfirmed = min(max(0, left), unconfirmed)
            if unconfirmed:
                account.lost[UNCONFIRMED] = account.lost.get(UNCONFIRMED, 0) + unconfirmed
                account.detail[UNCONFIRMED] = (f"{name}: {unconfirmed} span(s) sent, no answer "
                                               "before the shutdown deadline")
                left -= unconfirmed
            if left > 0:
                account.lost[reason] = account.lost.get(reason, 0) + left
                if detail:
                    account.detail[reason] = detail
            account.closed = True
            account.sending = 0
            if self.mirror is not None:
                self.mirror.account(account, lost=True)
            return max(0, left)

    def pending(self, name: str) -> int:
        """Records offered to `name` and not accounted for yet."""
        with self._lock:
            account = self._account(name)
            return account.offered - account.delivered - sum(account.lost.values())

    def _account(self, name: str) -> _Account:
        account = self._sinks.get(name)
        if account is None:
            account = self._sinks[name] = _Account(name, len(self._sinks))
            if self.mirror is not None:
                self.mirror.sinks(self._sinks)
        return account

    # -- what is said ------------------------------------------------------------------------
    def totals(self) -> dict[str, dict[str, object]]:
        """Per sink: recorded, delivered, lost (by reason, upstream losses included)."""
        with self._lock:
            upstream = dict(self.upstream)
            result: dict[str, dict[str, object]] = {}
            for name, account in self._sinks.items():
                lost = dict(upstream)
                for reason, n in account.lost.items():
                    lost[reason] = lost.get(reason, 0) + n
                pending = account.offered - account.delivered - sum(account.lost.values())
                unconfirmed = lost.pop(UNCONFIRMED, 0)
                result[name] = {
                    "sink": account.label,
                    "recorded": account.offered + sum(upstream.values()),
                    "delivered": account.delivered,
                    "lost": {reason: n for reason, n in lost.items() if n},
                    "pending": max(0, pending),
                }
                if unconfirmed:
                    result[name]["unconfirmed"] = unconfirmed
            return result

    def lost_most(self) -> int:
        """The most records any one sink misses (the upstream losses when there is none)."""
        totals = self.totals()
        if not totals:
            return sum(self.upstream.values())
        return max(sum(t["lost"].values()) for t in totals.values())  # type: ignore[attr-defined]

    def unconfirmed(self) -> int:
        """Records sent to some sink whose answer never came (the most of any sink)."""
        return max((int(t.get("unconfirmed", 0)) for t in self.totals().values()),  # type: ignore[call-overload]
                   default=0)

    def summary(self) -> dict[str, object]:
        """For timers.json (``otel_rl_ledger``): per sink totals, and losses before the sinks."""
        return {"sinks": self.totals(), "upstream": dict(self.upstream),
                "notes": list(self.notes)}

    def line(self) -> str | None:
        """The exit line: what was lost and where; None when every sink got everything."""
        totals = self.totals()
        worst = self.lost_most()
        if worst == 0 and not self.unconfirmed():
            return "; ".join(self.notes) or None
        parts = []
        for name, t in totals.items():
            lost: dict[str, int] = t["lost"]  # type: ignore[assignment]
            n = sum(lost.values())
            where = f"{name} {t['sink']}" if t["sink"] != name else name
            sent = int(t.get("unconfirmed", 0))  # type: ignore[call-overload]
            unsure = f", {sent} unconfirmed (sent, no answer before the deadline)" if sent else ""
            if n == 0 and not sent:
                parts.append(f"{where}: all {t['recorded']} delivered")
                continue
            if n == 0:
                parts.append(f"{where}: {t['delivered']} of {t['recorded']} delivered{unsure}")
                continue
            reasons = ", ".join(f"{reason} {count}" for reason, count in lost.items())
            parts.append(f"{where}: {n} of {t['recorded']} lost ({reasons}){unsure}")
        if not totals:
            reasons = ", ".join(f"{reason} {count}" for reason, count in self.upstream.items())
            parts.append(f"no sink: {reasons}")
        details = [d for d in self._details() if d] + list(self.notes)
        head = (f"{worst} span(s) were not exported" if worst else
                f"{self.unconfirmed()} span(s) were sent but not confirmed")
        text = f"{head}: " + "; ".join(parts)
        if details:
            text += " [" + "; ".join(details) + "]"
        return text

    def _details(self) -> list[str]:
        with self._lock:
            seen: list[str] = list(self.upstream_detail.values())
            for account in self._sinks.values():
                seen.extend(d for d in account.detail.values() if d not in seen)
            return seen
