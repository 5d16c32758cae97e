"""The chaos runner (`make chaos`, `python -m chaos`): the daemon as a real process, under pod churn
through the real plugin, with faults on a schedule; each fault is judged once it is over.

The model. Faults must reach a daemon in another process, so the runner owns the daemon's whole world
and the daemon is started as `ipamd run` (not `--embedded`) pointed at it (`chaos.node`):

    ipamd-cni (a process per ADD/DEL) --unix socket--> ipamd run --HTTP--> Ec2FaultProxy --> moto
                                                           |  --HTTP--> ImdsSimulator (moto's state)
                                                           |  --gRPC--> CriServer (the pods)
                                                           '-- state dir: a tmpfs of its own

moto serves EC2 on loopback from this process; the daemon reaches it only through `Ec2FaultProxy`
(`AWS_EC2_ENDPOINT`), and reaches the IMDS simulator through `AWS_EC2_METADATA_SERVICE_ENDPOINT`. The
runner plays kubelet and the container runtime: it lists a pod's sandbox from just before its ADD until
its DEL succeeded, cleans up a failed ADD with a DEL, retries a failed DEL, and restarts the daemon when
it exits (`chaos.pods`, `chaos.daemon`).

Fault kinds (`chaos.faults`), in seeded rounds through every kind, each landing at a seeded instant
while ADDs and DELs are in flight: `kill` (SIGKILL, then a restart), `imds_stale` (addresses shown
late, hidden, kept after release, or the whole view frozen), `imds_errors` (500/503, tokens revoked),
`ec2_throttle` (503 `RequestLimitExceeded`), `ec2_5xx` (500 `InternalError`), `ec2_timeout` (forwarded,
answer held past the daemon's EC2 call deadline), `disk_full` (a ballast file fills the state tmpfs;
skipped, never counted survived, when no tmpfs can be mounted), `runtime_down` (the CRI server refuses
every call, or hangs past the daemon's deadline).

A fault is survived (`chaos.runner`) when it took effect (the daemon met it at least once), and once
cleared: `/readyz` answered 200 within the deadline, failed DELs went through on retry, a new ADD was
served, the daemon did not exit on its own, and `chaos.checks` held: every acknowledged ADD kept with
its address (API and state file), nothing owned by a container whose DEL was acknowledged, no address
with two owners, every owned address on the instance's ENIs in EC2. At the end, every DEL the plugin
reported done while ipamd was unreachable must have been released by the daemon's leak GC.

Output: `name: value` lines on stdout (`chaos_faults_injected`, `chaos_faults_survived`, per kind,
...), progress on stderr, `--json PATH` for the report; exit 1 unless everything held.
"""
