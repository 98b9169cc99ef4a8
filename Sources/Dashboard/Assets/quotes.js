// Live quotes and trades through the relay's own WebSocket, as any client sees them: auth, subscribe,
// events, in the protocol the market speaks (Polygon's at /<market>, or Alpaca's JSON at its feed's path).
// Changed values flash; the relay's notices (lagging, upstream gaps) are banners. On Alpaca's crypto feed the
// first symbol's order book shows its top levels: the relay sends a book whole (`r: true`) to a late joiner.
// Where the market has trades, the first symbol's 5-second bars, which the relay builds from them
// (a derived topic: `AM.AAPL@5s`, Alpaca's `bars: ["AAPL@5s"]`), show as a small candlestick chart.
import { key, socketURL, el, decimal, time } from "./api.js";
import { candles } from "./charts.js";

const SAVED = "relay.quotes";

// Each market's quote and trade channels, and symbols to start with.
const MARKETS = {
  stocks: { quote: "Q", trade: "T", start: "AAPL, MSFT, NVDA" },
  options: { quote: "Q", trade: "T", start: "O:SPY251219C00650000, O:AAPL251219C00200000" },
  forex: { quote: "C", trade: null, start: "C:EUR-USD, C:GBP-USD" },
  crypto: { quote: "XQ", trade: "XT", start: "X:BTC-USD, X:ETH-USD" },
  indices: { quote: null, trade: "V", start: "I:SPX, I:NDX" },
  futures: { quote: "Q", trade: "T", start: "ESZ5, NQZ5" },
};

// Alpaca's markets: symbols as Alpaca names them (a crypto pair is BTC/USD).
const ALPACA = {
  stocks: { start: "AAPL, MSFT, NVDA" },
  crypto: { start: "BTC/USD, ETH/USD" },
  options: { start: "SPY251219C00650000, AAPL251219C00200000" },
};

// An event's ticker in the market's topic form (crypto `pair` BTC-USD is X:BTC-USD; forex `p` EUR/USD is C:EUR-USD).
function topicTicker(market, event) {
  const raw = String(event.sym || event.pair || (event.ev === "C" ? event.p : null) || event.T || "").toUpperCase();
  if (!raw) return null;
  const prefix = { options: "O:", forex: "C:", crypto: "X:", indices: "I:" }[market];
  if (!prefix || raw.startsWith(prefix)) return raw;
  return prefix + (market === "forex" ? raw.replace("/", "-") : raw);
}

function parseSymbols(text) {
  return [...new Set(text.split(/[\s,]+/).map((s) => s.trim().toUpperCase()).filter(Boolean))].slice(0, 50);
}

export function mount(main, context) {
  const infos = context.status.markets || [{ market: context.status.market }];
  // Markets with quotes (news has none).
  const served = infos.map((m) => m.market).filter((name) => name !== "news");
  const info = () => infos.find((m) => m.market === market) || {};
  const alpaca = () => info().vendor === "alpaca";
  const wanted = context.params ? context.params.get("market") : null;
  let market = served.includes(wanted) ? wanted : sessionStorage.getItem(SAVED + ".market");
  if (!served.includes(market)) market = served[0];
  const channels = () => (alpaca() ? ALPACA[market] || ALPACA.stocks : MARKETS[market] || MARKETS.stocks);
  let symbols = parseSymbols(sessionStorage.getItem(`${SAVED}.${market}`) || channels().start);
  const picker = el("select", { id: "market", name: "market" }, ...served.map((name) => el("option", { value: name, text: name, selected: name === market ? true : null })));
  const input = el("input", { id: "symbols", name: "symbols", value: symbols.join(", "), autocomplete: "off", "aria-describedby": "symbols-help symbols-error" });
  const error = el("p", { class: "field-error", id: "symbols-error" });
  const connection = el("p", { class: "muted", id: "quotes-connection", role: "status", text: "Connecting…" });
  const body = el("tbody");
  const table = el(
    "table",
    { "aria-labelledby": "quotes-title" },
    el(
      "thead",
      {},
      el("tr", {}, ...["Symbol", "Bid", "Bid size", "Ask", "Ask size", "Last trade", "Trade size", "Time"].map((name, i) => el("th", { scope: "col", class: [2, 4, 6].includes(i) ? "hide-narrow" : null, text: name }))),
    ),
    body,
  );
  const form = el(
    "form",
    { class: "inline", novalidate: true },
    el("div", { class: "field" }, el("label", { for: "market", text: "Market" }), picker),
    el("div", { class: "field" }, el("label", { for: "symbols", text: "Symbols" }), input, el("span", { id: "symbols-help", class: "visually-hidden", text: "Tickers separated by commas, such as AAPL, MSFT" }), error),
    el("button", { type: "submit", text: "Watch" }),
  );
  const bookTitle = el("h2", { id: "book-title", text: "Order book" });
  const bookBody = el("tbody");
  const bookNote = el("p", { class: "muted", id: "book-note", text: "Waiting for the whole book…" });
  const bookPanel = el(
    "section",
    { class: "panel table-wrap", id: "book", "aria-labelledby": "book-title", hidden: true },
    bookTitle,
    bookNote,
    el(
      "table",
      { "aria-labelledby": "book-title" },
      el("thead", {}, el("tr", {}, ...["Bid size", "Bid", "Ask", "Ask size"].map((name) => el("th", { scope: "col", text: name })))),
      bookBody,
    ),
  );
  const barsTitle = el("h2", { id: "bars-title", text: "5-second bars" });
  const barsNote = el("p", { class: "muted", id: "bars-note", text: "Waiting for the first bar…" });
  const barsChart = el("div", { id: "bars-chart" });
  const barsPanel = el("section", { class: "panel", id: "bars", "aria-labelledby": "bars-title", hidden: true }, barsTitle, barsNote, barsChart);
  main.append(
    el("h1", { text: "Live quotes" }),
    el("section", { class: "panel" }, form, connection),
    el("section", { class: "panel table-wrap", "aria-labelledby": "quotes-title" }, el("h2", { id: "quotes-title", text: "Quotes and trades" }), table),
    barsPanel,
    bookPanel,
  );

  // Derived 5-second bars of the first symbol: the relay builds them from the trades (docs/derived-bars.md).
  const BAR_SIZE = "5s";
  const BARS_KEPT = 60;
  let bars = [];
  const barEventType = () => (alpaca() ? (["stocks", "crypto"].includes(market) ? "b" : null) : { stocks: "AM", crypto: "XA" }[market] || null);
  const barTopic = (symbol) => `${barEventType()}.${symbol}@${BAR_SIZE}`;
  function showBar(symbol, bar) {
    if (!symbol || symbol.toUpperCase() !== `${symbols[0]}@${BAR_SIZE}`.toUpperCase()) return;
    const kept = bars.filter((one) => one.start !== bar.start);
    kept.push(bar);
    bars = kept.sort((a, b) => a.start - b.start).slice(-BARS_KEPT);
    renderBars();
  }
  function renderBars() {
    barsPanel.hidden = barEventType() === null;
    barsTitle.textContent = `5-second bars: ${symbols[0]}`;
    const last = bars[bars.length - 1];
    if (!last) {
      barsNote.textContent = "Waiting for the first bar…";
      barsChart.replaceChildren();
      return;
    }
    const window = `${time(new Date(last.start).toISOString())}–${time(new Date(last.end).toISOString())}`;
    const summary = `Last bar ${window}: open ${decimal(String(last.open))}, high ${decimal(String(last.high))}, low ${decimal(String(last.low))}, close ${decimal(String(last.close))}, volume ${last.volume}`;
    barsNote.textContent = `${summary} (${bars.length} bars)`;
    barsChart.replaceChildren(candles(bars, `${bars.length} five-second bars of ${symbols[0]}. ${summary}`));
  }

  // Order books (Alpaca's crypto `orderbooks`): price → size per side; a reset replaces the book, size 0 removes a level.
  const BOOK_LEVELS = 5;
  const books = new Map();
  let bookFrame = null;
  const booksShown = () => alpaca() && market === "crypto";
  function applyBook(message) {
    let book = books.get(message.S);
    if (!book || message.r) {
      book = { bids: new Map(), asks: new Map(), whole: Boolean(message.r) };
      books.set(message.S, book);
    }
    for (const [side, levels] of [[book.bids, message.b], [book.asks, message.a]]) {
      for (const level of levels || []) {
        if (Number(level.s) === 0) side.delete(Number(level.p));
        else side.set(Number(level.p), Number(level.s));
      }
    }
    if (message.S === symbols[0] && bookFrame === null) bookFrame = requestAnimationFrame(renderBook);
  }
  function renderBook() {
    bookFrame = null;
    const symbol = symbols[0];
    bookPanel.hidden = !booksShown();
    bookTitle.textContent = `Order book: ${symbol} (top ${BOOK_LEVELS})`;
    const book = books.get(symbol);
    bookBody.replaceChildren();
    if (!book || !book.whole) {
      bookNote.textContent = "Waiting for the whole book…";
      return;
    }
    const bids = [...book.bids].sort((a, b) => b[0] - a[0]).slice(0, BOOK_LEVELS);
    const asks = [...book.asks].sort((a, b) => a[0] - b[0]).slice(0, BOOK_LEVELS);
    bookNote.textContent = `${book.bids.size} bid and ${book.asks.size} ask levels`;
    for (let i = 0; i < BOOK_LEVELS; i += 1) {
      const [bp, bs] = bids[i] || [];
      const [ap, as] = asks[i] || [];
      bookBody.append(
        el(
          "tr",
          { "data-level": String(i) },
          el("td", { text: bs === undefined ? "—" : String(bs) }),
          el("td", { text: bp === undefined ? "—" : decimal(String(bp)) }),
          el("td", { text: ap === undefined ? "—" : decimal(String(ap)) }),
          el("td", { text: as === undefined ? "—" : String(as) }),
        ),
      );
    }
  }

  const rows = new Map();
  function row(symbol) {
    let r = rows.get(symbol);
    if (!r) {
      const cells = {};
      const tr = el("tr", { "data-symbol": symbol });
      for (const name of ["sym", "bp", "bs", "ap", "as", "p", "s", "t"]) {
        cells[name] = el(name === "sym" ? "th" : "td", { scope: name === "sym" ? "row" : null, class: ["bs", "as", "s"].includes(name) ? "hide-narrow" : null, text: name === "sym" ? symbol : "—" });
        tr.append(cells[name]);
      }
      body.append(tr);
      r = { tr, cells, values: {} };
      rows.set(symbol, r);
    }
    return r;
  }
  function update(r, name, value, shown) {
    if (value === undefined || value === null) return;
    const before = r.values[name];
    r.values[name] = value;
    const cell = r.cells[name];
    cell.textContent = shown;
    if (before !== undefined && before !== value && typeof value === "number") {
      cell.classList.remove("flash-up", "flash-down");
      void cell.offsetWidth; // restart the animation
      cell.classList.add(value > before ? "flash-up" : "flash-down");
    }
  }

  let socket = null;
  let stopped = false;
  let retry = null;
  let attempts = 0;

  function connect() {
    socket = new WebSocket(socketURL(info().path || "/" + market));
    connection.textContent = "Connecting…";
    socket.onmessage = (message) => {
      let events;
      try {
        events = JSON.parse(message.data);
      } catch {
        return;
      }
      for (const event of Array.isArray(events) ? events : [events]) (alpaca() ? handleAlpaca : handle)(event);
    };
    socket.onclose = (event) => {
      if (stopped) return;
      connection.textContent = `Disconnected (${event.code}${event.reason ? ": " + event.reason : ""}); reconnecting…`;
      attempts += 1;
      retry = setTimeout(connect, Math.min(1000 * 2 ** attempts, 15000));
    };
  }

  function send(message) {
    if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify(message));
  }

  let subscribed = [];
  function subscribe(next) {
    if (alpaca()) {
      // Alpaca's per-channel lists; a trades subscription brings corrections and cancel errors, not shown here.
      // On crypto, the first symbol's order book too (the relay gives it whole first).
      const withBook = (list, message) => (booksShown() && list.length ? { ...message, orderbooks: list.slice(0, 1) } : message);
      const withBars = (list, message) => (barEventType() && list.length ? { ...message, bars: [`${list[0]}@${BAR_SIZE}`] } : message);
      if (subscribed.length) send(withBars(subscribed, withBook(subscribed, { action: "unsubscribe", trades: subscribed, quotes: subscribed })));
      if (next.length) send(withBars(next, withBook(next, { action: "subscribe", trades: next, quotes: next })));
      subscribed = next;
      books.clear();
      renderBook();
      bars = [];
      renderBars();
      return;
    }
    const { quote, trade } = channels();
    const topics = (list) =>
      list
        .flatMap((s) => [quote && `${quote}.${s}`, trade && `${trade}.${s}`].filter(Boolean))
        .concat(barEventType() && list.length ? [barTopic(list[0])] : [])
        .join(",");
    if (subscribed.length) send({ action: "unsubscribe", params: topics(subscribed) });
    if (next.length) send({ action: "subscribe", params: topics(next) });
    subscribed = next;
    bars = [];
    renderBars();
  }

  function handle(event) {
    if (event.ev === "status") {
      switch (event.status) {
        case "connected":
          send({ action: "auth", params: key() || "dashboard" });
          break;
        case "auth_success":
          authenticated();
          break;
        case "auth_failed":
          connection.textContent = "The relay did not accept the key.";
          context.banner("quotes-auth", "The relay refused this key for the market feed.", "error");
          break;
        case "lagging":
          context.banner("quotes-lagging", `The relay says this page is lagging: ${event.message}`);
          break;
        case "upstream_disconnected":
          context.banner("quotes-upstream", `Upstream gap: ${event.message}`, "error");
          break;
        case "upstream_reconnected":
          context.banner("quotes-upstream", `Upstream back: ${event.message}`);
          break;
        case "error":
          error.textContent = event.message;
          break;
        default:
          break;
      }
      return;
    }
    if (event.ev === barEventType() && typeof event.s === "number") {
      // The derived bar: `sym` (or crypto's `pair`, without its X: prefix) is the symbol and its size.
      showBar(topicTicker(market, event), { start: event.s, end: event.e, open: event.o, high: event.h, low: event.l, close: event.c, volume: event.v });
      return;
    }
    show(topicTicker(market, event), event);
  }

  function authenticated() {
    attempts = 0;
    connection.textContent = `Connected to ${info().path || "/" + market}`;
    subscribe(symbols);
  }

  // An RFC 3339 time with up to nine fraction digits (kept to three) as Unix ms.
  const rfc3339 = (text) => Date.parse(String(text).replace(/(\.\d{3})\d+/, "$1"));

  // Alpaca's protocol: control messages by `T`, the relay's notices as `T: "relay"`, trades `t` and quotes `q`.
  function handleAlpaca(message) {
    switch (message.T) {
      case "success":
        if (message.msg === "connected") send({ action: "auth", key: key() || "dashboard", secret: "dashboard" });
        else if (message.msg === "authenticated") authenticated();
        return;
      case "error":
        if (message.code === 402 || message.code === 401) {
          connection.textContent = "The relay did not accept the key.";
          context.banner("quotes-auth", "The relay refused this key for the market feed.", "error");
        } else {
          error.textContent = `${message.code} ${message.msg}`;
        }
        return;
      case "relay":
        // The relay's notices carry Polygon's statuses: shown as for Polygon's markets.
        handle({ ev: "status", status: message.status, message: message.msg });
        return;
      case "q":
        show(message.S, { ev: "Q", bp: message.bp, bs: message.bs, ap: message.ap, as: message.as, t: message.t });
        return;
      case "t":
        show(message.S, { ev: "T", p: message.p, s: message.s, t: message.t });
        return;
      case "o":
        applyBook(message);
        return;
      case "b":
        // Alpaca's bar: `t` its start, `_e` its end (RFC 3339), on the derived symbol (AAPL@5s).
        showBar(message.S, { start: rfc3339(message.t), end: rfc3339(message._e), open: message.o, high: message.h, low: message.l, close: message.c, volume: message.v });
        return;
      default:
        return;
    }
  }

  // One event, in Polygon's field names, on its symbol's row.
  function show(symbol, event) {
    if (!symbol || !rows.has(symbol)) return;
    const r = row(symbol);
    if (event.ev === "Q" || event.ev === "XQ") {
      update(r, "bp", event.bp, decimal(String(event.bp)));
      update(r, "bs", event.bs, String(event.bs ?? "—"));
      update(r, "ap", event.ap, decimal(String(event.ap)));
      update(r, "as", event.as, String(event.as ?? "—"));
    } else if (event.ev === "C") {
      update(r, "bp", event.b, decimal(String(event.b)));
      update(r, "ap", event.a, decimal(String(event.a)));
    } else if (event.ev === "T" || event.ev === "XT") {
      update(r, "p", event.p, decimal(String(event.p)));
      update(r, "s", event.s, String(event.s ?? "—"));
    } else if (event.ev === "V") {
      update(r, "p", event.val, decimal(String(event.val)));
    } else {
      return;
    }
    // Polygon's `t` is Unix ms; Alpaca's an RFC 3339 text with up to nine fraction digits (kept to three).
    const at = typeof event.t === "string" ? new Date(event.t.replace(/(\.\d{3})\d+/, "$1")) : new Date(event.t);
    if (event.t && !Number.isNaN(at.getTime())) r.cells.t.textContent = time(at.toISOString());
  }

  form.addEventListener("submit", (event) => {
    event.preventDefault();
    const next = parseSymbols(input.value);
    if (!next.length) {
      error.textContent = "Enter at least one symbol, such as AAPL.";
      input.setAttribute("aria-invalid", "true");
      return;
    }
    error.textContent = "";
    input.removeAttribute("aria-invalid");
    sessionStorage.setItem(`${SAVED}.${market}`, next.join(", "));
    for (const [symbol, r] of rows) {
      if (!next.includes(symbol)) {
        r.tr.remove();
        rows.delete(symbol);
      }
    }
    symbols = next;
    symbols.forEach(row);
    subscribe(next);
  });

  picker.addEventListener("change", () => {
    // Another market is another connection, at that market's path.
    market = picker.value;
    sessionStorage.setItem(SAVED + ".market", market);
    subscribed = [];
    books.clear();
    renderBook();
    bars = [];
    renderBars();
    for (const r of rows.values()) r.tr.remove();
    rows.clear();
    symbols = parseSymbols(sessionStorage.getItem(`${SAVED}.${market}`) || channels().start);
    input.value = symbols.join(", ");
    symbols.forEach(row);
    clearTimeout(retry);
    if (socket) {
      socket.onclose = null;
      socket.close(1000, "market changed");
    }
    attempts = 0;
    connect();
  });

  symbols.forEach(row);
  connect();
  return () => {
    stopped = true;
    clearTimeout(retry);
    if (bookFrame !== null) cancelAnimationFrame(bookFrame);
    if (socket) socket.close(1000, "page left");
    for (const id of ["quotes-lagging", "quotes-upstream", "quotes-auth"]) context.clearBanner(id);
  };
}
