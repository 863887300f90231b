"""``make soak``: minutes of mixed traffic with random faults; the proxy must end where it began.

Four simulated nodes (every dialect each, in this process) behind the real ``twistd -n
nvpair-proxy --fleet``; clients in this process drive all three facades while faults come and go
on the simulated engines; samples of the proxy's RSS, fds, in-flight count and reservations are
taken every 10 s and judged against a quiet baseline after warm-up. Loopback only.
"""
