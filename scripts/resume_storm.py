#!/usr/bin/env python3
"""A reconnect storm: N tagged clients (KEY#tag) on a release relay's demo feed, each on one ticker's
quotes, all cut at once (reset), all reconnecting at once with their tags. Checks that every client's
topic sequence (`_s`) has no hole across the cut, and times how long until every client has its
`resumed` status.

    python3 scripts/resume_storm.py [--relay .build/release/relay] [--clients 1000]

With `--url` it storms a relay already running (the fanbench one of `scripts/storm_under_load`):
`--busy` clients take quotes of fanbench's symbols (`Q.S00000`…, 500 a second each), the rest take
their trades, which fanbench never publishes (a Python reader cannot take 1,000 × 500 frames a second
on two cores beside the bench), and `--settle` seconds pass before the cut.
"""
import argparse
import asyncio
import base64
import json
import os
import socket
import struct
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Client(asyncio.Protocol):
    """A minimal WebSocket client on an asyncio protocol: each chunk the event loop reads from the
    socket is parsed at once, so at the cut the process holds nothing it has not counted, as after a
    network break (the websockets library, or a slow reader's socket buffer, would hold received and
    unread events that a reset throws away: events the relay rightly considers delivered)."""

    def __init__(self, index, topic):
        self.tag = f"storm-{index}"
        self.topic = topic
        self.seen = []
        self.resumed_at = None
        self.statuses = {}
        self.transport = None
        self.buffer = b""
        self.upgraded = False
        self.changed = None

    async def connect(self, url, key):
        address, path = url.removeprefix("ws://").split("/", 1)
        host, port = address.rsplit(":", 1)
        self.buffer, self.upgraded, self.changed = b"", False, asyncio.Event()
        await asyncio.get_running_loop().create_connection(lambda: self, host, int(port))
        request = (f"GET /{path} HTTP/1.1\r\nHost: {address}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                   f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n\r\n")
        self.transport.write(request.encode())
        await self.statuses_reach("connected", self.statuses.get("connected", 0) + 1)
        self.send({"action": "auth", "params": f"{key}#{self.tag}"})
        await self.statuses_reach("auth_success", self.statuses.get("auth_success", 0) + 1)
        self.send({"action": "subscribe", "params": self.topic})

    async def statuses_reach(self, status, count):
        while self.statuses.get(status, 0) < count:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), timeout=60)

    def send(self, message):
        payload, mask = json.dumps(message).encode(), os.urandom(4)
        assert len(payload) < 126
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.transport.write(bytes([0x81, 0x80 | len(payload)]) + mask + masked)

    def connection_made(self, transport):
        self.transport = transport

    def data_received(self, data):
        self.buffer += data
        if not self.upgraded:
            head, separator, rest = self.buffer.partition(b"\r\n\r\n")
            if not separator:
                return
            self.upgraded, self.buffer = True, rest
        while len(self.buffer) >= 2:
            opcode, length, offset = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F, 2
            if length == 126:
                length, offset = struct.unpack_from("!H", self.buffer, 2)[0], 4
            elif length == 127:
                length, offset = struct.unpack_from("!Q", self.buffer, 2)[0], 10
            if len(self.buffer) < offset + length:
                return
            payload, self.buffer = self.buffer[offset:offset + length], self.buffer[offset + length:]
            if opcode == 0x1:
                self.on_frame(payload)

    def on_frame(self, payload):
        for m in json.loads(payload):
            if m.get("ev") == "status":
                self.statuses[m.get("status")] = self.statuses.get(m.get("status"), 0) + 1
                if m.get("status") == "resumed" and self.resumed_at is None:
                    self.resumed_at = time.monotonic()
                self.changed.set()
            elif "_s" in m:
                self.seen.append(m["_s"])

    def connection_lost(self, exc):
        self.changed.set()

    def cut(self):
        # A reset, as a broken network or a killed process leaves it.
        sock = self.transport.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


async def storm(url, key, clients, topics, settle):
    group = [Client(i, topics(i)) for i in range(clients)]
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.connect(url, key) for c in group[start:start + 100]))
    await asyncio.sleep(settle)
    for c in group:
        c.cut()
    cut_at = time.monotonic()
    print(json.dumps({"cut_at_unix": round(time.time(), 3)}), flush=True)
    await asyncio.sleep(0.5)
    for start in range(0, clients, 100):
        await asyncio.gather(*(c.connect(url, key) for c in group[start:start + 100]))
    await asyncio.sleep(8)
    missing = sum((max(c.seen) - min(c.seen) + 1) - len(set(c.seen)) for c in group if c.seen)
    duplicates = sum(len(c.seen) - len(set(c.seen)) for c in group)
    resumed = [c.resumed_at - cut_at for c in group if c.resumed_at]
    return {
        "resumed_by_unix": round(time.time() - (time.monotonic() - cut_at) + max(resumed), 3) if resumed else None,
        "statuses": {k: sum(c.statuses.get(k, 0) for c in group) for k in sorted({k for c in group for k in c.statuses})},
        "clients": clients, "events": sum(len(c.seen) for c in group), "missing": missing, "duplicates": duplicates,
        "resumed": len(resumed), "all_resumed_within_s": round(max(resumed), 2) if resumed else None,
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", default=".build/release/relay")
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--url", help="storm this running relay (fanbench's) instead of starting one")
    parser.add_argument("--key", default="k")
    parser.add_argument("--busy", type=int, default=20, help="with --url: clients on quotes fanbench publishes")
    parser.add_argument("--settle", type=float, default=5)
    args = parser.parse_args()
    if args.url:
        def topics(i):
            symbol = f"S{i % 100:05d}"
            return f"Q.{symbol}" if i < args.busy else f"T.{symbol}"
        result = asyncio.run(storm(args.url, args.key, args.clients, topics, args.settle))
        print(json.dumps(result))
        return 0 if result["missing"] == 0 and result["resumed"] == args.clients else 1
    port = free_port()
    relay = subprocess.Popen(
        [args.relay, "serve", "--listen", f"127.0.0.1:{port}", "--client-keys", "k", "--no-portfolio", "--demo-rate", str(args.rate),
         "--log-level", "error"])
    try:
        time.sleep(2)
        tickers = ["AAPL", "MSFT", "NVDA", "AMZN", "GOOGL", "META", "TSLA", "JPM", "V", "SPY"]
        result = asyncio.run(storm(f"ws://127.0.0.1:{port}/stocks", args.key, args.clients,
                                   lambda i: f"Q.{tickers[i % len(tickers)]}", args.settle))
        print(json.dumps(result))
        return 0 if result["missing"] == 0 and result["resumed"] == args.clients else 1
    finally:
        relay.terminate()
        relay.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
