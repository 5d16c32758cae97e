"""Continuous pings from pods, and the replies they lost: the evidence that traffic went on while
something changed under it.

`Pings.start` runs one `ping -n -D -O -i 0.2 -W 1` per (pod, target) in the pod's network namespace
(`nsenter --net=`; nsenter execs ping, so the PID is ping's), its output in a file. `stop` sends
SIGINT (ping prints its summary) and parses every file: an echo request is lost when no reply names
its sequence number. Its send time is the reply's time less its RTT, or the "no answer yet" line's
time less the interval (`-O` prints that line when the next request goes out unanswered, `-D` the
Unix time). The last request sent before the stop may still be in flight and is not counted.
`Pings.close` kills whatever still runs, whatever happened.

A continuous ping is one flow: the kernel keeps its NAT and its connection mark whatever becomes
of the rules that made them. `FreshFlows` probes the rules themselves: a thread per (pod, target)
sends one `ping -c 1` after another (each a new ICMP id, so a new connection that the SNAT and
connmark rules of the moment decide) and records each probe's start time and whether it was
answered.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

INTERVAL_S = 0.2

_REPLY = re.compile(r"^\[(\d+\.\d+)\] \d+ bytes from .*icmp_seq=(\d+) .*time=([\d.]+) ms")
_NO_ANSWER = re.compile(r"^\[(\d+\.\d+)\] no answer yet for icmp_seq=(\d+)")
_SUMMARY = re.compile(r"^(\d+) packets transmitted, (\d+) received")


@dataclass(frozen=True, slots=True)
class PingLog:
    """One ping's outcome: per sequence number its send time, and which got a reply."""

    sent: int
    send_times: dict[int, float]
    answered: frozenset[int]

    @classmethod
    def parse(cls, text: str) -> PingLog:
        send_times: dict[int, float] = {}
        answered: set[int] = set()
        sent = 0
        for line in text.splitlines():
            if (reply := _REPLY.match(line)) is not None:
                at, seq, rtt_ms = float(reply[1]), int(reply[2]), float(reply[3])
                send_times[seq] = at - rtt_ms / 1000
                answered.add(seq)
            elif (missing := _NO_ANSWER.match(line)) is not None:
                send_times.setdefault(int(missing[2]), float(missing[1]) - INTERVAL_S)
            elif (summary := _SUMMARY.match(line)) is not None:
                sent = int(summary[1])
        return cls(sent, send_times, frozenset(answered))

    def lost_after(self, since: float) -> list[int]:
        """Requests sent at or after `since` (Unix time) without a reply, the last one excepted.
        A request with neither a reply nor a "no answer" line has no known send time: it counts
        when its neighbours say it went out after `since`."""
        lost = []
        for seq in range(1, self.sent):  # the last one may be in flight
            if seq in self.answered:
                continue
            at = self.send_times.get(seq)
            if at is None:
                before = [t for s, t in self.send_times.items() if s < seq]
                at = max(before) if before else None
            if at is None or at >= since:
                lost.append(seq)
        return lost


@dataclass
class Pings:
    workdir: Path
    processes: dict[tuple[str, str], subprocess.Popen[bytes]] = field(default_factory=dict)
    logs: dict[tuple[str, str], Path] = field(default_factory=dict)

    def start(self, source: str, netns: str, target: str) -> None:
        """`source` names the pod (for messages and the file), `netns` is its namespace's path."""
        path = self.workdir / f"ping-{source}-{target}.log"
        with path.open("wb") as out:
            self.processes[(source, target)] = subprocess.Popen(
                [
                    "nsenter",
                    f"--net={netns}",
                    "ping",
                    "-n",
                    "-D",
                    "-O",
                    "-i",
                    str(INTERVAL_S),
                    "-W",
                    "1",
                    target,
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.logs[(source, target)] = path

    def stop(self) -> dict[tuple[str, str], PingLog]:
        """SIGINT to every ping; their logs once each has printed its summary."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGINT)
        outcome = {}
        for key, process in self.processes.items():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            outcome[key] = PingLog.parse(self.logs[key].read_text(errors="replace"))
        self.processes.clear()
        return outcome

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
        self.processes.clear()


@dataclass
class FreshFlows:
    """One-shot pings in a loop per (pod, target), each a new connection, until `stop`."""

    probes: dict[tuple[str, str], list[tuple[float, bool]]] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, source: str, netns: str, target: str) -> None:
        record = self.probes.setdefault((source, target), [])
        argv = ["nsenter", f"--net={netns}", "ping", "-n", "-q", "-c", "1", "-W", "1", target]

        def loop() -> None:
            while not self._stop.is_set():
                at = time.time()
                done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
                record.append((at, done.returncode == 0))
                self._stop.wait(INTERVAL_S)

        thread = threading.Thread(target=loop, name=f"flows-{source}-{target}", daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> dict[tuple[str, str], list[tuple[float, bool]]]:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=30)
        self._threads.clear()
        return self.probes

    def close(self) -> None:
        self.stop()

    def lost_after(self, since: float) -> dict[tuple[str, str], list[float]]:
        """Per (pod, target), the start times of unanswered probes started at or after `since`."""
        return {
            key: [at for at, ok in record if at >= since and not ok]
            for key, record in self.probes.items()
        }
