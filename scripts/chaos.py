#!/usr/bin/env python3
"""Chaos run of a relay cluster: three nodes on a real nats-server (JetStream, loopback), a mock Polygon
upstream that counts its connections, and clients that check every event arrived or was announced lost.

    python3 scripts/chaos.py --relay .build/debug/relay --duration 60
    scripts/chaos --duration 1800          # the wrapper: installs nats-server, builds a release relay

Pieces, all in this one process (stdlib only, one asyncio loop) besides nats-server and the nodes:

- **Mock upstream** (`MockUpstream`): a WebSocket server speaking Polygon's protocol at `/<market>` for
  each market (stocks and futures by default). It emits trades `T` for a few symbols, each symbol with its
  own increasing sequence `q`, to the connections that subscribed them, whether or not anyone is
  connected (the market goes on). It counts the connections open at once per market (the relay must
  never hold two) and serves `/v3/trades/{ticker}` from what it generated, so the relay's gap fill
  works against it. Each node authenticates with its own key (`chaos-n1`, …), so every connection is
  known by node.
- **Link proxies** (`LinkProxy`): each node reaches NATS through a TCP proxy that can be cut (`reset`:
  every connection reset, new ones refused) or stalled (`stall`: nothing forwarded, connections kept,
  as a partition that heals) and restored.
- **Clients** (`Client`): plain clients and tagged-session clients (`KEY#tag`) on each node and market,
  each on a few `T.<SYM>` topics. They reconnect when their node dies (home node first, then the
  others). Each keeps, per symbol, the last `q`; a jump in `q` is a hole, classified when it appears:
  `notice` (a relay status that announces lost events came first on this client since its previous
  event of the symbol: `upstream_disconnected`, `upstream_reconnected`, `lagging`, or `gap` for the
  topic), `reconnect` (the client's own connection broke meanwhile), or `silent`. Recovered events
  (`"_r":1`, the gap fill) fill holes afterwards.
- **Chaos**: at random intervals, `kill -9` of a node, SIGTERM of a node, a restart of nats-server
  (kill -9 or SIGTERM), a cut or stall of one node's NATS link, a reset of one client's connection
  (what makes a tagged client resume on a node that is still up); each fault is undone after a random
  while. After `--duration` every fault is undone and the cluster gets `--settle` seconds.
- **Leadership**: every node's `/healthz` is read twice a second; a market is without a leader while no
  node says `role: leader` for it.

Prints the report as JSON on stdout (and in WORK/report.json), a summary on stderr. Exit status 1 when the
relay misbehaved: more than one upstream connection of a market at once, events lost without any notice,
a tagged client's events lost although the relay said `resumed` (its history allowed it), a node that
exited by itself, or a client still without events at the end. Exit status 2 when the harness itself
could not set up.
"""
import argparse
import asyncio
import base64
import bisect
import collections
import ctypes
import hashlib
import itertools
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.parse

WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
# Statuses that tell a client events were lost here (README: "When the upstream fails", "Slow
# consumers", "Nothing missed silently").
COVERING = {"upstream_disconnected", "upstream_reconnected", "lagging", "gap"}
DEFAULT_SYMBOLS = {
    "stocks": ["AAPL", "MSFT", "NVDA", "TSLA", "AMD"],
    "futures": ["ESZ5", "NQZ5", "CLZ5", "GCZ5", "ZNZ5"],
}
START = time.monotonic()
# Per symbol, how the last this many distinct `q` arrived at a client (for the recovered duplicates' samples).
ARRIVALS_KEPT = 5000
# Samples in the report: holes in `lost_events` per kind, recovered duplicates per kind.
LOST_SAMPLES_PER_KIND = 40
DUPLICATE_SAMPLES_PER_KIND = 30
# The faults, with their weights.
ACTIONS = {"kill9": 3, "sigterm": 2, "nats_restart": 1, "link_cut": 2, "client_reset": 2}


def rel(t=None):
    """Seconds since the script started, for logs and the report."""
    return round((time.monotonic() if t is None else t) - START, 2)


def say(*parts):
    print(f"[{rel():8.2f}]", *parts, file=sys.stderr, flush=True)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def reset_transport(transport):
    """Close with a TCP reset, as a killed peer or a broken network leaves a connection."""
    if transport is None or transport.is_closing():
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
    transport.abort()


async def wait_event(event, timeout):
    """Waits for `event` at most `timeout` seconds; True when it is set."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return event.is_set()


# MARK: WebSocket framing


def mask_bytes(data, key):
    n = len(data)
    if n == 0:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(data, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


def ws_frame(opcode, payload, mask):
    header = bytearray([0x80 | opcode])
    n, bit = len(payload), 0x80 if mask else 0
    if n < 126:
        header.append(bit | n)
    elif n < 65536:
        header.append(bit | 126)
        header += struct.pack("!H", n)
    else:
        header.append(bit | 127)
        header += struct.pack("!Q", n)
    if mask:
        key = os.urandom(4)
        header += key
        payload = mask_bytes(payload, key)
    return bytes(header) + payload


class FrameReader:
    """Incremental WebSocket frame parser (either side); reassembles fragmented messages."""

    def __init__(self):
        self.buf = bytearray()
        self.fragments = None

    def feed(self, data):
        self.buf += data
        out = []
        while True:
            b = self.buf
            if len(b) < 2:
                break
            fin, opcode, masked, n, off = b[0] & 0x80, b[0] & 0x0F, b[1] & 0x80, b[1] & 0x7F, 2
            if n == 126:
                if len(b) < 4:
                    break
                n, off = struct.unpack_from("!H", b, 2)[0], 4
            elif n == 127:
                if len(b) < 10:
                    break
                n, off = struct.unpack_from("!Q", b, 2)[0], 10
            key = None
            if masked:
                if len(b) < off + 4:
                    break
                key, off = bytes(b[off:off + 4]), off + 4
            if len(b) < off + n:
                break
            payload = bytes(b[off:off + n])
            del b[:off + n]
            if key:
                payload = mask_bytes(payload, key)
            if opcode == 0:
                if self.fragments is not None:
                    self.fragments[1].append(payload)
                    if fin:
                        out.append((self.fragments[0], b"".join(self.fragments[1])))
                        self.fragments = None
            elif opcode in (1, 2) and not fin:
                self.fragments = (opcode, [payload])
            else:
                out.append((opcode, payload))
        return out


async def http_get(port, path, timeout=1.0):
    """(status, body bytes) of a GET on loopback, or None; the whole exchange bounded by `timeout`."""

    async def exchange():
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n".encode())
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split()[1])
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
            if "content-length" in headers:
                body = await reader.readexactly(int(headers["content-length"]))
            elif headers.get("transfer-encoding", "").lower() == "chunked":
                body = b""
                while True:
                    size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                    if size == 0:
                        break
                    body += await reader.readexactly(size)
                    await reader.readexactly(2)
            else:
                body = await reader.read()
            return status, body
        finally:
            writer.close()

    try:
        return await asyncio.wait_for(exchange(), timeout)
    except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError, ValueError, IndexError, asyncio.LimitOverrunError):
        return None


# MARK: the mock upstream


class UpstreamConnection:
    ids = itertools.count(1)

    def __init__(self, market, writer):
        self.id = next(self.ids)
        self.market = market
        self.writer = writer
        self.node = None
        self.authed = False
        self.topics = set()
        self.opened = time.monotonic()
        self.open = True

    def send(self, text):
        if not self.open or self.writer.is_closing():
            return
        self.writer.write(ws_frame(1, text.encode(), mask=False))


class MarketCounters:
    def __init__(self):
        self.open = 0
        self.max_open = 0
        self.authed = 0
        self.max_authed = 0
        self.total = 0
        self.by_node = collections.Counter()
        self.overlap = None
        self.overlaps = []
        self.generated = 0
        self.subscribes = 0
        self.unsubscribes = 0
        self.slow_closed = 0
        self.zero_since = None
        self.longest_zero = 0.0
        self.longest_zero_at = None
        self.log = collections.deque(maxlen=400)
        self.subscriptions = collections.deque(maxlen=400)


class MockUpstream:
    """Polygon's WebSocket protocol for a few markets, trades with a per-symbol `q`, and the REST trades
    history the gap fill reads. Counts connections per market."""

    def __init__(self, symbols, rate, rng):
        self.symbols = symbols
        self.market_of = {s: m for m, syms in symbols.items() for s in syms}
        self.rate = rate
        self.rng = rng
        self.q = {s: rng.randrange(1000, 100000) for s in self.market_of}
        self.price = {s: round(rng.uniform(20, 500), 2) for s in self.market_of}
        self.last_ns = {s: 0 for s in self.market_of}
        self.history = {s: [] for s in self.market_of}      # (t_ns, q, price, size)
        self.history_t = {s: [] for s in self.market_of}    # t_ns, for bisect
        self.conns = {m: set() for m in symbols}
        self.counters = {m: MarketCounters() for m in symbols}
        self.measuring = False
        self.rest_requests = 0
        self.rest_results = 0
        self.server = None
        self.port = None
        self.stopping = asyncio.Event()

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        self.generator = asyncio.create_task(self.generate())

    async def stop(self):
        self.stopping.set()
        self.server.close()
        for conns in self.conns.values():
            for conn in list(conns):
                reset_transport(conn.writer.transport)
        await asyncio.wait([self.generator], timeout=2)

    # connection counting

    def start_measuring(self):
        self.measuring = True
        now = time.monotonic()
        for c in self.counters.values():
            c.max_open, c.max_authed = c.open, c.authed
            c.zero_since = now if c.authed == 0 else None

    def opened(self, conn):
        c = self.counters[conn.market]
        c.log.append({"connection": conn.id, "opened": rel()})
        c.open += 1
        c.total += 1
        c.max_open = max(c.max_open, c.open)
        if c.open > 1 and c.overlap is None:
            c.overlap = {"at": rel(), "nodes": sorted({x.node or "?" for x in self.conns[conn.market]}),
                         "connections": sorted(x.id for x in self.conns[conn.market])}
            say(f"UPSTREAM: {c.open} connections open at once on {conn.market}: {c.overlap}")

    def authenticated(self, conn):
        c = self.counters[conn.market]
        for entry in reversed(c.log):
            if entry["connection"] == conn.id:
                entry["node"] = conn.node
                break
        c.authed += 1
        c.by_node[conn.node] += 1
        c.max_authed = max(c.max_authed, c.authed)
        if c.overlap is not None:
            c.overlap["nodes"] = sorted({x.node or "?" for x in self.conns[conn.market]} | set(c.overlap["nodes"]))
        if c.zero_since is not None:
            gap = time.monotonic() - c.zero_since
            if self.measuring and gap > c.longest_zero:
                c.longest_zero, c.longest_zero_at = gap, rel(c.zero_since)
            c.zero_since = None

    def closed(self, conn):
        if not conn.open:
            return
        conn.open = False
        self.conns[conn.market].discard(conn)
        c = self.counters[conn.market]
        for entry in reversed(c.log):
            if entry["connection"] == conn.id:
                entry["closed"] = rel()
                break
        c.open -= 1
        if conn.authed:
            c.authed -= 1
            if c.authed == 0:
                c.zero_since = time.monotonic()
        if c.overlap is not None and c.open <= 1:
            c.overlap["seconds"] = round(rel() - c.overlap["at"], 2)
            c.overlaps.append(c.overlap)
            c.overlap = None

    # the market

    async def generate(self):
        tick = 0.05
        next_at = time.monotonic()
        while not self.stopping.is_set():
            next_at += tick
            delay = next_at - time.monotonic()
            if delay < -1:
                next_at = time.monotonic()
            await asyncio.sleep(max(0.0, delay))
            now_ns = time.time_ns()
            for market, syms in self.symbols.items():
                batch = {}
                for sym in syms:
                    expected = self.rate * tick
                    n = int(expected) + (1 if self.rng.random() < expected - int(expected) else 0)
                    for _ in range(n):
                        batch.setdefault(sym, []).append(self.trade(sym, now_ns))
                if batch:
                    self.counters[market].generated += sum(len(v) for v in batch.values())
                    self.publish(market, batch)

    def trade(self, sym, now_ns):
        self.q[sym] += 1
        q = self.q[sym]
        t_ns = max(now_ns, self.last_ns[sym] + 1)
        self.last_ns[sym] = t_ns
        self.price[sym] = max(1.0, round(self.price[sym] + self.rng.choice((-0.01, 0, 0.01)), 2))
        size = self.rng.choice((1, 10, 100, 200))
        self.history[sym].append((t_ns, q, self.price[sym], size))
        self.history_t[sym].append(t_ns)
        return (f'{{"ev":"T","sym":"{sym}","i":"{q}","x":4,"p":{self.price[sym]},"s":{size},"c":[0],'
                f'"t":{t_ns // 1_000_000},"q":{q},"z":3}}')

    def publish(self, market, batch):
        for conn in list(self.conns[market]):
            if not conn.authed or not conn.topics:
                continue
            every = "T.*" in conn.topics
            events = [e for sym, evs in batch.items() if every or f"T.{sym}" in conn.topics for e in evs]
            if not events:
                continue
            conn.send("[" + ",".join(events) + "]")
            if conn.writer.transport.get_write_buffer_size() > 8 * 1024 * 1024:
                # Polygon drops a consumer that does not read, with no status.
                self.counters[market].slow_closed += 1
                say(f"upstream: connection {conn.id} ({conn.node}) on {market} does not read: dropped")
                reset_transport(conn.writer.transport)
                self.closed(conn)

    # serving

    async def handle(self, reader, writer):
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split()[:2]
            headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, OSError):
            writer.close()
            return
        path = urllib.parse.urlsplit(target).path
        try:
            if headers.get("upgrade", "").lower() == "websocket":
                market = path.strip("/")
                if market not in self.symbols:
                    self.respond(writer, 404, {"error": f"no market {market}"})
                    return
                await self.serve_websocket(market, reader, writer, headers)
            else:
                self.serve_rest(method, target, writer)
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    def respond(self, writer, status, body):
        data = json.dumps(body).encode()
        reason = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(status, "Error")
        writer.write(f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n"
                     f"Connection: close\r\n\r\n".encode() + data)

    def serve_rest(self, method, target, writer):
        parts = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(parts.query))
        path = urllib.parse.unquote(parts.path)
        if method != "GET" or not path.startswith("/v3/trades/"):
            self.respond(writer, 404, {"status": "NOT_FOUND", "error": f"not served by the chaos mock: {path}"})
            return
        ticker = path[len("/v3/trades/"):]
        if ticker not in self.history:
            self.respond(writer, 200, {"status": "OK", "results": [], "request_id": "chaos"})
            return
        self.rest_requests += 1
        times, rows = self.history_t[ticker], self.history[ticker]
        lo, hi = 0, len(times)
        if "timestamp.gte" in query:
            lo = bisect.bisect_left(times, int(query["timestamp.gte"]))
        if "timestamp.gt" in query:
            lo = max(lo, bisect.bisect_right(times, int(query["timestamp.gt"])))
        if "timestamp.lt" in query:
            hi = bisect.bisect_left(times, int(query["timestamp.lt"]))
        if "timestamp.lte" in query:
            hi = min(hi, bisect.bisect_right(times, int(query["timestamp.lte"])))
        limit = max(1, min(int(query.get("limit", 1000)), 50000))
        chosen = rows[lo:hi]
        if query.get("order") == "desc":
            chosen = chosen[::-1]
        page, rest = chosen[:limit], chosen[limit:]
        results = [{"conditions": [0], "exchange": 4, "id": str(q), "participant_timestamp": t - 1000, "price": p,
                    "sequence_number": q, "sip_timestamp": t, "size": s, "tape": 3} for t, q, p, s in page]
        self.rest_results += len(results)
        body = {"status": "OK", "request_id": "chaos", "results": results}
        if rest and query.get("order") != "desc":
            next_query = dict(query, **{"timestamp.gt": str(page[-1][0])})
            next_query.pop("timestamp.gte", None)
            body["next_url"] = f"http://127.0.0.1:{self.port}/v3/trades/{ticker}?{urllib.parse.urlencode(next_query)}"
        self.respond(writer, 200, body)

    async def serve_websocket(self, market, reader, writer, headers):
        accept = base64.b64encode(hashlib.sha1(headers.get("sec-websocket-key", "").encode() + WS_GUID).digest()).decode()
        response = f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: {accept}\r\n"
        if headers.get("sec-websocket-protocol"):
            response += f"Sec-WebSocket-Protocol: {headers['sec-websocket-protocol'].split(',')[0].strip()}\r\n"
        writer.write((response + "\r\n").encode())
        conn = UpstreamConnection(market, writer)
        self.conns[market].add(conn)
        self.opened(conn)
        conn.send('[{"ev":"status","status":"connected","message":"Connected Successfully"}]')
        frames = FrameReader()
        try:
            while conn.open:
                data = await reader.read(65536)
                if not data:
                    break
                for opcode, payload in frames.feed(data):
                    if opcode == 8:
                        # The peer is done with this connection: it no longer counts.
                        writer.write(ws_frame(8, payload[:2], mask=False))
                        self.closed(conn)
                        return
                    if opcode == 9:
                        writer.write(ws_frame(10, payload, mask=False))
                    elif opcode == 1:
                        self.action(conn, payload)
        finally:
            self.closed(conn)

    def action(self, conn, payload):
        try:
            message = json.loads(payload)
            action, params = message.get("action"), message.get("params", "")
        except (ValueError, AttributeError):
            conn.send('[{"ev":"status","status":"error","message":"malformed message"}]')
            return
        if action == "auth":
            if conn.authed:
                return
            conn.node = params.removeprefix("chaos-") if isinstance(params, str) else "?"
            conn.authed = True
            self.authenticated(conn)
            conn.send('[{"ev":"status","status":"auth_success","message":"authenticated"}]')
        elif action in ("subscribe", "unsubscribe") and conn.authed:
            topics = [t.strip() for t in str(params).split(",") if t.strip()]
            acks = []
            for topic in topics:
                if action == "subscribe":
                    conn.topics.add(topic)
                    self.counters[conn.market].subscribes += 1
                else:
                    conn.topics.discard(topic)
                    self.counters[conn.market].unsubscribes += 1
                verb = "subscribed to" if action == "subscribe" else "unsubscribed to"
                acks.append({"ev": "status", "status": "success", "message": f"{verb}: {topic}"})
            if acks:
                conn.send(json.dumps(acks))
                self.counters[conn.market].subscriptions.append(
                    {"at": rel(), "connection": conn.id, "node": conn.node, "action": action, "topics": ",".join(topics)})


# MARK: the NATS links


class LinkProxy:
    """A TCP proxy between one node and NATS: `reset` resets every connection and refuses new ones;
    `stall` forwards nothing (connections stay open, bytes wait) until restored."""

    def __init__(self, node, target_port):
        self.node = node
        self.target_port = target_port
        self.mode = "up"
        self.flowing = asyncio.Event()
        self.flowing.set()
        self.pairs = set()
        self.port = None

    async def start(self):
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]

    def cut(self, mode):
        self.mode = mode
        if mode == "reset":
            for a, b in list(self.pairs):
                reset_transport(a.transport)
                reset_transport(b.transport)
        else:
            self.flowing.clear()

    def restore(self):
        self.mode = "up"
        self.flowing.set()

    async def stop(self):
        self.restore()
        self.server.close()
        for a, b in list(self.pairs):
            reset_transport(a.transport)
            reset_transport(b.transport)

    async def handle(self, client_reader, client_writer):
        if self.mode == "reset":
            reset_transport(client_writer.transport)
            return
        if not self.flowing.is_set():
            await wait_event(self.flowing, 120)
        if self.mode != "up":
            reset_transport(client_writer.transport)
            return
        try:
            server_reader, server_writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.target_port), 3)
        except (OSError, asyncio.TimeoutError):
            reset_transport(client_writer.transport)
            return
        pair = (client_writer, server_writer)
        self.pairs.add(pair)
        try:
            await asyncio.gather(self.pump(client_reader, server_writer), self.pump(server_reader, client_writer))
        finally:
            self.pairs.discard(pair)
            client_writer.close()
            server_writer.close()

    async def pump(self, reader, writer):
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if not self.flowing.is_set():
                    await wait_event(self.flowing, 120)
                if writer.is_closing():
                    break
                writer.write(data)
                await asyncio.wait_for(writer.drain(), 30)
        except (OSError, asyncio.TimeoutError):
            pass
        finally:
            if not writer.is_closing():
                try:
                    writer.write_eof()
                except OSError:
                    writer.close()


# MARK: processes

CHILDREN = []


def die_with_parent():
    """Runs in the child before exec: SIGKILL it if this script dies (even by kill -9)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def spawn(argv, log_path, env=None):
    log = open(log_path, "ab")
    log.write(f"\n===== chaos: start at {rel()} s: {' '.join(argv)}\n".encode())
    log.flush()
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                            preexec_fn=die_with_parent)
    log.close()
    CHILDREN.append(proc)
    return proc


async def wait_exit(proc, timeout):
    deadline = time.monotonic() + timeout
    while proc.poll() is None and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return proc.poll() is not None


def log_tail(path, lines=15):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 8192))
            return f.read().decode("utf-8", "replace").splitlines()[-lines:]
    except OSError:
        return []


class NatsServer:
    def __init__(self, binary, port, work):
        self.binary, self.port, self.work = binary, port, work
        self.log = os.path.join(work, "nats.log")
        self.proc = None
        self.state = "down"

    def start(self):
        self.ready_before = self.ready_count()
        self.proc = spawn([self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd", os.path.join(self.work, "jetstream")], self.log)
        self.state = "starting"

    def ready_count(self):
        try:
            with open(self.log, "rb") as f:
                return f.read().count(b"Server is ready")
        except OSError:
            return 0

    async def wait_ready(self, timeout=20):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            if self.ready_count() > self.ready_before:
                self.state = "up"
                return True
            await asyncio.sleep(0.1)
        return False

    async def stop(self, hard):
        self.state = "stopping"
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if hard else signal.SIGTERM)
            if not await wait_exit(self.proc, 10):
                self.proc.kill()
                await wait_exit(self.proc, 5)
        self.state = "down"


class RelayNode:
    def __init__(self, index, args, mock, proxy, work):
        self.name = f"n{index}"
        self.index = index
        self.port = free_port()
        self.proxy = proxy
        self.log = os.path.join(work, f"{self.name}.log")
        self.proc = None
        self.state = "down"   # down, starting, up, stopping
        self.lock = asyncio.Lock()
        self.starts = 0
        upstreams = []
        for market in mock.symbols:
            upstreams += ["--upstream", f"ws://127.0.0.1:{mock.port}/{market}"]
        self.argv = [args.relay, "serve", "--listen", f"127.0.0.1:{self.port}", "--cluster", f"nats://127.0.0.1:{proxy.port}",
                     "--cluster-name", "chaos", "--node-id", self.name, *upstreams, "--upstream-key", f"chaos-{self.name}",
                     "--client-keys", "chaos", "--no-portfolio", "--log-level", args.log_level]
        if args.gap_fill:
            self.argv += ["--rest-url", f"http://127.0.0.1:{mock.port}"]
        else:
            self.argv += ["--no-gap-fill"]
        self.argv += args.relay_arg

    def start(self):
        self.proc = spawn(self.argv, self.log)
        self.state = "starting"
        self.starts += 1

    async def wait_ready(self, timeout=45):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            if await http_get(self.port, "/healthz", 1.0) is not None:
                self.state = "up"
                return True
            await asyncio.sleep(0.2)
        return False

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None


# MARK: clients


class SymbolState:
    def __init__(self):
        self.first = None
        self.last = None
        self.mark = None          # (connection, notices, topic notices) at the symbol's last event
        self.mark_was_first = False  # that event was the symbol's first on its connection (its snapshot)
        self.last_s = None
        self.last_at = None
        self.received = 0
        self.duplicates = 0
        self.recovered = 0
        self.recovered_twice = 0        # a recovered q already in a filled hole
        self.recovered_already_had = 0  # a recovered q in no hole: the client had it live or from a replay
        self.recovered_outside = 0
        self.holes = []
        # How each recent q arrived: q -> ((conn, node, recovered, before_resumed, at), ...), its arrivals in
        # order; `arrival_order` has the q in the order they were first seen, to forget the oldest.
        self.arrivals = {}
        self.arrival_order = collections.deque()


class Client(asyncio.Protocol):
    """One downstream client: a minimal WebSocket client on an asyncio protocol, so every chunk read from
    the socket is counted at once (a reset throws away nothing it has not seen, as resume_storm.py)."""

    def __init__(self, harness, name, market, symbols, tagged, home):
        self.harness = harness
        self.name = name
        self.market = market
        self.symbols = symbols
        self.tagged = tagged
        self.home = home
        self.key = f"chaos#{name}" if tagged else "chaos"
        self.syms = {s: SymbolState() for s in symbols}
        self.conn = 0
        self.transport = None
        self.node = None
        self.notices = 0
        self.topic_notices = collections.Counter()
        self.statuses = collections.Counter()
        self.resumed_conns = set()
        # Holes a COVERING status within 5 s on the same connection marks as told late (`late_notice`): silent
        # ones, and a tagged client's holes across its reconnect (resume_loss if that connection got `resumed`).
        self.late_notice_candidates = []
        self.reconnect_holes = []   # a tagged client's reconnect holes on its current connection
        # Recovered duplicates on a tagged connection before its `resumed`: (st, kind, sample). A replay's if
        # `resumed` comes (counted in `duplicates`), else recovered duplicates once the connection is over.
        self.pending_replay = []
        self.notes = collections.deque(maxlen=40)
        self.errors = []
        self.incomplete_fills = 0
        self.connections_by_node = collections.Counter()
        self.connect_failures = 0
        self.malformed = 0
        self.changed = asyncio.Event()
        self.lost = asyncio.Event()
        self.lost.set()
        self.conn_statuses = collections.Counter()
        self.stopping = False

    # connection

    async def run(self):
        nodes = self.harness.nodes
        attempt = 0
        while not self.stopping:
            node = nodes[(self.home + attempt) % len(nodes)]
            try:
                await self.connect(node)
            except (OSError, asyncio.TimeoutError, ConnectionError) as error:
                self.connect_failures += 1
                reset_transport(self.transport)
                attempt += 1
                await asyncio.sleep(0.2 if attempt % len(nodes) else 1.0)
                continue
            attempt = 0
            self.connections_by_node[node.name] += 1
            await self.lost.wait()
            self.notes.append((rel(), f"connection {self.conn} to {node.name} lost"))
            await asyncio.sleep(self.harness.rng.uniform(0.05, 0.5))

    async def connect(self, node):
        loop = asyncio.get_running_loop()
        self.settle_pending_replay()
        self.reconnect_holes = []
        self.conn += 1
        self.frames = FrameReader()
        self.upgraded = False
        self.head = b""
        self.conn_statuses = collections.Counter()
        self.lost.clear()
        self.node = node
        await asyncio.wait_for(loop.create_connection(lambda: self, "127.0.0.1", node.port), 2)
        key = base64.b64encode(os.urandom(16)).decode()
        self.transport.write((f"GET /{self.market} HTTP/1.1\r\nHost: 127.0.0.1:{node.port}\r\nUpgrade: websocket\r\n"
                              f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        await self.until(lambda: self.conn_statuses["connected"] > 0, 5)
        self.send({"action": "auth", "params": self.key})
        await self.until(lambda: self.conn_statuses["auth_success"] > 0, 5)
        self.send({"action": "subscribe", "params": ",".join(f"T.{s}" for s in self.symbols)})
        await self.until(lambda: self.conn_statuses["success"] > 0, 5)
        self.notes.append((rel(), f"connection {self.conn} to {node.name} subscribed"))

    async def until(self, condition, timeout):
        deadline = time.monotonic() + timeout
        while not condition():
            if self.lost.is_set():
                raise ConnectionError("connection lost")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise asyncio.TimeoutError()
            self.changed.clear()
            await wait_event(self.changed, remaining)

    def send(self, message):
        if self.transport and not self.transport.is_closing():
            self.transport.write(ws_frame(1, json.dumps(message).encode(), mask=True))

    def cut(self):
        reset_transport(self.transport)

    def connection_made(self, transport):
        self.transport = transport

    def connection_lost(self, exc):
        self.lost.set()
        self.changed.set()

    def data_received(self, data):
        if not self.upgraded:
            self.head += data
            head, sep, rest = self.head.partition(b"\r\n\r\n")
            if not sep:
                return
            status_line = head.split(b"\r\n", 1)[0]
            if b" 101 " not in status_line:
                self.errors.append(f"{rel()} upgrade refused by {self.node.name}: {status_line.decode('latin-1')}")
                self.transport.close()
                return
            self.upgraded = True
            data = rest
        for opcode, payload in self.frames.feed(data):
            if opcode == 1:
                self.on_text(payload)
            elif opcode == 9:
                self.transport.write(ws_frame(10, payload, mask=True))
            elif opcode == 8:
                code = struct.unpack("!H", payload[:2])[0] if len(payload) >= 2 else None
                self.notes.append((rel(), f"close {code} from {self.node.name}"))
                self.transport.write(ws_frame(8, payload[:2], mask=True))
                self.transport.close()

    # events

    def on_text(self, payload):
        try:
            messages = json.loads(payload)
        except ValueError:
            self.malformed += 1
            return
        for m in messages if isinstance(messages, list) else [messages]:
            if not isinstance(m, dict):
                self.malformed += 1
            elif m.get("ev") == "status":
                self.on_status(m)
            elif m.get("ev") == "T":
                self.on_event(m)
        self.changed.set()

    def on_status(self, m):
        status = m.get("status")
        self.statuses[status] += 1
        self.conn_statuses[status] += 1
        if status in ("connected", "auth_success", "success"):
            return
        detail = f" topics={json.dumps(m.get('topics'))} complete={m.get('complete')}" if status == "recovered" else ""
        self.notes.append((rel(), f"{status}: {str(m.get('message', ''))[:120]}{detail}"))
        if status in COVERING:
            topic = m.get("topic")
            if status == "gap" and isinstance(topic, str) and topic.startswith("T."):
                self.topic_notices[topic[2:]] += 1
            else:
                self.notices += 1
            # A notice right after a silent hole, or after a tagged client's hole across its reconnect, on the
            # same connection: told late, not missing silently (and the hole is the failover's, not the resume's).
            now = time.monotonic()
            for hole in self.late_notice_candidates:
                if "late_notice" not in hole and hole["conn"] == self.conn and now - hole["mono"] < 5 and (
                        status != "gap" or topic == f"T.{hole['symbol']}"):
                    hole["late_notice"] = {"status": status, "at": rel()}
            self.late_notice_candidates = [h for h in self.late_notice_candidates if now - h["mono"] < 5]
        elif status == "resumed":
            self.resumed_conns.add(self.conn)
            # The replay is over: recovered events it repeated were the resume margin's duplicates.
            for st, _, _ in self.pending_replay:
                st.duplicates += 1
            self.pending_replay = []
            for hole in self.reconnect_holes:
                if "late_notice" not in hole:
                    self.say_resume_loss(hole)
        elif status == "recovered":
            if m.get("complete") is False:
                self.incomplete_fills += 1
        elif status == "error" and len(self.errors) < 20:
            self.errors.append(f"{rel()} {self.node.name}: {m.get('message')}")

    def on_event(self, m):
        sym, q = m.get("sym"), m.get("q")
        st = self.syms.get(sym)
        if st is None or not isinstance(q, int):
            self.malformed += 1
            return
        if m.get("_r"):
            self.on_recovered(st, sym, q, m)
            return
        st.received += 1
        self.arrived(st, q, False)
        if st.first is None:
            st.first = q
        if st.last is not None and q <= st.last:
            st.duplicates += 1
            return
        if st.last is not None and q > st.last + 1:
            self.hole(st, sym, st.last + 1, q - 1, m)
        st.mark_was_first = st.mark is None or st.mark[0] != self.conn
        st.last = q
        st.mark = (self.conn, self.notices, self.topic_notices[sym])
        st.last_s = m.get("_s")
        st.last_at = time.monotonic()

    def arrived(self, st, q, recovered):
        """Notes how `q` arrived (kept for the last ARRIVALS_KEPT distinct q of the symbol); its arrivals so far."""
        arrival = (self.conn, self.node.name, recovered, self.tagged and self.conn not in self.resumed_conns, rel())
        seen = st.arrivals.get(q)
        if seen is None:
            seen = st.arrivals[q] = (arrival,)
            st.arrival_order.append(q)
            if len(st.arrival_order) > ARRIVALS_KEPT:
                st.arrivals.pop(st.arrival_order.popleft(), None)
        elif len(seen) < 8:
            seen = st.arrivals[q] = seen + (arrival,)
        return seen

    def on_recovered(self, st, sym, q, m):
        st.recovered += 1
        arrivals = self.arrived(st, q, True)
        if st.last is None or q < st.first:
            st.recovered_outside += 1
            return
        if q > st.last:
            if q > st.last + 1:
                self.hole(st, sym, st.last + 1, q - 1, m)
            st.last = q
            st.mark = (self.conn, self.notices, self.topic_notices[sym])
            st.mark_was_first = False
            return
        in_hole = None
        for hole in reversed(st.holes):
            if hole["lo"] <= q <= hole["hi"]:
                if q not in hole["filled"]:
                    hole["filled"].add(q)
                    return
                in_hole = hole
                break
        kind = "recovered_twice" if in_hole is not None else "recovered_already_had"
        sample = {"symbol": sym, "q": q, "at": rel(), "conn": self.conn, "node": self.node.name, "arrivals": arrivals,
                  "hole": in_hole, "s": m.get("_s")}
        if self.tagged and self.conn not in self.resumed_conns:
            # Perhaps a resume's replay repeating what the client had (the margin); settled by `resumed`.
            self.pending_replay.append((st, kind, sample))
        else:
            self.recovered_duplicate(st, kind, sample)

    def recovered_duplicate(self, st, kind, sample):
        if kind == "recovered_twice":
            st.recovered_twice += 1
        else:
            st.recovered_already_had += 1
        self.harness.offer_duplicate_sample(kind, self, sample)

    def settle_pending_replay(self):
        """Recovered duplicates of a tagged connection that ended (or is still open at the end) without
        `resumed`: no replay, so they count as recovered duplicates."""
        for st, kind, sample in self.pending_replay:
            self.recovered_duplicate(st, kind, sample)
        self.pending_replay = []

    def describe_arrival(self, arrival):
        conn, node, recovered, before_resumed, at = arrival
        if before_resumed and conn in self.resumed_conns:
            how = "replayed_recovered" if recovered else "replayed"
        else:
            how = "recovered" if recovered else "live"
        return {"conn": conn, "node": node, "how": how, "at": at}

    def describe_duplicate(self, kind, sample):
        """A recovered duplicate's sample for the report, with how the client got that q each time."""
        out = {"kind": kind, "client": self.name, "tagged": self.tagged, "symbol": sample["symbol"], "q": sample["q"],
               "at": sample["at"], "conn": sample["conn"], "node": sample["node"], "s": sample["s"],
               "connection_resumed": sample["conn"] in self.resumed_conns,
               "arrivals": [self.describe_arrival(a) for a in sample["arrivals"]],
               "client_notes": sample.get("notes", [])}
        hole = sample["hole"]
        if hole is not None:
            out["hole"] = {"lo": hole["lo"], "hi": hole["hi"], "kind": self.final_kind(hole), "conn": hole["conn"],
                           "node": hole["node"], "at": hole["at"], "filled": len(hole["filled"])}
        return out

    def hole(self, st, sym, lo, hi, m):
        conn, notices, topic_notices = st.mark
        if self.notices > notices or self.topic_notices[sym] > topic_notices:
            kind = "notice"
        elif conn != self.conn:
            kind = "reconnect"
        elif st.mark_was_first:
            # Between the snapshot a subscription starts with and the first live event.
            kind = "after_snapshot"
        else:
            kind = "silent"
        hole = {"client": self.name, "symbol": sym, "lo": lo, "hi": hi, "kind": kind, "conn": self.conn,
                "node": self.node.name, "at": rel(), "mono": time.monotonic(), "filled": set(),
                "s_before": st.last_s, "s_after": m.get("_s"), "recovered": bool(m.get("_r"))}
        # What the client saw just before (its notes roll over long before the report is written), and how
        # the events either side of the hole arrived: what a hole's cause is read from.
        hole["notes_before"] = list(self.notes)[-12:]
        hole["around"] = {q: [self.describe_arrival(a) for a in st.arrivals.get(q, ())] for q in (lo - 2, lo - 1, hi + 1)}
        st.holes.append(hole)
        if kind == "silent" or (kind == "reconnect" and self.tagged):
            # Either may yet turn out told late (see on_status); a tagged client's reconnect hole is the
            # resume's (resume_loss) unless so, or unless the connection is never `resumed` (not_resumed).
            self.late_notice_candidates = [h for h in self.late_notice_candidates if hole["mono"] - h["mono"] < 5]
            self.late_notice_candidates.append(hole)
        if kind == "reconnect" and self.tagged:
            self.reconnect_holes.append(hole)
            if self.conn in self.resumed_conns:
                self.say_resume_loss(hole)
        if kind in ("silent", "after_snapshot"):
            say(f"client {self.name} on {self.node.name}: {hi - lo + 1} events of {sym} missing (q {lo}..{hi}), "
                f"no notice so far (_s {st.last_s} -> {m.get('_s')}){' right after its snapshot' if kind != 'silent' else ''}")

    def say_resume_loss(self, hole):
        say(f"client {self.name} on {hole['node']}: {hole['hi'] - hole['lo'] + 1} events of {hole['symbol']} missing "
            f"(q {hole['lo']}..{hole['hi']}) across a reconnect the relay answered `resumed`, no notice so far "
            f"(_s {hole['s_before']} -> {hole['s_after']})")

    def final_kind(self, hole):
        kind = hole["kind"]
        if kind == "reconnect" and self.tagged:
            if hole["conn"] not in self.resumed_conns:
                return "not_resumed"
            return "late_notice" if "late_notice" in hole else "resume_loss"
        if kind == "silent" and "late_notice" in hole:
            return "late_notice"
        return kind

    def summary(self, stall_seconds):
        self.settle_pending_replay()
        lost = collections.Counter()
        recovered_in_holes = 0
        for st in self.syms.values():
            for hole in st.holes:
                missing = hole["hi"] - hole["lo"] + 1 - len(hole["filled"])
                recovered_in_holes += len(hole["filled"])
                lost[self.final_kind(hole)] += missing
        now = time.monotonic()
        stalled = [s for s, st in self.syms.items() if st.last_at is None or now - st.last_at > stall_seconds]
        return {
            "name": self.name, "tagged": self.tagged, "market": self.market, "symbols": self.symbols, "home": f"n{self.home + 1}",
            "received": sum(st.received for st in self.syms.values()),
            "lost_silent": lost["silent"], "lost_after_snapshot": lost["after_snapshot"], "lost_late_notice": lost["late_notice"],
            "lost_with_notice": lost["notice"],
            "lost_own_reconnect": lost["reconnect"], "tagged_lost_after_resumed": lost["resume_loss"],
            "tagged_lost_not_resumed": lost["not_resumed"],
            "recovered": sum(st.recovered for st in self.syms.values()), "recovered_into_holes": recovered_in_holes,
            "recovered_duplicates": sum(st.recovered_twice + st.recovered_already_had for st in self.syms.values()),
            "recovered_twice": sum(st.recovered_twice for st in self.syms.values()),
            "recovered_already_had": sum(st.recovered_already_had for st in self.syms.values()),
            "duplicates": sum(st.duplicates for st in self.syms.values()),
            "connections": self.conn, "connections_by_node": dict(self.connections_by_node), "connect_failures": self.connect_failures,
            "resumed": self.statuses["resumed"], "statuses": {k: v for k, v in sorted(self.statuses.items()) if k not in ("success",)},
            "incomplete_fills": self.incomplete_fills, "malformed": self.malformed, "errors": self.errors[:5],
            "stalled_symbols": stalled,
        }


# MARK: the harness


class Harness:
    def __init__(self, args):
        self.args = args
        self.rng = random.Random(args.seed)
        self.work = args.work_dir or tempfile.mkdtemp(prefix="relay-chaos-")
        os.makedirs(self.work, exist_ok=True)
        markets = [m.strip() for m in args.markets.split(",") if m.strip()]
        self.symbols = {m: DEFAULT_SYMBOLS[m][:args.symbols] for m in markets}
        self.mock = MockUpstream(self.symbols, args.rate, random.Random(self.rng.random()))
        self.nodes = []
        self.proxies = []
        self.clients = []
        self.tasks = []
        self.background = set()
        self.chaos_over = asyncio.Event()
        self.stop = asyncio.Event()
        self.actions = collections.Counter()
        self.chaos_log = []
        self.node_exits = []
        self.harness_errors = []
        self.leadership = {m: {"last_ok": None, "longest": 0.0, "longest_at": None, "changes": 0, "leader": None,
                               "multiple": 0, "samples": 0, "leaderless_samples": 0} for m in self.symbols}
        self.measuring = False
        # A uniform sample of the recovered duplicates of each kind (reservoir), with its own generator so
        # sampling does not change the chaos a seed chooses.
        self.duplicate_samples = {"recovered_twice": [], "recovered_already_had": []}
        self.duplicates_seen = collections.Counter()
        self.sample_rng = random.Random(f"samples-{args.seed}")

    def offer_duplicate_sample(self, kind, client, sample):
        self.duplicates_seen[kind] += 1
        kept = self.duplicate_samples[kind]
        if len(kept) < DUPLICATE_SAMPLES_PER_KIND:
            slot = len(kept)
            kept.append(None)
        else:
            slot = self.sample_rng.randrange(self.duplicates_seen[kind])
            if slot >= DUPLICATE_SAMPLES_PER_KIND:
                return
        sample["notes"] = [n for n in client.notes if sample["at"] - 10 <= n[0] <= sample["at"] + 5][-8:]
        kept[slot] = (client, sample)

    def record(self, kind, **details):
        self.actions[kind] += 1
        entry = {"at": rel(), "action": kind, **details}
        self.chaos_log.append(entry)
        say("chaos:", kind, " ".join(f"{k}={v}" for k, v in details.items()))

    def spawn_background(self, coroutine):
        task = asyncio.create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    async def pause(self, seconds):
        """Sleeps, but wakes as soon as the chaos is over (so every fault is undone at once)."""
        await wait_event(self.chaos_over, seconds)

    # setup

    async def setup(self):
        await self.mock.start()
        nats_binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        self.nats = NatsServer(nats_binary, free_port(), self.work)
        self.nats.start()
        if not await self.nats.wait_ready():
            raise RuntimeError(f"nats-server did not start: {log_tail(self.nats.log)}")
        for index in range(1, self.args.nodes + 1):
            proxy = LinkProxy(f"n{index}", self.nats.port)
            await proxy.start()
            self.proxies.append(proxy)
            self.nodes.append(RelayNode(index, self.args, self.mock, proxy, self.work))
        for node in self.nodes:
            node.start()
            if not await node.wait_ready():
                raise RuntimeError(f"{node.name} did not start: {log_tail(node.log)}")
        say(f"upstream mock :{self.mock.port}, NATS :{self.nats.port}, nodes "
            + ", ".join(f"{n.name} :{n.port} (NATS via :{n.proxy.port})" for n in self.nodes) + f", logs in {self.work}")
        self.tasks.append(asyncio.create_task(self.watch()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(self.leadership[m]["leader"] for m in self.symbols):
            await asyncio.sleep(0.25)
        if not all(self.leadership[m]["leader"] for m in self.symbols):
            raise RuntimeError(f"no leader for every market within 60 s: {self.leadership}")
        say("leaders: " + ", ".join(f"{m} {self.leadership[m]['leader']}" for m in self.symbols))
        index = 0
        for market, syms in self.symbols.items():
            for node in range(len(self.nodes)):
                for tagged in (False, True):
                    for _ in range(self.args.clients_per_node):
                        picked = [syms[(index + k * 2) % len(syms)] for k in range(min(self.args.topics, len(syms)))]
                        name = f"{'t' if tagged else 'p'}{index}-{market[:3]}"
                        self.clients.append(Client(self, name, market, sorted(set(picked)), tagged, node))
                        index += 1
        for client in self.clients:
            self.tasks.append(asyncio.create_task(client.run()))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not all(st.last is not None for c in self.clients for st in c.syms.values()):
            await asyncio.sleep(0.25)
        waiting = [c.name for c in self.clients if any(st.last is None for st in c.syms.values())]
        if waiting:
            raise RuntimeError(f"clients without events 30 s after connecting: {waiting}")
        say(f"{len(self.clients)} clients streaming; chaos for {self.args.duration} s (seed {self.args.seed})")

    # watching: leadership, node exits

    async def watch(self):
        while not self.stop.is_set():
            started = time.monotonic()
            for node in self.nodes:
                if node.state == "up" and node.proc.poll() is not None:
                    node.state = "down"
                    exit_info = {"at": rel(), "node": node.name, "returncode": node.proc.returncode, "log_tail": log_tail(node.log)}
                    self.node_exits.append(exit_info)
                    say(f"NODE EXIT: {node.name} exited by itself with {node.proc.returncode}")
                    self.spawn_background(self.restart_node(node, 1.0))
            live = [n for n in self.nodes if n.state == "up"]
            answers = await asyncio.gather(*(http_get(n.port, "/healthz", 1.0) for n in live))
            now = time.monotonic()
            claims = {m: set() for m in self.symbols}
            for node, answer in zip(live, answers):
                if answer is None:
                    continue
                try:
                    body = json.loads(answer[1])
                except ValueError:
                    continue
                for market in self.symbols:
                    cluster = ((body.get("markets") or {}).get(market) or {}).get("cluster") or {}
                    if cluster.get("role") == "leader":
                        claims[market].add(node.name)
            for market, claimed in claims.items():
                state = self.leadership[market]
                if self.measuring:
                    state["samples"] += 1
                if claimed:
                    if self.measuring and state["last_ok"] is not None:
                        gap = now - state["last_ok"]
                        if gap > state["longest"]:
                            state["longest"], state["longest_at"] = gap, rel(state["last_ok"])
                    state["last_ok"] = now
                    if len(claimed) > 1 and self.measuring:
                        state["multiple"] += 1
                    leader = ",".join(sorted(claimed))
                    if leader != state["leader"]:
                        if state["leader"] is not None and self.measuring:
                            state["changes"] += 1
                        state["leader"] = leader
                elif self.measuring:
                    state["leaderless_samples"] += 1
            await asyncio.sleep(max(0.05, 0.5 - (time.monotonic() - started)))

    # chaos

    def up_nodes(self):
        return [n for n in self.nodes if n.state == "up"]

    def leader_node(self):
        market = self.rng.choice(list(self.symbols))
        names = (self.leadership[market]["leader"] or "").split(",")
        return next((n for n in self.up_nodes() if n.name in names), None)

    def pick_node(self):
        if self.rng.random() < 0.5:
            node = self.leader_node()
            if node:
                return node
        return self.rng.choice(self.up_nodes())

    async def chaos(self):
        until = time.monotonic() + self.args.duration
        while time.monotonic() < until:
            await asyncio.sleep(min(self.rng.uniform(*self.args.interval), max(0.0, until - time.monotonic())))
            if time.monotonic() >= until:
                break
            possible = []
            if len(self.up_nodes()) > self.args.min_up:
                possible += ["kill9", "sigterm"]
            if self.nats.state == "up":
                possible += ["nats_restart"]
            if not any(p.mode != "up" for p in self.proxies):
                possible += ["link_cut"]
            if any(not c.lost.is_set() for c in self.clients):
                possible += ["client_reset"]
            choices = [(kind, ACTIONS[kind]) for kind in possible if kind in self.args.actions]
            if not choices:
                continue
            kinds, weights = zip(*choices)
            kind = self.rng.choices(kinds, weights)[0]
            if kind in ("kill9", "sigterm"):
                node = self.pick_node()
                down_for = self.rng.uniform(*self.args.down)
                async with node.lock:
                    node.state = "stopping"
                    self.record(kind, node=node.name, pid=node.proc.pid, restart_in=round(down_for, 1),
                                leads=[m for m in self.symbols if node.name in (self.leadership[m]["leader"] or "")])
                    node.proc.send_signal(signal.SIGKILL if kind == "kill9" else signal.SIGTERM)
                self.spawn_background(self.stop_then_restart(node, kind, down_for))
            elif kind == "nats_restart":
                hard = self.rng.random() < 0.5
                down_for = self.rng.uniform(0, self.args.down[1] / 2)
                self.record(kind, signal="KILL" if hard else "TERM", pid=self.nats.proc.pid, restart_in=round(down_for, 1))
                self.spawn_background(self.restart_nats(hard, down_for))
            elif kind == "link_cut":
                proxy = self.rng.choice(self.proxies)
                mode = self.rng.choice(("reset", "stall"))
                seconds = self.rng.uniform(*self.args.cut)
                self.record(kind, node=proxy.node, mode=mode, seconds=round(seconds, 1),
                            leads=[m for m in self.symbols if proxy.node in (self.leadership[m]["leader"] or "")])
                proxy.cut(mode)
                self.spawn_background(self.restore_link(proxy, seconds))
            elif kind == "client_reset":
                client = self.rng.choice([c for c in self.clients if not c.lost.is_set()])
                self.record(kind, client=client.name, node=client.node.name, tagged=client.tagged)
                client.cut()

    async def stop_then_restart(self, node, kind, down_for):
        if not await wait_exit(node.proc, 15 if kind == "sigterm" else 5):
            self.harness_errors.append(f"{node.name} still running 15 s after {kind}: killed")
            say(f"{node.name} did not exit 15 s after {kind}: kill -9")
            node.proc.kill()
            await wait_exit(node.proc, 5)
        node.state = "down"
        await self.restart_node(node, down_for)

    async def restart_node(self, node, delay):
        await self.pause(delay)
        async with node.lock:
            for attempt in range(3):
                if node.state != "down":
                    return
                node.start()
                if await node.wait_ready():
                    self.record("node_started", node=node.name)
                    return
                node.state = "down"
                if node.proc.poll() is None:
                    node.proc.kill()
                    await wait_exit(node.proc, 5)
                self.harness_errors.append(f"{node.name} did not come up (attempt {attempt + 1}): {log_tail(node.log, 5)}")
                await asyncio.sleep(2)

    async def restart_nats(self, hard, down_for):
        await self.nats.stop(hard)
        await self.pause(down_for)
        for attempt in range(3):
            self.nats.start()
            if await self.nats.wait_ready():
                self.record("nats_started")
                return
            await self.nats.stop(True)
            self.harness_errors.append(f"nats-server did not come up (attempt {attempt + 1}): {log_tail(self.nats.log, 5)}")
            await asyncio.sleep(2)

    async def restore_link(self, proxy, seconds):
        await self.pause(seconds)
        proxy.restore()
        self.record("link_restored", node=proxy.node)

    async def heal(self):
        """Ends the chaos: every pending fault is undone now; waits (bounded) until all is up again."""
        self.chaos_over.set()
        deadline = time.monotonic() + 90
        while self.background and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        for proxy in self.proxies:
            proxy.restore()
        if self.nats.state == "down":
            await self.restart_nats(False, 0)
        for node in self.nodes:
            if node.state == "down":
                await self.restart_node(node, 0)
        if self.background:
            self.harness_errors.append("faults still being undone 90 s after the chaos ended")

    # run

    async def run(self):
        await self.setup()
        self.measuring = True
        self.mock.start_measuring()
        for state in self.leadership.values():
            state["last_ok"] = time.monotonic() if state["leader"] else None
        await self.chaos()
        say(f"chaos over: undoing every fault, then {self.args.settle} s to settle")
        await self.heal()
        await asyncio.sleep(self.args.settle)
        return self.report()

    def report(self):
        now = time.monotonic()
        upstream = {}
        for market, c in self.mock.counters.items():
            overlaps = list(c.overlaps) + ([dict(c.overlap, seconds=None)] if c.overlap else [])
            longest_zero = c.longest_zero
            if c.zero_since is not None and now - c.zero_since > longest_zero:
                longest_zero = now - c.zero_since
            upstream[market] = {"max_connections_at_once": c.max_open, "max_authenticated_at_once": c.max_authed,
                                "open_now": c.open, "connections_total": c.total, "connections_by_node": dict(c.by_node),
                                "overlaps": overlaps, "longest_without_connection_s": round(longest_zero, 2),
                                "events_generated": c.generated, "subscribes": c.subscribes, "unsubscribes": c.unsubscribes,
                                "dropped_for_not_reading": c.slow_closed, "connections": list(c.log),
                                "subscription_changes": list(c.subscriptions)}
        leadership = {}
        for market, s in self.leadership.items():
            longest = s["longest"]
            if s["last_ok"] is None or now - s["last_ok"] > longest:
                longest = now - (s["last_ok"] or now)
            leadership[market] = {"longest_without_leader_s": round(longest, 2), "longest_without_leader_from": s["longest_at"],
                                  "leader_changes": s["changes"], "leader_now": s["leader"],
                                  "samples_with_two_leaders": s["multiple"], "samples_without_leader": s["leaderless_samples"],
                                  "samples": s["samples"]}
        clients = [c.summary(self.args.stall) for c in self.clients]
        totals = collections.Counter()
        for c in clients:
            for key in ("received", "lost_silent", "lost_after_snapshot", "lost_late_notice", "lost_with_notice", "lost_own_reconnect", "tagged_lost_after_resumed",
                        "tagged_lost_not_resumed", "recovered", "recovered_into_holes", "recovered_duplicates", "recovered_twice",
                        "recovered_already_had", "duplicates", "connections",
                        "resumed", "incomplete_fills", "malformed"):
                totals[key] += c[key]
        silent = []
        lost_holes = collections.Counter()
        for client in self.clients:
            for st in client.syms.values():
                for hole in st.holes:
                    kind = client.final_kind(hole)
                    if kind in ("silent", "after_snapshot", "late_notice", "resume_loss"):
                        missing = hole["hi"] - hole["lo"] + 1 - len(hole["filled"])
                        if missing > 0:
                            lost_holes[kind] += 1
                            silent.append({k: v for k, v in hole.items() if k not in ("filled", "mono")} | {"kind": kind, "missing": missing,
                                          "chaos_before": [e for e in self.chaos_log if hole["at"] - 15 <= e["at"] <= hole["at"]][-4:],
                                          "client_notes": hole.get("notes_before", []) + [n for n in client.notes if hole["at"] < n[0] <= hole["at"] + 5][-8:]})
        silent.sort(key=lambda h: h["at"])
        per_kind = collections.Counter()
        lost_events = []
        for h in silent:
            per_kind[h["kind"]] += 1
            if per_kind[h["kind"]] <= LOST_SAMPLES_PER_KIND:
                lost_events.append(h)
        duplicate_samples = {kind: sorted((client.describe_duplicate(kind, sample) for client, sample in kept),
                                          key=lambda d: d["at"])
                             for kind, kept in self.duplicate_samples.items()}
        failures = []
        for market, u in upstream.items():
            if u["max_connections_at_once"] > 1:
                failures.append(f"{market}: {u['max_connections_at_once']} upstream connections at once ({u['overlaps']})")
        if totals["lost_silent"]:
            failures.append(f"{totals['lost_silent']} events lost without any notice")
        if totals["tagged_lost_after_resumed"]:
            failures.append(f"{totals['tagged_lost_after_resumed']} events lost by tagged clients the relay said it resumed")
        for exit_info in self.node_exits:
            failures.append(f"{exit_info['node']} exited by itself with {exit_info['returncode']} at {exit_info['at']} s")
        stalled = [f"{c['name']}:{','.join(c['stalled_symbols'])}" for c in clients if c["stalled_symbols"]]
        if stalled:
            failures.append(f"clients without events in the last {self.args.stall} s: {' '.join(stalled)}")
        return {
            "ok": not failures, "failures": failures, "harness_errors": self.harness_errors,
            "settings": {"relay": self.args.relay, "duration_s": self.args.duration, "settle_s": self.args.settle, "seed": self.args.seed,
                         "nodes": len(self.nodes), "markets": self.symbols, "trades_per_symbol_per_s": self.args.rate,
                         "gap_fill": self.args.gap_fill, "clients": len(self.clients), "actions": sorted(self.args.actions)},
            "upstream": upstream, "leadership": leadership, "totals": dict(totals),
            "chaos_actions": dict(self.actions), "node_exits": self.node_exits,
            "lost_events": lost_events, "lost_event_holes": dict(lost_holes),
            "recovered_duplicate_samples": duplicate_samples, "clients": clients,
            "rest": {"requests": self.mock.rest_requests, "results": self.mock.rest_results},
            "chaos_log": self.chaos_log, "work_dir": self.work,
        }

    async def shutdown(self):
        self.stop.set()
        self.chaos_over.set()
        for client in self.clients:
            client.stopping = True
            reset_transport(client.transport)
        for task in self.tasks + list(self.background):
            task.cancel()
        pending = self.tasks + list(self.background)
        if pending:
            await asyncio.wait(pending, timeout=5)
        for proc in CHILDREN:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 8
        for proc in CHILDREN:
            while proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
        for proxy in self.proxies:
            await proxy.stop()
        await self.mock.stop()


def kill_children():
    for proc in CHILDREN:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass


def human(report):
    lines = ["", "relay chaos run: " + ("PASSED" if report["ok"] else "FAILED"),
             f"  {report['settings']['duration_s']} s of chaos + {report['settings']['settle_s']} s settling, seed {report['settings']['seed']}, "
             f"{report['settings']['nodes']} nodes, {report['settings']['clients']} clients, gap fill {'on' if report['settings']['gap_fill'] else 'off'}",
             "  chaos: " + ", ".join(f"{k} {v}" for k, v in sorted(report["chaos_actions"].items()))]
    for market, u in report["upstream"].items():
        lead = report["leadership"][market]
        lines.append(f"  {market}: most upstream connections at once {u['max_connections_at_once']} (must be 1); "
                     f"{u['connections_total']} connections in all {u['connections_by_node']}; "
                     f"longest without a leader {lead['longest_without_leader_s']} s, without an upstream connection "
                     f"{u['longest_without_connection_s']} s; {lead['leader_changes']} leader changes")
    t = report["totals"]
    lines += [f"  events received {t.get('received', 0)}, lost without notice {t.get('lost_silent', 0)} (must be 0), "
              f"lost between a subscription's snapshot and its first live event {t.get('lost_after_snapshot', 0)}, "
              f"lost with a late notice {t.get('lost_late_notice', 0)}, lost with a notice {t.get('lost_with_notice', 0)} "
              f"(after {t.get('recovered_into_holes', 0)} recovered by gap fill), lost across a plain client's own reconnect "
              f"{t.get('lost_own_reconnect', 0)}",
              f"  tagged clients: lost although resumed {t.get('tagged_lost_after_resumed', 0)} (must be 0), lost where no session "
              f"could resume (node restarted or another node) {t.get('tagged_lost_not_resumed', 0)}; {t.get('resumed', 0)} resumes",
              f"  duplicates {t.get('duplicates', 0)} (resume margin, snapshots), recovered duplicates {t.get('recovered_duplicates', 0)} "
              f"({t.get('recovered_twice', 0)} into an already filled hole, {t.get('recovered_already_had', 0)} the client had), "
              f"incomplete fills {t.get('incomplete_fills', 0)}"]
    for failure in report["failures"]:
        lines.append(f"  FAILURE: {failure}")
    for error in report["harness_errors"]:
        lines.append(f"  harness: {error}")
    lines.append(f"  logs and report.json: {report['work_dir']}" if report["work_dir"] else "  logs removed (the run passed; --keep keeps them)")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--relay", default=".build/release/relay", help="the relay binary")
    parser.add_argument("--duration", type=float, default=60, help="seconds of chaos (default 60)")
    parser.add_argument("--settle", type=float, default=20, help="seconds after every fault is undone, before the verdict")
    parser.add_argument("--seed", type=int, default=None, help="repeat a run's random choices")
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--markets", default="stocks,futures", help="comma-separated: stocks, futures (both by default)")
    parser.add_argument("--symbols", type=int, default=5, help="symbols per market (at most 5)")
    parser.add_argument("--topics", type=int, default=2, help="T.<SYM> topics per client")
    parser.add_argument("--clients-per-node", type=int, default=1, help="plain and as many tagged clients per node and market")
    parser.add_argument("--rate", type=float, default=10, help="trades per symbol per second")
    parser.add_argument("--interval", type=float, nargs=2, default=(2.0, 6.0), metavar=("MIN", "MAX"), help="seconds between faults")
    parser.add_argument("--down", type=float, nargs=2, default=(0.5, 10.0), metavar=("MIN", "MAX"), help="seconds a stopped node stays down")
    parser.add_argument("--cut", type=float, nargs=2, default=(1.0, 10.0), metavar=("MIN", "MAX"), help="seconds a NATS link stays cut")
    parser.add_argument("--min-up", type=int, default=1, help="nodes left running by the chaos")
    parser.add_argument("--actions", default=",".join(ACTIONS), help=f"the faults to choose from (default all: {','.join(ACTIONS)})")
    parser.add_argument("--stall", type=float, default=5, help="a client with no event of a symbol for this long at the end has stalled")
    parser.add_argument("--no-gap-fill", dest="gap_fill", action="store_false", help="run the nodes without the REST gap fill")
    parser.add_argument("--log-level", default="info", help="the nodes' log level")
    parser.add_argument("--work-dir", help="logs and report here (default: a new temporary directory)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory after a passing run")
    parser.add_argument("--relay-arg", action="append", default=[], help="one more argument for every relay serve (repeatable)")
    args = parser.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1, 1_000_000)
    if not os.access(args.relay, os.X_OK):
        print(f"error: no relay binary at {args.relay} (build it, or pass --relay)", file=sys.stderr)
        return 2
    args.relay = os.path.abspath(args.relay)
    args.actions = {a.strip() for a in args.actions.split(",") if a.strip()}
    if args.actions - set(ACTIONS):
        print(f"error: --actions: unknown {sorted(args.actions - set(ACTIONS))}; of {', '.join(ACTIONS)}", file=sys.stderr)
        return 2
    unknown = [m for m in args.markets.split(",") if m.strip() and m.strip() not in DEFAULT_SYMBOLS]
    if unknown:
        print(f"error: --markets: unknown {unknown}; one of {', '.join(DEFAULT_SYMBOLS)}", file=sys.stderr)
        return 2

    async def run():
        harness = Harness(args)
        loop = asyncio.get_running_loop()
        main_task = asyncio.current_task()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, main_task.cancel)
        try:
            return harness, await harness.run()
        except RuntimeError as error:
            say(f"setup failed: {error}")
            return harness, None
        finally:
            await asyncio.wait_for(harness.shutdown(), 30)

    harness = None
    try:
        harness, report = asyncio.run(run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        kill_children()
    if report is None:
        print(f"setup failed; logs in {harness.work}", file=sys.stderr)
        return 2
    remove = report["ok"] and not args.keep and not args.work_dir
    if remove:
        shutil.rmtree(harness.work, ignore_errors=True)
        report["work_dir"] = None
    else:
        with open(os.path.join(harness.work, "report.json"), "w") as f:
            json.dump(report, f, indent=2)
    print(json.dumps(report))
    print(human(report), file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
