#!/usr/bin/env python3
"""Polygon's official Python client (unmodified, model mode) on the relay while the relay's upstream
(a demo feed) is dropped: it must take the recovered events like any other, and over the whole run see
exactly the trades and quotes the feed generated, by `q` (`sequence_number`), none twice.

Prints one JSON line per topic and a summary; exit 0 when every topic is exact.
"""
import argparse
import asyncio
import json
import sys
import time
import urllib.request

from polygon import WebSocketClient
from polygon.websocket.models import EquityQuote, EquityTrade


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--feed-port", type=int, required=True)
    parser.add_argument("--feed-key", required=True)
    parser.add_argument("--drop-seconds", type=float, default=2)
    args = parser.parse_args()
    feed = f"http://127.0.0.1:{args.feed_port}"
    seen = {"T.AAPL": [], "Q.MSFT": []}
    errors = []
    state = {"dropped_at": None}

    def drop():
        request = urllib.request.Request(
            f"{feed}/faults/drop?seconds={args.drop_seconds}", method="POST", headers={"Authorization": f"Bearer {args.feed_key}"})
        urllib.request.urlopen(request, timeout=10).read()

    async def run():
        client = WebSocketClient(
            api_key=args.key, feed=f"127.0.0.1:{args.port}", market="stocks", secure=False, subscriptions=["T.AAPL", "Q.MSFT"])

        async def handle(messages):
            try:
                for message in messages:
                    if isinstance(message, EquityTrade) and message.symbol == "AAPL":
                        seen["T.AAPL"].append((message.sequence_number, message.timestamp))
                    elif isinstance(message, EquityQuote) and message.symbol == "MSFT":
                        seen["Q.MSFT"].append((message.sequence_number, message.timestamp))
                if state["dropped_at"] is None and len(seen["Q.MSFT"]) >= 20:
                    state["dropped_at"] = time.monotonic()
                    await asyncio.get_running_loop().run_in_executor(None, drop)
                elif state["dropped_at"] is not None and time.monotonic() - state["dropped_at"] > args.drop_seconds + 6:
                    await client.close()
            except Exception as error:  # noqa: BLE001 - reported, and the run fails
                errors.append(repr(error))
                await client.close()

        await asyncio.wait_for(client.connect(handle), 60)

    asyncio.run(run())
    exact = True
    for topic, path in (("T.AAPL", "/v3/trades/AAPL"), ("Q.MSFT", "/v3/quotes/MSFT")):
        sequences = [q for q, _ in seen[topic]]
        if not sequences:
            print(json.dumps({"topic": topic, "error": "no events"}))
            exact = False
            continue
        first_ns = min(t for _, t in seen[topic]) * 1_000_000
        url = f"{feed}{path}?timestamp.gte={first_ns}&order=asc&limit=50000&apiKey={args.feed_key}"
        truth = json.loads(urllib.request.urlopen(url, timeout=10).read())["results"]
        low, high = min(sequences), max(sequences)
        expected = {r["sequence_number"] for r in truth if low <= r["sequence_number"] <= high}
        missing = sorted(expected - set(sequences))
        extra = sorted(set(sequences) - expected)
        duplicates = len(sequences) - len(set(sequences))
        print(json.dumps({"topic": topic, "events": len(sequences), "missing": len(missing), "extra": len(extra),
                          "duplicates": duplicates, "first_missing": missing[:5]}))
        exact = exact and not missing and not extra and duplicates == 0
    print(json.dumps({"exact": exact, "errors": errors, "dropped": state["dropped_at"] is not None}))
    return 0 if exact and not errors and state["dropped_at"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
