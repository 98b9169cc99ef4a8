// The relay's HTTP API and WebSockets as the page uses them: the client key (kept for this tab only)
// sent as `Authorization: Bearer KEY` (HTTP) or `apiKey=KEY` (WebSocket), and a per-tab client name
// (`X-Relay-Client`) so the relay's prefetching follows this tab.

const KEY = "relay.key";
const CLIENT = "relay.client";

export class ApiError extends Error {
  constructor(status, message, field) {
    super(message);
    this.status = status;
    this.field = field || null;
  }
}

export function key() {
  return sessionStorage.getItem(KEY);
}

export function setKey(value) {
  if (value) sessionStorage.setItem(KEY, value);
  else sessionStorage.removeItem(KEY);
}

function clientName() {
  let name = sessionStorage.getItem(CLIENT);
  if (!name) {
    name = "dashboard-" + Math.random().toString(36).slice(2, 10);
    sessionStorage.setItem(CLIENT, name);
  }
  return name;
}

const listeners = new Set();
/// Called with the failing ApiError when the relay refuses the key (401).
export function onUnauthorized(listener) {
  listeners.add(listener);
}

export async function api(path, { method = "GET", body, signal } = {}) {
  const headers = { "X-Relay-Client": clientName() };
  const current = key();
  if (current) headers.Authorization = "Bearer " + current;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  let response;
  try {
    response = await fetch(path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body), signal });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "the relay cannot be reached");
  }
  const text = await response.text();
  let data = null;
  try {
    data = text ? JSON.parse(text) : null;
  } catch {
    data = null;
  }
  if (!response.ok) {
    const error = new ApiError(response.status, (data && data.error) || `HTTP ${response.status}`, data && data.field);
    if (response.status === 401) listeners.forEach((listener) => listener(error));
    throw error;
  }
  return data;
}

/// A WebSocket URL on this relay, with the key as `apiKey` when there is one.
export function socketURL(path) {
  const url = new URL(path, location.href);
  url.protocol = location.protocol === "https:" ? "wss:" : "ws:";
  const current = key();
  if (current) url.searchParams.set("apiKey", current);
  return url.toString();
}

// Formatting. Money and quantities arrive as exact decimal strings; they are shown as given, grouped.
const grouping = new Intl.NumberFormat(undefined, { maximumFractionDigits: 20 });

export function decimal(text, places) {
  if (text === null || text === undefined || text === "") return "—";
  const number = Number(text);
  if (!Number.isFinite(number)) return String(text);
  if (places !== undefined) {
    return number.toLocaleString(undefined, { minimumFractionDigits: places, maximumFractionDigits: places });
  }
  const [whole, fraction] = String(text).replace("-", "").split(".");
  const sign = String(text).startsWith("-") ? "−" : "";
  return sign + grouping.format(Number(whole)) + (fraction ? "." + fraction : "");
}

export function money(text) {
  return decimal(text, 2);
}

export function signed(text, places = 2) {
  if (text === null || text === undefined) return "—";
  const number = Number(text);
  const shown = decimal(String(Math.abs(number)), places);
  return (number > 0 ? "+" : number < 0 ? "−" : "") + shown;
}

export function trend(text) {
  const number = Number(text);
  return number > 0 ? "up" : number < 0 ? "down" : "";
}

export function rate(value) {
  if (value >= 1e6) return (value / 1e6).toFixed(2) + "M";
  if (value >= 1e4) return (value / 1e3).toFixed(1) + "k";
  return Math.round(value).toLocaleString();
}

export function time(iso) {
  if (!iso) return "—";
  return new Date(iso).toLocaleTimeString();
}

/// Builds an element: el("td", { class: "up", text: "1" }, child…).
export function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attributes)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "text") node.textContent = value;
    else if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}
