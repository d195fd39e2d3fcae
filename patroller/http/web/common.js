// What Patroller's pages share (index.html's app.js, fleet.html's fleet.js, report.html's
// report.js): the one element builder, a bar, a duration, memory, a time of day. Loaded before each
// page's own script, it defines window.Patroller and nothing else. The one duration formatting of the web; Python's is
// patroller/durations.py (tests/test_layout.py keeps each the only one).
"use strict";

window.Patroller = Object.freeze({
  // h("div", {class: "x", data: {n: 1}}, "text", child, ...): an element, its attributes (null,
  // undefined and false ones left out; `data` as data-* attributes) and its children (arrays
  // flattened; text arguments become text nodes, never HTML; null, undefined and false left
  // out). Everything from the daemon is untrusted text: this is how every page builds its DOM.
  h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    window.Patroller.setAttrs(el, attrs);
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      el.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return el;
  },

  // Attributes as h sets them (also on SVG elements).
  setAttrs(el, attrs) {
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "data") {
        for (const [k, v] of Object.entries(value)) el.dataset[k] = String(v);
      } else {
        el.setAttribute(key, String(value));
      }
    }
  },

  // A bar of `fraction` (0 to 1; anything else: an empty bar) as the live and the fleet page
  // draw SM and memory: its label (shown on a phone only, where a table's head is not), the
  // track, its text; the fraction also as data-value, for the tests.
  bar(kind, label, fraction, text) {
    const h = window.Patroller.h;
    const shown = typeof fraction === "number" && isFinite(fraction);
    const fill = h("span", {class: "fill"});
    fill.style.width = shown ? Math.min(100, Math.max(0, fraction * 100)).toFixed(1) + "%" : "0";
    return h("div", {class: "bar " + kind, data: {value: shown ? fraction.toFixed(3) : ""}},
      h("span", {class: "bar-label"}, label),
      h("span", {class: "track", role: "img", "aria-label": label + " " + text}, fill),
      h("span", {class: "bar-text"}, text));
  },

  // 42 s, 12 min, 3 h 5 min, 2 d 4 h
  duration(seconds) {
    if (typeof seconds !== "number" || !isFinite(seconds)) return "–";
    const t = Math.max(0, Math.floor(seconds));
    if (t < 60) return t + " s";
    if (t < 3600) return Math.floor(t / 60) + " min";
    if (t < 86400) {
      const m = Math.floor(t / 60) % 60;
      return Math.floor(t / 3600) + " h" + (m ? " " + m + " min" : "");
    }
    const hours = Math.floor(t / 3600) % 24;
    return Math.floor(t / 86400) + " d" + (hours ? " " + hours + " h" : "");
  },

  // Memory in GiB everywhere (cards, process tables, the fleet): one decimal below 10 GiB.
  gib(mib) {
    if (typeof mib !== "number") return "–";
    const g = mib / 1024;
    return (g === 0 || g >= 10 ? Math.round(g) : g.toFixed(1)) + " GiB";
  },

  // 14:03:07 in the browser's own way of writing a time of day.
  timeOfDay(iso) {
    const when = new Date(iso);
    if (isNaN(when)) return String(iso || "");
    return when.toLocaleTimeString([], {hour: "2-digit", minute: "2-digit", second: "2-digit"});
  },
});
