"""The cluster simulator (`python -m bench.cluster`, `make bench-cluster`): N ipamd nodes against one
EC2 account, in virtual time.

The model:

- **One account.** moto's EC2 backend, with ipamd's extension (`cloud.embedded.moto_ext`: prefixes,
  per-ENI and per-instance limits, subnet-wide address rules, DeleteOnTermination), in this process.
  N m5.large instances (3 ENIs of 10 IPv4 addresses) are launched in it, ten to a /20 subnet.
- **The account's API budget** (`front.AccountFront`): EC2's token buckets, shared by every node —
  non-mutating 100 tokens refilled at 20/s, mutating 200 at 5/s by default (`front.Ec2Budget`, where
  each limit is a parameter, per-action buckets an option). A request beyond the budget is refused
  with `RequestLimitExceeded` and counted; every request is counted by operation and outcome.
  Requests take `describe_latency_s` / `mutate_latency_s` of virtual time to answer; EC2 acts on
  arrival.
- **Real ipamd on every node** (`node`): the engine on a real SQLite state file (under /dev/shm when
  there is one), the pool manager, EC2 drift, IMDS hint, runtime leak GC and ENI GC, wired as the
  daemon wires them and run at the daemon's default intervals from `ipamd.config.settings.Config`; each node
  has its own `cloud.ec2.Boto3Ec2` adapter (client-side buckets, retries, error translation), whose
  boto3 client is replaced by `moto_client.MotoEc2Client`, which calls moto's backend directly. IMDS
  is read from moto's state without lag; the runtime is `ipamd.runtime.fake.FakeRuntime`.
- **Virtual time** (`vtime`): one asyncio event loop whose clock jumps to the next timer when nothing
  is ready, so every interval, cooldown, grace window, backoff and latency is virtual and an hour of
  cluster time takes seconds to minutes of CPU. All nodes share it; nothing waits on a thread.
- **Workloads** (`workload`, `sim`): pods scheduled onto ready nodes with room, each ADD retried every
  second while the node has no free address (the engine wakes the pool manager at once) until it
  succeeds or 30 minutes pass (then it failed for want of an address); DELs, 1 % of which never reach
  ipamd (the leak GC releases those). Runs: steady, a burst of pods onto an idle cluster, node churn
  (instances terminated, their pods rescheduled, fresh instances joining), steady in prefix mode,
  and a node subnet running dry while a tagged pod subnet takes over (`subnets_run`).
- **Checks** (`invariants`): every 15 minutes and at the end, each node's own invariants, every owned
  address on that node's ENIs in moto, no address owned twice in the cluster, no ENI leaked.
- **Report** (`report`): EC2 calls per node-hour by operation, throttled calls, time from the first
  ADD to an address (p50/p99/max, of the pods whose first ADD fell in the measured window) beside
  the least the account's budget allowed that workload (`bound`: no node-local policy obeying the
  targets could have made the longest wait shorter) and the p99 over it, ADDs failed for want of
  an address, invariant violations, the pool size against pods over time, and pods waiting over
  time in the run and under the bound, as `name: value` lines and JSON.

What it leaves out: IMDS lag and EC2's eventual consistency (drift and hint are exercised, but never
see a stale listing), concurrency inside a node beyond asyncio's (commits take no virtual time), and
the cost of the network round trips themselves (only their latency).
"""
