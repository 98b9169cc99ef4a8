// The dashboard's shell: which page shows (the URL's hash), the client key, the navigation.
import { api, key, setKey, onUnauthorized, el } from "./api.js";
import * as overview from "./overview.js";
import * as quotes from "./quotes.js";
import * as portfolio from "./portfolio.js";
import * as security from "./security.js";

const pages = { overview, quotes, portfolio, security };
const main = document.getElementById("main");
const dialog = document.getElementById("key-dialog");
const keyInput = document.getElementById("key-input");
const keyError = document.getElementById("key-error");
const keyButton = document.getElementById("key-button");

const context = { status: null, banner, clearBanner };
let unmount = null;
let waitingForKey = null;

function banner(id, text, kind = "warning") {
  const box = document.getElementById("banners");
  let node = box.querySelector(`[data-banner="${id}"]`);
  if (!node) {
    node = el("div", { class: "banner" + (kind === "error" ? " error" : ""), "data-banner": id, role: kind === "error" ? "alert" : "status" });
    box.append(node);
  }
  node.replaceChildren(el("span", { text }), el("button", { type: "button", class: "quiet", text: "Dismiss", onclick: () => node.remove() }));
}

function clearBanner(id) {
  document.querySelector(`#banners [data-banner="${id}"]`)?.remove();
}

function askForKey(message) {
  if (!waitingForKey) {
    waitingForKey = new Promise((resolve) => {
      keyError.textContent = message || "";
      keyInput.setAttribute("aria-invalid", message ? "true" : "false");
      keyInput.value = "";
      dialog.showModal();
      document.getElementById("key-form").onsubmit = (event) => {
        event.preventDefault();
        if (!keyInput.value.trim()) {
          keyError.textContent = "Enter a client key.";
          keyInput.setAttribute("aria-invalid", "true");
          return;
        }
        setKey(keyInput.value.trim());
        dialog.close();
        waitingForKey = null;
        resolve();
      };
    });
  }
  return waitingForKey;
}

dialog.addEventListener("cancel", (event) => event.preventDefault());
keyButton.addEventListener("click", async () => {
  setKey(null);
  await askForKey();
  await start();
});
// A key refused later (changed on the relay, say) asks again; while the status is loading, that
// loop asks itself.
let loadingStatus = false;
onUnauthorized(() => {
  if (!loadingStatus && !dialog.open) askForKey("The relay did not accept this key.").then(start);
});

async function loadStatus() {
  loadingStatus = true;
  try {
    return await statusWithKey();
  } finally {
    loadingStatus = false;
  }
}

async function statusWithKey() {
  // The relay says in the page whether it asks for keys: a tab without one asks before any call.
  if (!key() && document.querySelector('meta[name="relay-keys"]')?.content === "required") await askForKey();
  for (;;) {
    try {
      return await api("/v1/status");
    } catch (error) {
      if (error.status === 401) {
        await askForKey(key() ? "The relay did not accept this key." : "");
        continue;
      }
      throw error;
    }
  }
}

function pageFromHash() {
  const hash = location.hash.replace(/^#\/?/, "");
  const [path, query] = hash.split("?");
  // A link's `%` that is no escape reads as nothing, not as an error that leaves the page loading.
  const decoded = (part) => {
    try {
      return decodeURIComponent(part);
    } catch {
      return "";
    }
  };
  const parts = path.split("/").filter(Boolean).map(decoded);
  return { name: parts[0] || "overview", args: parts.slice(1), params: new URLSearchParams(query || "") };
}

function canSeePortfolio() {
  const status = context.status;
  return Boolean(status && status.portfolio && status.viewer.portfolio !== "none");
}

function render() {
  if (unmount) unmount();
  unmount = null;
  let { name, args, params } = pageFromHash();
  // Only the pages' own names (not `constructor` or `__proto__`, which every object has).
  if (!Object.hasOwn(pages, name) || ((name === "portfolio" || name === "security") && !canSeePortfolio())) name = "overview";
  const current = name === "security" ? "portfolio" : name;
  for (const link of document.querySelectorAll("nav a[data-page]")) {
    if (link.dataset.page === current) link.setAttribute("aria-current", "page");
    else link.removeAttribute("aria-current");
  }
  main.replaceChildren();
  unmount = pages[name].mount(main, { ...context, args, params }) || null;
}

async function start() {
  try {
    context.status = await loadStatus();
  } catch (error) {
    main.replaceChildren(el("p", { class: "banner error", role: "alert", text: `The relay cannot be reached: ${error.message}` }));
    return;
  }
  clearBanner("unreachable");
  keyButton.hidden = !context.status.viewer.keysRequired;
  document.querySelector('nav a[data-needs="portfolio"]').hidden = !canSeePortfolio();
  render();
}

let previousPage = pageFromHash().name;
window.addEventListener("hashchange", () => {
  const next = pageFromHash().name;
  render();
  // Moving between pages puts focus on the new page, as a screen reader user expects; a step within
  // the security detail keeps it where it is.
  if (next !== previousPage) main.focus();
  previousPage = next;
});
start();
