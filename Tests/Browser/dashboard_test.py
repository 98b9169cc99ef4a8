#!/usr/bin/env python3
"""The dashboard in a real browser: Debian's chromium driven by Playwright for Python.

Starts the relay (the binary given) on the built-in demo feed with the sample portfolio and two client
keys (one with every right, one without portfolio rights), then checks what a person would: the key
prompt, the overview's live upstream and counts, live quotes, the holdings table and its sorting, the
total with its partial banner, the history chart, stepping through ten holdings with `j` (each detail
shown within 200 ms of the key press, measured by the page; a step over it is taken once more and only a
second slow one fails, so a scheduling hiccup on a loaded machine is not a failure), a form error next to its field, and no
console errors. Screenshots of every page at 1280x800 and 390x844 go to the given directory. Then a second
relay on the demo feed in Alpaca's protocol (`--upstream-vendor alpaca`): the overview names its feeds'
paths, live quotes arrive over Alpaca's JSON protocol for stocks and crypto, and a holding's detail shows
its live quote.

    python3 Tests/Browser/dashboard_test.py --relay .build/debug/relay --screenshots .build/screenshots
"""
import argparse
import contextlib
import json
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from playwright.sync_api import expect, sync_playwright

OWNER = "owner-secret-7f3a"
FEED_ONLY = "feed-only-19c2"
STEP_LIMIT_MS = 200


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Relay:
    """A relay process on a loopback port chosen here, stopped by its own process id."""

    def __init__(self, binary, root, extra=()):
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        data = os.path.join(root, "data")
        config = os.path.join(root, "relay.yaml")
        with open(config, "w") as f:
            f.write(
                "client:\n  keys:\n"
                f"    - {{name: owner, key: {OWNER}}}\n"
                f"    - {{name: ops, key: {FEED_ONLY}, portfolio: none}}\n"
            )
        sample = os.path.join(os.path.dirname(__file__), "..", "..", "config", "sample-portfolio.csv")
        subprocess.run([binary, "portfolio", "import", sample, "--data-dir", data], check=True, capture_output=True)
        self.log = open(os.path.join(root, "relay.log"), "w")
        self.process = subprocess.Popen(
            [binary, "serve", "--config", config, "--listen", f"127.0.0.1:{self.port}", "--data-dir", data, "--time-zone", "UTC", *extra],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                if "relay is up" in line:
                    ready.set()
        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(60):
            self.stop()
            raise SystemExit(f"the relay did not start within 60 s (log: {self.log.name})")

    def call(self, method, path, body=None, key=OWNER):
        request = urllib.request.Request(self.base + path, method=method, data=None if body is None else json.dumps(body).encode())
        request.add_header("Authorization", f"Bearer {key}")
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read() or b"null")

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


class Checks:
    def __init__(self):
        self.failures = []

    def check(self, condition, message):
        print(("ok   " if condition else "FAIL ") + message, flush=True)
        if not condition:
            self.failures.append(message)


def wait_until(predicate, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def open_page(browser, relay, key, size, scheme="light"):
    context = browser.new_context(viewport={"width": size[0], "height": size[1]}, color_scheme=scheme)
    page = context.new_page()
    errors = []
    page.on("console", lambda m: errors.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    page.on("response", lambda r: print(f"     (HTTP {r.status} for {r.request.method} {r.url})") if r.status >= 400 else None)
    page.goto(relay.base + "/")
    if key:
        page.get_by_role("textbox", name="Key", exact=True).fill(key)
        page.get_by_role("button", name="Use this key").click()
    return context, page, errors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--relay", required=True)
    parser.add_argument("--screenshots", required=True)
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    arguments = parser.parse_args()
    os.makedirs(arguments.screenshots, exist_ok=True)
    root = tempfile.mkdtemp(prefix="relay-browser-")
    relay = Relay(os.path.abspath(arguments.relay), root)
    checks = Checks()
    try:
        # More holdings than the sample's six (ten steps need eleven), one of them a symbol the feed
        # never prices, so the total is partial, and one of another market (crypto, priced live from /crypto).
        account = relay.call("POST", "/v1/accounts", {"name": "Browser", "kind": "brokerage", "createdAt": "2024-01-02T00:00:00Z"})
        relay.call("POST", f"/v1/accounts/{account['id']}/transactions", {"kind": "deposit", "date": "2024-01-02", "amount": "50000"})
        for symbol, price in [("GOOGL", "140.10"), ("AMD", "150.20"), ("SPY", "470.30"), ("QQQ", "400.40"), ("ZZZQ", "10.00")]:
            relay.call("POST", f"/v1/accounts/{account['id']}/transactions",
                       {"kind": "buy", "date": "2024-01-03", "symbol": symbol, "quantity": "5", "price": price, "fees": "1"})
        relay.call("POST", f"/v1/accounts/{account['id']}/transactions",
                   {"kind": "buy", "date": "2024-01-04", "symbol": "X:BTC-USD", "quantity": "0.1", "price": "43000.00", "fees": "1"})
        run(relay, arguments, checks)
    finally:
        relay.stop()
    alpaca_root = tempfile.mkdtemp(prefix="relay-browser-alpaca-")
    alpaca = Relay(os.path.abspath(arguments.relay), alpaca_root, extra=("--upstream-vendor", "alpaca"))
    try:
        run_alpaca(alpaca, arguments, checks)
    finally:
        alpaca.stop()
    if checks.failures:
        print(f"\n{len(checks.failures)} browser check(s) failed (relay log: {relay.log.name}):")
        for failure in checks.failures:
            print("  - " + failure)
        sys.exit(1)
    shutil.rmtree(root, ignore_errors=True)
    shutil.rmtree(alpaca_root, ignore_errors=True)
    print("\nall browser checks passed")


@contextlib.contextmanager
def chromium(arguments):
    """Debian's chromium under Playwright, closed after use."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=arguments.chromium, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


def run(relay, arguments, checks):
    shots = arguments.screenshots
    with chromium(arguments) as browser:
        # The key prompt: a wrong key is refused in the dialog, the feed-only key sees no portfolio.
        context, page, errors = open_page(browser, relay, None, (1280, 800))
        page.get_by_role("textbox", name="Key", exact=True).fill("wrong-key")
        page.get_by_role("button", name="Use this key").click()
        expect(page.locator("#key-error")).to_contain_text("did not accept", timeout=10_000)
        checks.check(True, "a wrong key is refused in the key dialog")
        page.get_by_role("textbox", name="Key", exact=True).fill(FEED_ONLY)
        page.get_by_role("button", name="Use this key").click()
        expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=10_000)
        checks.check(not page.get_by_role("link", name="Portfolio").is_visible(), "a key without portfolio rights sees no Portfolio page")
        page.goto(relay.base + "/#/portfolio")
        expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=10_000)
        checks.check(True, "…and is shown the overview when it asks for the portfolio")
        # A link to no page (a `%` that is no escape, a name every object has) loads the overview.
        for name in ["%", "constructor", "__proto__"]:
            page.goto(relay.base + "/#/" + name)
            page.reload()
            expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=10_000)
            checks.check(True, f"a link to #/{name} loads the overview")
        # Refused key errors (401 on the wrong key) are expected above; only count what follows.
        context.close()

        for size, scheme in [((1280, 800), "light"), ((390, 844), "dark")]:
            tag = f"{size[0]}x{size[1]}"
            context, page, errors = open_page(browser, relay, OWNER, size, scheme)
            check_overview(page, checks, tag)
            page.screenshot(path=f"{shots}/overview-{tag}.png", full_page=True)
            check_quotes(page, checks, tag)
            page.screenshot(path=f"{shots}/quotes-{tag}.png", full_page=True)
            check_portfolio(page, checks, tag, first=size[0] == 1280)
            page.screenshot(path=f"{shots}/portfolio-{tag}.png", full_page=True)
            check_security(page, checks, tag, steps=10 if size[0] == 1280 else 3)
            page.screenshot(path=f"{shots}/security-{tag}.png", full_page=True)
            if size[0] == 1280:
                check_form_error(page, checks, errors)
            checks.check(not errors, f"{tag}: no console errors" + ("" if not errors else ": " + "; ".join(errors[:5])))
            context.close()


def run_alpaca(relay, arguments, checks):
    """The dashboard on a relay whose feeds speak Alpaca's protocol."""
    shots = arguments.screenshots
    with chromium(arguments) as browser:
        context, page, errors = open_page(browser, relay, OWNER, (1280, 800))
        expect(page.get_by_role("heading", name="Overview")).to_be_visible(timeout=10_000)
        markets = page.get_by_role("table", name="Markets")
        expect(markets.locator('tr[data-market="stocks"] th')).to_have_text("/v2/iex (Alpaca)", timeout=15_000)
        expect(markets.locator('tr[data-market="crypto"] .state')).to_have_text("connected", timeout=15_000)
        checks.check(True, "alpaca: the overview names each feed's path and protocol (/v2/iex, crypto connected)")
        page.get_by_role("link", name="Live quotes").click()
        expect(page.locator("#quotes-connection")).to_have_text("Connected to /v2/iex", timeout=15_000)
        page.get_by_label("Symbols").fill("AAPL, MSFT")
        page.get_by_role("button", name="Watch").click()
        bid = page.locator('tr[data-symbol="AAPL"] td').first
        wait_until(lambda: bid.inner_text() not in ("—", ""), 15, "an Alpaca quote for AAPL over /v2/iex")
        trade = page.locator('tr[data-symbol="AAPL"] td').nth(4)
        wait_until(lambda: trade.inner_text() not in ("—", ""), 15, "an Alpaca trade for AAPL over /v2/iex")
        stamp = page.locator('tr[data-symbol="AAPL"] td').last
        checks.check(stamp.inner_text() not in ("—", ""), f"alpaca: live quotes and trades arrive in Alpaca's JSON (AAPL bid {bid.inner_text()}, last {trade.inner_text()} at {stamp.inner_text()})")
        check_bars(page, checks, "alpaca", "AAPL")
        page.screenshot(path=f"{shots}/alpaca-quotes-1280x800.png", full_page=True)
        btc = watch_market(page, "crypto", "/v1beta3/crypto/us", "BTC/USD")
        checks.check(True, f"alpaca: picking crypto shows live BTC/USD quotes from /v1beta3/crypto/us (bid {btc})")
        book = page.get_by_role("region", name="Order book: BTC/USD (top 5)")
        expect(book).to_be_visible(timeout=10_000)
        best_bid = book.locator('tr[data-level="0"] td').nth(1)
        wait_until(lambda: best_bid.inner_text() not in ("—", ""), 15, "BTC/USD's order book, whole, over /v1beta3/crypto/us")
        # Both sides read in one turn of the page: the book moves live, and a bid read after the ask could
        # come from a newer book than the ask's.
        def best_pair():
            return book.locator('tr[data-level="0"]').evaluate(
                "row => { const cells = row.querySelectorAll('td'); return [cells[1].innerText, cells[2].innerText]; }")

        def priced(text):
            return text.replace(",", "").replace(".", "", 1).isdigit()

        wait_until(lambda: all(priced(side) for side in best_pair()), 15, "BTC/USD's best bid and ask, both priced")
        bid_text, ask_text = best_pair()
        checks.check(priced(bid_text) and priced(ask_text) and float(bid_text.replace(",", "")) < float(ask_text.replace(",", "")),
                     f"alpaca: the crypto page shows BTC/USD's order book, its best bid {bid_text} under its best ask {ask_text}")
        page.screenshot(path=f"{shots}/alpaca-book-1280x800.png", full_page=True)
        watch_market(page, "stocks", "/v2/iex")
        # A holding's detail takes its live quote from the Alpaca feed's last values.
        page.goto(relay.base + "/#/security/AAPL")
        expect(page.locator("#detail")).to_have_attribute("data-loaded", "AAPL", timeout=15_000)
        details = page.get_by_role("region", name="Quote and market")
        expect(details).to_contain_text("live", timeout=10_000)
        checks.check(True, "alpaca: a holding's detail shows its live quote from the Alpaca feed")
        page.screenshot(path=f"{shots}/alpaca-security-1280x800.png", full_page=True)
        checks.check(not errors, "alpaca: no console errors" + ("" if not errors else ": " + "; ".join(errors[:5])))
        context.close()


def check_overview(page, checks, tag):
    page.get_by_role("link", name="Overview").click()
    upstream = page.get_by_role("region", name="Upstream")
    expect(upstream.locator("#upstream-state")).to_have_text("connected", timeout=15_000)
    checks.check(True, f"{tag}: the overview shows the upstream connected")
    events = page.locator("#note-in")

    def events_in():
        # The count as a one-element tuple (0 is a count too), or None while the page (re)draws: a click
        # on Overview mounts it anew, so text read just after a check may be the new page's, still empty.
        text = events.inner_text()
        words = text.split()
        if not words or "since start" not in text or not words[0].replace(",", "").isdigit():
            return None
        return (int(words[0].replace(",", "")),)

    first = wait_until(events_in, 10, "the events-in count shown")[0]
    wait_until(lambda: (events_in() or (first,))[0] > first, 10, "the events-in count moving")
    checks.check(True, f"{tag}: the events-in count moves ({first} and up)")
    expect(page.locator("#spark-in svg path.line")).to_have_count(1, timeout=10_000)
    checks.check(True, f"{tag}: the events-in sparkline is drawn")
    markets = page.get_by_role("table", name="Markets")
    expect(markets.locator("tbody tr")).to_have_count(6, timeout=10_000)
    expect(markets.locator('tr[data-market="crypto"] .state')).to_have_text("connected", timeout=15_000)
    # Each market's history for resumes: events held and what resumes did.
    expect(markets.locator('tr[data-market="stocks"] .history')).to_contain_text("events", timeout=10_000)
    expect(markets.locator('tr[data-market="stocks"] .resumes')).to_contain_text("replayed")
    # Each market's recording on the tape.
    # Its size and since when it holds (looked at every second until the tape holds a block).
    expect(markets.locator('tr[data-market="stocks"] .tape')).to_have_text(re.compile(r"^\d[\d.,]* [KMG]B · since (\d\d:\d\d UTC|\d{4}-\d\d-\d\d)$"), timeout=10_000)
    checks.check(True, f"{tag}: the overview lists every market's upstream (crypto connected)")
    # The REST gateway: a closed month's bars asked twice through the relay (the vendor once, then the
    # cache), so the card shows a hit rate and the account's budget.
    page.evaluate("""async () => {
        const headers = { Authorization: `Bearer ${sessionStorage.getItem("relay.key")}` };
        for (let i = 0; i < 2; i++) await fetch("/v2/aggs/ticker/AAPL/range/1/day/2026-10-01/2026-10-31", { headers });
    }""")
    expect(page.locator("#stat-gateway")).to_have_text(re.compile(r"^\d+% without a call$"), timeout=10_000)
    expect(page.locator("#note-gateway")).to_contain_text("polygon budget 100/s", timeout=10_000)
    checks.check(True, f"{tag}: the REST gateway card shows its hit rate ({page.locator('#stat-gateway').inner_text()}) and the account's budget")


def check_quotes(page, checks, tag):
    page.get_by_role("link", name="Live quotes").click()
    page.get_by_label("Symbols").fill("AAPL, MSFT")
    page.get_by_role("button", name="Watch").click()
    bid = page.locator('tr[data-symbol="AAPL"] td').first
    wait_until(lambda: bid.inner_text() not in ("—", ""), 15, "a quote for AAPL over the relay's WebSocket")
    checks.check(True, f"{tag}: live quotes arrive through the relay's WebSocket (AAPL bid {bid.inner_text()})")
    check_bars(page, checks, tag, "AAPL")
    # A second market: crypto at its own path, its pairs in the market's ticker form.
    btc = watch_market(page, "crypto", "/crypto", "X:BTC-USD")
    checks.check(True, f"{tag}: picking crypto shows live X:BTC-USD quotes from /crypto (bid {btc})")
    watch_market(page, "stocks", "/stocks")


def check_bars(page, checks, tag, symbol):
    """The first symbol's 5-second bars, built by the relay from the trades: at least two candles drawn
    and the last bar's values told in text."""
    panel = page.get_by_role("region", name=f"5-second bars: {symbol}")
    expect(panel).to_be_visible(timeout=10_000)
    candles = panel.locator("svg.candles rect")
    # The first window the relay sees began before it subscribed: its bar is not sent; two more take 10-17 s.
    wait_until(lambda: candles.count() >= 2, 30, f"two 5-second bars of {symbol}")
    note = panel.locator("#bars-note").inner_text()
    checks.check(note.startswith("Last bar") and "close" in note,
                 f"{tag}: the live quotes page charts {symbol}'s 5-second bars, built by the relay ({candles.count()} bars; {note})")


def watch_market(page, market, path, symbol=None):
    """Picks a market on the live quotes page and waits for its connection at `path` and, given a
    symbol, for its first quote; returns the bid shown."""
    page.get_by_label("Market").select_option(market)
    expect(page.locator("#quotes-connection")).to_have_text(f"Connected to {path}", timeout=15_000)
    if symbol is None:
        return None
    bid = page.locator(f'tr[data-symbol="{symbol}"] td').first
    wait_until(lambda: bid.inner_text() not in ("—", ""), 15, f"a quote for {symbol} over {path}")
    return bid.inner_text()


def holdings_symbols(page):
    return page.locator("#holdings tbody tr").evaluate_all("rows => rows.map(r => r.dataset.symbol)")


def check_portfolio(page, checks, tag, first):
    page.get_by_role("link", name="Portfolio").click()
    table = page.get_by_role("table", name="Holdings")
    expect(table.locator("tbody tr")).to_have_count(12, timeout=15_000)
    symbols = holdings_symbols(page)
    sample = {"AAPL", "MSFT", "NVDA", "AMZN", "META", "TSLA"}
    checks.check(sample <= set(symbols), f"{tag}: the holdings table lists the sample holdings ({', '.join(symbols)})")
    if first:
        table.get_by_role("button", name="Symbol").click()
        expect(table.locator("th[data-field=symbol]")).to_have_attribute("aria-sort", "ascending", timeout=10_000)
        wait_until(lambda: holdings_symbols(page) == sorted(symbols), 10, "the holdings sorted by symbol A to Z")
        table.get_by_role("button", name="Symbol").click()
        expect(table.locator("th[data-field=symbol]")).to_have_attribute("aria-sort", "descending", timeout=10_000)
        wait_until(lambda: holdings_symbols(page) == sorted(symbols, reverse=True), 10, "the holdings sorted by symbol Z to A")
        checks.check(True, f"{tag}: the holdings sort by symbol both ways")
        table.get_by_role("button", name="Market value").click()
        expect(table.locator("th[data-field=marketValue]")).to_have_attribute("aria-sort", "descending", timeout=10_000)
        page.get_by_label("Filter by symbol").fill("AA")
        expect(table.locator("tbody tr")).to_have_count(1, timeout=10_000)
        checks.check(holdings_symbols(page) == ["AAPL"], f"{tag}: the filter narrows the holdings to AAPL")
        page.get_by_label("Filter by symbol").fill("")
        expect(table.locator("tbody tr")).to_have_count(12, timeout=10_000)
    crypto = table.locator('tr[data-symbol="X:BTC-USD"] td')
    wait_until(lambda: any(re.search(r"[1-9]", cell) for cell in crypto.all_inner_texts()[1:3]), 15, "the crypto holding priced")
    checks.check(True, f"{tag}: the crypto holding X:BTC-USD is priced live from the crypto market ({' | '.join(crypto.all_inner_texts()[:4])})")
    total = page.get_by_role("region", name="Portfolio total")
    expect(total.locator("#total-value")).not_to_have_text("—", timeout=10_000)
    expect(total.locator("#partial-banner")).to_contain_text("ZZZQ", timeout=10_000)
    checks.check(True, f"{tag}: the total ({total.locator('#total-value').inner_text()}) shows a partial banner naming ZZZQ")
    page.get_by_role("button", name="All").click()
    chart = page.locator('#history-chart svg[data-range="All"]')
    expect(chart).to_have_attribute("data-points", re.compile(r"^[1-9][0-9]+$"), timeout=10_000)
    points = int(chart.get_attribute("data-points"))
    circles = chart.locator("circle.point").count()
    label = chart.get_attribute("aria-label")
    checks.check(points > 30 and circles == points, f"{tag}: the history chart draws its {points} daily points ({circles} drawn)")
    checks.check("latest" in (label or ""), f"{tag}: the chart's text alternative gives the latest value ({label})")
    box = chart.bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] / 2)
    expect(chart).to_have_attribute("data-hover", re.compile(r"\d{4}-\d\d-\d\d"), timeout=5_000)
    checks.check(True, f"{tag}: hovering the chart shows a day's value ({chart.get_attribute('data-hover')})")


def check_security(page, checks, tag, steps):
    table = page.get_by_role("table", name="Holdings")
    order = holdings_symbols(page)
    table.get_by_role("link", name=order[0], exact=True).click()
    expect(page.locator("#detail")).to_have_attribute("data-loaded", order[0], timeout=15_000)
    for group in ["Quote and market", "Price history", "Transactions (past year)", "Tax lots"]:
        expect(page.get_by_role("region", name=group)).to_be_visible()
    checks.check(True, f"{tag}: a holding's detail shows its four groups")
    slow = []

    def step(key, expected):
        # The neighbours are prefetched once a detail is shown; a person reads before pressing on.
        page.wait_for_timeout(300)
        page.keyboard.press(key)
        expect(page.locator("#detail")).to_have_attribute("data-loaded", expected, timeout=10_000)
        return float(page.locator("#detail").get_attribute("data-step-ms"))

    for index in range(1, steps + 1):
        expected = order[index]
        took = step("j", expected)
        print(f"     step to {expected}: {took:.0f} ms ({page.locator('#detail-position').inner_text()})")
        if took > STEP_LIMIT_MS:
            # One slow step on a loaded machine (a debug relay beside chromium on two cores) is a
            # hiccup; a slow path is slow again. Step back and forward once more and judge the retry.
            step("k", order[index - 1])
            again = step("j", expected)
            print(f"     step to {expected} again: {again:.0f} ms")
            if again > STEP_LIMIT_MS:
                slow.append(f"{expected} {took:.0f} then {again:.0f} ms")
    checks.check(not slow, f"{tag}: {steps} steps with j each show the detail within {STEP_LIMIT_MS} ms" + (f" (slow: {', '.join(slow)})" if slow else ""))
    page.keyboard.press("k")
    expect(page.locator("#detail")).to_have_attribute("data-loaded", order[steps - 1], timeout=10_000)
    checks.check(True, f"{tag}: k steps back")


def check_form_error(page, checks, errors):
    page.get_by_role("link", name="Portfolio").click()
    form = page.get_by_role("form", name="Add a transaction")
    quantity = form.get_by_label("Quantity")
    error = page.locator("#tx-quantity-error")

    def next_to_quantity():
        return error.evaluate("(node) => node.parentElement.contains(document.getElementById('tx-quantity'))")

    # Refused in the page, before any request: an exponent, as the API refuses it.
    form.get_by_label("Kind").select_option("buy")
    form.get_by_label("Symbol").fill("AAPL")
    quantity.fill("1e3")
    form.get_by_label("Price").fill("10")
    form.get_by_role("button", name="Add transaction").click()
    expect(error).not_to_be_empty(timeout=10_000)
    checks.check(
        quantity.get_attribute("aria-invalid") == "true" and next_to_quantity(),
        f"a malformed quantity is shown next to the Quantity field: “{error.inner_text()}”")
    # Refused by the relay: selling more than is held. The browser itself reports the refused request
    # (a 4xx "Failed to load resource" line); that one line is expected, nothing else.
    before = len(errors)
    form.get_by_label("Kind").select_option("sell")
    quantity.fill("100000")
    form.get_by_role("button", name="Add transaction").click()
    expect(error).to_contain_text("held", timeout=10_000)
    checks.check(
        quantity.get_attribute("aria-invalid") == "true" and next_to_quantity(),
        f"the relay's refusal of an oversell is shown next to the Quantity field: “{error.inner_text()}”")
    extra = errors[before:]
    checks.check(len(extra) <= 1 and all("status of 4" in e for e in extra), f"only the refused request is reported by the browser ({extra})")
    del errors[before:]


if __name__ == "__main__":
    main()
