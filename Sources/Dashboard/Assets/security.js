// One security's detail: four groups, each loaded or failed on its own, and j/k (or the arrow keys)
// to step through the holdings of the list it was opened from. The relay prefetches the neighbours,
// so a step is answered from its cache.
import { api, el, money, decimal, signed, trend, time } from "./api.js";
import { lineChart } from "./charts.js";

function group(id, title) {
  const body = el("div", { class: "body" }, el("p", { class: "muted", text: "Loading…" }));
  const section = el("section", { class: "panel group", id: `group-${id}`, "data-state": "loading", "aria-labelledby": `group-${id}-title`, "aria-busy": "true" }, el("h2", { id: `group-${id}-title`, text: title }), body);
  return { section, body };
}

function facts(pairs) {
  return el("dl", { class: "facts" }, ...pairs.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", {}, value)]));
}

function table(label, headers, rows) {
  if (!rows.length) return el("p", { class: "muted", text: label === "Transactions" ? "No transactions in the past year." : `No ${label.toLowerCase()}.` });
  return el(
    "div",
    { class: "table-wrap" },
    el(
      "table",
      { "aria-label": label },
      el("thead", {}, el("tr", {}, ...headers.map((h, i) => el("th", { scope: "col", class: i === 0 || h.text ? "text" : null, text: h.label || h })))),
      el("tbody", {}, ...rows.map((cells) => el("tr", {}, ...cells.map((c, i) => el(i === 0 ? "th" : "td", { scope: i === 0 ? "row" : null, class: typeof c === "object" && c.class ? c.class : i === 0 ? "text" : null, text: typeof c === "object" ? c.text : c }))))),
    ),
  );
}

const renderers = {
  details(d) {
    const trade = d.lastTrade;
    const quote = d.lastQuote;
    const market = d.marketStatus;
    return facts([
      ["Last trade", trade ? `${decimal(trade.price)} × ${trade.size ? decimal(trade.size) : "—"} at ${time(trade.at)} (${trade.source})` : "none yet"],
      ["Bid / ask", quote ? `${decimal(quote.bid)} / ${decimal(quote.ask)} at ${time(quote.at)} (${quote.source})` : "none yet"],
      ["Market", market ? market.market || JSON.stringify(market) : "unknown"],
    ]);
  },
  priceHistory(h) {
    const closes = h.bars.map((b) => ({ x: Date.parse(b.date + "T00:00:00Z"), y: Number(b.close) }));
    const atr = h.bars.filter((b) => b.atr !== undefined).map((b) => ({ x: Date.parse(b.date + "T00:00:00Z"), y: Number(b.atr) }));
    const last = h.bars[h.bars.length - 1];
    const price = lineChart({ series: [{ name: "close", points: closes }], label: last ? `Daily close from ${h.from} to ${h.to}; latest ${decimal(last.close)} on ${last.date}` : "No price history", formatY: (y) => y.toFixed(2), height: 220, dots: false });
    const range = lineChart({ series: [{ name: "ATR", points: atr, className: "line" }], label: h.atr ? `Average true range (${h.atrPeriod} days); latest ${decimal(h.atr)}` : "Average true range: too few bars", formatY: (y) => y.toFixed(2), height: 120, dots: false });
    return el("div", {}, facts([["Range", `${h.from} to ${h.to} (${h.bars.length} bars)`], [`ATR (${h.atrPeriod})`, h.atr ? decimal(h.atr) : "too few bars"]]), price, el("h3", { text: `Average true range (${h.atrPeriod})` }), range);
  },
  transactions(list) {
    return table(
      "Transactions",
      ["Date", { label: "Account", text: true }, { label: "Kind", text: true }, "Quantity", "Price", "Fees", "Cash change"],
      list.map((t) => [t.date, { text: t.accountName, class: "text" }, { text: t.kind, class: "text" }, decimal(t.quantity), decimal(t.price), decimal(t.fees), { text: signed(t.cashChange), class: trend(t.cashChange) }]),
    );
  },
  taxLots(t) {
    return el(
      "div",
      {},
      facts([["Shares", decimal(t.sharesAvailable)], ["Cost basis", money(t.costBasis)], ["Average cost", t.averageCost ? decimal(t.averageCost, 4) : "—"]]),
      table("Tax lots", ["Acquired", { label: "Account", text: true }, "Quantity", "Unit cost", "Cost basis", { label: "Term", text: true }], t.lots.map((l) => [l.acquired, { text: l.accountName, class: "text" }, decimal(l.quantity), decimal(l.unitCost), money(l.costBasis), { text: l.term, class: "text" }])),
    );
  },
};

export function mount(main, context) {
  let symbol = (context.args[0] || "").toUpperCase();
  const view = context.params.get("view") || "";
  let position = null;
  let stopped = false;
  let controller = null;
  let sequence = 0;

  const title = el("h1", { id: "detail-title", text: symbol });
  const where = el("p", { class: "muted", id: "detail-position", "aria-live": "polite" });
  const previous = el("button", { type: "button", class: "quiet", text: "← Previous (k)", onclick: () => step(-1) });
  const next = el("button", { type: "button", class: "quiet", text: "Next (j) →", onclick: () => step(1) });
  const back = el("a", { href: "#/portfolio", text: "← Holdings" });
  const groups = { details: group("details", "Quote and market"), priceHistory: group("history", "Price history"), transactions: group("transactions", "Transactions (past year)"), taxLots: group("lots", "Tax lots") };
  const container = el("div", { id: "detail", "data-loaded": "" }, el("div", { class: "grid" }, ...Object.values(groups).map((g) => el("div", { class: "wide" }, g.section))));
  main.append(el("p", {}, back), el("div", { class: "detail-head" }, title, where, previous, next), el("p", { class: "muted", text: "Keys: j or ↓ next, k or ↑ previous." }), container);

  // When the step's key was pressed, to say how long it took to show (`data-step-ms`).
  let pressedAt = performance.now();

  async function load(target) {
    const mine = ++sequence;
    controller?.abort();
    controller = new AbortController();
    symbol = target;
    title.textContent = symbol;
    container.dataset.loaded = "";
    for (const g of Object.values(groups)) {
      g.section.dataset.state = "loading";
      g.section.setAttribute("aria-busy", "true");
    }
    let answer;
    try {
      answer = await api(`/v1/securities/${encodeURIComponent(symbol)}${view ? `?view=${encodeURIComponent(view)}` : ""}`, { signal: controller.signal });
    } catch (error) {
      if (error.name === "AbortError" || mine !== sequence || stopped) return;
      for (const g of Object.values(groups)) {
        g.section.dataset.state = "failed";
        g.section.removeAttribute("aria-busy");
        g.body.replaceChildren(el("p", { class: "banner error", text: `Could not load: ${error.message}` }));
      }
      return;
    }
    if (mine !== sequence || stopped) return;
    position = answer.view || null;
    where.textContent = position ? `${position.position + 1} of ${position.count} in this list · ${answer.assetType} · ${answer.cache === "miss" ? "loaded now" : "from the relay's cache"}` : answer.assetType;
    previous.disabled = !position?.previous;
    next.disabled = !position?.next;
    for (const [name, g] of Object.entries(groups)) {
      const part = answer[name];
      g.section.removeAttribute("aria-busy");
      if (part.status === "loaded") {
        g.section.dataset.state = "loaded";
        g.body.replaceChildren(renderers[name](part.data));
      } else {
        g.section.dataset.state = "failed";
        g.body.replaceChildren(el("p", { class: "banner error", role: "status", text: `Could not load this part: ${part.error}` }), el("button", { type: "button", class: "quiet", text: "Retry", onclick: () => load(symbol) }));
      }
    }
    container.dataset.loaded = symbol;
    container.dataset.stepMs = (performance.now() - pressedAt).toFixed(1);
    document.title = `${symbol} · relay`;
  }

  function step(direction) {
    const target = direction > 0 ? position?.next : position?.previous;
    if (!target) return;
    pressedAt = performance.now();
    window.history.replaceState(null, "", `#/security/${encodeURIComponent(target)}${view ? `?view=${encodeURIComponent(view)}` : ""}`);
    load(target);
  }

  function onKey(event) {
    if (event.defaultPrevented || event.altKey || event.ctrlKey || event.metaKey) return;
    if (event.target.closest && event.target.closest("input, select, textarea, [contenteditable], dialog")) return;
    if (event.key === "j" || event.key === "ArrowDown") {
      event.preventDefault();
      step(1);
    } else if (event.key === "k" || event.key === "ArrowUp") {
      event.preventDefault();
      step(-1);
    }
  }
  document.addEventListener("keydown", onKey);
  load(symbol);
  return () => {
    stopped = true;
    controller?.abort();
    document.removeEventListener("keydown", onKey);
    document.title = "relay";
  };
}
