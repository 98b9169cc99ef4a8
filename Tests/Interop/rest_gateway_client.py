#!/usr/bin/env python3
"""Polygon's official Python REST client (unmodified) through the relay's REST gateway, with a relay
client key and `base` pointed at the relay: last trade and quote, a snapshot, daily bars, the previous
close, and trades paged over several `next_url`s. Each answer is checked against the same request sent
straight to the vendor (the demo feed) where the values cannot differ.

Prints one JSON object (what each call returned, and `errors`); exit 0 when there are none.
"""
import argparse
import json
import sys
import time
import urllib.request

from polygon import RESTClient


def vendor(feed: str, key: str, path: str):
    request = urllib.request.Request(f"{feed}{path}", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--feed-port", type=int, required=True)
    parser.add_argument("--feed-key", required=True)
    parser.add_argument("--ticker", default="AAPL")
    args = parser.parse_args()
    feed = f"http://127.0.0.1:{args.feed_port}"
    client = RESTClient(api_key=args.key, base=f"http://127.0.0.1:{args.port}", retries=0)
    errors = []
    out = {}

    trade = client.get_last_trade(args.ticker)
    out["last_trade"] = {"price": trade.price, "size": trade.size, "sip_timestamp": trade.sip_timestamp, "ticker": trade.ticker}
    if not trade.price or not trade.sip_timestamp or trade.sip_timestamp < 10**18:
        errors.append(f"last trade: {out['last_trade']}")

    quote = client.get_last_quote(args.ticker)
    out["last_quote"] = {"bid": quote.bid_price, "ask": quote.ask_price, "sip_timestamp": quote.sip_timestamp}
    if not quote.bid_price or not quote.ask_price or quote.bid_price > quote.ask_price:
        errors.append(f"last quote: {out['last_quote']}")

    snapshot = client.get_snapshot_ticker("stocks", args.ticker)
    out["snapshot"] = {
        "ticker": snapshot.ticker,
        "last_trade": snapshot.last_trade.price if snapshot.last_trade else None,
        "prev_close": snapshot.prev_day.close if snapshot.prev_day else None,
        "todays_change": snapshot.todays_change,
    }
    if snapshot.ticker != args.ticker or not snapshot.last_trade or not snapshot.prev_day:
        errors.append(f"snapshot: {out['snapshot']}")

    prev = client.get_previous_close_agg(args.ticker)
    truth = vendor(feed, args.feed_key, f"/v2/aggs/ticker/{args.ticker}/prev")["results"][0]
    out["previous_close"] = prev[0].close if prev else None
    if not prev or prev[0].close != truth["c"]:
        errors.append(f"previous close {out['previous_close']} != vendor's {truth['c']}")

    bars = client.get_aggs(args.ticker, 1, "day", "2026-10-01", "2026-10-31")
    truth_bars = vendor(feed, args.feed_key, f"/v2/aggs/ticker/{args.ticker}/range/1/day/2026-10-01/2026-10-31")["results"]
    out["daily_bars"] = len(bars)
    if [b.close for b in bars] != [b["c"] for b in truth_bars]:
        errors.append("daily bars differ from the vendor's")

    # Trades of the last minute, 3 a page: the client follows next_url back through the relay.
    now_ns = time.time_ns()
    trades = list(client.list_trades(args.ticker, timestamp_gte=now_ns - 60 * 10**9, timestamp_lt=now_ns, order="asc", limit=3))
    truth_trades = vendor(feed, args.feed_key, f"/v3/trades/{args.ticker}?timestamp.gte={now_ns - 60 * 10**9}&timestamp.lt={now_ns}&order=asc&limit=1000")["results"]
    out["trades"] = len(trades)
    sequences = [t.sequence_number for t in trades]
    if len(trades) <= 3:
        errors.append(f"trades: {len(trades)}, expected more than one page of 3")
    if sequences != [t["sequence_number"] for t in truth_trades]:
        errors.append(f"trades: {len(sequences)} through the relay, {len(truth_trades)} from the vendor, or in another order")
    if len(set(sequences)) != len(sequences):
        errors.append("trades: a trade twice across pages")

    out["errors"] = errors
    print(json.dumps(out))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
