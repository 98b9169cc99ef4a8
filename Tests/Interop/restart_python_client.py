#!/usr/bin/env python3
"""Polygon's official Python client (unmodified, raw mode), N of them with tagged keys (KEY#c0, KEY#c1,
...), reading while the relay is restarted under them. Each reconnects on its own (the relay closes with
1012); the relay, started again on the same tape, takes their sessions back.

When every client has read --before events it writes --ready-file (the test then stops the relay and
starts it again). Each client then reads until it has had a `resumed` status and --after more events.

Prints one JSON line: events, missing (per-topic _s numbers never received before the gap, or after it),
leaps (topics whose numbers do not go on by one across the gap), duplicates, resumed, and the gap
statuses (their from/through/unit): the down window each client was told.
Exit 0 when nothing is missing and every client resumed.
"""
import argparse
import asyncio
import json
import sys

from polygon import WebSocketClient


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument("--subscribe", default="Q.*")
    parser.add_argument("--before", type=int, default=500)
    parser.add_argument("--after", type=int, default=500)
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()

    states = [{"seen": {}, "segment": 0, "events": 0, "after": 0, "resumed": 0, "gaps": [], "ready": False} for _ in range(args.clients)]

    async def run_one(index):
        state = states[index]
        client = WebSocketClient(
            api_key=f"{args.key}#c{index}",
            feed=f"127.0.0.1:{args.port}",
            market="stocks",
            raw=True,
            secure=False,
            subscriptions=[t for t in args.subscribe.split(",") if t],
            max_reconnects=50,
        )

        async def handle(raw):
            for message in json.loads(raw):
                if message.get("ev") == "status":
                    status = message.get("status")
                    if status == "resumed":
                        state["resumed"] += 1
                    elif status == "gap":
                        state["gaps"].append({k: message.get(k) for k in ("topic", "from", "through", "unit")})
                        # What follows the gap is numbered after the restart: a segment of its own.
                        state["segment"] += 1
                    continue
                topic = f'{message["ev"]}.{message["sym"]}'
                state["seen"].setdefault((topic, state["segment"]), []).append(message["_s"])
                state["events"] += 1
                if state["resumed"]:
                    state["after"] += 1
            if not state["ready"] and state["events"] >= args.before:
                state["ready"] = True
                if all(s["ready"] for s in states):
                    with open(args.ready_file, "w") as ready:
                        ready.write("ready\n")
            if state["resumed"] and state["after"] >= args.after:
                await client.close()

        await client.connect(handle)

    async def run():
        await asyncio.wait_for(asyncio.gather(*(run_one(i) for i in range(args.clients))), args.timeout)

    try:
        asyncio.run(run())
    except asyncio.TimeoutError:
        print(f"timed out: {[(s['events'], s['resumed']) for s in states]}", file=sys.stderr)
        return 1

    # Missing: numbers never received within a segment (before the gap, after it). Leaps: topics whose
    # numbers do not go on by one across the gap (after a crash they leap past what was reserved).
    missing = 0
    duplicates = 0
    events = 0
    leaps = 0
    for state in states:
        events += state["events"]
        last = {}
        for (topic, segment), numbers in sorted(state["seen"].items(), key=lambda item: item[0][1]):
            unique = set(numbers)
            duplicates += len(numbers) - len(unique)
            missing += (max(unique) - min(unique) + 1) - len(unique)
            if topic in last and min(unique) != last[topic] + 1:
                leaps += 1
            last[topic] = max(unique)
    result = {
        "clients": args.clients,
        "events": events,
        "missing": missing,
        "duplicates": duplicates,
        "leaps": leaps,
        "resumed": sum(s["resumed"] for s in states),
        "gaps": [gap for s in states for gap in s["gaps"]][:20],
        "gapCount": sum(len(s["gaps"]) for s in states),
    }
    print(json.dumps(result))
    # Up to the resume margin (64 KiB) of events from just before a break may come again (told by _s).
    ok = missing == 0 and all(s["resumed"] >= 1 for s in states)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
