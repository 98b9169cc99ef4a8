// The feed's health at a glance: the upstream, the clients, events in and out, latency, drops and
// lagging clients, with the last minutes as sparklines. Polls /v1/status once a second.
import { api, el, rate, time } from "./api.js";
import { sparkline } from "./charts.js";

// The upstream client's states, as a person reads them.
const STATES = {
  authenticated: "connected",
  connecting: "connecting",
  authenticating: "connecting (authenticating)",
  disconnected: "disconnected",
  auth_failed: "key refused by the upstream",
  max_connections: "refused: the upstream's connection limit",
  stopped: "stopped",
  idle: "not started",
  standby: "standby (another node holds the connection)",
};

function card(id, title) {
  const value = el("div", { class: "stat", id: `stat-${id}`, text: "—" });
  const note = el("div", { class: "stat-label", id: `note-${id}` });
  const spark = el("div", { id: `spark-${id}` });
  const heading = el("h2", { id: `card-${id}`, text: title });
  return el("section", { class: "panel", "aria-labelledby": `card-${id}` }, heading, value, note, spark);
}

function set(id, text) {
  const node = document.getElementById(id);
  if (node && node.textContent !== text) node.textContent = text;
}

function ms(value) {
  if (value === null || value === undefined) return "—";
  return value < 1 ? value.toFixed(2) + " ms" : value < 10 ? value.toFixed(1) + " ms" : Math.round(value) + " ms";
}

export function mount(main) {
  const state = el("span", { class: "state", id: "upstream-state", text: "…" });
  const upstream = el(
    "section",
    { class: "panel wide", "aria-labelledby": "upstream-title", id: "upstream" },
    el("h2", { id: "upstream-title", text: "Upstream" }),
    el(
      "dl",
      { class: "facts" },
      el("dt", { text: "State" }), el("dd", {}, state, " ", el("span", { id: "upstream-detail", class: "muted" })),
      el("dt", { text: "URL" }), el("dd", { id: "upstream-url", text: "—" }),
      el("dt", { text: "Last message" }), el("dd", { id: "upstream-age", text: "—" }),
      el("dt", { text: "Topics subscribed" }), el("dd", { id: "upstream-topics", text: "—" }),
      el("dt", { text: "Reconnects" }), el("dd", { id: "upstream-reconnects", text: "—" }),
      el("dt", { text: "Cluster" }), el("dd", { id: "cluster", text: "single node" }),
    ),
  );
  const changes = el("ol", { class: "changes", id: "changes" });
  const marketRows = el("tbody", { id: "market-rows" });
  const markets = el(
    "section",
    { class: "panel wide table-wrap", "aria-labelledby": "markets-title", id: "markets" },
    el("h2", { id: "markets-title", text: "Markets" }),
    el(
      "table",
      { "aria-labelledby": "markets-title" },
      el("thead", {}, el("tr", {}, ...["Market", "Upstream", "Topics subscribed", "Subscribers", "Events in", "Last message", "History", "Resumes", "Conflated", "Tape"].map((name) => el("th", { scope: "col", text: name })))),
      marketRows,
    ),
  );
  main.append(
    el("h1", { text: "Overview" }),
    el(
      "div",
      { class: "grid" },
      upstream,
      markets,
      card("clients", "Clients"),
      card("in", "Events in"),
      card("out", "Events out"),
      card("latency", "Delivery latency"),
      card("dropped", "Dropped events"),
      card("lagging", "Lagging clients"),
      card("gateway", "REST gateway"),
      el("section", { class: "panel wide", "aria-labelledby": "changes-title" }, el("h2", { id: "changes-title", text: "Recent changes" }), changes),
    ),
  );

  let stopped = false;
  let timer = null;
  async function tick() {
    try {
      const s = await api("/v1/status");
      if (stopped) return;
      draw(s);
    } catch (error) {
      if (stopped) return;
      set("upstream-detail", `status unavailable: ${error.message}`);
    }
    if (!stopped) timer = setTimeout(tick, 1000);
  }

  function draw(s) {
    const up = s.upstream;
    // With several markets this panel is the first market's; the Markets table has them all.
    set("upstream-title", (s.markets || []).length > 1 ? `Upstream: /${s.market}` : "Upstream");
    set("upstream-state", STATES[up.state] || up.state);
    state.className = "state " + (s.healthy ? "good" : "bad");
    state.title = `state: ${up.state}`;
    set("upstream-detail", up.detail || up.lastError || "");
    set("upstream-url", up.url || "—");
    set("upstream-age", up.lastMessageAgeMs === undefined || up.lastMessageAgeMs === null ? "—" : `${up.lastMessageAgeMs} ms ago`);
    set("upstream-topics", String(up.subscribedTopics));
    const reconnects = Object.entries(up.reconnects || {}).map(([why, count]) => `${why}: ${count}`).join(", ");
    set("upstream-reconnects", reconnects || "none");
    set("cluster", s.cluster ? `${s.cluster.role} (node ${s.cluster.node}${s.cluster.leader ? ", leader " + s.cluster.leader : ""}; NATS ${s.cluster.nats}; ${s.cluster.liveNodes.length} live nodes)` : "single node");

    set("stat-clients", `${s.clients.connections} connected`);
    set("note-clients", `${s.clients.subscribers} hub ${s.clients.subscribers === 1 ? "subscriber" : "subscribers"} (clients and the portfolio)`);
    set("stat-in", `${rate(s.rates.eventsIn)}/s`);
    set("note-in", `${s.eventsPublished.toLocaleString()} since start`);
    set("stat-out", `${rate(s.rates.eventsOut)}/s`);
    set("note-out", `${s.eventsDelivered.toLocaleString()} delivered since start`);
    set("stat-latency", `p50 ${ms(s.latency.p50Ms)} · p99 ${ms(s.latency.p99Ms)}`);
    set("note-latency", "upstream frame in to client frame out, last 10 s");
    set("stat-dropped", s.dropped.toLocaleString());
    set("note-dropped", "events lost by clients that fell behind");
    set("stat-lagging", String(s.clients.lagging));
    set("note-lagging", "clients now losing events");

    const minutes = Math.round(s.series.eventsIn.length / 60) || 1;
    const spark = (id, values, what) => {
      const latest = values.length ? values[values.length - 1] : null;
      document.getElementById(`spark-${id}`).replaceChildren(sparkline(values, `${what} over the last ${minutes} min; latest ${latest === null ? "none" : what.includes("ms") ? ms(latest) : rate(latest)}`));
    };
    // The REST gateways (one per vendor account): answers that cost no upstream call, and each budget.
    const gateways = s.gateways || [];
    if (gateways.length) {
      const sum = (f) => gateways.reduce((n, g) => n + f(g.answers), 0);
      const saved = sum((a) => a.live + a.cache + a.coalesced);
      const served = saved + sum((a) => a.upstream);
      set("stat-gateway", served === 0 ? "no requests yet" : `${Math.round((saved / served) * 100)}% without a call`);
      const budgets = gateways.map((g) => {
        const paused = g.pausedUntil && g.pausedUntil > Date.now() ? `, paused by the vendor for ${Math.ceil((g.pausedUntil - Date.now()) / 1000)} s` : "";
        return `${g.vendor} budget ${g.budget}: ${Math.floor(g.tokens)} of ${g.burst} left${g.waiting ? `, ${g.waiting} waiting` : ""}${paused}, ${g.refusedByBudget.toLocaleString()} refused`;
      });
      const cache = gateways[0].cacheBytes === null || gateways[0].cacheBytes === undefined ? "no cache" : `cache ${(gateways[0].cacheBytes / 1048576).toFixed(1)} MB`;
      set("note-gateway", `${served.toLocaleString()} answered (${sum((a) => a.live).toLocaleString()} live, ${sum((a) => a.cache).toLocaleString()} cached, ${sum((a) => a.coalesced).toLocaleString()} shared) · ${budgets.join(" · ")} · ${cache}`);
    } else {
      set("stat-gateway", "off");
      set("note-gateway", "no REST API configured");
    }

    spark("clients", s.series.connections, "Connections");
    spark("in", s.series.eventsIn, "Events in per second");
    spark("out", s.series.eventsOut, "Events out per second");
    spark("latency", s.series.p99Ms, "p99 latency in ms");
    spark("lagging", s.series.lagging, "Lagging clients");

    function tapeCell(t) {
      if (!t) return el("span", { class: "muted", text: "off" });
      // What the tape holds (looked at once a minute), else what this run wrote.
      const bytes = t.heldBytes ?? t.bytesWritten;
      const size = bytes < 1048576 ? `${Math.round(bytes / 1024)} KB` : bytes < 1073741824 ? `${(bytes / 1048576).toFixed(1)} MB` : `${(bytes / 1073741824).toFixed(2)} GB`;
      // Held since: the oldest record's time, UTC (its date when not today).
      let since = "";
      if (t.heldSince) {
        const at = new Date(t.heldSince).toISOString();
        since = at.slice(0, 10) === new Date().toISOString().slice(0, 10) ? ` · since ${at.slice(11, 16)} UTC` : ` · since ${at.slice(0, 10)}`;
      }
      const where = t.store === "jetstream" ? "in the cluster's JetStream stream" : t.heldDays ? `in ${t.heldDays} day ${t.heldDays === 1 ? "file" : "files"}` : "on disk";
      const recorded = `${where}; this run recorded ${t.eventsRecorded.toLocaleString()} events in ${t.blocksWritten.toLocaleString()} blocks`;
      const dropped = t.eventsDropped ? `; ${t.eventsDropped.toLocaleString()} not recorded` : "";
      if (!t.recording) return el("span", { class: "state bad", title: `paused: ${t.pausedBecause}; ${recorded}${dropped}`, text: `paused · ${size}${since}` });
      return el("span", { title: `${recorded}${dropped}`, text: `${size}${since}` });
    }

    // One row per market, each with its own upstream connection.
    marketRows.replaceChildren(
      ...(s.markets || []).map((m) => {
        const up = m.upstream;
        const h = m.history;
        const badge = el("span", { class: "state " + (m.healthy ? "good" : "bad"), title: `state: ${up.state}`, text: STATES[up.state] || up.state });
        return el(
          "tr",
          { "data-market": m.market },
          el("th", { scope: "row", class: "path", title: `${m.market}, ${m.vendor === "alpaca" ? "Alpaca" : "Polygon"}'s protocol`, text: m.vendor === "alpaca" ? `${m.path} (Alpaca)` : m.path || `/${m.market}` }),
          el("td", {}, badge),
          el("td", { text: String(up.subscribedTopics) }),
          el("td", { text: String(m.subscribers) }),
          el("td", { text: m.eventsPublished.toLocaleString() }),
          el("td", { text: up.lastMessageAgeMs === undefined || up.lastMessageAgeMs === null ? "—" : `${up.lastMessageAgeMs} ms ago` }),
          // What a returning client can get back, and what it got.
          el("td", { class: "history", title: h ? `epoch ${h.epoch}, ${h.topics} topics` : "", text: h ? `${h.events.toLocaleString()} events · ${(h.memoryBytes / 1048576).toFixed(1)} MB` : "off" }),
          el("td", {
            class: "resumes",
            title: h ? `${h.counts.withGaps} with a gap (${h.counts.gaps} topics); ${h.sessionsKept} tagged sessions waiting` : "",
            text: h ? `${h.counts.resumes} · ${h.counts.replayed.toLocaleString()} replayed` : "—",
          }),
          el("td", { class: "conflated", text: h ? h.counts.conflated.toLocaleString() : "—" }),
          // Its recording: what is on disk, and a paused recording (a failing disk) in red with its reason.
          el("td", { class: "tape" }, tapeCell(m.tape)),
        );
      }),
    );

    const items = s.changes.map((change) => el("li", {}, el("time", { datetime: change.at, text: time(change.at) }), " ", change.what, change.detail ? el("span", { class: "muted", text: ` — ${change.detail}` }) : null));
    changes.replaceChildren(...(items.length ? items : [el("li", { class: "muted", text: "No changes yet." })]));
  }

  tick();
  return () => {
    stopped = true;
    clearTimeout(timer);
  };
}
