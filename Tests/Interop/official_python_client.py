#!/usr/bin/env python3
"""Connects Polygon's official Python client (polygon-api-client) to a running relay.

Exit 0 when the client behaved as expected, 1 with a reason otherwise. Used by the Swift interop test
(Tests/IntegrationTests/InteropTests.swift), which starts the relay and runs this script against it.
"""
import argparse
import asyncio
import json
import sys

from polygon import WebSocketClient
from polygon.websocket.models import EquityAgg, EquityQuote, EquityTrade


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--subscribe", default="Q.AAPL")
    parser.add_argument("--count", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=20)
    parser.add_argument("--expect-auth-failure", action="store_true")
    parser.add_argument("--secure", action="store_true", help="wss:// (secure=True)")
    parser.add_argument("--ca", help="with --secure: the CA to trust instead of certifi's bundle")
    parser.add_argument("--market", default="stocks", help="the client's market (its path and its models)")
    args = parser.parse_args()

    if args.ca:
        # The client trusts certifi's bundle (certifi.where()); a private CA is given the same way.
        import certifi

        certifi.where = lambda: args.ca
    wanted = [t.strip() for t in args.subscribe.split(",") if t.strip()]
    client = WebSocketClient(
        api_key=args.key, feed=f"127.0.0.1:{args.port}", market=args.market, secure=args.secure, subscriptions=wanted
    )
    received = []

    async def handle(messages):
        received.extend(messages)
        if len(received) >= args.count:
            await client.close()

    async def run():
        await asyncio.wait_for(client.connect(handle), args.timeout)

    try:
        asyncio.run(run())
    except asyncio.TimeoutError:
        print(f"timed out with {len(received)} of {args.count} messages", file=sys.stderr)
        return 1
    except Exception as error:  # the client raises AuthError on auth_failed
        if args.expect_auth_failure and type(error).__name__ == "AuthError":
            print(json.dumps({"auth_failed": True}))
            return 0
        print(f"client raised {type(error).__name__}: {error}", file=sys.stderr)
        return 1

    if args.expect_auth_failure:
        print("expected the relay to refuse the key", file=sys.stderr)
        return 1
    if args.market != "stocks":
        # Every message parsed into the market's own model (a dict would mean the client did not know it).
        models = {}
        for message in received:
            if isinstance(message, dict):
                print(f"unparsed message {message!r}", file=sys.stderr)
                return 1
            ident = getattr(message, "symbol", None) or getattr(message, "pair", None) or getattr(message, "ticker", None)
            models.setdefault(type(message).__name__, set()).add(str(ident))
        if len(received) < args.count:
            print(f"received {len(received)} messages: {models}", file=sys.stderr)
            return 1
        print(json.dumps({"messages": len(received), "models": {k: sorted(v) for k, v in models.items()}}))
        return 0
    topics = set()
    for message in received:
        if isinstance(message, EquityQuote):
            topics.add(f"Q.{message.symbol}")
        elif isinstance(message, EquityTrade):
            topics.add(f"T.{message.symbol}")
        elif isinstance(message, EquityAgg):
            # The vendor's aggregates and the relay's derived bars (AM.AAPL@5s) alike.
            event_type = getattr(message.event_type, "value", message.event_type)
            topics.add(f"{event_type}.{message.symbol}")
            if message.start_timestamp is None or message.end_timestamp is None or message.close is None:
                print(f"an aggregate without its start, end or close: {message!r}", file=sys.stderr)
                return 1
        else:
            print(f"unexpected message {message!r}", file=sys.stderr)
            return 1
    unexpected = topics - set(wanted)
    if len(received) < args.count or unexpected:
        print(f"received {len(received)} messages on {sorted(topics)}; unexpected {sorted(unexpected)}", file=sys.stderr)
        return 1
    print(json.dumps({"messages": len(received), "topics": sorted(topics)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
