// Small SVG charts drawn here: a sparkline, and a line chart with axes and hover (or arrow-key)
// values. Each chart is an image with a text alternative that gives its latest value.

const NS = "http://www.w3.org/2000/svg";

function svg(tag, attributes = {}) {
  const node = document.createElementNS(NS, tag);
  for (const [name, value] of Object.entries(attributes)) node.setAttribute(name, value);
  return node;
}

function scale(domainLow, domainHigh, rangeLow, rangeHigh) {
  const span = domainHigh - domainLow || 1;
  return (value) => rangeLow + ((value - domainLow) / span) * (rangeHigh - rangeLow);
}

/// A sparkline of `values` (numbers; null for no value), labelled `label`.
export function sparkline(values, label) {
  const width = 240;
  const height = 40;
  const node = svg("svg", { class: "spark", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "aria-label": label });
  const present = values.filter((value) => value !== null && value !== undefined);
  if (present.length < 2) return node;
  const high = Math.max(...present, 0);
  const low = Math.min(...present, 0);
  const x = scale(0, values.length - 1, 0, width);
  const y = scale(low, high === low ? low + 1 : high, height - 2, 2);
  let d = "";
  values.forEach((value, index) => {
    if (value === null || value === undefined) return;
    d += (d ? "L" : "M") + x(index).toFixed(1) + "," + y(value).toFixed(1);
  });
  node.append(svg("path", { class: "area", d: `${d}L${x(values.length - 1)},${height}L${x(0)},${height}Z` }));
  node.append(svg("path", { class: "line", d }));
  return node;
}

/// A line chart. `series`: [{ name, className, points: [{ x: ms, y: number, mark? }] }]; the first
/// series drives the hover. `formatY(y)`, `formatX(ms)` label values; `label` is the text alternative.
export function lineChart({ series, label, formatY = String, formatX = (ms) => new Date(ms).toISOString().slice(0, 10), height = 260, dots = true }) {
  // Drawn at the width it will show at (so its text stays readable on a phone), within bounds.
  const room = document.getElementById("main")?.clientWidth || 800;
  const width = Math.round(Math.min(1000, Math.max(300, room - 56)));
  const pad = { left: 64, right: 12, top: 12, bottom: 26 };
  const node = svg("svg", { class: "chart", viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": label, tabindex: "0" });
  const main = series[0];
  const all = series.flatMap((s) => s.points);
  if (!main || main.points.length === 0) {
    const text = svg("text", { x: width / 2, y: height / 2, "text-anchor": "middle" });
    text.textContent = "No data in this range";
    node.append(text);
    return node;
  }
  const xs = all.map((p) => p.x);
  const ys = all.map((p) => p.y);
  let low = Math.min(...ys);
  let high = Math.max(...ys);
  if (low === high) {
    low -= 1;
    high += 1;
  }
  const margin = (high - low) * 0.06;
  low -= margin;
  high += margin;
  const x = scale(Math.min(...xs), Math.max(...xs) === Math.min(...xs) ? Math.min(...xs) + 1 : Math.max(...xs), pad.left, width - pad.right);
  const y = scale(low, high, height - pad.bottom, pad.top);

  for (let i = 0; i <= 4; i++) {
    const value = low + ((high - low) * i) / 4;
    node.append(svg("line", { class: "axis", x1: pad.left, x2: width - pad.right, y1: y(value), y2: y(value) }));
    const text = svg("text", { x: pad.left - 6, y: y(value) + 4, "text-anchor": "end" });
    text.textContent = formatY(value);
    node.append(text);
  }
  const first = main.points[0].x;
  const last = main.points[main.points.length - 1].x;
  for (const [at, anchor] of [[first, "start"], [last, "end"]]) {
    const text = svg("text", { x: x(at), y: height - 6, "text-anchor": anchor });
    text.textContent = formatX(at);
    node.append(text);
  }
  for (const s of series) {
    const d = s.points.map((p, i) => (i ? "L" : "M") + x(p.x).toFixed(1) + "," + y(p.y).toFixed(1)).join("");
    node.append(svg("path", { class: s.className || "line", d, "data-series": s.name }));
  }
  const dotGroup = svg("g", { class: "points", "data-count": String(main.points.length) });
  if (dots) {
    for (const p of main.points) {
      dotGroup.append(svg("circle", { class: p.mark ? "point partial" : "point", cx: x(p.x).toFixed(1), cy: y(p.y).toFixed(1), r: main.points.length > 120 ? 1.6 : 2.8 }));
    }
  }
  node.append(dotGroup);

  const cursor = svg("line", { class: "cursor", y1: pad.top, y2: height - pad.bottom, visibility: "hidden" });
  const tip = svg("g", { class: "tip", visibility: "hidden" });
  const tipBox = svg("rect", { rx: 4, height: 20 + 16 * (series.length - 1) });
  tip.append(tipBox);
  const tipLines = series.map((_, i) => {
    const text = svg("text", { x: 8, y: 14 + 16 * i });
    tip.append(text);
    return text;
  });
  node.append(cursor, tip);

  let index = -1;
  function show(i) {
    index = Math.max(0, Math.min(main.points.length - 1, i));
    const p = main.points[index];
    const px = x(p.x);
    cursor.setAttribute("x1", px);
    cursor.setAttribute("x2", px);
    cursor.setAttribute("visibility", "visible");
    series.forEach((s, n) => {
      const match = s.points.find((q) => q.x === p.x);
      tipLines[n].textContent = (n === 0 ? formatX(p.x) + "  " : "") + (s.name ? s.name + " " : "") + (match ? formatY(match.y) : "—") + (n === 0 && p.mark ? " (partial)" : "");
    });
    const boxWidth = Math.max(...tipLines.map((t) => t.textContent.length)) * 7 + 16;
    tipBox.setAttribute("width", boxWidth);
    const left = px + boxWidth + 12 > width ? px - boxWidth - 8 : px + 8;
    tip.setAttribute("transform", `translate(${left},${pad.top})`);
    tip.setAttribute("visibility", "visible");
    node.dataset.hover = tipLines[0].textContent;
  }
  function hide() {
    cursor.setAttribute("visibility", "hidden");
    tip.setAttribute("visibility", "hidden");
  }
  node.addEventListener("pointermove", (event) => {
    const box = node.getBoundingClientRect();
    const at = ((event.clientX - box.left) / box.width) * width;
    let best = 0;
    main.points.forEach((p, i) => {
      if (Math.abs(x(p.x) - at) < Math.abs(x(main.points[best].x) - at)) best = i;
    });
    show(best);
  });
  node.addEventListener("pointerleave", hide);
  node.addEventListener("blur", hide);
  node.addEventListener("keydown", (event) => {
    if (event.key === "ArrowLeft" || event.key === "ArrowRight") {
      event.preventDefault();
      event.stopPropagation();
      show(index < 0 ? main.points.length - 1 : index + (event.key === "ArrowRight" ? 1 : -1));
    }
  });
  return node;
}

/// A small candlestick chart of `bars` ([{ start: ms, open, high, low, close, volume }], oldest first),
/// labelled `label`: a line from low to high and a box from open to close per bar, rising bars filled.
export function candles(bars, label) {
  const width = 480;
  const height = 120;
  const node = svg("svg", { class: "candles", viewBox: `0 0 ${width} ${height}`, preserveAspectRatio: "none", role: "img", "aria-label": label });
  if (!bars.length) return node;
  const high = Math.max(...bars.map((bar) => bar.high));
  const low = Math.min(...bars.map((bar) => bar.low));
  const step = width / Math.max(bars.length, 30);
  const y = scale(low, high === low ? low + 1 : high, height - 4, 4);
  bars.forEach((bar, index) => {
    const middle = step * index + step / 2;
    const rising = bar.close >= bar.open;
    node.append(svg("line", { class: "wick", x1: middle, x2: middle, y1: y(bar.high).toFixed(1), y2: y(bar.low).toFixed(1) }));
    const top = y(Math.max(bar.open, bar.close));
    const box = Math.max(1, y(Math.min(bar.open, bar.close)) - top);
    node.append(svg("rect", { class: rising ? "candle up" : "candle down", x: (middle - step * 0.35).toFixed(1), y: top.toFixed(1), width: (step * 0.7).toFixed(1), height: box.toFixed(1) }));
  });
  return node;
}
