"""The figures of a chaos run: `name: value` lines for stdout and the JSON document of `--json`."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from chaos.runner import Outcome


@dataclass(frozen=True, slots=True)
class Report:
    outcome: Outcome

    @property
    def injected(self) -> int:
        return sum(1 for r in self.outcome.results if r.injected)

    @property
    def survived(self) -> int:
        return sum(1 for r in self.outcome.results if r.survived)

    @property
    def lost(self) -> int:
        """Acknowledged ADDs found lost after any fault (each pod counted once)."""
        verdicts = [r.verdict for r in self.outcome.results] + [self.outcome.final]
        return len(set().union(*(v.lost for v in verdicts)))

    @property
    def double_owners(self) -> int:
        """Addresses found with two owners after any fault (each address counted once)."""
        verdicts = [r.verdict for r in self.outcome.results] + [self.outcome.final]
        return len(set().union(*(v.double_owners for v in verdicts)))

    @property
    def ok(self) -> bool:
        o = self.outcome
        return (
            self.survived == self.injected
            and self.lost == 0
            and self.double_owners == 0
            and not o.deferred_unreleased
            and o.final.ok
        )

    def by_kind(self) -> dict[str, dict[str, int]]:
        kinds: dict[str, dict[str, int]] = {}
        for r in self.outcome.results:
            counts = kinds.setdefault(r.kind, {"injected": 0, "survived": 0, "skipped": 0})
            counts["injected"] += r.injected
            counts["survived"] += r.survived
            counts["skipped"] += not r.injected
        return dict(sorted(kinds.items()))

    def during_by_kind(self) -> dict[str, dict[str, int]]:
        """Plugin outcomes while each kind of fault was on, summed over its occurrences."""
        during: dict[str, Counter[str]] = {}
        for r in self.outcome.results:
            during.setdefault(r.kind, Counter()).update(r.during)
        return {kind: dict(sorted(c.items())) for kind, c in sorted(during.items())}

    def figures(self) -> dict[str, Any]:
        o = self.outcome
        ready = [r.ready_s for r in o.results if r.ready_s is not None]
        return {
            "faults_injected": self.injected,
            "faults_survived": self.survived,
            "faults_skipped": sum(1 for r in o.results if not r.injected),
            "acknowledged_lost": self.lost,
            "double_owners": self.double_owners,
            "adds_acknowledged": o.ledger.adds_acknowledged,
            "dels_acknowledged": o.ledger.dels_acknowledged,
            "dels_deferred": o.ledger.outcomes["del:deferred"],
            "deferred_unreleased": len(o.deferred_unreleased),
            "adds_refused": sum(
                n for k, n in o.ledger.outcomes.items() if k.startswith("add:") and k != "add:ok"
            ),
            "daemon_starts": o.starts,
            "daemon_kills": o.kills,
            "daemon_exits_unexpected": len(o.exits),
            "ready_after_fault_max_s": round(max(ready, default=0.0), 3),
            "wall_s": round(o.wall_s, 1),
        }

    def to_json(self) -> dict[str, Any]:
        failures = [
            {"index": r.index, "kind": r.kind, "reasons": r.why_not()}
            for r in self.outcome.results
            if r.injected and not r.survived
        ]
        return {
            **self.figures(),
            "by_kind": self.by_kind(),
            "outcomes_during_fault": self.during_by_kind(),
            "outcomes": dict(sorted(self.outcome.ledger.outcomes.items())),
            "failures": failures,
            "final_problems": self.outcome.final.problems,
        }

    def lines(self) -> list[str]:
        out = [f"chaos_{name}: {value}" for name, value in self.figures().items()]
        for kind, counts in self.by_kind().items():
            out += [f"chaos_{kind}_{what}: {n}" for what, n in counts.items()]
        return out
