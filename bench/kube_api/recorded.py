"""What the test API server (`bench.kube_api.server`) records of each request, and the faults it
answers with instead of serving one."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.kube_api.paths import parse_target


@dataclass(slots=True)
class RecordedRequest:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    """Lower-case names."""
    body: bytes
    status: int | None = None
    """What was answered (None while a watch still streams)."""

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def is_watch(self) -> bool:
        return self.query.get("watch", "") in ("1", "true")

    @property
    def field_selector(self) -> str:
        return self.query.get("fieldSelector", "")

    @property
    def kind_plural(self) -> str:
        target = parse_target(self.path)
        return target.kind.plural if target is not None else ""


Match = Callable[[RecordedRequest], bool]


@dataclass(slots=True)
class Fault:
    status: int
    times: int | None
    retry_after_s: int = 0
    delay_s: float = 0.0
    match: Match | None = None

    def applies(self, request: RecordedRequest) -> bool:
        return (self.times is None or self.times > 0) and (
            self.match is None or self.match(request)
        )
