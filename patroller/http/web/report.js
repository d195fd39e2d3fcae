// The usage report's page (/report): asks GET /usage for a range (by day and user, by weekday
// and hour, by user), in the browser's time zone, and draws the GPU-hours per day by user and by
// category, when in the week the GPUs are held or used, and who held GPUs idle or reserved
// them unused. Read-only. Everything from the daemon is untrusted text: the DOM is built with
// textContent and setAttribute, never from HTML strings.
"use strict";

(function () {
  const {stackedBars, heatmap, hours: gpuHours} = window.PatrollerCharts;  // charts.js
  const CATEGORIES = ["active", "idle_held", "reserved_unused", "trespass", "unreserved",
                      "free", "lost"];
  const USED = CATEGORIES.slice(0, 5);  // GPU-time held or used: all but free and lost
  const NAMES = {active: "active", idle_held: "idle-held", reserved_unused: "reserved, unused",
                 trespass: "trespass", unreserved: "unreserved use", free: "free", lost: "lost",
                 used: "held or used"};
  const WEEKDAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];
  const HOURS = Array.from({length: 24}, (_, n) => String(n).padStart(2, "0"));
  const USERS_SHOWN = 8;  // users with a colour of their own; the rest are "others"
  const TOP = 10;         // lines of each list
  const DEFAULT_DAYS = 30;

  const page = new URLSearchParams(location.search);
  const asUser = page.get("user");  // test mode: who is asking (whose names --hide-users shows)
  let zone = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  let answers = null;  // {days, heat, users}: the last answers of /usage
  let asked = 0;       // loads started: an older one's answers are dropped

  function $(id) { return document.getElementById(id); }

  function h(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined) continue;
      if (key === "data") {
        for (const [k, v] of Object.entries(value)) node.dataset[k] = String(v);
      } else {
        node.setAttribute(key, String(value));
      }
    }
    for (const child of children) {
      if (child !== null && child !== undefined) {
        node.append(child instanceof Node ? child : document.createTextNode(String(child)));
      }
    }
    return node;
  }

  // -- dates, in the browser's own time zone -----------------------------------------------------

  function isoDate(when) {
    const two = (n) => String(n).padStart(2, "0");
    return `${when.getFullYear()}-${two(when.getMonth() + 1)}-${two(when.getDate())}`;
  }

  function addDays(date, days) {
    const [y, m, d] = date.split("-").map(Number);
    return isoDate(new Date(y, m - 1, d + days));
  }

  function today() { return isoDate(new Date()); }

  function validDate(text) {
    return /^\d{4}-\d{2}-\d{2}$/.test(text || "") && addDays(text, 0) === text;
  }

  // The zone as an offset (+02:00), for a daemon whose host does not know the zone's name.
  function offsetNow() {
    const minutes = -new Date().getTimezoneOffset();
    const two = (n) => String(Math.floor(Math.abs(n))).padStart(2, "0");
    return (minutes < 0 ? "-" : "+") + two(minutes / 60) + ":" + two(minutes % 60);
  }

  function range() {
    return {from: $("from").value, to: $("to").value};
  }

  function setRange(from, to) {
    $("from").value = from;
    $("to").value = to;
    const now = today();
    for (const button of document.querySelectorAll("[data-days]")) {
      const days = Number(button.dataset.days);
      button.setAttribute("aria-pressed", String(to === now && from === addDays(now, 1 - days)));
    }
  }

  // -- asking the daemon -------------------------------------------------------------------------

  class Refused extends Error {
    constructor(message, status, field) {
      super(message);
      this.status = status;
      this.field = field;
    }
  }

  async function usage(by, from, to) {
    const query = new URLSearchParams({since: from, by, tz: zone});
    const end = addDays(to, 1);
    if (end <= today()) query.set("until", end);  // else up to now: the future is refused
    if (asUser) query.set("user", asUser);
    let response;
    try {
      response = await fetch("/usage?" + query.toString(), {headers: {Accept: "application/json"},
                                                            cache: "no-store"});
    } catch (error) {
      throw new Refused("the daemon cannot be reached: " + error.message, 0, null);
    }
    const body = await response.json().catch(() => ({}));
    if (!response.ok) {
      throw new Refused(body.error || `the daemon answered ${response.status}`,
                        response.status, body.field || null);
    }
    return body;
  }

  async function load() {
    const {from, to} = range();
    if (!validDate(from) || !validDate(to) || from > to) {
      problem("choose a range: from a day, to the same day or a later one");
      return;
    }
    const mine = ++asked;
    document.body.dataset.state = "loading";
    const address = new URLSearchParams({from, to});
    if (asUser) address.set("user", asUser);
    history.replaceState(null, "", "?" + address.toString());
    let found;
    try {
      found = await Promise.all(["day,user", "weekday,hour", "user"].map(
        (by) => usage(by, from, to)));
    } catch (error) {
      if (mine !== asked) return;
      if (error.field === "tz" && zone !== offsetNow()) {
        zone = offsetNow();  // this host knows no zone of that name: its offset now will do
        load();
        return;
      }
      problem(error.message, error.status);
      return;
    }
    if (mine !== asked) return;
    const [days, heat, users] = found;
    answers = {days, heat, users, from, to};
    draw();
  }

  function problem(text, status) {
    $("problem").textContent = text;
    $("problem").hidden = false;
    $("summary").textContent = status === 404 || status === 503 ? "no usage report here"
                                                                : "no report";
    document.body.dataset.state = "unavailable";
    for (const id of ["by-user", "by-category", "heat"]) $(id).replaceChildren();
  }

  // -- drawing -----------------------------------------------------------------------------------

  function used(hours) { return USED.reduce((sum, c) => sum + (hours[c] || 0), 0); }

  function part(hours, category) {
    return category === "used" ? used(hours) : (hours[category] || 0);
  }

  function userLabel(key) { return key === null ? "nobody" : key; }

  function percent(share) { return Math.round(share * 1000) / 10 + "\u00a0%"; }

  function draw() {
    if (answers === null) return;
    const {days, heat, users, from, to} = answers;
    $("problem").hidden = true;
    const empty = days.rows.length === 0;
    document.body.dataset.state = empty ? "empty" : "shown";
    summarize(days, from, to);
    $("zone").textContent = "days and hours in " + (days.tz || zone);
    document.body.dataset.zone = days.tz || zone;
    const columns = [];
    for (let day = from; day <= to; day = addDays(day, 1)) {
      const [y, m, d] = day.split("-").map(Number);
      const label = new Date(y, m - 1, d).toLocaleDateString([], {month: "short", day: "numeric"});
      columns.push({key: day, label, short: label});
    }
    drawByUser(days, columns);
    drawByCategory(days, columns);
    drawHeat(heat);
    drawTop(users, "idle_held", "top-idle");
    drawTop(users, "reserved_unused", "top-unused");
  }

  function summarize(days, from, to) {
    const total = days.total;
    const span = from === to ? from : `${from} to ${to}`;
    if (days.rows.length === 0) {
      $("summary").textContent = `${span}: no GPU-time recorded` + (days.first === null
        ? " (the usage store holds nothing yet)"
        : ` (the store holds figures from ${days.first.slice(0, 10)})`);
      return;
    }
    const shares = USED.filter((c) => total.shares[c] > 0)
      .map((c) => `${percent(total.shares[c])} ${NAMES[c]}`);
    $("summary").textContent = `${span}: ${gpuHours(total.gpu_hours)} GPU-hours` +
      (shares.length ? ", " + shares.join(", ") : ", none held or used");
  }

  function plotWidth(id) { return Math.max(280, $(id).clientWidth || 800); }

  function drawByUser(days, columns) {
    const category = $("category").value;
    const cells = new Map();  // day -> user -> GPU-hours
    const totals = new Map();  // user -> GPU-hours in the range
    for (const row of days.rows) {
      const [day, user] = row.key;
      const value = part(row.hours, category);
      if (value <= 0) continue;
      const key = user === null ? "" : user;
      if (!cells.has(day)) cells.set(day, new Map());
      cells.get(day).set(key, (cells.get(day).get(key) || 0) + value);
      totals.set(key, (totals.get(key) || 0) + value);
    }
    const ranked = [...totals.entries()].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
    const shown = ranked.slice(0, USERS_SHOWN).map(([key], n) => (
      {key, label: userLabel(key === "" ? null : key), className: "u" + n}));
    const rest = new Set(ranked.slice(USERS_SHOWN).map(([key]) => key));
    const series = rest.size ? [...shown, {key: "\u0000others", label: `${rest.size} others`,
                                           className: "others"}] : shown;
    const value = (day, key) => {
      const byUser = cells.get(day);
      if (!byUser) return 0;
      if (key !== "\u0000others") return byUser.get(key) || 0;
      let sum = 0;
      for (const [user, hours] of byUser) if (rest.has(user)) sum += hours;
      return sum;
    };
    $("by-user").replaceChildren(stackedBars({
      columns, series, value, unit: "GPU-h", width: plotWidth("by-user"),
      title: `GPU-hours ${NAMES[category]} per day, by user`}));
    legend("by-user-legend", series);
  }

  function drawByCategory(days, columns) {
    const cells = new Map();  // day -> category -> GPU-hours
    for (const row of days.rows) {
      const day = row.key[0];
      if (!cells.has(day)) cells.set(day, Object.fromEntries(CATEGORIES.map((c) => [c, 0])));
      for (const c of CATEGORIES) cells.get(day)[c] += row.hours[c] || 0;
    }
    const series = CATEGORIES.map((c) => ({key: c, label: NAMES[c], className: "cat-" + c}));
    $("by-category").replaceChildren(stackedBars({
      columns, series, value: (day, c) => (cells.get(day) || {})[c] || 0, unit: "GPU-h",
      width: plotWidth("by-category"), title: "GPU-hours per day, by category"}));
    legend("by-category-legend", series);
  }

  function legend(id, series) {
    $(id).replaceChildren(...series.map((s) => h("li", {data: {series: s.key}},
      h("span", {class: "swatch " + s.className}), s.label)));
  }

  function drawHeat(heat) {
    const cells = new Map();  // "Mon 09" -> GPU-hours held or used
    let unplaced = 0;  // daily totals (before --usage-days): no hour of the day
    for (const row of heat.rows) {
      const [weekday, hour] = row.key;
      const value = used(row.hours);
      if (weekday === null || hour === null) {
        unplaced += value;
        continue;
      }
      cells.set(weekday + " " + hour, (cells.get(weekday + " " + hour) || 0) + value);
    }
    $("heat").replaceChildren(heatmap({
      rows: WEEKDAYS.map((d) => ({key: d, label: d})),
      columns: HOURS.map((hour) => ({key: hour, label: String(Number(hour))})),
      value: (d, hour) => cells.get(d + " " + hour) || 0, unit: "GPU-h",
      width: plotWidth("heat"), title: "GPU-hours held or used, by weekday and hour"}));
    $("heat-note").textContent = `(GPU-hours held or used, summed over the range, by weekday ` +
                                 `and hour in ${heat.tz || zone})`;
    $("heat-unplaced").hidden = unplaced <= 0;
    $("heat-unplaced").textContent = `${gpuHours(unplaced)} GPU-hours from before --usage-days ` +
                                     "are kept as daily totals, with no hour of the day";
  }

  function drawTop(users, category, id) {
    const rows = users.rows.filter((row) => (row.hours[category] || 0) > 0)
      .sort((a, b) => b.hours[category] - a.hours[category] ||
                      (String(a.key) < String(b.key) ? -1 : 1))
      .slice(0, TOP);
    $(id).querySelector("tbody").replaceChildren(...rows.map((row) => {
      const held = used(row.hours);
      return h("tr", {data: {user: row.key === null ? "" : row.key, hours: row.hours[category]}},
        h("td", {title: userLabel(row.key)}, userLabel(row.key)),
        h("td", {}, gpuHours(row.hours[category])),
        h("td", {}, held > 0 ? percent(row.hours[category] / held) : "–"));
    }));
    $(id).hidden = rows.length === 0;
    $(id + "-empty").hidden = rows.length > 0;
  }

  // -- the range control -------------------------------------------------------------------------

  function start() {
    $("where").textContent = location.host;
    const now = today();
    for (const input of [$("from"), $("to")]) input.max = now;
    const from = page.get("from"), to = page.get("to");
    if (validDate(from) && validDate(to)) {
      setRange(from, to);
    } else {
      setRange(addDays(now, 1 - DEFAULT_DAYS), now);
    }
    for (const button of document.querySelectorAll("[data-days]")) {
      button.addEventListener("click", () => {
        const end = today();
        setRange(addDays(end, 1 - Number(button.dataset.days)), end);
        load();
      });
    }
    $("show").addEventListener("click", () => {
      const {from: chosen, to: until} = range();
      setRange(chosen, until);
      load();
    });
    for (const input of [$("from"), $("to")]) {
      input.addEventListener("keydown", (event) => {
        if (event.key === "Enter") $("show").click();
      });
    }
    $("category").addEventListener("change", draw);
    let resized = null;
    window.addEventListener("resize", () => {
      clearTimeout(resized);
      resized = setTimeout(draw, 150);
    });
    load();
  }

  start();
})();
