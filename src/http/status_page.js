"use strict";
// The token comes from the URL fragment (#token=...; never sent to the server) or the
// form, and is kept for this tab only.
const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
if (fromHash) {
  sessionStorage.setItem("posgate-token", fromHash);
  // Out of the address bar, the history and any bookmark or screenshot of the page.
  history.replaceState(null, "", location.pathname + location.search);
  console.info("posgate: token taken from the URL fragment; the address is now " + location.href);
}
document.getElementById("auth").addEventListener("submit", (e) => {
  e.preventDefault();
  sessionStorage.setItem("posgate-token", document.getElementById("token").value);
  refresh();
});

// Everything is drawn as SVG elements with attributes and classes: the policy allows no
// style attribute, and the page loads nothing but /v1/cluster.
const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs, parent) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
  if (parent) parent.appendChild(el);
  return el;
}
function label(parent, x, y, content, attrs = {}) {
  const t = svg("text", { x, y, ...attrs }, parent);
  t.textContent = content;
  return t;
}

// Each pod keeps the palette slot its name hashes to (or the next free one), so a pod
// that joins or leaves does not repaint the others. Red and grey stay free for the
// unowned and unassigned marks.
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#76b7b2", "#edc948",
  "#ff9da7", "#9c755f"];
function hash(s) {
  let h = 2166136261;
  for (const c of s) h = Math.imul(h ^ c.codePointAt(0), 16777619) >>> 0;
  return h;
}
function colours(pods) {
  const map = new Map(), used = new Set();
  let extra = 0;
  for (const pod of pods) {
    let slot = hash(pod) % PALETTE.length;
    for (let i = 0; i < PALETTE.length && used.has(slot); i++) slot = (slot + 1) % PALETTE.length;
    if (used.has(slot)) {
      map.set(pod, `hsl(${(extra++ * 137.5 + 15) % 360}, 40%, 60%)`);
    } else {
      used.add(slot);
      map.set(pod, PALETTE[slot]);
    }
  }
  return map;
}

// The order the table used: a shard held through an outage first, then no holder, then
// a holder other than the placement's choice, then a move waiting for a slot of the
// move budget (its holder keeps serving it meanwhile).
function shardState(s) {
  if (s.suspended) return "suspended";
  if (s.owner === null) return "unowned";
  if (s.assigned !== s.owner) return "moving";
  if (s.next_owner) return "waiting";
  return "served";
}

// Every pod the view names, sorted: members, and holders or choices that are not (a pod
// that crashed holds its leases until they expire).
function podsOf(view) {
  const pods = new Set(view.members.map((m) => m.pod));
  for (const s of view.shards) {
    if (s.owner !== null) pods.add(s.owner);
    if (s.assigned !== null) pods.add(s.assigned);
  }
  return [...pods].sort();
}

const RING = { inner: 100, mid: 164, outer: 196 };
function at(r, turn) {
  const a = turn * 2 * Math.PI - Math.PI / 2;
  return `${(r * Math.cos(a)).toFixed(2)} ${(r * Math.sin(a)).toFixed(2)}`;
}
function sector(r0, r1, t0, t1) {
  return `M ${at(r1, t0)} A ${r1} ${r1} 0 0 1 ${at(r1, t1)} L ${at(r0, t1)} ` +
    `A ${r0} ${r0} 0 0 0 ${at(r0, t0)} Z`;
}

function renderRing(view, colour) {
  const g = document.getElementById("segments");
  const n = view.shards.length;
  const outer = [], served = [], marked = [];
  const count = { served: 0, moving: 0, waiting: 0, unowned: 0, suspended: 0 };
  for (const s of view.shards) {
    const [t0, t1] = [s.shard / n, (s.shard + 1) / n];
    const state = shardState(s);
    count[state]++;
    const seg = svg("path", {
      class: "seg " + state, d: sector(RING.inner, RING.mid, t0, t1),
      fill: s.owner === null ? "url(#hatch)" : colour.get(s.owner),
      "data-shard": s.shard, "data-owner": s.owner ?? "", "data-assigned": s.assigned ?? "",
      "data-state": state,
    });
    const connected = s.terminals_connected ?? "?", listed = s.terminals_listed ?? "?";
    svg("title", {}, seg).textContent = `shard ${s.shard}: ${state}, held by ` +
      `${s.owner ?? "nobody"}, assigned to ${s.assigned ?? "nobody"}` +
      (s.next_owner ? `, then to ${s.next_owner} once a move slot is free` : "") + `, epoch ` +
      `${s.epoch ?? "–"}, ${connected} of ${listed} terminals connected`;
    // Marked segments last, so their outlines are not painted over by a neighbour.
    (state === "served" ? served : marked).push(seg);
    outer.push(svg("path", {
      class: "assigned", d: sector(RING.mid + 4, RING.outer, t0, t1),
      fill: s.assigned === null ? "#ccc" : colour.get(s.assigned), "data-shard": s.shard,
    }));
  }
  g.replaceChildren(...outer, ...served, ...marked);

  const labels = document.getElementById("ring-labels");
  labels.replaceChildren();
  for (let s = 0; s < n; s += Math.max(1, n / 8)) {
    const [x, y] = at(RING.outer + 11, (s + 0.5) / n).split(" ");
    label(labels, x, Number(y) + 4, s, { "text-anchor": "middle", class: "dim" });
  }
  label(labels, 0, -28, `${n} shards`, { "text-anchor": "middle", class: "big" });
  const lines = [`${count.served} served`, `${count.moving} moving`,
    `${count.waiting} waiting`, `${count.unowned} unowned`, `${count.suspended} suspended`];
  lines.forEach((line, i) => label(labels, 0, -4 + 16 * i, line, { "text-anchor": "middle" }));
  return count;
}

function swatch(li, attrs) {
  const box = svg("svg", { width: 18, height: 14, viewBox: "0 0 18 14" }, li);
  svg("rect", { x: 1, y: 1, width: 16, height: 12, ...attrs }, box);
}

function renderLegend(view, pods, colour) {
  const members = new Set(view.members.map((m) => m.pod));
  const items = pods.map((pod) => {
    const li = document.createElement("li");
    li.setAttribute("data-legend-pod", pod);
    li.setAttribute("data-colour", colour.get(pod));
    swatch(li, { fill: colour.get(pod) });
    let note = pod === view.pod ? " (this pod)" : "";
    if (!members.has(pod)) note += " (not a member: its leases run out)";
    li.append(pod + note);
    return li;
  });
  for (const [cls, fill, text] of [
    ["seg moving", "#ccc", "moving: held by one pod, assigned to another"],
    ["seg waiting", "#ccc", "waiting: to move once a move slot is free (--max-moving-shards)"],
    ["seg unowned", "url(#hatch)", "unowned: no lease holder"],
    ["seg suspended", "#ccc", "held past its lease through a Redis outage"],
  ]) {
    const li = document.createElement("li");
    swatch(li, { class: cls, fill });
    li.append(text);
    items.push(li);
  }
  document.getElementById("legend").replaceChildren(...items);
}

// Connected: the terminals of the shards a pod holds, as it counts them. Expected: the
// terminals listed for the shards the placement assigns to it. A shard nobody counts
// (unowned, a pod that does not answer) is left out and the total says so.
function podTotals(view, pods) {
  const totals = new Map(pods.map((p) => [p, {
    held: 0, assigned: 0, connected: 0, expected: 0, connectedUnknown: 0, expectedUnknown: 0,
  }]));
  for (const s of view.shards) {
    if (s.owner !== null) {
      const t = totals.get(s.owner);
      t.held++;
      if (s.terminals_connected == null) t.connectedUnknown++;
      else t.connected += s.terminals_connected;
    }
    if (s.assigned !== null) {
      const t = totals.get(s.assigned);
      t.assigned++;
      if (s.terminals_listed == null) t.expectedUnknown++;
      else t.expected += s.terminals_listed;
    }
  }
  return totals;
}

// Pushes with a TTL waiting for the terminals of the shards a pod serves, as it counts
// them: null (unknown, never 0) for a pod that did not say: one that did not answer, is
// not a member or is of an earlier release.
function queueOf(view, pod) {
  const member = view.members.find((m) => m.pod === pod);
  return member?.queue ?? null;
}
function queueText(queue) {
  if (queue === null) return "queued pushes: unknown";
  if (queue.oldest_ms_ago === null) return `queued pushes: ${queue.pushes}`;
  const secs = Math.round(queue.oldest_ms_ago / 1000);
  const age = secs < 120 ? `${secs} s` : `${Math.round(secs / 60)} min`;
  return `queued pushes: ${queue.pushes}, the oldest waits ${age}`;
}

function renderBars(view, pods, colour) {
  const el = document.getElementById("bars");
  el.replaceChildren();
  const totals = podTotals(view, pods);
  const most = Math.max(1, ...[...totals.values()].map((t) => Math.max(t.connected, t.expected)));
  const ROW = 52;
  el.setAttribute("viewBox", `0 0 400 ${Math.max(1, pods.length) * ROW}`);
  pods.forEach((pod, i) => {
    const t = totals.get(pod), y = i * ROW, queue = queueOf(view, pod);
    const g = svg("g", {
      class: "bar", "data-pod": pod, "data-connected": t.connected, "data-expected": t.expected,
      "data-connected-unknown": t.connectedUnknown, "data-expected-unknown": t.expectedUnknown,
      "data-queued": queue?.pushes ?? "", "data-queued-oldest-ms": queue?.oldest_ms_ago ?? "",
    }, el);
    const of = (n, unknown) => unknown ? `≥${n} (${unknown} shards uncounted)` : `${n}`;
    label(g, 0, y + 12, `${pod}: ${of(t.connected, t.connectedUnknown)} of ` +
      `${of(t.expected, t.expectedUnknown)}`);
    label(g, 400, y + 12, `${t.held} held · ${t.assigned} assigned`,
      { "text-anchor": "end", class: "dim" });
    svg("rect", { class: "track", x: 0, y: y + 17, width: 400 * t.expected / most, height: 14 }, g);
    svg("rect", {
      x: 0, y: y + 19, width: 400 * t.connected / most, height: 10, fill: colour.get(pod),
    }, g);
    label(g, 0, y + 44, queueText(queue), { class: "dim" });
  });
}

// The pods' timelines summed on a common 5 s grid: each pod's series is read at every
// grid age between its oldest and newest point (the newest also stands for the few
// seconds since), and a grid age counts only if every pod covers it.
const STEP = 5000, SPAN = 300000;
// The chart spans the samples there are (at least a minute, at most five), so a young
// pod's few points are not squeezed into the right edge.
function spanOf(timelines) {
  const oldest = Math.max(0, ...timelines.map((t) => t.points.length ? t.points[0].age_ms : 0));
  return Math.min(SPAN, Math.max(60000, Math.ceil(oldest / 60000) * 60000));
}
function valueAt(points, age, key) {
  const newest = points[points.length - 1], oldest = points[0];
  if (age < newest.age_ms) return newest.age_ms - age <= STEP ? newest[key] : undefined;
  if (age > oldest.age_ms) return undefined;
  for (let i = points.length - 1; i > 0; i--) {
    const [a, b] = [points[i], points[i - 1]];
    if (age <= b.age_ms) {
      const f = (age - a.age_ms) / Math.max(1, b.age_ms - a.age_ms);
      return a[key] + f * (b[key] - a[key]);
    }
  }
  return oldest[key];
}
function summed(timelines, key, span) {
  const lines = timelines.filter((t) => t.points.length > 0);
  const out = [];
  for (let age = span; age >= 0 && lines.length > 0; age -= STEP) {
    const values = lines.map((t) => valueAt(t.points, age, key));
    if (values.every((v) => v !== undefined)) out.push([age, values.reduce((a, b) => a + b, 0)]);
  }
  return out;
}

function renderTimeline(view) {
  const el = document.getElementById("timeline");
  el.replaceChildren();
  const timelines = view.timelines || [];
  const span = spanOf(timelines);
  const panels = [
    ["terminals connected", [["connected", "terminals_connected"]]],
    ["dials/s", [["dials", "dials_per_s"]]],
    ["pushes/s ok, failed", [["pushes-ok", "pushes_ok_per_s"], ["pushes-failed", "pushes_failed_per_s"]]],
  ];
  panels.forEach(([title, series], i) => {
    const top = i * 88, lines = series.map(([cls, key]) => [cls, summed(timelines, key, span)]);
    const most = Math.max(1, ...lines.flatMap(([, pts]) => pts.map(([, v]) => v)));
    const latest = lines.map(([, pts]) => pts.length ? round(pts[pts.length - 1][1]) : "–");
    label(el, 0, top + 11, `${title}: ${latest.join(", ")}`);
    label(el, 400, top + 11, `max ${round(most)}`, { "text-anchor": "end", class: "dim" });
    svg("line", { class: "axis", x1: 0, x2: 400, y1: top + 78, y2: top + 78 }, el);
    for (const [cls, pts] of lines) {
      svg("polyline", {
        class: cls, "data-series": cls, "data-points": pts.length,
        "data-last": pts.length ? round(pts[pts.length - 1][1]) : "",
        points: pts.map(([age, v]) =>
          `${(400 * (1 - age / span)).toFixed(1)},${(top + 78 - 60 * v / most).toFixed(1)}`).join(" "),
      }, el);
    }
  });
  label(el, 0, 3 * 88 - 2, `−${span / 60000} min`, { class: "dim" });
  const note = `${timelines.length} pods' samples, every 5 s`;
  label(el, 200, 3 * 88 - 2, note, { "text-anchor": "middle", class: "dim" });
  label(el, 400, 3 * 88 - 2, "now", { "text-anchor": "end", class: "dim" });
}
function round(v) {
  return Math.round(v * 100) / 100;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "–" : String(text);
  if (cls) td.className = cls;
}

// What this pod makes of Redis, and what that means for its shards.
function renderStore(view) {
  const el = document.getElementById("store");
  const store = view.store || { verdict: "unknown", unreachable_ms: null };
  const secs = Math.round((store.unreachable_ms || 0) / 1000);
  const held = view.shards.filter((s) => s.suspended && s.serving).length;
  const parked = view.shards.filter((s) => s.suspended && !s.serving).length;
  let cls = "outage", text;
  if (store.verdict === "reachable") {
    cls = "reachable";
    text = "Redis reachable";
  } else if (store.verdict === "cluster_wide") {
    text = `Redis unreachable for the whole cluster for ${secs} s (verdict: cluster_wide): ` +
      `${held} shards held past their lease keep delivering, ${parked} parked. ` +
      "Pushes still flow; ownership cannot change until Redis is back. Do not restart pods.";
  } else if (store.verdict === "isolated") {
    cls = "cutoff";
    text = `Redis unreachable from this pod only for ${secs} s (verdict: isolated): its ` +
      "shards are given up at their lease deadlines and move to pods that reach Redis.";
  } else if (store.unreachable_ms === null) {
    text = "Redis not reached yet (verdict: unknown)";
  } else {
    text = `Redis unreachable for ${secs} s (verdict: unknown): asking the other pods ` +
      `whether they reach it; ${held} shards held, ${parked} parked.`;
  }
  el.className = cls;
  el.textContent = text;
}

// The running broadcasts, one line each: progress, items per second since the last
// refresh, and what is left.
const lastDelivered = new Map();
function renderBroadcasts(view) {
  const el = document.getElementById("broadcasts");
  const list = view.broadcasts || [];
  const now = Date.now();
  el.replaceChildren(...list.map((b) => {
    const c = b.counts, line = document.createElement("div");
    line.className = "broadcast";
    line.dataset.broadcast = b.id;
    const before = lastDelivered.get(b.id);
    const rate = before && now > before.at
      ? Math.round((c.delivered - before.delivered) * 1000 / (now - before.at)) : 0;
    lastDelivered.set(b.id, { delivered: c.delivered, at: now });
    const left = Math.max(0, Math.round((b.expires_ms - now) / 1000));
    line.textContent = `broadcast ${b.id.slice(0, 8)} (${b.tenant}, ${b.selector}) ${b.state}: ` +
      `${c.delivered}/${c.matched} delivered (${rate}/s), ${c.failed} failed, ` +
      `${c.remaining} remaining (${c.queued} waiting for their terminal), ` +
      `${b.shards_walked}/${b.shards} shards walked, expires in ${left} s`;
    return line;
  }));
}

function served(s) {
  if (s.suspended) return s.serving ? "held" : "parked";
  return s.serving ? "yes" : "";
}

function renderTable(view) {
  const body = document.getElementById("shards");
  body.replaceChildren();
  for (const s of view.shards) {
    const row = body.insertRow();
    const state = shardState(s);
    if (state === "suspended") row.className = "held";
    else if (state === "unowned") row.className = "orphan";
    else if (state === "moving") row.className = "moving";
    else if (state === "waiting") row.className = "waiting";
    cell(row, s.shard, "num");
    cell(row, s.assigned);
    cell(row, s.owner);
    cell(row, s.next_owner);
    cell(row, s.epoch, "num");
    cell(row, s.terminals_connected, "num");
    cell(row, s.terminals_listed, "num");
    cell(row, served(s));
  }
}

function render(view) {
  renderStore(view);
  const members = document.getElementById("members");
  members.replaceChildren(...view.members.map((m) => {
    const s = document.createElement("span");
    s.textContent = m.pod;
    if (m.pod === view.pod) s.className = "self";
    return s;
  }));
  const pods = podsOf(view), colour = colours(pods);
  const count = renderRing(view, colour);
  renderLegend(view, pods, colour);
  renderBars(view, pods, colour);
  renderTimeline(view);
  renderTable(view);
  renderBroadcasts(view);
  const connected = view.shards.reduce((n, s) => n + (s.terminals_connected || 0), 0);
  const state = document.getElementById("state");
  state.className = "";
  state.textContent = `as seen by ${view.pod} · ${view.members.length} members · ` +
    `${view.shards.length} shards · ${count.moving} moving · ${count.unowned} unowned · ` +
    `${connected} terminals connected · ` + new Date().toLocaleTimeString();
}

async function refresh() {
  const state = document.getElementById("state");
  const token = sessionStorage.getItem("posgate-token");
  const headers = token ? { Authorization: "Bearer " + token } : {};
  try {
    const r = await fetch("/v1/cluster?include=terminals", { headers, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      document.getElementById("auth").hidden = false;
      state.className = "error";
      state.textContent = r.status === 401
        ? "this pod needs an operator token"
        : "this token is a tenant's; the status page needs an operator token";
      return;
    }
    if (!r.ok) throw new Error("HTTP " + r.status);
    document.getElementById("auth").hidden = true;
    render(await r.json());
  } catch (e) {
    state.className = "error";
    state.textContent = "cannot load /v1/cluster: " + e.message;
  }
}
refresh();
setInterval(refresh, 1000);
