#!/usr/bin/env python3
"""Relay RSS and drops for a slow Q.* reader (10 frames/s), with and without conflation: python3 scripts/conflate_rss.py .build/release/relay"""
import asyncio, json, socket, subprocess, sys, time
import websockets
def free_port():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"): return int(line.split()[1])
async def run(port, pid, conflate):
    ws = await websockets.connect(f"ws://127.0.0.1:{port}/stocks", max_size=1<<26)
    await ws.recv(); await ws.send(json.dumps({"action":"auth","params":"k"})); await ws.recv()
    msg = {"action":"subscribe","params":"Q.*"}
    if conflate: msg["conflate"] = 250
    await ws.send(json.dumps(msg))
    samples = []; quotes = 0; statuses = set()
    start = time.time()
    while time.time() - start < 20:
        raw = await ws.recv()
        for m in json.loads(raw):
            if m.get("ev") == "Q": quotes += 1
            elif m.get("ev") == "status": statuses.add(m.get("status"))
        await asyncio.sleep(0.1)  # 10 frames/s
        if int(time.time() - start) in (5, 10, 15, 19) and (not samples or samples[-1][0] != int(time.time() - start)):
            samples.append((int(time.time() - start), rss(pid)))
    return samples, quotes, statuses
for conflate in (True, False):
    port = free_port()
    p = subprocess.Popen([sys.argv[1], "serve", "--listen", f"127.0.0.1:{port}", "--client-keys", "k", "--no-portfolio", "--no-history", "--demo-rate", "50000", "--log-level", "error"])
    time.sleep(2)
    samples, quotes, statuses = asyncio.run(run(port, p.pid, conflate))
    status = json.loads(subprocess.run(["curl", "-s", "-H", "Authorization: Bearer k", f"http://127.0.0.1:{port}/v1/status"], capture_output=True, text=True).stdout or "{}")
    print(json.dumps({"conflate": conflate, "rss_kb": samples, "quotes_read": quotes, "statuses": sorted(s for s in statuses if s), "published": status.get("eventsPublished"), "dropped": status.get("dropped")}))
    p.terminate(); p.wait()
