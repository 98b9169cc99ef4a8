#!/usr/bin/env python3
"""The abuse attacks (floods, slow clients, bad input, and the replay, parked-session and hostile-REST ones), run against a
relay on loopback while other clients stream.

Each attack is bounded in count and time, targets 127.0.0.1 only, and prints one JSON line with what
it did and what the relay did back. Standard library only. Used by scripts/abuse; it can also be run
by hand: scripts/abuse_attacks.py --port 8080 --key KEY --pid RELAY_PID. docs/abuse.md describes the
later attacks.
"""
import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import json
import re
import socket
import struct
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

HOST = "127.0.0.1"


def rss_mb(pid):
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def frame(opcode, payload, fin=True):
    """One masked client frame."""
    if isinstance(payload, str):
        payload = payload.encode()
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    if n < 126:
        head += bytes([0x80 | n])
    elif n < 65536:
        head += bytes([0x80 | 126]) + struct.pack(">H", n)
    else:
        head += bytes([0x80 | 127]) + struct.pack(">Q", n)
    mask = b"\x12\x34\x56\x78"
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def text(payload):
    return frame(0x1, payload)


class Client:
    """A raw WebSocket client on a blocking socket."""

    def __init__(self, port, path="/stocks", rcvbuf=None, timeout=5.0):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.settimeout(timeout)
        self.sock.connect((HOST, port))
        self.buffer = b""
        self.path = path

    def upgrade(self):
        self.sock.sendall(
            (f"GET {self.path} HTTP/1.1\r\nHost: {HOST}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
             "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        while b"\r\n\r\n" not in self.buffer:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("closed during upgrade")
            self.buffer += chunk
        head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        if not head.startswith(b"HTTP/1.1 101"):
            raise ConnectionError(head.decode(errors="replace").splitlines()[0])
        return self

    def next_frame(self, timeout=5.0):
        """(opcode, payload) of the next server frame; None on timeout or EOF."""
        deadline = time.monotonic() + timeout
        while True:
            if len(self.buffer) >= 2:
                opcode, n = self.buffer[0] & 0x0F, self.buffer[1] & 0x7F
                offset = 2
                if n == 126 and len(self.buffer) >= 4:
                    n, offset = struct.unpack(">H", self.buffer[2:4])[0], 4
                elif n == 127 and len(self.buffer) >= 10:
                    n, offset = struct.unpack(">Q", self.buffer[2:10])[0], 10
                if n < 126 or offset > 2:
                    if len(self.buffer) >= offset + n:
                        payload = self.buffer[offset:offset + n]
                        self.buffer = self.buffer[offset + n:]
                        return opcode, payload
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except (socket.timeout, OSError):
                return None
            if not chunk:
                return None
            self.buffer += chunk

    def wait_for(self, needle, timeout=5.0):
        """The text of the first frame containing needle, or ('close', code) / None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = self.next_frame(deadline - time.monotonic())
            if got is None:
                return None
            opcode, payload = got
            if opcode == 0x8:
                return ("close", struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None)
            if needle.encode() in payload:
                return payload.decode(errors="replace")
        return None

    def authenticated(self, key):
        self.upgrade()
        self.wait_for("connected")
        self.sock.sendall(text(json.dumps({"action": "auth", "params": key})))
        answer = self.wait_for("auth_")
        if not isinstance(answer, str) or "auth_success" not in answer:
            raise ConnectionError(f"auth: {answer}")
        return self

    def closed_within(self, timeout):
        """Whether the relay closes the connection within timeout (reading and dropping what comes)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.01))
            try:
                if not self.sock.recv(65536):
                    return True
            except socket.timeout:
                return False
            except OSError:
                return True
        return False

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


def send_for(sock, data, seconds):
    """Sends data repeatedly for at most seconds; returns bytes the kernel took."""
    sock.settimeout(1.0)
    sent, deadline = 0, time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            sock.sendall(data)
            sent += len(data)
        except socket.timeout:
            break
        except OSError:
            break
    return sent


def health_ms(port):
    start = time.monotonic()
    try:
        with urllib.request.urlopen(f"http://{HOST}:{port}/healthz", timeout=10) as answer:
            body = json.loads(answer.read() or b"{}")
    except Exception as error:  # noqa: BLE001 - any failure is the outcome
        return None, str(error)
    return round((time.monotonic() - start) * 1000, 1), body


def report(name, **fields):
    print(json.dumps({"attack": name, **fields}), flush=True)


# --- attacks -----------------------------------------------------------------------------------------


def ping_flood(args):
    """1. 64 MB of pings from a client that never reads its pongs."""
    before = rss_mb(args.pid)
    client = Client(args.port, rcvbuf=4096).authenticated(args.key)
    ping = frame(0x9, b"A" * 125) * 500
    sent = 0
    deadline = time.monotonic() + 20
    client.sock.settimeout(2.0)
    while sent < 64 << 20 and time.monotonic() < deadline:
        try:
            client.sock.sendall(ping)
            sent += len(ping)
        except (socket.timeout, OSError):
            break
    report("ping-flood", sent_mb=round(sent / 2**20, 1), rss_before_mb=round(before), rss_after_mb=round(rss_mb(args.pid)))
    client.close()


def unsubscribe_flood(args):
    """1. Four non-reading clients, each 1,000 unsubscribes of 1,000 one-character entries."""
    before = rss_mb(args.pid)
    message = text(json.dumps({"action": "unsubscribe", "params": ",".join("A" * 1000)}))
    results = []

    def one():
        client = Client(args.port, rcvbuf=4096).authenticated(args.key)
        taken = send_for(client.sock, message * 50, 15) // len(message)
        results.append((taken, client.closed_within(10)))
        client.close()

    threads = [threading.Thread(target=one) for _ in range(4)]
    for thread in threads:
        thread.start()
    peak = before
    while any(thread.is_alive() for thread in threads):
        peak = max(peak, rss_mb(args.pid))
        time.sleep(0.2)
    report("unsubscribe-flood", messages_taken=[r[0] for r in results], closed=[r[1] for r in results],
           rss_before_mb=round(before), rss_peak_mb=round(peak))


def big_frames_before_auth(args):
    """2. 100 unauthenticated connections sending 1 MB frames."""
    before = rss_mb(args.pid)
    codes = []
    payload = frame(0x1, b"x" * (1 << 20))
    for _ in range(100):
        try:
            client = Client(args.port).upgrade()
            client.wait_for("connected")
            client.sock.settimeout(2.0)
            try:
                client.sock.sendall(payload)
            except OSError:
                pass
            answer = client.wait_for("never", timeout=3)
            codes.append(answer[1] if isinstance(answer, tuple) else "open")
            client.close()
        except OSError as error:
            codes.append(f"refused: {error}")
    closed_1009 = sum(1 for code in codes if code == 1009)
    report("big-frames-before-auth", connections=100, closed_1009=closed_1009, other=sorted({str(c) for c in codes if c != 1009}),
           rss_before_mb=round(before), rss_after_mb=round(rss_mb(args.pid)))


def slow_headers(args):
    """4. 400 TCP connections: half silent, half a header byte every 5 s."""
    sockets = []
    for index in range(400):
        try:
            sock = socket.create_connection((HOST, args.port), timeout=5)
            sockets.append((index, sock))
        except OSError:
            pass
    opened = len(sockets)
    start = time.monotonic()
    during_ms, _ = health_ms(args.port)
    header = b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
    alive = {index for index, _ in sockets}
    for step in range(4):
        for index, sock in sockets:
            if index in alive and index % 2 == 0:
                try:
                    sock.send(header[step:step + 1])
                except OSError:
                    alive.discard(index)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            for index, sock in sockets:
                if index not in alive:
                    continue
                sock.settimeout(0.001)
                try:
                    if not sock.recv(4096):
                        alive.discard(index)
                except socket.timeout:
                    pass
                except OSError:
                    alive.discard(index)
            time.sleep(0.1)
    report("slow-headers", opened=opened, still_open_after_s=round(time.monotonic() - start), still_open=len(alive),
           healthz_during_ms=during_ms)
    for _, sock in sockets:
        sock.close()


def guessing(args):
    """6. Wrong keys, one after another, while the right key comes in."""
    delays = []
    for _ in range(6):
        client = Client(args.port, timeout=15).upgrade()
        client.wait_for("connected")
        start = time.monotonic()
        client.sock.sendall(text(json.dumps({"action": "auth", "params": "wrong-guess"})))
        client.wait_for("auth_failed", timeout=15)
        delays.append(round(time.monotonic() - start, 2))
        client.close()
    start = time.monotonic()
    right = Client(args.port).authenticated(args.key)
    report("guessing", failure_answer_s=delays, right_key_auth_s=round(time.monotonic() - start, 3))
    right.close()


def second_auth(args):
    """5. A second auth on an authenticated connection."""
    client = Client(args.port).authenticated(args.key)
    client.sock.sendall(text(json.dumps({"action": "auth", "params": args.key})))
    answer = client.wait_for("status")
    report("second-auth", answer=answer if isinstance(answer, str) else str(answer))
    client.close()


def junk_topics(args):
    """8. Three connections x 10,000 made-up tickers, then one toggling a topic at 50 msg/s for 12 s."""
    clients, accepted, refused = [], 0, 0
    for c in range(3):
        client = Client(args.port).authenticated(args.key)
        for chunk in range(10):
            params = ",".join(f"Q.JUNK{c}X{chunk * 1000 + i}" for i in range(1000))
            client.sock.sendall(text(json.dumps({"action": "subscribe", "params": params})))
            answer = client.wait_for("status", timeout=5) or ""
            if "subscribed to" in answer:
                accepted += int(answer.split("subscribed to ")[1].split(" ")[0]) if "topics" in answer else 1
            if "limit" in answer:
                refused += 1
        clients.append(client)
    _, health = health_ms(args.port)
    upstream_topics = health.get("upstream", {}).get("subscribedTopics") if isinstance(health, dict) else None
    toggler = clients[0]
    start = time.monotonic()
    sent = 0
    while time.monotonic() - start < 12:
        action = "subscribe" if sent % 2 == 0 else "unsubscribe"
        toggler.sock.sendall(text(json.dumps({"action": action, "params": "T.TOGGLE"})))
        sent += 1
        time.sleep(0.02)
    report("junk-topics", topics_accepted=accepted, messages_refused_by_a_limit=refused, upstream_topics=upstream_topics,
           toggles=sent)
    for client in clients:
        client.close()


def http(port, method, path, key, body=None):
    """(status, JSON body) of one request with a bearer key."""
    request = urllib.request.Request(
        f"http://{HOST}:{port}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read() or b"{}")


def portfolio(args):
    """7, 9, 11, 12. Symbols that would name other topics, a year-1 account, a close before a later
    transaction, and a narrow key on another symbol's security detail."""
    if not args.narrow_key:
        report("portfolio", skipped="no --narrow-key (the relay runs without the portfolio)")
        return
    _, health = health_ms(args.port)
    topics_before = health.get("upstream", {}).get("subscribedTopics") if isinstance(health, dict) else None
    status, account = http(args.port, "POST", "/v1/accounts", args.key,
                           {"name": "abuse", "kind": "brokerage", "createdAt": "2024-01-01T00:00:00Z"})
    account_id = account.get("id")
    symbols = {}
    for symbol in ["*", "ZZZQ,AM.*", "ZZZQ,Q.AAPL", "A B"]:
        symbols[symbol] = http(args.port, "POST", f"/v1/accounts/{account_id}/transactions", args.key,
                               {"date": "2024-01-02", "kind": "buy", "symbol": symbol, "quantity": "1", "price": "1"})[0]
    year_one = http(args.port, "POST", "/v1/accounts", args.key, {"name": "old", "kind": "brokerage", "createdAt": "0001-01-01T00:00:00Z"})[0]
    http(args.port, "POST", f"/v1/accounts/{account_id}/transactions", args.key,
         {"date": "2024-03-01", "kind": "buy", "symbol": "AAPL", "quantity": "1", "price": "1"})
    close = http(args.port, "POST", f"/v1/accounts/{account_id}/close", args.key, {"closedAt": "2024-02-01T00:00:00Z"})[0]
    narrow = http(args.port, "GET", "/v1/securities/MSFT", args.narrow_key)[0]
    _, health = health_ms(args.port)
    topics_after = health.get("upstream", {}).get("subscribedTopics") if isinstance(health, dict) else None
    report("portfolio", account=status, symbols=symbols, account_dated_year_1=year_one, close_before_a_later_buy=close,
           narrow_key_on_MSFT=narrow, upstream_topics_before=topics_before, upstream_topics_after=topics_after)


# --- later attacks: replays, parked sessions, a hostile REST API ------------------------------------


def metrics(port, key):
    """{series: value} of /metrics (asked with the key); {} when it cannot be read."""
    request = urllib.request.Request(f"http://{HOST}:{port}/metrics", headers={"Authorization": f"Bearer {key}"})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            body = answer.read().decode(errors="replace")
    except Exception:  # noqa: BLE001 - no figures is the outcome
        return {}
    values = {}
    for line in body.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        try:
            values[series] = float(value)
        except ValueError:
            pass
    return values


def metric(values, name, **labels):
    """The sum of name's series whose labels include labels."""
    total = 0.0
    for series, value in values.items():
        if series != name and not series.startswith(name + "{"):
            continue
        if all(f'{label}="{wanted}"' in series for label, wanted in labels.items()):
            total += value
    return total


def metric_deltas(before, after, names):
    """{name: after - before} for each (name, labels) in names, as ints."""
    return {title: int(metric(after, name, **labels) - metric(before, name, **labels)) for title, (name, labels) in names.items()}


def relay_status(port, key):
    """(upstream topics, kept tagged sessions, subscribers) summed over the markets of /v1/status."""
    try:
        _, body = http(port, "GET", "/v1/status", key)
    except Exception:  # noqa: BLE001
        return None, None, None
    markets = body.get("markets") or []
    topics = sum(m.get("upstream", {}).get("subscribedTopics", 0) for m in markets)
    kept = sum((m.get("history") or {}).get("sessionsKept", 0) for m in markets)
    subscribers = sum(m.get("subscribers", 0) for m in markets)
    return topics, kept, subscribers


class Watch(threading.Thread):
    """Samples the relay's RSS and its delivery p99 over the last 10 s (/v1/status) every second
    while an attack runs: what the streaming clients paid for it. The p99 of the first 10 s is
    reported apart (its window still holds the attack before); the history's memory (the 5-minute
    window filling) is reported beside the RSS, so that its growth is not taken for the attack's."""

    def __init__(self, args):
        super().__init__(daemon=True)
        self.args, self.stop, self.rss_peak = args, threading.Event(), rss_mb(args.pid)
        self.start_time, self.p99_first_10s, self.p99_after = time.monotonic(), 0.0, None
        self.history_before = metric(metrics(args.port, args.key), "relay_history_bytes")

    def run(self):
        while not self.stop.is_set():
            self.rss_peak = max(self.rss_peak, rss_mb(self.args.pid))
            try:
                _, body = http(self.args.port, "GET", "/v1/status", self.args.key)
                p99 = (body.get("latency") or {}).get("p99Ms") or 0
                if time.monotonic() - self.start_time < 10:
                    self.p99_first_10s = max(self.p99_first_10s, p99)
                else:
                    self.p99_after = max(self.p99_after or 0, p99)
            except Exception:  # noqa: BLE001
                pass
            self.stop.wait(1.0)

    def finish(self):
        self.stop.set()
        self.join(5)
        history_after = metric(metrics(self.args.port, self.args.key), "relay_history_bytes")
        return {"rss_peak_mb": round(self.rss_peak), "relay_p99_worst_ms_first_10s": round(self.p99_first_10s, 1),
                "relay_p99_worst_ms_after": None if self.p99_after is None else round(self.p99_after, 1),
                "history_mb": [round(self.history_before / 2**20), round(history_after / 2**20)]}


class FrameReader(threading.Thread):
    """Reads a client's socket until stopped, counting bytes and the statuses named in `watch`;
    keeps the payloads of frames containing one of `keep`, and the close code."""

    def __init__(self, client, watch=(), keep=()):
        super().__init__(daemon=True)
        self.client, self.watch, self.keep = client, watch, keep
        self.bytes, self.counts, self.kept, self.close_code, self.closed = 0, {w: 0 for w in watch}, [], None, False
        self.stop = threading.Event()

    def run(self):
        sock, buffer = self.client.sock, self.client.buffer
        self.client.buffer = b""
        sock.settimeout(0.5)
        while not self.stop.is_set():
            while len(buffer) >= 2:
                opcode, n, offset = buffer[0] & 0x0F, buffer[1] & 0x7F, 2
                if n == 126:
                    if len(buffer) < 4:
                        break
                    n, offset = struct.unpack(">H", buffer[2:4])[0], 4
                elif n == 127:
                    if len(buffer) < 10:
                        break
                    n, offset = struct.unpack(">Q", buffer[2:10])[0], 10
                if len(buffer) < offset + n:
                    break
                payload, buffer = buffer[offset:offset + n], buffer[offset + n:]
                if opcode == 0x8:
                    self.close_code = struct.unpack(">H", payload[:2])[0] if len(payload) >= 2 else None
                for needle in self.watch:
                    self.counts[needle] += payload.count(needle.encode())
                if any(needle.encode() in payload for needle in self.keep):
                    self.kept.append(payload.decode(errors="replace"))
            try:
                chunk = sock.recv(262144)
            except socket.timeout:
                continue
            except OSError:
                self.closed = True
                return
            if not chunk:
                self.closed = True
                return
            self.bytes += len(chunk)
            buffer += chunk

    def finish(self, timeout=2.0):
        self.stop.set()
        self.join(timeout)


def replay_flood(args):
    """Resumes thrown away at once: pairs of a subscribe with `sinceTime` 30 s back and its
    unsubscribe, from a client that never reads (4 KiB receive buffer) and from one that reads
    everything and sends at the allowed message rate (40 a second). Once with each topic list of
    --replay-topics: a wildcard nobody held (its history is never whole: every resume is a gap) and
    fanbench's 100 quote topics, held all along by the streaming clients (whole: real replays)."""
    for topic in args.replay_topics.split(";"):
        if topic == "FANBENCH":
            topic = ",".join(f"Q.S{i:05d}" for i in range(100))
        replay_flood_of(args, topic)


def replay_flood_of(args, topic):
    pairs = args.replay_pairs
    shown = topic if len(topic) < 40 else f"{topic[:17]}…{topic[-9:]} ({topic.count(',') + 1} topics)"
    watched = ['"status":"resumed"', '"status":"gap"', '"status":"error"']
    counters = {
        "replayed_events": ("relay_events_replayed_total", {}),
        "resumes_whole": ("relay_resumes_total", {"result": "resumed"}),
        "resumes_with_gap": ("relay_resumes_total", {"result": "gap"}),
        "topics_told_gap": ("relay_resume_gaps_total", {}),
    }

    def pair():
        since = int(time.time() * 1000) - 30_000
        return (text(json.dumps({"action": "subscribe", "params": topic, "sinceTime": since}))
                + text(json.dumps({"action": "unsubscribe", "params": topic})))

    # The clients that never read (--replay-nonreaders, 1 unless asked).
    before_metrics, before = metrics(args.port, args.key), rss_mb(args.pid)
    watch = Watch(args)
    watch.start()
    clients = [Client(args.port, rcvbuf=4096).authenticated(args.key) for _ in range(args.replay_nonreaders)]
    sent, start = [0] * len(clients), time.monotonic()
    for index, client in enumerate(clients):
        client.sock.settimeout(2.0)
        while sent[index] < pairs and time.monotonic() - start < 15 * len(clients):
            try:
                client.sock.sendall(pair())
            except OSError:
                break
            sent[index] += 1
    client = clients[0]
    peak, hold_until = before, time.monotonic() + 15
    while time.monotonic() < hold_until:
        peak = max(peak, rss_mb(args.pid))
        time.sleep(0.25)
    held = rss_mb(args.pid)
    # Then read for 10 s: what was queued for it, and whether the relay closed it meanwhile.
    reader = FrameReader(client, watched)
    reader.start()
    reader.join(5)
    reader.finish()
    for each in clients:
        each.close()
    time.sleep(2)
    report("replay-flood", variant="never-reads", topic=shown, clients=len(clients), pairs_sent=sent[0] if len(sent) == 1 else sent,
           rss_before_mb=round(before), rss_peak_mb=round(peak), rss_after_15s_mb=round(held), rss_2s_after_close_mb=round(rss_mb(args.pid)),
           closed=reader.closed or reader.close_code is not None, close_code=reader.close_code,
           bytes_read_in_5s_after_15s_first_client=reader.bytes,
           statuses={k.split('"')[3]: v for k, v in reader.counts.items()},
           relay=metric_deltas(before_metrics, metrics(args.port, args.key), counters), watch=watch.finish())

    # The client that reads everything, at the allowed message rate (50/s sustained: 40/s here).
    before_metrics, before = metrics(args.port, args.key), rss_mb(args.pid)
    watch = Watch(args)
    watch.start()
    client = Client(args.port).authenticated(args.key)
    reader = FrameReader(client, watched)
    reader.start()
    client.sock.settimeout(2.0)
    sent, peak, start = 0, before, time.monotonic()
    while sent < pairs and time.monotonic() - start < 30 and not reader.closed:
        try:
            client.sock.sendall(pair())
        except OSError:
            break
        sent += 1
        peak = max(peak, rss_mb(args.pid))
        time.sleep(max(0.0, start + sent * 0.05 - time.monotonic()))
    drain_until = time.monotonic() + 5
    while time.monotonic() < drain_until and not reader.closed:
        peak = max(peak, rss_mb(args.pid))
        time.sleep(0.25)
    elapsed = time.monotonic() - start
    reader.finish()
    client.close()
    report("replay-flood", variant="reads-at-allowed-rate", topic=shown, pairs_sent=sent, seconds=round(elapsed, 1),
           rss_before_mb=round(before), rss_peak_mb=round(peak), rss_after_mb=round(rss_mb(args.pid)),
           closed=reader.closed or reader.close_code is not None, close_code=reader.close_code,
           bytes_received=reader.bytes, mb_per_s=round(reader.bytes / 2**20 / max(elapsed, 0.001), 2),
           statuses={k.split('"')[3]: v for k, v in reader.counts.items()},
           relay=metric_deltas(before_metrics, metrics(args.port, args.key), counters), watch=watch.finish())


def parked_flood(args):
    """One key, many tagged connections (KEY#abuseN), each subscribing 500 made-up topics, each then
    dropping its TCP connection without a close frame: the broken sessions are parked for the resume
    window, holding their topics. The upstream topics must stay within the key's topicsPerKey."""
    connections, per = args.parked_connections, 500
    topics_before, kept_before, _ = relay_status(args.port, args.key)
    before = rss_mb(args.pid)
    watch = Watch(args)
    watch.start()
    accepted, refused_messages, failures = 0, 0, []
    start = time.monotonic()
    for c in range(connections):
        if time.monotonic() - start > 60:
            failures.append("stopped at 60 s")
            break
        try:
            client = Client(args.port).authenticated(f"{args.key}#abuse{c}")
        except (OSError, ConnectionError) as error:
            failures.append(f"{c}: {error}")
            continue
        client.sock.sendall(text(json.dumps({"action": "subscribe", "params": ",".join(f"T.JUNK{c}X{i}" for i in range(per))})))
        seen, until = set(), time.monotonic() + 3
        while time.monotonic() < until and len(seen) < 2:
            answer = client.wait_for('"status"', timeout=max(until - time.monotonic(), 0.01))
            if not isinstance(answer, str):
                break
            if '"success"' in answer:
                seen.add("success")
                counted = re.search(r"subscribed to (\d+) topics", answer)
                accepted += int(counted.group(1)) if counted else 1
                until = min(until, time.monotonic() + 0.3)
            if '"error"' in answer:
                seen.add("error")
                refused_messages += 1
                until = min(until, time.monotonic() + 0.3)
        client.close()  # a FIN, no close frame: the session is parked
    time.sleep(1)
    topics_peak, kept_peak, _ = relay_status(args.port, args.key)
    rss_peak = rss_mb(args.pid)
    # The resume window (60 s): the parked sessions, and their topics, are let go after it.
    released_after, wait_start = None, time.monotonic()
    topics_after, kept_after = topics_peak, kept_peak
    while time.monotonic() - wait_start < 75:
        time.sleep(5)
        topics_after, kept_after, _ = relay_status(args.port, args.key)
        if kept_after is not None and kept_before is not None and kept_after <= kept_before:
            released_after = round(time.monotonic() - wait_start)
            break
    added = (topics_peak or 0) - (topics_before or 0)
    report("parked-flood", connections=connections, topics_asked=connections * per, topics_accepted=accepted,
           messages_refused=refused_messages, failures=failures[:3], seconds=round(time.monotonic() - start),
           upstream_topics_before=topics_before, upstream_topics_parked=topics_peak, upstream_topics_added=added,
           within_topics_per_key=added <= args.topics_per_key, sessions_kept_before=kept_before, sessions_kept_parked=kept_peak,
           released_after_s=released_after, upstream_topics_after_release=topics_after, sessions_kept_after=kept_after,
           rss_before_mb=round(before), rss_parked_mb=round(rss_peak), rss_after_mb=round(rss_mb(args.pid)), watch=watch.finish())


class HostileREST(ThreadingHTTPServer):
    """A REST API answering /v3/trades/ABUSEC* with corrupt values, /v3/trades/ABUSEP* with endless
    next_url pages, /v3/trades/ABUSET* with a body trickled a byte every 0.5 s; anything else an
    empty page. Counts what it was asked."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, port):
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.requests, self.pages, self.trickles, self.key_in_url, self.no_bearer = {}, {}, [], 0, 0
        super().__init__((HOST, port), HostileHandler)

    def count(self, kind):
        with self.lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1


class HostileHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_):
        pass

    def answer(self, body, status=200):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802 - http.server's name
        server = self.server
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if "apiKey" in query or "apikey" in query:
            server.key_in_url += 1
        if not self.headers.get("Authorization", "").startswith("Bearer "):
            server.no_bearer += 1
        ticker = url.path.rsplit("/", 1)[-1]
        gte = int(query.get("timestamp.gte", [str(time.time_ns())])[0])
        if url.path.startswith("/v3/trades/ABUSEC"):
            server.count("corrupt")
            if ticker.endswith("1"):  # not JSON at all
                body = f'{{"results":[{{"price":1nullfalse,"size":100,"sip_timestamp":{gte + 1},"sequence_number":1,"exchange":4}}],"status":"OK"}}'
            else:  # JSON, but values no trade has
                body = (f'{{"results":[{{"price":[[["1"]]],"size":"NaN","sip_timestamp":{gte + 1}00000000000000000000,'
                        f'"sequence_number":-1e999,"exchange":{{"x":null}}}}],"status":"OK"}}')
            self.answer(body)
        elif url.path.startswith("/v3/trades/ABUSEP"):
            server.count("paging")
            with server.lock:
                page = server.pages[ticker] = server.pages.get(ticker, 0) + 1
            self.answer(json.dumps({"results": [], "status": "OK",
                                    "next_url": f"http://{HOST}:{server.server_address[1]}/v3/trades/{ticker}?cursor={page}"}))
        elif url.path.startswith("/v3/trades/ABUSET"):
            server.count("trickle")
            start = time.monotonic()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100000")
            self.end_headers()
            sent = 0
            try:
                self.wfile.flush()
                body = b'{"results":[' + b" " * 99987 + b"]}"
                while not server.stopping.is_set() and time.monotonic() - start < 40 and sent < len(body):
                    self.wfile.write(body[sent:sent + 1])
                    self.wfile.flush()
                    sent += 1
                    time.sleep(0.5)
                outcome = "server stopped"
            except OSError:
                outcome = "relay hung up"
            with server.lock:
                server.trickles.append({"ticker": ticker, "outcome": outcome, "after_s": round(time.monotonic() - start, 1), "bytes": sent})
            self.close_connection = True
        else:
            server.count("other:" + "/".join(url.path.split("/")[:3]))
            self.answer('{"results":[],"status":"OK"}')


def hostile_rest(args):
    """A gap fill from a hostile REST API: the relay's --rest-url is our HostileREST, the attacker holds
    T.ABUSEC1-2 (corrupt values), T.ABUSEP1-2 (endless next_url) and T.ABUSET1 (a trickled body),
    and the upstream connection is cut (ss -K) so that the relay reconnects and fills the outage. Waits
    up to 100 s for the fill's `recovered` (a trickled request is tried 4 times, 10 s each)."""
    if not args.rest_port or not args.upstream_port:
        report("hostile-rest", skipped="needs --rest-port (the relay's --rest-url) and --upstream-port; scripts/abuse passes both")
        return
    try:
        server = HostileREST(args.rest_port)
    except OSError as error:
        report("hostile-rest", skipped=f"cannot listen on the relay's REST port {args.rest_port}: {error}")
        return
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    topics = ["T.ABUSEC1", "T.ABUSEC2", "T.ABUSEP1", "T.ABUSEP2", "T.ABUSET1"]
    client = None
    try:
        client = Client(args.port).authenticated(args.key)
        client.sock.sendall(text(json.dumps({"action": "subscribe", "params": ",".join(topics)})))
        client.wait_for('"success"', timeout=5)
        reader = FrameReader(client, ['"upstream_disconnected"', '"upstream_reconnected"'], keep=['"status":"recovered"'])
        reader.start()
        counters = {
            "fills_complete": ("relay_gap_fills_total", {"result": "complete"}),
            "fills_incomplete": ("relay_gap_fills_total", {"result": "incomplete"}),
            "requests_ok": ("relay_gap_fill_requests_total", {"result": "ok"}),
            "requests_failed": ("relay_gap_fill_requests_total", {"result": "failed"}),
            "results_refused": ("relay_gap_fill_results_refused_total", {}),
            "events_recovered": ("relay_gap_fill_events_total", {}),
        }
        before_metrics, before = metrics(args.port, args.key), rss_mb(args.pid)
        watch = Watch(args)
        watch.start()
        try:
            cut = subprocess.run(["ss", "-K", "-tn", "dst", HOST, "dport", "=", f":{args.upstream_port}"],
                                 capture_output=True, text=True, timeout=10)
            killed = [line for line in cut.stdout.splitlines()[1:] if line.strip()]
            why = cut.stderr.strip() or "ss -K killed no socket (needs root and a kernel with CONFIG_INET_DIAG_DESTROY)"
        except (OSError, subprocess.SubprocessError) as error:
            killed, why = [], f"ss -K: {error}"
        if not killed:
            reader.finish()
            watch.finish()
            report("hostile-rest", skipped=f"cannot drop the upstream connection: {why}")
            return
        start, peak, health_worst = time.monotonic(), before, 0.0
        while time.monotonic() - start < 100 and not reader.kept and not reader.closed:
            peak = max(peak, rss_mb(args.pid))
            ms, _ = health_ms(args.port)
            health_worst = max(health_worst, ms or 0)
            time.sleep(0.5)
        seconds = round(time.monotonic() - start, 1)
        reader.finish()
        recovered = None
        if reader.kept:
            status = json.loads(reader.kept[0])
            status = next((s for s in status if s.get("status") == "recovered"), {}) if isinstance(status, list) else status
            recovered = {"complete": status.get("complete"), "topics": status.get("topics"),
                         "missing": {t: reason[:110] for t, reason in (status.get("missing") or {}).items()}}
        report("hostile-rest", upstream_sockets_cut=len(killed), seconds_to_recovered=seconds if recovered else None,
               statuses={k.strip('"'): v for k, v in reader.counts.items()}, recovered=recovered,
               rest_requests=server.requests, pages_per_paging_topic=server.pages, trickles=list(server.trickles),
               key_in_url=server.key_in_url, requests_without_bearer=server.no_bearer,
               relay=metric_deltas(before_metrics, metrics(args.port, args.key), counters),
               healthz_worst_ms=health_worst, rss_before_mb=round(before), rss_peak_mb=round(peak), rss_after_mb=round(rss_mb(args.pid)),
               watch=watch.finish())
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        if client:
            client.close()


def hostile_nats(args):
    """A hostile NATS peer: only on a cluster, which scripts/abuse does not run."""
    report("hostile-nats", skipped="scripts/abuse runs a single relay without NATS; a hostile NATS peer needs a cluster (scripts/chaos runs one)")


ATTACKS = {
    "ping-flood": ping_flood,
    "unsubscribe-flood": unsubscribe_flood,
    "big-frames-before-auth": big_frames_before_auth,
    "slow-headers": slow_headers,
    "guessing": guessing,
    "second-auth": second_auth,
    "junk-topics": junk_topics,
    "portfolio": portfolio,
    "replay-flood": replay_flood,
    "parked-flood": parked_flood,
    "hostile-rest": hostile_rest,
    "hostile-nats": hostile_nats,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help="an accepted client key (not the streaming clients')")
    parser.add_argument("--pid", type=int, default=0, help="the relay's pid, for its RSS")
    parser.add_argument("--only", default="", help="comma-separated attack names")
    parser.add_argument("--narrow-key", default="", help="a key whose topics are Q.AAPL only (the portfolio attack)")
    parser.add_argument("--upstream-port", type=int, default=0, help="the relay's upstream port on loopback (hostile-rest cuts it)")
    parser.add_argument("--rest-port", type=int, default=0, help="the loopback port of the relay's --rest-url (hostile-rest serves it)")
    parser.add_argument("--replay-topics", default="T.*;FANBENCH",
                        help="replay-flood's topic lists, ';' between them; FANBENCH: fanbench's Q.S00000…Q.S00099")
    parser.add_argument("--replay-pairs", type=int, default=200, help="replay-flood's subscribe/unsubscribe pairs per client")
    parser.add_argument("--replay-nonreaders", type=int, default=1, help="replay-flood's clients that never read (the first is read at the end)")
    parser.add_argument("--parked-connections", type=int, default=60, help="parked-flood's tagged connections (500 topics each)")
    parser.add_argument("--topics-per-key", type=int, default=20000, help="the relay's limits.topicsPerKey")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    unknown = [n for n in names if n not in ATTACKS]
    if unknown:
        parser.error(f"unknown attacks {unknown}; known: {', '.join(ATTACKS)}")
    for name in names:
        try:
            ATTACKS[name](args)
        except Exception as error:  # noqa: BLE001 - an attack that fails says so and the rest go on
            report(name, error=str(error))


if __name__ == "__main__":
    main()
