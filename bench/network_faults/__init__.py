"""A secure training over a faulty network, emulated in userspace (issue 12, network faults).

``tc netem`` is not available on the machine this was written on (``sch_netem`` is an
unknown qdisc), so each worker talks to the service through its own asyncio TCP proxy on
loopback, which can:

- **delay**: hold every chunk it forwards (one ``read()`` of up to 64 KiB, either direction)
  for a fixed one-way delay (100 ms), in order, pipelined (latency, not bandwidth); a new
  connection's first request waits one more round trip (the TCP handshake's);
- **loss** (modelled, not real): each new connection stalls with probability ``loss`` for the
  initial retransmission timeout of a lost SYN (1 s, RFC 6298), and each forwarded chunk
  stalls with probability ``loss`` for one data retransmission timeout (0.4 s: Linux's
  SRTT + max(4 RTTVAR, 200 ms) at the emulated 200 ms round trip); a stalled chunk holds the
  chunks behind it (TCP's in-order delivery);
- **partition**: for ``--partition-seconds`` the proxy of one worker forwards nothing and
  connects nothing upstream, then recovers. ``hold``: connections stay open and their bytes
  are delivered when the partition ends, as TCP retransmission would deliver them, at once
  (real TCP's backed-off retransmission timer could add up to the length of the outage again);
  a new connection is accepted by the kernel where a real partition would let it time out.
  ``refuse``: the proxy stops listening and resets its open connections (what a dead or
  restarting middlebox, or a peer answering with RST / "connection refused", looks like), so
  every request fails at once and the workers' retry policy is what rides through or gives up.

It cannot emulate real packet loss (retransmissions, congestion-window collapse), reordering,
duplication or bandwidth limits: every byte still crosses loopback at loopback speed.

Scenarios: ``clean`` (the proxies forward without faults), ``delay-loss`` (delay and loss on
every worker's proxy), ``delay-loss-partition`` (the same plus a ``hold`` partition of worker 1
once the session is half-way through its passes) and ``delay-loss-partition-refuse`` (the same
with a ``refuse`` partition; a worker that gives up with exit code 4 is started again with the
same command once the partition is over, as docs/deploy.md says to). Each runs ``glasu
serve``, ``glasu session create`` (CKKS and DP on, Cora, 3 clients) and three ``glasu worker``
processes, and records whether every worker finished, how the others ended (exit code and
message), the wall time from the workers' start to the last exit (and of the training phase:
from the last worker's first pass request to the last exit), and their ratios to the clean run.
Results go to bench/results/network_faults.json and the "network-faults" section of docs/results.md.

    .venv/bin/python -m bench.network_faults                 # --rounds 10, 30 s partition
    .venv/bin/python -m bench.network_faults --quick         # 4 rounds, 10 s partition
"""
