#!/usr/bin/env python3
"""Alpaca's official SDKs, unmodified, against the relay: each stream subscribes, takes a few events into
its own model objects (or raw dicts), and the script prints one JSON line of what it got.

  --sdk alpaca-py | alpaca-trade-api    --crypto    --raw    --key KEY    --port PORT
  --orderbooks: crypto order books only (each described with its reset flag and levels)
  --news: the news stream only (each item described with its id, symbols and content's length);
          --max-size raises the websockets library's 1 MiB message limit (alpaca-py's websocket_params)
"""
import argparse
import json
import sys
import threading

parser = argparse.ArgumentParser()
parser.add_argument("--sdk", required=True, choices=["alpaca-py", "alpaca-trade-api"])
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--key", default="client-key")
parser.add_argument("--crypto", action="store_true")
parser.add_argument("--options", choices=["indicative", "opra"], help="alpaca-py's OptionDataStream on this feed (trades and quotes)")
parser.add_argument("--orderbooks", action="store_true", help="crypto order books only")
parser.add_argument("--bars-only", action="store_true", help="bars only (derived bars: AAPL@5s)")
parser.add_argument("--news", action="store_true", help="the news stream only")
parser.add_argument("--max-size", type=int, help="the largest message the WebSocket takes (news)")
parser.add_argument("--raw", action="store_true")
parser.add_argument("--symbols", default="AAPL")
parser.add_argument("--want", type=int, default=3, help="events of each kind before stopping")
parser.add_argument("--seconds", type=float, default=20)
args = parser.parse_args()
symbols = args.symbols.split(",")

# Options have trades and quotes only.
if args.news:
    got = {"news": []}
elif args.orderbooks:
    got = {"orderbooks": []}
elif args.bars_only:
    got = {"bars": []}
elif args.options:
    got = {"trades": [], "quotes": []}
else:
    got = {"trades": [], "quotes": [], "bars": []}
done = threading.Event()


def field(item, *names):
    for name in names:
        if isinstance(item, dict) and name in item:
            return item[name]
        value = getattr(item, name, None)
        if value is not None:
            return value
    return None


def levels(side):
    return [[float(field(level, "price", "p")), float(field(level, "size", "s"))] for level in side or []]


def describe(kind, event):
    if kind == "orderbooks" and not isinstance(event, dict):
        # alpaca-py's Orderbook (bids, asks, reset) or alpaca-trade-api's OrderbookV2 (its fields by name).
        return {
            "kind": kind, "type": f"{type(event).__module__}.{type(event).__name__}", "symbol": field(event, "symbol", "S"),
            "reset": bool(field(event, "reset", "r")), "bids": levels(field(event, "bids", "b")), "asks": levels(field(event, "asks", "a")),
        }
    if kind == "news":
        created = field(event, "created_at")
        return {
            "kind": kind, "type": "dict" if isinstance(event, dict) else f"{type(event).__module__}.{type(event).__name__}",
            "id": field(event, "id"), "symbols": list(field(event, "symbols") or []), "headline": field(event, "headline"),
            "content": len(field(event, "content") or ""),
            "created_at": created.isoformat() if hasattr(created, "isoformat") else str(created),
        }
    if isinstance(event, dict):
        return {"kind": kind, "type": "dict", "symbol": event.get("S"), "t": str(event.get("t")), "fields": sorted(event.keys())}
    raw = getattr(event, "_raw", None)
    symbol = getattr(event, "symbol", None) or (raw or {}).get("symbol")
    timestamp = getattr(event, "timestamp", None)
    price = getattr(event, "price", None)
    if price is None:
        price = getattr(event, "close", None) or getattr(event, "bid_price", None)
    return {
        "kind": kind, "type": f"{type(event).__module__}.{type(event).__name__}", "symbol": symbol,
        "timestamp": timestamp.isoformat() if hasattr(timestamp, "isoformat") else str(timestamp), "price": price,
    }


def handler(kind, stop):
    async def handle(event):
        got[kind].append(describe(kind, event))
        if all(len(events) >= args.want for events in got.values()):
            done.set()
            await stop()
    return handle


if args.news:
    params = {"ping_interval": 10, "ping_timeout": 180, "max_queue": 1024}
    if args.max_size:
        params["max_size"] = args.max_size
    if args.sdk == "alpaca-py":
        from alpaca.data.live import NewsDataStream

        stream = NewsDataStream(args.key, "relay-secret", raw_data=args.raw, websocket_params=params,
                                url_override=f"ws://127.0.0.1:{args.port}/v1beta1/news")
    else:
        from alpaca_trade_api.stream import Stream

        stream = Stream(args.key, "relay-secret", data_stream_url=f"http://127.0.0.1:{args.port}", raw_data=args.raw,
                        websocket_params=params)
    stream.subscribe_news(handler("news", stream.stop_ws), *symbols)
elif args.sdk == "alpaca-py" and args.options:
    from alpaca.data.enums import OptionsFeed
    from alpaca.data.live import OptionDataStream

    stream = OptionDataStream(args.key, "relay-secret", raw_data=args.raw, feed=OptionsFeed(args.options),
                              url_override=f"ws://127.0.0.1:{args.port}/v1beta1/{args.options}")
    stream.subscribe_trades(handler("trades", stream.stop_ws), *symbols)
    stream.subscribe_quotes(handler("quotes", stream.stop_ws), *symbols)
elif args.sdk == "alpaca-py":
    from alpaca.data.live import CryptoDataStream, StockDataStream

    path = "/v1beta3/crypto/us" if args.crypto else "/v2/iex"
    cls = CryptoDataStream if args.crypto else StockDataStream
    stream = cls(args.key, "relay-secret", raw_data=args.raw, url_override=f"ws://127.0.0.1:{args.port}{path}")
    if args.orderbooks:
        stream.subscribe_orderbooks(handler("orderbooks", stream.stop_ws), *symbols)
    elif args.bars_only:
        stream.subscribe_bars(handler("bars", stream.stop_ws), *symbols)
    else:
        stream.subscribe_trades(handler("trades", stream.stop_ws), *symbols)
        stream.subscribe_quotes(handler("quotes", stream.stop_ws), *symbols)
        stream.subscribe_bars(handler("bars", stream.stop_ws), *symbols)
else:
    from alpaca_trade_api.stream import Stream

    stream = Stream(args.key, "relay-secret", data_stream_url=f"http://127.0.0.1:{args.port}", data_feed="iex", raw_data=args.raw)
    if args.orderbooks:
        stream.subscribe_crypto_orderbooks(handler("orderbooks", stream.stop_ws), *symbols)
    elif args.bars_only:
        stream.subscribe_bars(handler("bars", stream.stop_ws), *symbols)
    elif args.crypto:
        stream.subscribe_crypto_trades(handler("trades", stream.stop_ws), *symbols)
        stream.subscribe_crypto_quotes(handler("quotes", stream.stop_ws), *symbols)
        stream.subscribe_crypto_bars(handler("bars", stream.stop_ws), *symbols)
    else:
        stream.subscribe_trades(handler("trades", stream.stop_ws), *symbols)
        stream.subscribe_quotes(handler("quotes", stream.stop_ws), *symbols)
        stream.subscribe_bars(handler("bars", stream.stop_ws), *symbols)

timer = threading.Timer(args.seconds, stream.stop)
timer.start()
try:
    stream.run()
finally:
    timer.cancel()
print(json.dumps({"complete": done.is_set(), "got": got}))
sys.exit(0 if done.is_set() else 1)
