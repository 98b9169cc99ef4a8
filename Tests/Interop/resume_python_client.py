#!/usr/bin/env python3
"""Polygon's official Python client (unmodified, raw mode) with a tagged key, its connection broken under
load by a TCP proxy this script controls; it reconnects on its own and the relay resumes its session.

Prints one JSON line: events, topics, missing (per-topic sequence numbers never received), duplicates,
resumed and gap statuses. Exit 0 when nothing is missing and every break was resumed.

The proxy forwards everything it read before it closes the client's side (gracefully, so the client
reads it all) and resets the relay's side; its socket to the relay has a small receive buffer, so what
its TCP stack acknowledged and it never read stays under the relay's resume margin.
"""
import argparse
import asyncio
import json
import socket
import sys

from polygon import WebSocketClient


class Pair:
    def __init__(self):
        self.client = None
        self.relay = None


class ToRelay(asyncio.Protocol):
    def __init__(self, pair):
        self.pair = pair

    def data_received(self, data):
        self.pair.client.write(data)

    def connection_lost(self, exc):
        if self.pair.client and not self.pair.client.is_closing():
            self.pair.client.close()


class FromClient(asyncio.Protocol):
    def __init__(self, relay_port, pairs):
        self.relay_port = relay_port
        self.pairs = pairs
        self.pair = Pair()
        self.pending = []

    def connection_made(self, transport):
        self.pair.client = transport
        transport.pause_reading()
        asyncio.ensure_future(self.open())

    async def open(self):
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8192)
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", self.relay_port))
        transport, _ = await loop.create_connection(lambda: ToRelay(self.pair), sock=sock)
        self.pair.relay = transport
        self.pairs.append(self.pair)
        self.pair.client.resume_reading()

    def data_received(self, data):
        self.pair.relay.write(data)

    def connection_lost(self, exc):
        if self.pair.relay and not self.pair.relay.is_closing():
            self.pair.relay.abort()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--subscribe", default="T.*,Q.*")
    parser.add_argument("--breaks", type=int, default=3)
    parser.add_argument("--events-per-break", type=int, default=3000)
    parser.add_argument("--timeout", type=float, default=90)
    args = parser.parse_args()

    seen = {}
    state = {"events": 0, "since_break": 0, "breaks": 0, "resumed": 0, "gaps": 0, "statuses": []}
    pairs = []

    async def run():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: FromClient(args.port, pairs), "127.0.0.1", 0)
        proxy_port = server.sockets[0].getsockname()[1]
        client = WebSocketClient(
            api_key=args.key,
            feed=f"127.0.0.1:{proxy_port}",
            market="stocks",
            raw=True,
            secure=False,
            subscriptions=[t for t in args.subscribe.split(",") if t],
            max_reconnects=args.breaks + 5,
        )

        def cut():
            # Everything read from the relay was written to the client; the client's side closes after
            # it is flushed, the relay's side is reset now.
            for pair in list(pairs):
                pair.relay.pause_reading()
                pair.client.close()
                pair.relay.abort()
            pairs.clear()

        async def handle(raw):
            for message in json.loads(raw):
                if message.get("ev") == "status":
                    status = message.get("status")
                    if status == "resumed":
                        state["resumed"] += 1
                    elif status == "gap":
                        state["gaps"] += 1
                    if status not in ("success", "connected", "auth_success"):
                        state["statuses"].append(message)
                    continue
                topic = f'{message["ev"]}.{message["sym"]}'
                seen.setdefault(topic, []).append(message["_s"])
                state["events"] += 1
                state["since_break"] += 1
            if state["since_break"] >= args.events_per_break:
                state["since_break"] = 0
                if state["breaks"] < args.breaks:
                    state["breaks"] += 1
                    cut()
                else:
                    await client.close()

        await asyncio.wait_for(client.connect(handle), args.timeout)
        server.close()

    try:
        asyncio.run(run())
    except asyncio.TimeoutError:
        print(f"timed out: {state['events']} events, {state['breaks']} breaks", file=sys.stderr)
        return 1

    missing = 0
    distinct = 0
    for numbers in seen.values():
        unique = set(numbers)
        distinct += len(unique)
        missing += (max(unique) - min(unique) + 1) - len(unique)
    result = {
        "events": state["events"],
        "topics": len(seen),
        "missing": missing,
        "duplicates": state["events"] - distinct,
        "breaks": state["breaks"],
        "resumed": state["resumed"],
        "gaps": state["gaps"],
        "statuses": state["statuses"][:5],
    }
    print(json.dumps(result))
    return 0 if missing == 0 and state["resumed"] >= args.breaks and state["gaps"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
