#!/usr/bin/env python3
"""The gap fill under load: a release relay on a demo feed of 50 tickers (`relay demo-feed --tickers 40`
beside the 10 majors) at `--rate` events/s. One client holds 100 named topics (`T.` and `Q.` of every
ticker); a second one, in its own process, reads `Q.*` and measures live delivery latency (receive time
minus the event's `t`). The feed and the filling client run at `nice 10`, so that the live client's
latency is the relay's rather than two cores shared with the harness. After a calm spell the feed drops the relay's upstream for `--outage` seconds.

Prints one JSON line: the outage window, how long from the reconnect notice until the `recovered` status
(as the filling client saw it, and as the relay counted it), events recovered, whether complete, and
the live client's latency p50/p99 in the calm spell and from the reconnect until a second after the fill.

    python3 scripts/gap_fill_bench.py [--relay .build/release/relay] [--rate 6000] [--outage 60]
"""
import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import urllib.request

import websockets


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tickers():
    generated = []
    for index in range(40):
        letters, n = [], index
        for _ in range(3):
            letters.append(chr(65 + n % 26))
            n //= 26
        generated.append("Z" + "".join(reversed(letters)))
    return ["AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "AMD", "SPY", "QQQ"] + generated


def watch(url, stop, queue):
    """The live client: (receive ms, latency ms) of every quote, until `stop` is set."""
    async def run():
        samples = []
        async with websockets.connect(url, max_size=1 << 26) as ws:
            await ws.recv()
            await ws.send(json.dumps({"action": "auth", "params": "k"}))
            await ws.recv()
            await ws.send(json.dumps({"action": "subscribe", "params": "Q.*"}))
            while not stop.is_set():
                try:
                    raw = await asyncio.wait_for(ws.recv(), 1)
                except asyncio.TimeoutError:
                    continue
                now = time.time() * 1000
                for m in json.loads(raw):
                    if m.get("ev") == "Q" and "t" in m and not m.get("_r"):
                        samples.append((now, now - m["t"]))
        queue.put(samples)
    asyncio.run(run())


def percentile(values, q):
    if not values:
        return None
    values = sorted(values)
    return round(values[min(len(values) - 1, int(q * len(values)))], 1)


async def fill(url, feed, outage, calm):
    marks = {}
    recovered_events = 0
    async with websockets.connect(url, max_size=1 << 28) as ws:
        await ws.recv()
        await ws.send(json.dumps({"action": "auth", "params": "k"}))
        await ws.recv()
        await ws.send(json.dumps({"action": "subscribe", "params": ",".join(f"{e}.{t}" for t in tickers() for e in ("T", "Q"))}))
        marks["subscribed"] = time.time() * 1000
        async def read_until(status, timeout):
            nonlocal recovered_events
            end = time.time() + timeout
            while time.time() < end:
                try:
                    raw = await asyncio.wait_for(ws.recv(), 1)
                except asyncio.TimeoutError:
                    continue
                for m in json.loads(raw):
                    if m.get("_r"):
                        recovered_events += 1
                    if m.get("ev") == "status" and m.get("status") == status:
                        marks[status] = time.time() * 1000
                        return m
            return None
        await read_until("never", calm)
        request = urllib.request.Request(f"{feed}/faults/drop?seconds={outage}", method="POST", headers={"Authorization": "Bearer feed-key"})
        urllib.request.urlopen(request, timeout=10).read()
        marks["dropped"] = time.time() * 1000
        back = await read_until("upstream_reconnected", outage + 120)
        done = await read_until("recovered", 120)
        await read_until("never", 1)
        return marks, back, done, recovered_events


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", default=".build/release/relay")
    parser.add_argument("--rate", type=float, default=6000)
    parser.add_argument("--outage", type=float, default=60)
    parser.add_argument("--calm", type=float, default=15)
    args = parser.parse_args()
    feed_port, relay_port = free_port(), free_port()
    # The feed and the filling client run at a lower priority than the relay and the live client, so
    # that the live client's latency is the relay's, not two cores shared with the harness.
    feed = subprocess.Popen(["nice", "-n", "10", args.relay, "demo-feed", "--listen", f"127.0.0.1:{feed_port}", "--api-key", "feed-key", "--markets", "stocks",
                             "--rate", str(args.rate), "--tickers", "40", "--log-level", "error"])
    relay = subprocess.Popen([args.relay, "serve", "--listen", f"127.0.0.1:{relay_port}", "--upstream", f"ws://127.0.0.1:{feed_port}/stocks",
                              "--upstream-key", "feed-key", "--rest-url", f"http://127.0.0.1:{feed_port}", "--client-keys", "k",
                              "--no-portfolio", "--log-level", "warning"])
    try:
        time.sleep(3)
        url = f"ws://127.0.0.1:{relay_port}/stocks"
        queue, stop = multiprocessing.Queue(), multiprocessing.Event()
        watcher = multiprocessing.Process(target=watch, args=(url, stop, queue))
        watcher.start()
        os.nice(10)
        marks, back, done, recovered_events = asyncio.run(fill(url, f"http://127.0.0.1:{feed_port}", args.outage, args.calm))
        status = json.loads(urllib.request.urlopen(urllib.request.Request(
            f"http://127.0.0.1:{relay_port}/v1/status", headers={"Authorization": "Bearer k"}), timeout=10).read())
        stop.set()
        samples = queue.get(timeout=60)
        watcher.join()
        calm = [lat for at, lat in samples if marks["subscribed"] + 2000 <= at < marks["dropped"]]
        during = [lat for at, lat in samples if back and done and marks["upstream_reconnected"] <= at <= marks["recovered"] + 1000]
        last = (status["markets"][0].get("gapFill") or {}).get("last") or {}
        print(json.dumps({
            "outage_ms": (back or {}).get("gap_ms"),
            "reconnect_to_recovered_s": round((marks["recovered"] - marks["upstream_reconnected"]) / 1000, 2) if done and back else None,
            "relay_fill_s": round((last["endedAt"] - last["through"]) / 1000, 2) if last else None,
            "recovered": recovered_events, "complete": (done or {}).get("complete"), "topics": len((done or {}).get("topics", {})),
            "calm_p50_ms": percentile(calm, 0.5), "calm_p99_ms": percentile(calm, 0.99),
            "fill_p50_ms": percentile(during, 0.5), "fill_p99_ms": percentile(during, 0.99), "fill_samples": len(during),
        }))
    finally:
        for process in (relay, feed):
            process.terminate()
            process.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
