// Patroller's page: follows /events (Server-Sent Events, one snapshot per change) and draws
// the host's GPUs, the queue, the users and the recent events. Read-only.
// Everything from the daemon is untrusted text: the DOM is built with textContent and
// setAttribute on plain attributes, never from HTML strings.
"use strict";

(function () {
  const SVG = "http://www.w3.org/2000/svg";
  const STATES = ["free", "reserved", "allocated", "claimed", "shared", "lost"];
  let source = null;          // the EventSource
  let retryTimer = null;      // a reconnect of our own, when the browser gave up
  let receivedAt = 0;         // performance.now() when the last snapshot came
  let rendered = false;

  const {bar, duration, gib, h, setAttrs, timeOfDay} = window.Patroller;  // common.js

  function $(id) { return document.getElementById(id); }

  function s(tag, attrs) {
    const el = document.createElementNS(SVG, tag);
    setAttrs(el, attrs);
    return el;
  }

  function num(value, digits) {
    return typeof value === "number" && isFinite(value) ? value.toFixed(digits || 0) : null;
  }

  // 0:08, 12:30, 1:59:58
  function clock(seconds) {
    const t = Math.max(0, Math.ceil(seconds));
    const two = (n) => String(n).padStart(2, "0");
    const hours = Math.floor(t / 3600);
    const rest = two(Math.floor(t / 60) % 60) + ":" + two(t % 60);
    return hours ? hours + ":" + rest : String(Math.floor(t / 60)) + ":" + two(t % 60);
  }

  // The name people know a holder by: e-mail, else account, else container, else the user string.
  // The user as leases compare them: an e-mail, a host account, container:<id>.
  function who(identity) {
    if (!identity) return "";
    // A rootless container's labels are its user's own word: the e-mail is a claim, not its user.
    if (identity.claimed) return identity.user + (identity.email ? " (claims " + identity.email + ")" : "");
    return identity.email || identity.user || "?";
  }

  // A Slurm job's process: its job (and step, account, partition); a Kubernetes pod's: its
  // pod (namespace/name, and the container's name); then the copied labels.
  function labels(identity) {
    const job = identity && identity.job;
    const jobLabel = job ? [h("span", {class: "label job"}, "job " + job.id +
      (job.account ? " · " + job.account : "") + (job.partition ? " · " + job.partition : ""))]
      : [];
    const pod = identity && identity.pod;
    const podLabel = pod ? [h("span", {class: "label pod"}, "pod " + pod.namespace + "/" +
      pod.name + (pod.container ? " · " + pod.container : ""))] : [];
    const info = (identity && identity.info) || {};
    return jobLabel.concat(podLabel, Object.entries(info)
      .filter(([, v]) => v !== null && v !== undefined && v !== "")
      .map(([k, v]) => h("span", {class: "label"}, k + ": " + v)));
  }

  // A text that keeps moving between snapshots: seconds left (down) or seconds so far (up).
  function ticking(seconds, direction, format, prefix, suffix) {
    return h("span", {class: "tick", data: {
      base: seconds, dir: direction, fmt: format, at: receivedAt,
      prefix: prefix || "", suffix: suffix || ""}}, tickText(seconds, direction, format,
      receivedAt, prefix, suffix));
  }

  function tickText(base, direction, format, at, prefix, suffix) {
    const elapsed = (performance.now() - at) / 1000;
    const value = direction === "down" ? base - elapsed : base + elapsed;
    const text = format === "clock" ? clock(value) : duration(value);
    return (prefix || "") + text + (suffix || "");
  }

  function tick() {
    for (const el of document.querySelectorAll(".tick")) {
      const d = el.dataset;
      el.textContent = tickText(Number(d.base), d.dir, d.fmt, Number(d.at), d.prefix, d.suffix);
    }
  }

  // The SM utilisation of the last ten minutes (HISTORY points, one per interval), newest at
  // the right edge: a GPU watched for a short while has a short line.
  const HISTORY = 120;

  function sparkline(points, interval) {
    const width = 120, height = 28;
    const shown = points.slice(-HISTORY);
    const span = duration(HISTORY * interval);
    const svg = s("svg", {class: "spark", viewBox: "0 0 " + width + " " + height,
      preserveAspectRatio: "none", role: "img", "aria-label": "SM utilisation, last " + span});
    svg.append(s("rect", {x: 0, y: 0, width: width, height: height, class: "spark-bg"}));
    const step = width / (HISTORY - 1);
    const coords = [];
    shown.forEach((v, i) => {
      if (typeof v !== "number") return;
      const x = width - (shown.length - 1 - i) * step;
      const y = height - 1 - (Math.min(100, Math.max(0, v)) / 100) * (height - 2);
      coords.push(x.toFixed(1) + "," + y.toFixed(1));
    });
    if (coords.length === 1) coords.unshift((width - step).toFixed(1) + "," + coords[0].split(",")[1]);
    if (coords.length) svg.append(s("polyline", {points: coords.join(" "), class: "spark-line"}));
    const title = s("title", {});
    title.textContent = "SM utilisation over the last " + span;
    svg.append(title);
    return svg;
  }

  function holdText(claim) {
    if (claim.jobs && claim.jobs.length) {
      return h("span", {class: "hold"}, "Slurm job" + (claim.jobs.length > 1 ? "s " : " ") +
        claim.jobs.map((j) => j.id).join(", "));
    }
    if (claim.pods && claim.pods.length) {  // a pod's name is null where its holder is hidden
      const named = claim.pods.filter((p) => p.name).map((p) => p.namespace + "/" + p.name);
      return h("span", {class: "hold"}, "Kubernetes pod" + (claim.pods.length > 1 ? "s" : "") +
        (named.length ? " " + named.join(", ") : ""));
    }
    if (claim.held_for_pid !== null && claim.held_for_pid !== undefined) {
      return h("span", {class: "hold"}, "while pid " + claim.held_for_pid + " lives");
    }
    if (typeof claim.expires === "number") {
      const what = claim.hold === "duration" ? "held, " : "lease, ";
      return h("span", {class: "hold countdown"}, what,
        ticking(claim.expires, "down", "clock", "", " left"));
    }
    return null;
  }

  // A GPU's slowed clocks and its processes' faults (Xids): a line each.
  function healthNotes(health) {
    if (!health) return null;
    const lines = (health.problems || []).filter((p) => !p.grave)
      .map((p) => "degraded: " + p.words + ": " + p.action)
      .concat((health.faults || []).map((f) =>
        (f.pid !== null && f.pid !== undefined ? "pid " + f.pid + ": " : "") + f.words +
          (f.kind === "application" ? " (a fault of its process)" : " (an Xid Patroller does not place)")));
    return lines.length ? lines.map((line) => h("p", {class: "warn health"}, line)) : null;
  }

  function processTable(claim) {
    const rows = (claim.process_detail || []).map((p) => h("tr", {data: {pid: p.pid}},
      h("td", {class: "pid"}, String(p.pid)),
      h("td", {}, h("span", {class: "command"}, p.command || "?"),
        h("span", {class: "puser", title: p.user || ""}, p.user || "?")),
      h("td", {class: "pmem"}, gib(p.fb)),
      h("td", {class: "psm"}, typeof p.sm === "number" ? p.sm + " %" : "–")));
    if (!rows.length) return null;
    return h("table", {class: "procs"},
      h("thead", {}, h("tr", {}, h("th", {scope: "col", class: "c-pid"}, "pid"),
        h("th", {scope: "col"}, "process"), h("th", {scope: "col", class: "c-mem"}, "memory"),
        h("th", {scope: "col", class: "c-sm"}, "SM"))),
      h("tbody", {}, rows));
  }

  function card(uuid, device, stat, history, interval) {
    const claim = (stat && stat.claim) || {state: "free", users: []};
    const state = device.lost ? "lost" : (STATES.includes(claim.state) ? claim.state : "free");
    const idle = typeof claim.idle_for === "number";
    const holder = claim.user;
    const others = (claim.users || []).slice(holder ? 1 : 0);
    const sm = stat ? stat.sm : null;
    const fb = stat ? stat.fb : null;
    const total = stat && typeof stat.fb_total === "number" ? stat.fb_total : null;
    const temps = [num(stat && stat.gtemp), num(stat && stat.mtemp)];
    const topo = (stat && stat.topology) || device.topology;  // null: links not known
    const facts = [
      temps[0] !== null ? "GPU " + temps[0] + " °C" : null,
      temps[1] !== null ? "memory " + temps[1] + " °C" : null,
      num(stat && stat.power) !== null ? num(stat.power) + " W" : null,
      topo && topo.nvlink.length ? "NVLink to " + (topo.nvlink.length ===
        Object.keys(topo.links).length ? "all" : topo.nvlink.join(",")) : null,
      topo && topo.numa !== null ? "NUMA " + topo.numa : null,
    ].filter(Boolean).map((fact) => fact.replace(/ /g, "\u00a0"));  // a figure never splits
    const badges = [h("span", {class: "state state-" + state}, state)];
    if (idle) badges.push(h("span", {class: "state state-idle"}, "idle " + duration(claim.idle_for)));
    if (claim.asked === false && holder) badges.push(h("span", {class: "note"}, "not asked for"));

    const el = h("article", {class: "card is-" + state + (idle ? " is-idle" : ""),
      data: {uuid: uuid, number: device.number, state: state, idle: idle ? "1" : "0"}},
      h("header", {class: "card-head"},
        h("span", {class: "gpu-number"}, "GPU " + device.number),
        h("span", {class: "model"}, device.name || "?"),
        h("span", {class: "badges"}, badges)),
      h("div", {class: "who"},
        holder ? h("span", {class: "holder"}, who(holder)) : h("span", {class: "holder none"},
          state === "lost" ? "gone from the host" : "free"),
        holder ? labels(holder) : null,
        others.length ? h("span", {class: "others"}, "also: " + others.map(who).join(", ")) : null),
      h("div", {class: "when"},
        h("span", {class: "age"}, state + " for ", ticking(claim.age || 0, "up", "duration")),
        holdText(claim),
        claim.set_aside_for ? h("span", {class: "aside"}, "set aside for " + claim.set_aside_for) : null,
        claim.withheld ? h("span", {class: "aside"}, "granted to nobody") : null),
      bar("util", "SM", typeof sm === "number" ? sm / 100 : null,
        typeof sm === "number" ? sm + " %" : "–"),
      bar("mem", "memory", typeof fb === "number" && total ? fb / total : null,
        gib(fb) + " / " + gib(total)),
      h("div", {class: "foot-row"},
        h("span", {class: "facts"}, facts.join(" · ") || "no figures yet"),
        sparkline(history || [], interval)),
      stat && stat.stale ? h("p", {class: "warn"}, "statistics are stale") : null,
      claim.processes_stale ? h("p", {class: "warn"}, "the process list is stale") : null,
      claim.withheld ? h("p", {class: "warn withheld"}, "granted to nobody: " + claim.withheld) : null,
      healthNotes(claim.health),
      processTable(claim));
    return el;
  }

  function renderGpus(snap) {
    const devices = snap.devices || {};
    const status = snap.status || {};
    // In device order; a lost GPU last (it keeps its last number, which another may have now).
    const uuids = Object.keys(devices).sort((a, b) =>
      (devices[a].lost ? 1 : 0) - (devices[b].lost ? 1 : 0) || devices[a].number - devices[b].number);
    const counts = {};
    const cards = uuids.map((uuid) => {
      const el = card(uuid, devices[uuid], status[uuid], (snap.history || {})[uuid],
        snap.interval || 5);
      counts[el.dataset.state] = (counts[el.dataset.state] || 0) + 1;
      return el;
    });
    $("gpus").replaceChildren(...cards);
    const parts = STATES.filter((st) => counts[st]).map((st) => counts[st] + " " + st);
    $("summary").textContent = uuids.length + " GPU" + (uuids.length === 1 ? "" : "s") +
      (parts.length ? ": " + parts.join(", ") : "");
  }

  function wants(w) {
    return Object.entries(w || {}).map(([group, n]) => n + " " + group).join(" + ");
  }

  function renderQueue(queue) {
    const items = (queue || []).map((q) => h("li", {data: {position: q.position}},
      h("span", {class: "quser"}, q.user), " wants ", h("span", {class: "qwants"}, wants(q.wants)),
      ", waiting ", ticking(q.waited || 0, "up", "duration"),
      q.pid ? " (for pid " + q.pid + ")" : null));
    $("queue").replaceChildren(...items);
    $("queue-empty").hidden = items.length > 0;
  }

  function cell(value) {
    return h("td", {}, value === null || value === undefined ? "none" : String(value));
  }

  // Over a limit: GPUs taken beyond it by computing, or more held than the user's limit or
  // their account's allows (a limit lowered since).
  function overLimit(u) {
    const over = (held, limit) => typeof limit === "number" && held > limit;
    return u.over_limit > 0 || over(u.held, u.limit) ||
      (u.accounts || []).some((a) => over(a.held, a.limit));
  }

  function renderUsers(users) {
    const rows = Object.entries(users || {}).map(([name, u]) => {
      const over = overLimit(u);
      return h("tr", {class: over ? "over" : null, data: {user: name, over: over ? "1" : "0"},
                      title: over ? "over the limit" : null},
        h("th", {scope: "row", title: name}, name), cell(u.held), cell(u.limit),
        cell(u.reserved_unused), cell(u.idle), cell(u.unreserved),
        h("td", {}, u.waiting ? u.waiting + " (" + duration(u.waited_max) + ")" : "0"));
    });
    $("users-body").replaceChildren(...rows);
    $("users").hidden = rows.length === 0;
    $("users-empty").hidden = rows.length > 0;
  }

  function renderEvents(events) {
    const items = (events || []).slice(-10).reverse().map((e) => {
      const numbers = (e.devices || []).map((d) => d.number).filter((n) => n !== undefined);
      return h("li", {},
        h("time", {datetime: e.time}, timeOfDay(e.time)), " ",
        h("span", {class: "event"}, String(e.event || "").replace(/_/g, " ")), " ",
        e.user ? h("span", {class: "euser"}, e.user) : null,
        numbers.length ? " GPU " + numbers.join(", ") : null,
        e.by ? " by " + e.by : null,
        e.reason ? h("span", {class: "reason"}, " (" + e.reason + ")") : null);
    });
    $("events").replaceChildren(...items);
    $("events-empty").hidden = items.length > 0;
  }

  function render(snap) {
    receivedAt = performance.now();
    renderGpus(snap);
    renderQueue(snap.queue);
    renderUsers(snap.users);
    renderEvents(snap.events);
    $("mode").textContent = snap.mode === "test" ? "test mode (synthetic GPUs)" :
      snap.mode === "gpu" ? "GPU host" : String(snap.mode || "");
    $("updated").textContent = "updated " + timeOfDay(snap.time);
    if (!rendered) {
      rendered = true;
      document.body.dataset.firstRender = performance.now().toFixed(1);
      document.body.dataset.rendered = "1";
    }
    document.body.dataset.snapshots = String(Number(document.body.dataset.snapshots || 0) + 1);
  }

  function setConnection(state) {
    document.body.dataset.connection = state;
    $("banner").hidden = state !== "lost";
  }

  function connect() {
    retryTimer = null;
    source = new EventSource("/events");
    source.addEventListener("snapshot", (event) => {
      let snap;
      try {
        snap = JSON.parse(event.data);
      } catch (err) {
        return;
      }
      setConnection("live");
      render(snap);
    });
    source.onerror = () => {
      setConnection("lost");
      // The browser reconnects by itself (retry: 1000) unless the answer was not a stream at
      // all (a 503 when too many pages are open, a proxy's error page): then we do.
      if (source.readyState === EventSource.CLOSED && retryTimer === null) {
        source.close();
        retryTimer = setTimeout(connect, 2000);
      }
    };
  }

  $("where").textContent = location.host;
  setInterval(tick, 1000);
  connect();
})();
