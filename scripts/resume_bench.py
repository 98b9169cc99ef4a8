#!/usr/bin/env python3
"""Times a resume: how long from a client's subscribe with `since` until its `resumed` status, for a
replay of at least --missed events, against a release relay on its built-in demo feed.

    python3 scripts/resume_bench.py [--relay .build/release/relay] [--missed 10000] [--runs 5]

Prints one JSON line per run and a summary (median and worst, in ms).
"""
import argparse
import asyncio
import json
import socket
import statistics
import subprocess
import sys
import time

import websockets


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def authenticated(url):
    ws = await websockets.connect(url, max_size=1 << 26)
    await ws.recv()
    await ws.send(json.dumps({"action": "auth", "params": "bench-key"}))
    await ws.recv()
    return ws


async def one_run(url, missed):
    holder = await authenticated(url)
    await holder.send(json.dumps({"action": "subscribe", "params": "Q.*"}))
    victim = await authenticated(url)
    await victim.send(json.dumps({"action": "subscribe", "params": "Q.*"}))
    epoch, last = None, None
    while last is None:
        for m in json.loads(await victim.recv()):
            if m.get("ev") == "status" and m.get("status") == "success":
                epoch = m.get("epoch")
            elif m.get("ev") == "Q":
                last = m["_m"]
    await victim.close()
    seen = 0
    while seen < missed:
        for m in json.loads(await holder.recv()):
            if m.get("ev") == "Q" and m["_m"] > last:
                seen += 1
    back = await authenticated(url)
    started = time.perf_counter()
    await back.send(json.dumps({"action": "subscribe", "params": "Q.*", "since": {"epoch": epoch, "Q.*": last}}))
    # Frames are searched, not parsed: the time is the relay's and the socket's, not Python's JSON.
    frames = []
    while True:
        raw = await back.recv()
        frames.append(raw)
        if '"status":"resumed"' in raw:
            break
    elapsed = (time.perf_counter() - started) * 1000
    text = "".join(frames)
    replayed = text[: text.index('"status":"resumed"')].count('"ev":"Q"')
    for ws in (holder, back):
        await ws.close()
    return {"replayed": replayed, "ms": round(elapsed, 2)}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", default=".build/release/relay")
    parser.add_argument("--missed", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rate", type=int, default=20000)
    args = parser.parse_args()
    port = free_port()
    relay = subprocess.Popen(
        [args.relay, "serve", "--listen", f"127.0.0.1:{port}", "--client-keys", "bench-key", "--no-portfolio",
         "--demo-rate", str(args.rate), "--log-level", "warning"])
    try:
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"ws://127.0.0.1:{port}/stocks"
        results = []
        for _ in range(args.runs):
            result = asyncio.run(one_run(url, args.missed))
            print(json.dumps(result))
            results.append(result["ms"])
        print(json.dumps({"scenario": f"resume of >= {args.missed} missed Q.* events", "median_ms": statistics.median(results),
                          "worst_ms": max(results)}))
    finally:
        relay.terminate()
        relay.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
