#!/usr/bin/env python3
"""alpaca-py's historical data clients (unmodified) through the relay's REST gateway, `url_override`
pointed at the relay, the relay's client key as the key id: latest trade, quote and bar, a snapshot,
daily bars over several pages, crypto's latest quote. Bars are checked against the vendor (the demo
feed) asked directly.

Prints one JSON object (what each call returned, and `errors`); exit 0 when there are none.
"""
import argparse
import json
import sys
import urllib.request
from datetime import datetime, timezone

from alpaca.data.historical import CryptoHistoricalDataClient, StockHistoricalDataClient
from alpaca.data.requests import (
    CryptoLatestQuoteRequest,
    StockBarsRequest,
    StockLatestBarRequest,
    StockLatestQuoteRequest,
    StockLatestTradeRequest,
    StockSnapshotRequest,
)
from alpaca.data.timeframe import TimeFrame


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--feed-url", required=True)
    parser.add_argument("--feed-key", required=True)
    parser.add_argument("--crypto", action="store_true")
    args = parser.parse_args()
    errors = []
    out = {}
    stocks = StockHistoricalDataClient(args.key, "any-secret", url_override=args.url)

    trade = stocks.get_stock_latest_trade(StockLatestTradeRequest(symbol_or_symbols=["AAPL", "MSFT"]))
    out["latest_trade"] = {s: t.price for s, t in trade.items()}
    if set(trade) != {"AAPL", "MSFT"} or any(t.price <= 0 for t in trade.values()):
        errors.append(f"latest trade: {out['latest_trade']}")

    quote = stocks.get_stock_latest_quote(StockLatestQuoteRequest(symbol_or_symbols="AAPL"))["AAPL"]
    out["latest_quote"] = [quote.bid_price, quote.ask_price]
    if not 0 < quote.bid_price <= quote.ask_price:
        errors.append(f"latest quote: {out['latest_quote']}")

    bar = stocks.get_stock_latest_bar(StockLatestBarRequest(symbol_or_symbols="AAPL"))["AAPL"]
    out["latest_bar"] = bar.close
    if bar.close <= 0:
        errors.append(f"latest bar: {bar}")

    snapshot = stocks.get_stock_snapshot(StockSnapshotRequest(symbol_or_symbols="AAPL"))["AAPL"]
    out["snapshot"] = {"trade": snapshot.latest_trade.price, "quote": snapshot.latest_quote.ask_price,
                       "previous_close": snapshot.previous_daily_bar.close if snapshot.previous_daily_bar else None}
    if snapshot.latest_trade.price <= 0 or snapshot.previous_daily_bar is None:
        errors.append(f"snapshot: {out['snapshot']}")

    start = datetime(2026, 10, 1, tzinfo=timezone.utc)
    end = datetime(2026, 10, 31, tzinfo=timezone.utc)
    bars = stocks.get_stock_bars(StockBarsRequest(symbol_or_symbols="AAPL", timeframe=TimeFrame.Day, start=start, end=end))["AAPL"]
    truth = []
    token = None
    while True:
        query = f"symbols=AAPL&timeframe=1Day&start=2026-10-01&end=2026-10-31" + (f"&page_token={token}" if token else "")
        request = urllib.request.Request(f"{args.feed_url}/v2/stocks/bars?{query}", headers={"APCA-API-KEY-ID": args.feed_key})
        with urllib.request.urlopen(request, timeout=10) as response:
            page = json.loads(response.read())
        truth += page["bars"].get("AAPL", [])
        token = page.get("next_page_token")
        if not token:
            break
    out["daily_bars"] = len(bars)
    if [b.close for b in bars] != [b["c"] for b in truth] or len(bars) <= 10:
        errors.append(f"daily bars: {len(bars)} through the relay, {len(truth)} from the vendor (more than one page of 10 expected)")

    if args.crypto:
        crypto = CryptoHistoricalDataClient(args.key, "any-secret", url_override=args.url)
        btc = crypto.get_crypto_latest_quote(CryptoLatestQuoteRequest(symbol_or_symbols="BTC/USD"))["BTC/USD"]
        out["crypto_quote"] = [btc.bid_price, btc.ask_price]
        if not 0 < btc.bid_price <= btc.ask_price:
            errors.append(f"crypto quote: {out['crypto_quote']}")

    out["errors"] = errors
    print(json.dumps(out))
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
