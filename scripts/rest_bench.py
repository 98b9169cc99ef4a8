#!/usr/bin/env python3
"""The REST gateway under load, on the built-in demo feed (release build).

Scenarios (each on a relay of its own, started here and stopped by its process id):
- live:  100 clients, each asking the last trade and the last quote of 50 tickers the relay holds, once
         a second, over keep-alive connections: requests answered, the vendor's calls (goal 0), p50/p99.
- aggs:  50 clients ask the same day's minute bars at once, the demo vendor slowed to 200 ms an answer:
         the vendor's calls (goal 1).
- burst: 1,000 distinct history requests at once against a 5/min budget: what the vendor saw (at most
         5), how many got 429 with Retry-After, the slowest answer (none hangs).

The live scenario's clients are the C load generator (scripts/rest_load.c, built by scripts/rest_bench),
each client's second at its own offset (--together: all at the same instant); --loader python uses
asyncio clients instead (p50/p99 only, on the same cores).

Usage: scripts/rest_bench [--relay .build/release/relay] [--scenario live|aggs|burst|all] [--seconds 10]
                          [--clients 100] [--together] [--loader python]
"""
import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    def __init__(self, binary, *extra):
        self.port = free_port()
        self.root = tempfile.mkdtemp(prefix="rest-bench-")
        self.log = open(os.path.join(self.root, "relay.log"), "w")
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", f"127.0.0.1:{self.port}", "--no-tape", "--no-portfolio", "--data-dir", self.root, *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        deadline = time.time() + 30
        for line in self.process.stdout:
            if "relay is up" in line:
                break
            if time.time() > deadline:
                raise SystemExit("the relay did not start")

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def cpu_seconds(self):
        with open(f"/proc/{self.process.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Connection:
    """One keep-alive HTTP/1.1 connection: GET and read the whole answer."""

    def __init__(self, port):
        self.port = port
        self.reader = self.writer = None

    async def get(self, path):
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\nAuthorization: Bearer bench\r\n\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        if headers.get("connection", "").lower() == "close":
            self.writer.close()
            self.writer = None
        return status, headers, body


def metric(port, name):
    """The sum of a counter's series in /metrics."""
    import urllib.request
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? ([0-9.e+]+)$", text, re.M))


def quantile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def held_tickers(port, count):
    """Subscribes T.* and Q.* to learn the demo's tickers, then holds `count` of them by name."""
    import websockets
    async with websockets.connect(f"ws://127.0.0.1:{port}/stocks") as ws:
        await ws.recv()
        await ws.send(json.dumps({"action": "auth", "params": "bench"}))
        await ws.recv()
        await ws.send(json.dumps({"action": "subscribe", "params": "T.*"}))
        seen = set()
        deadline = time.time() + 15
        while len(seen) < count and time.time() < deadline:
            for event in json.loads(await ws.recv()):
                if event.get("ev") == "T":
                    seen.add(event["sym"])
    tickers = sorted(seen)[:count]
    holder = await websockets.connect(f"ws://127.0.0.1:{port}/stocks", max_size=None)
    await holder.recv()
    await holder.send(json.dumps({"action": "auth", "params": "bench"}))
    await holder.recv()
    await holder.send(json.dumps({"action": "subscribe", "params": ",".join(f"T.{t},Q.{t}" for t in tickers)}))

    async def drain():
        try:
            async for _ in holder:
                pass
        except Exception:
            pass
    return tickers, holder, asyncio.create_task(drain())


async def warm(port, tickers, seconds=20):
    """Waits (at most `seconds`) until the relay answers every asked path live: each held ticker traded
    and quoted once since it was subscribed, so the run measures the steady state, not the first
    quotes' upstream calls."""
    connection = Connection(port)
    pending = [path for ticker in tickers for path in (f"/v2/last/trade/{ticker}", f"/v2/last/nbbo/{ticker}")]
    deadline = time.time() + seconds
    while pending and time.time() < deadline:
        waiting = []
        for path in pending:
            _, headers, _ = await connection.get(path)
            if headers.get("x-relay-source") != "live":
                waiting.append(path)
        pending = waiting
        if pending:
            await asyncio.sleep(0.2)
    if pending:
        print(f"not live after {seconds} s: {pending[:5]}", file=sys.stderr)


async def live(binary, seconds, clients=100, loader=None, together=False):
    relay = Relay(binary)
    try:
        tickers, holder, drain = await held_tickers(relay.port, 50)
        await warm(relay.port, tickers)
        calls = metric(relay.port, "relay_rest_upstream_calls_total")
        cpu = relay.cpu_seconds()
        paths = [path for ticker in tickers for path in (f"/v2/last/trade/{ticker}", f"/v2/last/nbbo/{ticker}")]
        scenario = f"live: {clients} clients x (last trade + last quote) x 50 held tickers, once a second"
        if loader:
            # The C load generator: the answer times without a Python event loop sharing the cores.
            process = await asyncio.create_subprocess_exec(
                loader, str(relay.port), "bench", str(seconds), str(clients), *paths, stdout=asyncio.subprocess.PIPE,
                env={**os.environ, "REST_LOAD_TOGETHER": "1" if together else "0"})
            output, _ = await process.communicate()
            if process.returncode != 0:
                raise SystemExit("the C load generator failed")
            when = "all at the same instant of each second" if together else "each client at its own offset in the second"
            result = {"scenario": f"{scenario}, {when} (C load generator)", "asked_per_second": clients * len(paths), **json.loads(output)}
            result["vendor_calls"] = metric(relay.port, "relay_rest_upstream_calls_total") - calls
            result["relay_cpu_seconds"] = round(relay.cpu_seconds() - cpu, 2)
            result["relay_cpu_us_per_request"] = round(result["relay_cpu_seconds"] * 1e6 / max(result["requests"], 1), 1)
            drain.cancel()
            await holder.close()
            return result
        latencies, sources = [], {}
        stop = time.time() + seconds

        async def client():
            connection = Connection(relay.port)
            next_round = time.time()
            while time.time() < stop:
                for path in paths:
                    started = time.perf_counter()
                    status, headers, _ = await connection.get(path)
                    latencies.append(time.perf_counter() - started)
                    source = f"{status} {headers.get('x-relay-source')}"
                    sources[source] = sources.get(source, 0) + 1
                next_round += 1
                await asyncio.sleep(max(0, next_round - time.time()))

        started = time.time()
        await asyncio.gather(*(client() for _ in range(clients)))
        elapsed = time.time() - started
        result = {
            "scenario": scenario + " (Python clients)",
            "requests": len(latencies), "per_second": round(len(latencies) / elapsed), "asked_per_second": clients * len(paths),
            "answers": sources, "vendor_calls": metric(relay.port, "relay_rest_upstream_calls_total") - calls,
            "p50_ms": round(quantile(latencies, 0.5) * 1000, 2), "p99_ms": round(quantile(latencies, 0.99) * 1000, 2),
            "relay_cpu_seconds": round(relay.cpu_seconds() - cpu, 2), "seconds": round(elapsed, 1),
        }
        drain.cancel()
        await holder.close()
        return result
    finally:
        relay.stop()


async def aggs(binary):
    relay = Relay(binary, "--demo-rest-delay-ms", "200")
    try:
        calls = metric(relay.port, "relay_rest_upstream_calls_total")
        now = int(time.time() * 1000)
        path = f"/v2/aggs/ticker/AAPL/range/1/minute/{now - 3_600_000}/{now}"
        answers = await asyncio.gather(*(Connection(relay.port).get(path) for _ in range(50)))
        statuses = {}
        for status, headers, _ in answers:
            key = f"{status} {headers.get('x-relay-source')}"
            statuses[key] = statuses.get(key, 0) + 1
        return {"scenario": "aggs: 50 clients, the same day's minute bars at once (vendor answers in 200 ms)", "answers": statuses,
                "vendor_calls": metric(relay.port, "relay_rest_upstream_calls_total") - calls}
    finally:
        relay.stop()


async def burst(binary):
    relay = Relay(binary, "--rest-budget", "5/min")
    try:
        calls = metric(relay.port, "relay_rest_upstream_calls_total")
        now = int(time.time() * 1e9)
        connections = [Connection(relay.port) for _ in range(100)]
        latencies, statuses, retry = [], {}, []

        async def one(connection, index):
            for n in range(10):
                started = time.perf_counter()
                status, headers, _ = await connection.get(f"/v3/trades/AAPL?timestamp.gte={now - (index * 10 + n + 1) * 1_000_000_000}&limit=5")
                latencies.append(time.perf_counter() - started)
                statuses[status] = statuses.get(status, 0) + 1
                if status == 429:
                    retry.append(int(headers.get("retry-after", "0")))

        started = time.time()
        await asyncio.gather(*(one(c, i) for i, c in enumerate(connections)))
        return {"scenario": "burst: 1,000 distinct history requests at once, a 5/min budget", "answers": statuses,
                "vendor_calls": metric(relay.port, "relay_rest_upstream_calls_total") - calls,
                "retry_after_s": [min(retry), max(retry)] if retry else None, "slowest_ms": round(max(latencies) * 1000, 1),
                "seconds": round(time.time() - started, 2)}
    finally:
        relay.stop()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", default=".build/release/relay")
    parser.add_argument("--scenario", default="all", choices=["live", "aggs", "burst", "all"])
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--clients", type=int, default=100, help="the live scenario's clients")
    parser.add_argument("--loader", default=".build/rest_load",
                        help="the live scenario's C load generator (scripts/rest_load.c); 'python' for asyncio clients")
    parser.add_argument("--together", action="store_true",
                        help="the live scenario's clients all start each second at the same instant (default: spread over it)")
    args = parser.parse_args()
    results = []
    if args.scenario in ("live", "all"):
        loader = None if args.loader == "python" else args.loader
        results.append(asyncio.run(live(args.relay, args.seconds, args.clients, loader, args.together)))
    if args.scenario in ("aggs", "all"):
        results.append(asyncio.run(aggs(args.relay)))
    if args.scenario in ("burst", "all"):
        results.append(asyncio.run(burst(args.relay)))
    for result in results:
        print(json.dumps(result))


if __name__ == "__main__":
    sys.exit(main())
