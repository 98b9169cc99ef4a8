// The portfolio: its total (and what is missing from it), the daily history, the holdings to sort and
// filter, the accounts and the forms that change them. Live from /v1/portfolio/stream.
import { api, el, money, signed, trend, decimal, time, socketURL } from "./api.js";
import { lineChart } from "./charts.js";

const QUERY = "relay.holdings.query";

const columns = [
  { field: "symbol", label: "Symbol", text: true },
  { field: "assetType", label: "Type", text: true, narrow: true },
  { field: "quantity", label: "Quantity", narrow: true },
  { field: "price", label: "Price" },
  { field: "marketValue", label: "Market value" },
  { field: "dayChange", label: "Day change", signed: true },
  { field: "unrealizedPnL", label: "Unrealized P&L", signed: true, narrow: true },
  { field: "unrealizedPnLPercent", label: "P&L %", signed: true, percent: true, narrow: true },
  { field: "weight", label: "Weight", percent: true, narrow: true },
];

const ranges = [
  ["1M", 30],
  ["3M", 91],
  ["1Y", 365],
  ["All", null],
];

/// The API's rule for decimals, checked before sending: plain digits, an optional fraction, no
/// exponent. Returns the refusal for `field`, or null.
function decimalRefusal(data, field, label) {
  const text = String(data.get(field) ?? "").trim();
  if (!text || /^\d+(\.\d+)?$/.test(text)) return null;
  return Object.assign(new Error(`${label}: expected a plain decimal such as "12.50" (no exponent, no sign)`), { field });
}

function day(offset) {
  const date = new Date(Date.now() - offset * 86400000);
  return date.toISOString().slice(0, 10);
}

function field(form, name, label, control, help) {
  const id = `${form}-${name}`;
  control.id = id;
  control.name = name;
  control.setAttribute("aria-describedby", `${id}-error`);
  return el("div", { class: "field" }, el("label", { for: id, text: label }), control, help ? el("span", { class: "muted", text: help }) : null, el("p", { class: "field-error", id: `${id}-error` }));
}

/// Shows an API refusal next to its field, or for the whole form when it names none of its fields.
function showErrors(form, error) {
  for (const node of form.querySelectorAll(".field-error")) node.textContent = "";
  for (const node of form.querySelectorAll("[aria-invalid]")) node.removeAttribute("aria-invalid");
  const status = form.querySelector(".form-status");
  status.textContent = "";
  status.className = "form-status";
  if (!error) return;
  // The field is named by what the request sent: escaped, never read as part of the selector.
  const control = error.field ? form.querySelector(`[name="${CSS.escape(error.field)}"]`) : null;
  const message = control && document.getElementById(`${control.id}-error`);
  if (control && message) {
    control.setAttribute("aria-invalid", "true");
    message.textContent = error.message;
    control.focus();
  } else {
    status.textContent = error.message;
    status.className = "form-status field-error";
    status.setAttribute("role", "alert");
  }
}

export function mount(main, context) {
  const saved = JSON.parse(sessionStorage.getItem(QUERY) || "{}");
  const query = {
    sort: context.params.get("sort") || saved.sort || "marketValue",
    order: context.params.get("order") || saved.order || "",
    filter: context.params.get("filter") ?? saved.filter ?? "",
    range: context.params.get("range") || saved.range || "3M",
  };
  let stopped = false;
  let accounts = [];
  let valuation = null;
  const writable = context.status.viewer.portfolio === "write";

  // Total.
  const totalValue = el("div", { class: "total", id: "total-value", text: "—" });
  const totalFacts = el("dl", { class: "facts", id: "total-facts" });
  const partial = el("div", { id: "partial", role: "status" });
  const totalRegion = el(
    "section",
    { class: "panel", "aria-labelledby": "total-title" },
    el("h2", { id: "total-title", text: "Portfolio total" }),
    el("div", { class: "total-row" }, totalValue, totalFacts),
    partial,
  );

  // History.
  const chartBox = el("div", { id: "history-chart" });
  const rangeButtons = el("div", { class: "ranges", role: "group", "aria-label": "History range" });
  for (const [name] of ranges) {
    rangeButtons.append(el("button", { type: "button", "aria-pressed": String(name === query.range), "data-range": name, text: name, onclick: () => setRange(name) }));
  }
  const history = el("section", { class: "panel", "aria-labelledby": "history-title" }, el("h2", { id: "history-title", text: "History" }), rangeButtons, chartBox);

  // Holdings.
  const filter = el("input", { id: "holdings-filter", type: "search", value: query.filter, autocomplete: "off", placeholder: "e.g. AA" });
  const headRow = el("tr");
  const holdingsBody = el("tbody");
  const holdingsTable = el("table", { id: "holdings", "aria-label": "Holdings", "aria-describedby": "holdings-help" }, el("thead", {}, headRow), holdingsBody);
  for (const column of columns) {
    const th = el("th", { scope: "col", class: [column.text ? "text" : null, column.narrow ? "hide-narrow" : null].filter(Boolean).join(" ") || null, "data-field": column.field });
    th.append(el("button", { type: "button", class: "sort", text: column.label, onclick: () => sortBy(column.field) }));
    headRow.append(th);
  }
  const holdingsCount = el("span", { class: "muted", id: "holdings-count" });
  const holdings = el(
    "section",
    { class: "panel", "aria-labelledby": "holdings-title" },
    el("h2", { id: "holdings-title" }, "Holdings ", holdingsCount),
    el("form", { class: "inline", role: "search", onsubmit: (event) => event.preventDefault() }, el("div", { class: "field" }, el("label", { for: "holdings-filter", text: "Filter by symbol" }), filter)),
    el("p", { id: "holdings-help", class: "muted", text: "Open a holding for its detail; there, j and k step to the next and previous holding." }),
    el("div", { class: "table-wrap" }, holdingsTable),
  );

  // Accounts and forms.
  const accountsBody = el("tbody");
  const accountsTable = el(
    "table",
    { "aria-label": "Accounts" },
    el("thead", {}, el("tr", {}, ...["Account", "Kind", "Value", "Cash", "Valued", "As of"].map((name, i) => el("th", { scope: "col", class: i < 2 ? "text" : null, text: name })))),
    accountsBody,
  );
  const forms = el("div", { class: "forms" });
  const accountsPanel = el("section", { class: "panel", "aria-labelledby": "accounts-title" }, el("h2", { id: "accounts-title", text: "Accounts" }), el("div", { class: "table-wrap" }, accountsTable), writable ? forms : el("p", { class: "muted", text: "This key may read the portfolio but not change it." }));

  main.append(el("h1", { text: "Portfolio" }), el("div", { class: "grid" }, el("div", { class: "wide" }, totalRegion), el("div", { class: "wide" }, holdings), el("div", { class: "wide" }, history), el("div", { class: "wide" }, accountsPanel)));

  function remember() {
    sessionStorage.setItem(QUERY, JSON.stringify(query));
    const params = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) if (value) params.set(name, value);
    history_replace(`#/portfolio?${params}`);
  }

  // Total and accounts from a valuation.
  function drawValuation(v) {
    valuation = v;
    totalValue.textContent = money(v.total);
    const change = el("span", { class: trend(v.dayChange), text: signed(v.dayChange) });
    totalFacts.replaceChildren(
      el("dt", { text: "Day change" }), el("dd", { id: "day-change" }, change),
      el("dt", { text: "Positions" }), el("dd", { text: money(v.positionsValue) }),
      el("dt", { text: "Cash" }), el("dd", { text: money(v.cash) }),
      el("dt", { text: "As of" }), el("dd", {}, el("time", { datetime: v.asOf, text: time(v.asOf) })),
    );
    const reasons = [];
    if (v.unpricedSymbols.length) reasons.push(`no price for ${v.unpricedSymbols.join(", ")} (nothing received from the feed or the REST API yet), so they are left out of the total`);
    if (v.staleSymbols.length) reasons.push(`stale prices for ${v.staleSymbols.join(", ")} (the last price is older than the relay accepts), left out of the total`);
    if ((v.withheldSymbols || []).length) reasons.push(`prices withheld for ${v.withheldSymbols.join(", ")} (this key may not read them), left out of the total`);
    const noValue = (v.accounts || []).filter((a) => a.value === undefined || a.value === null).map((a) => a.name);
    if (noValue.length) reasons.push(`no value entered yet for ${noValue.join(", ")}`);
    partial.replaceChildren(...(reasons.length || v.hasPartialFailures ? [el("p", { class: "banner", id: "partial-banner" }, el("strong", { text: "Partial total: " }), reasons.join("; ") || "some values are missing")] : []));
    drawAccounts();
  }

  function drawAccounts() {
    const values = new Map((valuation?.accounts || []).map((a) => [a.id, a]));
    const rows = accounts
      .filter((a) => a.isActive)
      .map((a) => {
        const value = values.get(a.id);
        return el(
          "tr",
          {},
          el("th", { scope: "row", class: "text", text: a.name }),
          el("td", { class: "text", text: a.kind }),
          el("td", { text: value ? money(value.value) : "—" }),
          el("td", { text: value && value.cash !== undefined ? money(value.cash) : "—" }),
          el("td", { text: value ? (value.basis === "live" ? "live" : "last update") + (value.partial ? ", partial" : "") : "—" }),
          el("td", {}, value && value.asOf ? el("time", { datetime: value.asOf, text: new Date(value.asOf).toLocaleString() }) : "—"),
        );
      });
    accountsBody.replaceChildren(...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "6", class: "text muted", text: "No accounts yet." }))]));
    drawForms();
  }

  // History.
  let historySequence = 0;
  async function loadHistory() {
    const mine = ++historySequence;
    const days = ranges.find(([name]) => name === query.range)?.[1];
    const path = days ? `/v1/portfolio/history?from=${day(days)}` : "/v1/portfolio/history";
    try {
      const rows = await api(path);
      if (stopped || mine !== historySequence) return;
      const points = rows.map((r) => ({ x: Date.parse(r.day + "T00:00:00Z"), y: Number(r.value), mark: r.partial }));
      const last = rows[rows.length - 1];
      const label = last ? `Portfolio value by day, ${rows.length} days; latest ${money(last.value)} on ${last.day}${last.partial ? " (partial)" : ""}` : "Portfolio value by day: no days in this range";
      const chart = lineChart({ series: [{ name: "", points }], label, formatY: (y) => Math.round(y).toLocaleString() });
      chart.dataset.points = String(rows.length);
      chart.dataset.range = query.range;
      chartBox.replaceChildren(chart);
    } catch (error) {
      chartBox.replaceChildren(el("p", { class: "banner error", text: `History unavailable: ${error.message}` }));
    }
  }

  function setRange(name) {
    query.range = name;
    for (const button of rangeButtons.querySelectorAll("button")) button.setAttribute("aria-pressed", String(button.dataset.range === name));
    remember();
    loadHistory();
  }

  // Holdings.
  let holdingsRequest = null;
  async function loadHoldings() {
    holdingsRequest?.abort();
    const controller = new AbortController();
    holdingsRequest = controller;
    const params = new URLSearchParams({ sort: query.sort });
    if (query.order) params.set("order", query.order);
    if (query.filter) params.set("filter", query.filter);
    try {
      const view = await api(`/v1/holdings?${params}`, { signal: controller.signal });
      if (stopped || controller.signal.aborted) return;
      drawHoldings(view);
    } catch (error) {
      if (error.name === "AbortError") return;
      holdingsBody.replaceChildren(el("tr", {}, el("td", { colspan: String(columns.length), class: "text banner error", text: `Holdings unavailable: ${error.message}` })));
    }
  }

  function cell(holding, column) {
    const value = holding[column.field];
    if (column.field === "symbol") {
      return el("th", { scope: "row", class: "text" }, el("a", { href: `#/security/${encodeURIComponent(value)}?view=${encodeURIComponent(currentView)}`, text: value }));
    }
    if (column.text) return el("td", { class: "text" + (column.narrow ? " hide-narrow" : ""), text: value });
    let shown = column.field === "quantity" ? decimal(value) : column.signed ? signed(value) : money(value);
    if (column.percent && value !== undefined) shown = (column.signed ? signed(value) : decimal(value, 2)) + " %";
    if (column.field === "price" && holding.status !== "priced") shown += holding.status === "stale" ? " (stale)" : " (no price)";
    const missing = column.field === "price" ? (holding.status === "withheld" ? "withheld" : "no price") : "—";
    return el("td", { class: [column.signed ? trend(value) : null, column.narrow ? "hide-narrow" : null].filter(Boolean).join(" ") || null, text: value === undefined ? missing : shown });
  }

  let currentView = "";
  function drawHoldings(view) {
    currentView = view.view.id;
    query.order = view.view.order;
    for (const th of headRow.children) {
      th.setAttribute("aria-sort", th.dataset.field === view.view.sort ? (view.view.order === "asc" ? "ascending" : "descending") : "none");
    }
    holdingsCount.textContent = `(${view.count})`;
    const focused = document.activeElement?.closest?.("#holdings tbody tr")?.dataset.symbol;
    holdingsBody.replaceChildren(...view.holdings.map((h) => el("tr", { "data-symbol": h.symbol }, ...columns.map((column) => cell(h, column)))));
    if (!view.holdings.length) holdingsBody.append(el("tr", {}, el("td", { colspan: String(columns.length), class: "text muted", text: query.filter ? `No holding matches “${query.filter}”.` : "No holdings yet." })));
    if (focused) holdingsBody.querySelector(`tr[data-symbol="${CSS.escape(focused)}"] a`)?.focus();
  }

  function sortBy(fieldName) {
    if (query.sort === fieldName) query.order = query.order === "asc" ? "desc" : "asc";
    else {
      query.sort = fieldName;
      query.order = "";
    }
    remember();
    loadHoldings();
  }

  let filterTimer = null;
  filter.addEventListener("input", () => {
    clearTimeout(filterTimer);
    filterTimer = setTimeout(() => {
      query.filter = filter.value.trim();
      remember();
      loadHoldings();
    }, 200);
  });

  // Forms.
  function form(id, title, controls, submit, label) {
    const node = el("form", { id, novalidate: true, "aria-labelledby": `${id}-title` }, el("h3", { id: `${id}-title`, text: title }), ...controls, el("div", {}, el("button", { type: "submit", text: label })), el("p", { class: "form-status", "aria-live": "polite" }));
    node.addEventListener("submit", async (event) => {
      event.preventDefault();
      showErrors(node, null);
      const button = node.querySelector("button[type=submit]");
      button.disabled = true;
      try {
        await submit(new FormData(node));
        const status = node.querySelector(".form-status");
        status.textContent = "Saved.";
        node.reset();
        await refresh();
      } catch (error) {
        showErrors(node, error);
      } finally {
        button.disabled = false;
      }
    });
    return node;
  }

  function accountSelect(kind) {
    const select = el("select", {});
    for (const account of accounts.filter((a) => a.isActive && (!kind || a.kind === kind))) select.append(el("option", { value: String(account.id), text: account.name }));
    return select;
  }

  function optional(data, names) {
    const body = {};
    for (const name of names) {
      const value = String(data.get(name) ?? "").trim();
      if (value) body[name] = value;
    }
    return body;
  }

  function drawForms() {
    if (!writable) return;
    // Keep what a person is typing: forms are built once the accounts are known, and again only when
    // the set of accounts changed.
    const signature = accounts.map((a) => `${a.id}:${a.isActive}`).join(",");
    if (forms.dataset.signature === signature) return;
    forms.dataset.signature = signature;
    const kinds = el("select", {}, ...["buy", "sell", "dividend", "fee", "deposit", "withdrawal"].map((k) => el("option", { value: k, text: k })));
    forms.replaceChildren(
      form(
        "new-transaction",
        "Add a transaction",
        [
          field("tx", "account", "Account", accountSelect("brokerage")),
          field("tx", "kind", "Kind", kinds),
          field("tx", "date", "Date", el("input", { type: "date", value: day(0), required: true })),
          field("tx", "symbol", "Symbol", el("input", { autocomplete: "off" })),
          field("tx", "quantity", "Quantity", el("input", { inputmode: "decimal", autocomplete: "off" })),
          field("tx", "price", "Price", el("input", { inputmode: "decimal", autocomplete: "off" })),
          field("tx", "fees", "Fees", el("input", { inputmode: "decimal", autocomplete: "off" })),
          field("tx", "amount", "Amount (deposit, withdrawal)", el("input", { inputmode: "decimal", autocomplete: "off" })),
        ],
        async (data) => {
          const account = data.get("account");
          if (!account) throw Object.assign(new Error("Create a brokerage account first."), { field: "account" });
          const kind = data.get("kind");
          if (["buy", "sell", "dividend"].includes(kind) && !String(data.get("symbol") || "").trim()) {
            throw Object.assign(new Error(`A ${kind} needs the symbol, such as AAPL.`), { field: "symbol" });
          }
          for (const [name, label] of [["quantity", "Quantity"], ["price", "Price"], ["fees", "Fees"], ["amount", "Amount"]]) {
            const refusal = decimalRefusal(data, name, label);
            if (refusal) throw refusal;
          }
          const body = { kind: data.get("kind"), date: data.get("date"), ...optional(data, ["symbol", "quantity", "price", "fees", "amount"]) };
          await api(`/v1/accounts/${account}/transactions`, { method: "POST", body });
        },
        "Add transaction",
      ),
      form(
        "new-account",
        "Add an account",
        [
          field("acct", "name", "Name", el("input", { autocomplete: "off", required: true })),
          field("acct", "kind", "Kind", el("select", {}, el("option", { value: "brokerage", text: "brokerage" }), el("option", { value: "savings", text: "savings" }))),
          field("acct", "allowNegativeCash", "Margin", el("select", {}, el("option", { value: "false", text: "no: cash may not go below zero" }), el("option", { value: "true", text: "yes: withdrawals may take cash below zero" }))),
        ],
        async (data) => {
          await api("/v1/accounts", { method: "POST", body: { name: String(data.get("name") || ""), kind: data.get("kind"), allowNegativeCash: data.get("allowNegativeCash") === "true" } });
        },
        "Add account",
      ),
      form(
        "new-update",
        "Update a savings balance",
        [field("upd", "account", "Account", accountSelect("savings")), field("upd", "value", "Value", el("input", { inputmode: "decimal", autocomplete: "off" }))],
        async (data) => {
          const account = data.get("account");
          if (!account) throw Object.assign(new Error("Create a savings account first."), { field: "account" });
          const refusal = decimalRefusal(data, "value", "Value");
          if (refusal) throw refusal;
          await api(`/v1/accounts/${account}/updates`, { method: "POST", body: { value: String(data.get("value") || "") } });
        },
        "Save value",
      ),
      form(
        "close-account",
        "Close an account",
        [field("close", "account", "Account", accountSelect(null)), field("close", "closedAt", "Closing day", el("input", { type: "date", value: day(0) }), "It counts up to the day before.")],
        async (data) => {
          const account = data.get("account");
          if (!account) throw Object.assign(new Error("There is no open account."), { field: "account" });
          const date = String(data.get("closedAt") || "");
          await api(`/v1/accounts/${account}/close`, { method: "POST", body: date ? { closedAt: `${date}T12:00:00Z` } : {} });
        },
        "Close account",
      ),
    );
  }

  async function refresh() {
    try {
      const [list, v] = await Promise.all([api("/v1/accounts"), api("/v1/portfolio")]);
      if (stopped) return;
      accounts = list;
      drawValuation(v);
    } catch (error) {
      totalValue.textContent = "—";
      partial.replaceChildren(el("p", { class: "banner error", text: `Portfolio unavailable: ${error.message}` }));
    }
    loadHoldings();
    loadHistory();
  }

  // Live values: each valuation the relay pushes redraws the total; the holdings follow, at most
  // every few seconds.
  let socket = null;
  let lastHoldings = 0;
  let retry = null;
  function live() {
    socket = new WebSocket(socketURL("/v1/portfolio/stream"));
    socket.onmessage = (message) => {
      try {
        drawValuation(JSON.parse(message.data));
      } catch {
        return;
      }
      if (Date.now() - lastHoldings > 5000) {
        lastHoldings = Date.now();
        loadHoldings();
      }
    };
    socket.onclose = () => {
      if (!stopped) retry = setTimeout(live, 3000);
    };
  }

  refresh();
  live();
  return () => {
    stopped = true;
    clearTimeout(retry);
    clearTimeout(filterTimer);
    holdingsRequest?.abort();
    if (socket) socket.close(1000, "page left");
  };
}

function history_replace(hash) {
  if (location.hash !== hash) window.history.replaceState(null, "", hash);
}
