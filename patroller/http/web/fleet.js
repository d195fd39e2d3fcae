// Patroller's fleet page: asks /fleet.json of this daemon every few seconds (the daemon itself
// asks every host; the browser talks to nobody else) and draws a panel per host, a row per GPU,
// and each host that does not answer marked, with since when. Read-only.
// Everything in the answer is untrusted text (user names come from the hosts): the DOM is built
// with textContent and setAttribute on plain attributes, never from HTML strings. The daemon
// checks each host's answer, and the page still draws each host on its own: a host whose data
// cannot be drawn is marked so, and every other host is drawn as usual.
"use strict";

(function () {
  const STATES = ["free", "reserved", "allocated", "claimed", "shared", "lost"];
  const TIMEOUT = 10000;      // ms the daemon may take to answer this page
  const HELD = ["reserved", "allocated", "claimed", "shared"];
  const COMPACT_FROM = 16;    // more GPUs than this in the fleet: a line per host at first
  const REMEMBERED = "patroller.fleet.compact";
  let every = 2000;           // ms between two askings: the daemon's interval, 1 to 5 s
  let rendered = false;
  let last = null;            // the last answer drawn, to draw again when the choice changes
  let compactAll = false;     // the page-wide choice: a line per host, or every GPU
  const opened = new Map();   // host -> its GPUs shown (true) or not: its own toggle

  const {bar, duration, gib, h, timeOfDay} = window.Patroller;  // common.js

  function $(id) { return document.getElementById(id); }

  // Seconds from `iso` to the answer's own time (the daemon's clock: the browser's may differ).
  function ago(iso, now) {
    return (Date.parse(now) - Date.parse(iso)) / 1000;
  }

  function who(identity) {
    if (!identity) return "";
    // A rootless container's labels are its user's own word: the e-mail is a claim, not its user.
    if (identity.claimed) return identity.user + (identity.email ? " (claims " + identity.email + ")" : "");
    const container = identity.container || {};
    return identity.email || container.name || identity.user || "?";
  }

  function gpuRow(gpu) {
    const state = STATES.includes(gpu.state) ? gpu.state : "free";
    const holder = gpu.user;
    const others = (gpu.users || []).filter((u) => !holder || u.user !== holder.user);
    const job = holder && holder.job ? holder.job : null;
    const idle = typeof gpu.idle_for === "number";
    const label = (gpu.group && gpu.group !== "gpu" ? gpu.group + " " : "GPU ") + gpu.number;
    return h("tr", {class: "gpu is-" + state,
                    data: {uuid: gpu.uuid, number: gpu.number, state: state,
                           user: holder ? holder.user : ""}},
      h("th", {scope: "row"}, label),
      h("td", {class: "model"}, String(gpu.name || "?").replace(/^NVIDIA /, "")),
      h("td", {class: "cell-state"}, h("span", {class: "state state-" + state}, state),
        idle ? [" ", h("span", {class: "state state-idle"}, "idle " + duration(gpu.idle_for))] : null,
        gpu.withheld ? [" ", h("span", {class: "note"}, "withheld")] : null),
      h("td", {class: "cell-user"},
        holder ? h("span", {class: "holder"}, who(holder)) :
          h("span", {class: "holder none"}, state === "lost" ? "gone from the host" : "free"),
        job ? [" ", h("span", {class: "label job"}, "job " + job.id)] : null,
        others.length ? [" ", h("span", {class: "others"}, "also: " + others.map(who).join(", "))]
          : null,
        gpu.stale ? [" ", h("span", {class: "note"}, "statistics stale")] : null),
      h("td", {class: "cell-sm"}, bar("util", "SM", typeof gpu.sm === "number" ? gpu.sm / 100
        : null, typeof gpu.sm === "number" ? gpu.sm + " %" : "–")),
      h("td", {class: "cell-mem"}, bar("mem", "memory", typeof gpu.fb === "number" &&
        gpu.fb_total ? gpu.fb / gpu.fb_total : null, gib(gpu.fb) + " / " + gib(gpu.fb_total))));
  }

  function counted(gpus) {
    const counts = {};
    for (const gpu of gpus) counts[gpu.state] = (counts[gpu.state] || 0) + 1;
    const parts = Object.keys(counts).sort((a, b) => STATES.indexOf(a) - STATES.indexOf(b))
      .map((st) => counts[st] + " " + st);
    return gpus.length + " GPU" + (gpus.length === 1 ? "" : "s") +
      (parts.length ? ": " + parts.join(", ") : "");
  }

  // One line for a host's GPUs: a square each, in its state's colour, its number and holder
  // in its title.
  function strip(gpus) {
    return h("span", {class: "strip", "aria-hidden": "true"}, gpus.map((gpu) => {
      const state = STATES.includes(gpu.state) ? gpu.state : "free";
      const holder = gpu.user ? ": " + who(gpu.user) : "";
      return h("span", {class: "cell state-" + state + (gpu.free ? " is-free" : ""),
                        title: "GPU " + gpu.number + " " + state + holder});
    }));
  }

  // '3 free, 5 held of 8 GPUs': free as the daemon counts (answers.py: free, not silent, not
  // lost), held in any way.
  function freeHeld(host, gpus) {
    const held = gpus.filter((gpu) => HELD.includes(gpu.state)).length;
    const free = typeof host.free === "number" ? host.free : 0;
    return free + " free, " + held + " held of " + gpus.length + " GPU" +
      (gpus.length === 1 ? "" : "s");
  }

  function compactNow(name) {
    return opened.has(name) ? !opened.get(name) : compactAll;
  }

  function hostPanel(host, now) {
    const up = host.state === "up";
    const kind = up ? "up" : host.state === "asking" ? "asking" : "down";
    const gpus = host.gpus || [];
    let said;
    if (up) {
      said = freeHeld(host, gpus);
    } else if (kind === "asking") {
      said = "asked, no answer yet";
    } else {
      said = host.state + " since " + timeOfDay(host.since) + " (" +
        duration(ago(host.since, now)) + "); " + (host.last_seen ?
          "last seen " + timeOfDay(host.last_seen) + " (" + duration(ago(host.last_seen, now)) +
          " ago)" : "not seen since this daemon started");
    }
    const compact = gpus.length > 0 && compactNow(host.host);
    const link = h("a", {href: host.url + "/"}, host.host);
    const toggle = gpus.length ? h("button", {type: "button", class: "toggle",
      "aria-expanded": compact ? "false" : "true", title: compact ? "show its GPUs" :
        "one line for this host"}, compact ? "show GPUs" : "hide GPUs") : null;
    const table = gpus.length ? h("table", {class: "fleet-gpus", hidden: compact},
      h("thead", {}, h("tr", {},
        h("th", {scope: "col", class: "c-gpu"}, "GPU"),
        h("th", {scope: "col", class: "c-model"}, "model"),
        h("th", {scope: "col", class: "c-state"}, "state"),
        h("th", {scope: "col"}, "user or job"),
        h("th", {scope: "col", class: "c-sm"}, "SM"),
        h("th", {scope: "col", class: "c-mem"}, "memory"))),
      h("tbody", {}, gpus.map(gpuRow))) : null;
    return h("section", {class: "panel host is-" + kind + (compact ? " is-compact" : ""),
                         data: {host: host.host, state: host.state}, "aria-label": host.host},
      h("header", {class: "host-head"}, h("h2", {}, link),
        h("span", {class: "state state-" + kind}, host.state),
        h("span", {class: "host-summary"}, said),
        gpus.length ? strip(gpus) : null, toggle),
      !up && host.error ? h("p", {class: "down-why"}, host.error) : null,
      table);
  }

  // A host's own toggle: its GPUs shown or one line, kept over the page-wide choice.
  function toggled(event) {
    const button = event.target.closest("button.toggle");
    const panel = button && button.closest("section.host");
    if (!panel) return;
    const compact = !panel.classList.contains("is-compact");
    opened.set(panel.dataset.host, !compact);
    panel.classList.toggle("is-compact", compact);
    panel.querySelector("table.fleet-gpus").hidden = compact;
    button.setAttribute("aria-expanded", compact ? "false" : "true");
    button.textContent = compact ? "show GPUs" : "hide GPUs";
    button.title = compact ? "show its GPUs" : "one line for this host";
  }

  // The page-wide choice: every host on one line, or every GPU; remembered in this browser.
  function setCompactAll(compact, remember) {
    compactAll = compact;
    opened.clear();
    const button = $("compact");
    button.setAttribute("aria-pressed", compact ? "true" : "false");
    button.textContent = compact ? "show every GPU" : "one line per host";
    if (remember) {
      try { localStorage.setItem(REMEMBERED, compact ? "1" : "0"); } catch (err) { /* private */ }
    }
    if (last) render(last);
  }

  function remembered() {
    try {
      const value = localStorage.getItem(REMEMBERED);
      return value === "1" ? true : value === "0" ? false : null;
    } catch (err) {
      return null;
    }
  }

  // A panel for a host whose data could not be drawn: its name, and why, as far as known.
  function unreadable(host, err) {
    const name = String((host && typeof host === "object" && host.host) || "?");
    return h("section", {class: "panel host is-down", data: {host: name, state: "unreadable"},
                         "aria-label": name},
      h("header", {class: "host-head"}, h("h2", {}, name),
        h("span", {class: "state state-down"}, "unreadable"),
        h("span", {class: "host-summary"}, "its data could not be drawn")),
      h("p", {class: "down-why"}, String(err && err.message || err)));
  }

  // One host: its panel and the GPUs it counts, or, if its data breaks the drawing, the mark.
  function drawn(host, now) {
    try {
      const gpus = host.gpus || [];
      if (!Array.isArray(gpus)) throw new TypeError("its GPUs are not a list");
      return {panel: hostPanel(host, now), gpus: gpus, state: String(host.state)};
    } catch (err) {
      console.warn("fleet: a host could not be drawn", err);
      return {panel: unreadable(host, err), gpus: [], state: "unreadable"};
    }
  }

  function render(snap) {
    const given = Array.isArray(snap.hosts) ? snap.hosts : [];
    if (!rendered) {  // the first answer: as this browser chose last, else by the fleet's size
      const gpus = given.reduce((n, host) => n + (Array.isArray(host && host.gpus) ?
        host.gpus.length : 0), 0);
      const chosen = remembered();
      setCompactAll(chosen !== null ? chosen : gpus > COMPACT_FROM, false);
    }
    last = snap;
    const hosts = given.map((host) => drawn(host, snap.time));
    $("hosts").replaceChildren(...hosts.map((one) => one.panel));
    const byState = {};
    for (const one of hosts) byState[one.state] = (byState[one.state] || 0) + 1;
    const states = Object.entries(byState).map(([st, n]) => n + " " + st).join(", ");
    $("summary").textContent = hosts.length + " host" + (hosts.length === 1 ? "" : "s") +
      (states ? ": " + states : "") + "; " + counted(hosts.flatMap((one) => one.gpus));
    $("updated").textContent = "updated " + timeOfDay(snap.time);
    $("every").textContent = "every " + snap.interval + " s";
    if (!rendered) {
      rendered = true;
      document.body.dataset.rendered = "1";
    }
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  }

  function setConnection(state) {
    document.body.dataset.connection = state;
    $("banner").hidden = state !== "lost";
  }

  async function ask() {
    const abort = new AbortController();
    const timer = setTimeout(() => abort.abort(), TIMEOUT);
    try {
      const answer = await fetch("/fleet.json", {cache: "no-store", signal: abort.signal,
                                                 headers: {Accept: "application/json"}});
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const snap = await answer.json();
      setConnection("live");
      render(snap);
      every = Math.min(5, Math.max(1, Number(snap.interval) || 2)) * 1000;
    } catch (err) {
      setConnection("lost");
    } finally {
      clearTimeout(timer);
      setTimeout(ask, every);
    }
  }

  $("where").textContent = location.host;
  $("hosts").addEventListener("click", toggled);
  $("compact").addEventListener("click", () => setCompactAll(!compactAll, true));
  ask();
})();
