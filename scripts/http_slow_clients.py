#!/usr/bin/env python3
"""What idle and slow HTTP clients cost a running pd-router (docs/benchmarks.md).

Opens N connections to the router's HTTP API and either leaves them silent ("idle") or sends
one byte of a never-ending request head to each every --interval seconds ("slow"). Reads the
router's threads and resident memory from /proc/<pid>/status before and with the connections
open, times a GET /health meanwhile, and prints one result line. Loopback only; raise the
shell's open-file limit first (ulimit -n) for thousands of connections.

  scripts/http_slow_clients.py --pid $(pgrep -n pd-router) --port 8000 --connections 1000 \
      --mode slow
"""
import argparse
import socket
import time


def proc_status(pid):
    fields = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            fields[key] = value.strip()
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0]) * 1024


def health(port):
    start = time.monotonic()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            reply = s.recv(64).decode(errors="replace")
            status = reply.split(" ")[1] if reply.startswith("HTTP/1.1 ") else "none"
    except OSError as e:
        status = f"error ({e.strerror})"
    return status, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--connections", type=int, default=1000)
    ap.add_argument("--mode", choices=["idle", "slow"], default="slow")
    ap.add_argument("--interval", type=float, default=5.0, help="seconds between bytes (slow)")
    ap.add_argument("--hold", type=float, default=10.0, help="seconds to hold them open")
    args = ap.parse_args()

    threads0, rss0 = proc_status(args.pid)
    socks = []
    head = b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    for i in range(args.connections):
        s = socket.create_connection(("127.0.0.1", args.port), timeout=30)
        s.setblocking(False)
        if args.mode == "slow":
            s.send(head[:1])
        socks.append(s)
    opened = time.monotonic()
    sent = 1
    closed = 0
    max_threads, max_rss = threads0, rss0
    while time.monotonic() < opened + args.hold:
        time.sleep(min(args.interval, 1.0))
        if args.mode == "slow" and time.monotonic() >= opened + sent * args.interval:
            byte = head[sent:sent + 1] or b"x"
            sent += 1
            for s in socks:
                try:
                    s.send(byte)
                except OSError:
                    pass
        threads, rss = proc_status(args.pid)
        max_threads, max_rss = max(max_threads, threads), max(max_rss, rss)
    status, seconds = health(args.port)
    for s in socks:  # the router writes only when it closes (408) or ends (FIN, reset)
        try:
            s.recv(1, socket.MSG_PEEK)
            closed += 1
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
        s.close()
    n = args.connections
    print(f"{args.mode} connections={n} threads {threads0} -> {max_threads} "
          f"({(max_threads - threads0) / n:.3f}/conn) rss {rss0 / 2**20:.1f} -> "
          f"{max_rss / 2**20:.1f} MiB ({(max_rss - rss0) / n / 1024:.1f} KiB/conn) "
          f"health {status} in {seconds * 1000:.0f} ms; closed by the router: {closed}")


if __name__ == "__main__":
    main()
