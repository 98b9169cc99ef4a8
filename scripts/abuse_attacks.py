#!/usr/bin/env python3
"""The attacks of issue 22, run against a relay on loopback while other clients stream.

Each attack is bounded in count and time, targets 127.0.0.1 only, and prints one JSON line with what
it did and what the relay did back. Standard library only. Used by scripts/abuse; it can also be run
by hand: scripts/abuse_attacks.py --port 8080 --key KEY --pid RELAY_PID
"""
import argparse
import json
import os
import socket
import struct
import threading
import time
import urllib.error
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


ATTACKS = {
    "ping-flood": ping_flood,
    "unsubscribe-flood": unsubscribe_flood,
    "big-frames-before-auth": big_frames_before_auth,
    "slow-headers": slow_headers,
    "guessing": guessing,
    "second-auth": second_auth,
    "junk-topics": junk_topics,
    "portfolio": portfolio,
}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--key", required=True, help="an accepted client key (not the streaming clients')")
    parser.add_argument("--pid", type=int, default=0, help="the relay's pid, for its RSS")
    parser.add_argument("--only", default="", help="comma-separated attack names")
    parser.add_argument("--narrow-key", default="", help="a key whose topics are Q.AAPL only (the portfolio attack)")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or list(ATTACKS)
    for name in names:
        try:
            ATTACKS[name](args)
        except Exception as error:  # noqa: BLE001 - an attack that fails says so and the rest go on
            report(name, error=str(error))


if __name__ == "__main__":
    main()
