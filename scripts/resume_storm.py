#!/usr/bin/env python3
"""A reconnect storm: N tagged clients (KEY#tag) on a release relay's demo feed, each on one ticker's
quotes, all cut at once (reset), all reconnecting at once with their tags. Checks that every client's
topic sequence (`_s`) has no hole across the cut, and times how long until every client has its
`resumed` status.

    python3 scripts/resume_storm.py [--relay .build/release/relay] [--clients 1000]
"""
import argparse
import asyncio
import json
import socket
import struct
import subprocess
import sys
import time

import websockets


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client:
    def __init__(self, index, topic):
        self.tag = f"storm-{index}"
        self.topic = topic
        self.seen = []
        self.resumed_at = None
        self.ws = None

    async def connect(self, url):
        self.ws = await websockets.connect(url, max_size=1 << 26, open_timeout=60)
        await self.ws.recv()
        await self.ws.send(json.dumps({"action": "auth", "params": f"k#{self.tag}"}))
        await self.ws.recv()
        await self.ws.send(json.dumps({"action": "subscribe", "params": self.topic}))

    async def read(self, until):
        try:
            while time.monotonic() < until:
                raw = await asyncio.wait_for(self.ws.recv(), timeout=max(until - time.monotonic(), 0.01))
                for m in json.loads(raw):
                    if m.get("ev") == "status":
                        if m.get("status") == "resumed" and self.resumed_at is None:
                            self.resumed_at = time.monotonic()
                    elif "_s" in m:
                        self.seen.append(m["_s"])
        except (asyncio.TimeoutError, websockets.ConnectionClosed):
            pass

    def cut(self):
        # A reset, as a broken network or a killed process leaves it.
        sock = self.ws.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.ws.transport.abort()


async def storm(url, clients, tickers):
    group = [Client(i, f"Q.{tickers[i % len(tickers)]}") for i in range(clients)]
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.connect(url) for c in group[start:start + 100]))
    await asyncio.gather(*(c.read(time.monotonic() + 5) for c in group))
    for c in group:
        c.cut()
    cut_at = time.monotonic()
    await asyncio.sleep(0.5)
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.connect(url) for c in group[start:start + 100]))
    await asyncio.gather(*(c.read(time.monotonic() + 8) for c in group))
    missing = sum((max(c.seen) - min(c.seen) + 1) - len(set(c.seen)) for c in group if c.seen)
    duplicates = sum(len(c.seen) - len(set(c.seen)) for c in group)
    resumed = [c.resumed_at - cut_at for c in group if c.resumed_at]
    return {
        "clients": clients, "events": sum(len(c.seen) for c in group), "missing": missing, "duplicates": duplicates,
        "resumed": len(resumed), "all_resumed_within_s": round(max(resumed), 2) if resumed else None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", default=".build/release/relay")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=2000)
    args = parser.parse_args()
    port = free_port()
    relay = subprocess.Popen(
        [args.relay, "serve", "--listen", f"127.0.0.1:{port}", "--client-keys", "k", "--no-portfolio", "--demo-rate", str(args.rate),
         "--log-level", "error"])
    try:
        time.sleep(2)
        tickers = ["AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "JPM", "V", "SPY"]
        result = asyncio.run(storm(f"ws://127.0.0.1:{port}/stocks", args.clients, tickers))
        print(json.dumps(result))
        return 0 if result["missing"] == 0 and result["resumed"] == args.clients else 1
    finally:
        relay.terminate()
        relay.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
