"""The takeover test's loss count (`pings.PingLog`), on ping's own output: what it counts as lost is
what it must (no root, no namespace: text in, sequence numbers out)."""

from __future__ import annotations

from tests.e2e.vpc.pings import FreshFlows, PingLog

OUTPUT = """\
PING 10.0.2.10 (10.0.2.10) 56(84) bytes of data.
[100.000200] 64 bytes from 10.0.2.10: icmp_seq=1 ttl=63 time=0.200 ms
[100.200300] 64 bytes from 10.0.2.10: icmp_seq=2 ttl=63 time=0.300 ms
[100.600000] no answer yet for icmp_seq=3
[100.800000] no answer yet for icmp_seq=4
[101.000100] 64 bytes from 10.0.2.10: icmp_seq=6 ttl=63 time=0.100 ms
[101.200100] 64 bytes from 10.0.2.10: icmp_seq=7 ttl=63 time=0.100 ms (DUP!)
[101.200200] 64 bytes from 10.0.2.10: icmp_seq=7 ttl=63 time=0.200 ms

--- 10.0.2.10 ping statistics ---
9 packets transmitted, 5 received, +1 duplicates, 44.4444% packet loss, time 1600ms
"""


def test_unanswered_requests_are_lost_from_their_send_time_on() -> None:
    log = PingLog.parse(OUTPUT)
    assert log.sent == 9
    assert log.answered == {1, 2, 6, 7}
    # 3 and 4 by their "no answer" lines; 5 has no line, its neighbour 4 dates it; 8 is lost; the
    # ninth, the last sent, may be in flight.
    assert log.lost_after(0.0) == [3, 4, 5, 8]
    assert log.lost_after(100.5) == [4, 5, 8]
    assert log.lost_after(101.0) == [8]


def test_a_ping_that_never_sent_loses_nothing_it_can_date() -> None:
    log = PingLog.parse("ping: connect: Network is unreachable\n")
    assert log.sent == 0 and log.lost_after(0.0) == []


def test_fresh_flows_count_unanswered_probes_after_a_time() -> None:
    flows = FreshFlows()
    flows.probes[("pod", "198.51.100.10")] = [(10.0, True), (10.2, False), (11.0, False)]
    assert flows.lost_after(10.5) == {("pod", "198.51.100.10"): [11.0]}
    assert flows.lost_after(0.0) == {("pod", "198.51.100.10"): [10.2, 11.0]}
