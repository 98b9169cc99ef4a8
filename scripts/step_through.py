#!/usr/bin/env python3
"""Steps through every holding's security detail the way a person browsing does, on one keep-alive
connection (one relay client), and reports how many steps the cache served.

Usage: scripts/step_through.py --port 8080 [--think-ms 400] [--sort symbol] [--back 10]
"""
import argparse
import http.client
import json
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--think-ms", type=int, default=400, help="pause between steps, as a reader would")
    parser.add_argument("--sort", default="symbol")
    parser.add_argument("--back", type=int, default=10, help="steps back at the end")
    args = parser.parse_args()

    connection = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)

    def get(path: str) -> dict:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise SystemExit(f"GET {path}: HTTP {response.status}: {body[:300]!r}")
        return json.loads(body)

    listing = get(f"/v1/holdings?sort={args.sort}")
    view = listing["view"]["id"]
    order = [h["symbol"] for h in listing["holdings"]]
    path = list(range(len(order))) + list(range(len(order) - 2, max(len(order) - 2 - args.back, -1), -1))
    outcomes: dict[str, list[float]] = {"hit": [], "joined": [], "miss": []}
    incomplete = 0
    for step, index in enumerate(path):
        if step:
            time.sleep(args.think_ms / 1000)
        started = time.perf_counter()
        detail = get(f"/v1/securities/{order[index]}?view={view}")
        elapsed = (time.perf_counter() - started) * 1000
        outcomes[detail["cache"]].append(elapsed)
        incomplete += 0 if detail["complete"] else 1

    steps = len(path)
    hits = len(outcomes["hit"])
    print(f"{len(order)} holdings, {steps} steps ({len(order)} forward, {steps - len(order)} back), think time {args.think_ms} ms")
    print(f"cache hit rate {hits / steps:.1%} ({hits}/{steps}); incomplete details {incomplete}")
    for name, times in outcomes.items():
        if times:
            print(f"  {name:6} {len(times):3}  median {statistics.median(times):7.1f} ms  max {max(times):7.1f} ms")


if __name__ == "__main__":
    main()
