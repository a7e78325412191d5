// cfmaps explorer: plain JavaScript over the public API (no build step, no CDN).
// The token the user types is sent as a Bearer header and kept in this page's memory only.
"use strict";

const $ = (id) => document.getElementById(id);
// Objects keyed by feature, group or class names: without a prototype, so that a name like
// "toString" or "__proto__" is a key like any other (with {}, bounds["toString"] read the
// inherited function and the bound typed there was dropped, and inst["__proto__"] = 1 set
// no key at all).
const dict = () => Object.create(null);
// Answers arrive in any order: a query's, a picture's or a model's answer is shown only when
// it answers the latest request of its kind (querySeq, mapSeq, modelSeq); picking another
// model supersedes them all.
const state = {
  model: null, features: [], groups: dict(), lastAnswer: null, mapUrl: null,
  mapSeq: 0, querySeq: 0, modelSeq: 0,
};
// The request paths an API error's `field` starts with, before a feature's name. A name may
// hold "." itself (`a.b "q"`): the field is matched against the known names, never split.
const FEATURE_FIELDS = ["instance", "bounds", "direction", "immutable", "weights"];
const SPEC_FIXED = "fixed by the model's spec";
// A nominal feature with fewer codes than this is chosen from a list; more, typed in.
const MAX_CODE_OPTIONS = 200;

function headers(json) {
  const h = {};
  const t = $("token").value.trim();
  if (t) h["Authorization"] = "Bearer " + t;
  if (json) h["Content-Type"] = "application/json";
  return h;
}

async function api(path, options = {}) {
  const res = await fetch(path, options);
  let body = null;
  const type = res.headers.get("content-type") || "";
  if (type.includes("json")) body = await res.json();
  if (!res.ok) {
    const err = new Error((body && body.message) || res.status + " " + res.statusText);
    err.field = body && body.field;
    err.status = res.status;
    throw err;
  }
  return { res, body };
}

function cleanErrors() {
  document.querySelectorAll(".error").forEach((e) => { e.textContent = ""; });
  document.querySelectorAll(".invalid").forEach((e) => {
    e.classList.remove("invalid");
    e.removeAttribute("aria-invalid");
  });
}

// The feature an error's field names after `prefix.` ("bounds.AGE", "bounds.AGE.0"): the
// longest known name the rest equals or starts with, followed by ".".
function featureIn(rest) {
  let best = null;
  for (const f of state.features) {
    if ((rest === f.name || rest.startsWith(f.name + ".")) && (!best || f.name.length > best.name.length)) best = f;
  }
  return best;
}

// An API error names its field ("instance.AGE", "bounds.AGE", "k"): show it there.
function showError(err) {
  const field = err.field || "";
  let input = null;
  let slot = null;
  const prefix = FEATURE_FIELDS.find((p) => field.startsWith(p + "."));
  const f = prefix && featureIn(field.slice(prefix.length + 1));
  if (prefix === "instance" && f) {
    input = document.querySelector(`#fields [data-feature="${CSS.escape(f.name)}"]`)
      || (f.group && document.querySelector(`[data-group="${CSS.escape(f.group)}"]`));
    slot = input && $(input.getAttribute("aria-describedby").split(" ")[0]);
  } else if (["immutable", "direction", "bounds"].includes(prefix) && f) {
    input = document.querySelector(`[data-constraint="${prefix}"][data-name="${CSS.escape(f.name)}"]`);
    slot = $("form-error");
  } else if (["target", "norm", "k"].includes(field)) {
    input = $("opt-" + field);
    slot = $("err-" + field);
  }
  if (input) {
    // a constraint's control may sit in the closed <details>: open it so focus can land
    const box = input.closest("details");
    if (box) box.open = true;
    input.classList.add("invalid");
    input.setAttribute("aria-invalid", "true");
    input.focus();
  }
  (slot || $("form-error")).textContent = err.message;
}

// -- models ----------------------------------------------------------------------------
async function loadModels() {
  $("model-status").textContent = "Loading models...";
  try {
    // Every page: the list is paginated (next_cursor), and a busy service holds more
    // models than one page.
    const models = [];
    let cursor = null;
    do {
      const q = "v1/models?limit=1000" + (cursor ? "&cursor=" + encodeURIComponent(cursor) : "");
      const { body } = await api(q, { headers: headers(false) });
      models.push(...body.models);
      cursor = body.next_cursor;
    } while (cursor);
    const sel = $("model");
    const keep = sel.value;
    sel.innerHTML = "";
    for (const m of models) {
      const o = document.createElement("option");
      o.value = m.id;
      o.textContent = (m.name || m.id) + (m.status === "ready" ? "" : " (" + m.status + ")");
      o.disabled = m.status !== "ready";
      sel.appendChild(o);
    }
    const ready = models.filter((m) => m.status === "ready");
    if (!ready.length) {
      $("model-status").textContent = "No ready model: upload one with POST /v1/models.";
      return;
    }
    sel.value = ready.some((m) => m.id === keep) ? keep : ready[0].id;
    await selectModel(sel.value);
  } catch (err) {
    $("model-status").textContent = "Could not list models: " + err.message;
  }
}

function defaultValue(f) {
  if (f.lower !== null && f.upper !== null) {
    const mid = (f.lower + f.upper) / 2;
    return f.type === "continuous" ? mid : Math.round(mid);
  }
  if (f.lower !== null) return f.lower;
  if (f.upper !== null) return f.upper;
  return 0;
}

function weightOf(f) {
  if (f.weight !== null && f.weight !== undefined) return f.weight;
  if (f.type === "nominal") return 1;  // a switch of code, as the API's default
  if (f.lower !== null && f.upper !== null && f.upper > f.lower) return 1 / (f.upper - f.lower);
  return 1;
}

async function selectModel(id) {
  const seq = ++state.modelSeq;
  const { body: m } = await api("v1/models/" + encodeURIComponent(id), { headers: headers(false) });
  if (seq !== state.modelSeq) return;  // another model was picked meanwhile
  state.model = m;
  // answers still on their way are the previous model's: drop them when they come
  state.querySeq++;
  state.mapSeq++;
  $("submit").disabled = false;
  state.features = m.features;
  state.groups = dict();
  m.features.forEach((f, j) => {
    if (f.group) (state.groups[f.group] = state.groups[f.group] || []).push(j);
  });
  $("model-status").textContent = `${m.name || m.id}: ${m.model_type}, ${m.features.length} features, classes ${m.classes.join(", ")}.`;
  buildForm();
  buildOptions();
  buildMapControls();
  cleanErrors();
  clearAnswer();
  clearMap();
}

function makeField(id, labelText, control, meta, fixed) {
  const div = document.createElement("div");
  div.className = "field";
  const label = document.createElement("label");
  label.htmlFor = id;
  label.textContent = labelText;
  if (fixed) {
    const b = document.createElement("span");
    b.className = "fixed";
    b.textContent = fixed === true ? "immutable" : fixed;
    label.appendChild(b);
  }
  control.id = id;
  const err = document.createElement("p");
  err.className = "error";
  err.id = "err-" + id;
  err.setAttribute("role", "alert");
  const described = [err.id];
  div.append(label, control);
  if (meta) {
    const p = document.createElement("span");
    p.className = "meta";
    p.id = "meta-" + id;
    p.textContent = meta;
    div.appendChild(p);
    described.push(p.id);
  }
  div.appendChild(err);
  control.setAttribute("aria-describedby", described.join(" "));
  return div;
}

function buildForm() {
  const box = $("fields");
  box.innerHTML = "";
  const done = new Set();
  state.features.forEach((f, j) => {
    if (f.group) {
      if (done.has(f.group)) return;
      done.add(f.group);
      const sel = document.createElement("select");
      sel.dataset.group = f.group;
      for (const k of state.groups[f.group]) {
        const o = document.createElement("option");
        o.value = String(k);
        const name = state.features[k].name;
        o.textContent = name.startsWith(f.group + "=") ? name.slice(f.group.length + 1) : name;
        sel.appendChild(o);
      }
      // a group is immutable when all its columns are; with some, only those columns stay
      // as they are (their categories can be neither left nor taken), the others switch
      const cols = state.groups[f.group];
      const nFixed = cols.filter((k) => !state.features[k].mutable).length;
      const fixed = nFixed === cols.length ? true : nFixed > 0 ? `${nFixed} of ${cols.length} fixed` : false;
      box.appendChild(makeField("in-group-" + done.size, f.group, sel, "one of " + state.groups[f.group].length, fixed));
      return;
    }
    let control;
    if (f.type === "binary") {
      control = document.createElement("select");
      for (const v of [0, 1]) {
        const o = document.createElement("option");
        o.value = String(v);
        o.textContent = v ? "1 (yes)" : "0 (no)";
        control.appendChild(o);
      }
    } else if (f.type === "nominal" && Math.floor(f.upper) - Math.ceil(f.lower) < MAX_CODE_OPTIONS) {
      // category codes have no order: a list of them (the integers within the bounds, as
      // the API's domain), not a number to step through
      control = document.createElement("select");
      for (let v = Math.ceil(f.lower); v <= Math.floor(f.upper); v++) {
        const o = document.createElement("option");
        o.value = String(v);
        o.textContent = String(v);
        control.appendChild(o);
      }
      control.value = String(Math.ceil(f.lower));
    } else {
      control = document.createElement("input");
      control.type = "number";
      control.step = f.type === "continuous" ? "any" : "1";
      if (f.lower !== null) control.min = String(f.lower);
      if (f.upper !== null) control.max = String(f.upper);
      control.value = String(defaultValue(f));
      control.required = true;
    }
    control.dataset.feature = f.name;
    const range = (f.lower !== null ? f.lower : "-inf") + " to " + (f.upper !== null ? f.upper : "inf");
    box.appendChild(makeField("in-" + j, f.name, control, f.type + ", " + range, !f.mutable));
  });
}

function buildOptions() {
  const t = $("opt-target");
  t.innerHTML = "";
  const any = document.createElement("option");
  any.value = "";
  any.textContent = "Nearest other class";
  t.appendChild(any);
  for (const c of state.model.classes) {
    const o = document.createElement("option");
    o.value = JSON.stringify(c);
    o.textContent = String(c);
    t.appendChild(o);
  }
  const body = $("constraints").querySelector("tbody");
  body.innerHTML = "";
  state.features.forEach((f, j) => {
    const tr = document.createElement("tr");
    const th = document.createElement("th");
    th.scope = "row";
    th.textContent = f.name;
    tr.appendChild(th);
    // What the spec fixes, a query cannot lift (its immutable adds to the spec's, its
    // direction restricts the spec's): such a control shows the spec's choice, disabled,
    // and says why.
    const spec = !f.mutable ? "immutable" : f.direction === "increase" || f.direction === "decrease"
      ? f.direction + " only" : null;
    let note = null;
    if (spec) {
      note = document.createElement("span");
      note.className = "fixed";
      note.id = "spec-" + j;
      note.textContent = `${spec}: ${SPEC_FIXED}`;
      th.appendChild(note);
    }
    const bySpec = (el) => {
      el.disabled = true;
      el.title = SPEC_FIXED;
      el.setAttribute("aria-describedby", note.id);
    };
    const imm = document.createElement("input");
    imm.type = "checkbox";
    imm.checked = !f.mutable;
    imm.dataset.constraint = "immutable";
    imm.dataset.name = f.name;
    imm.setAttribute("aria-label", f.name + " immutable");
    if (!f.mutable) bySpec(imm);
    const dir = document.createElement("select");
    const ordered = !(f.group || f.type === "nominal");
    const choices = ordered && spec && f.mutable ? [f.direction] : ["any", "increase", "decrease"];
    for (const v of choices) {
      const o = document.createElement("option");
      o.value = v;
      o.textContent = v;
      dir.appendChild(o);
    }
    dir.value = f.direction || "any";
    dir.dataset.constraint = "direction";
    dir.dataset.name = f.name;
    dir.setAttribute("aria-label", f.name + " direction");
    if (!ordered) {
      dir.disabled = true;  // no order to follow
      dir.title = "a category has no order to follow";
    } else if (spec) {
      bySpec(dir);
    }
    const cells = [imm, dir];
    for (const side of ["lower", "upper"]) {
      const b = document.createElement("input");
      b.type = "number";
      b.step = "any";
      b.placeholder = f[side] !== null ? String(f[side]) : "none";
      b.dataset.constraint = "bounds";
      b.dataset.name = f.name;
      b.dataset.side = side;
      b.setAttribute("aria-label", f.name + " " + side + " bound");
      cells.push(b);
    }
    for (const c of cells) {
      const td = document.createElement("td");
      td.appendChild(c);
      tr.appendChild(td);
    }
    body.appendChild(tr);
  });
}

// The features a map can show: any but a one-hot group's columns.
function mapNames() {
  return state.features.filter((f) => !f.group).map((f) => f.name);
}

function buildMapControls() {
  const names = mapNames();
  // a slice needs two features: with fewer, say so instead of asking for a picture the
  // API refuses ("the two features must differ") at every query
  const none = names.length < 2;
  $("map-controls").hidden = none;
  $("map-figure").hidden = none;
  $("map-none").hidden = !none;
  $("map-none").textContent = none
    ? `No map for this model: a slice needs two features other than one-hot columns, and it has ${names.length}.`
    : "";
  for (const [id, pick] of [["map-a", 0], ["map-b", 1]]) {
    const sel = $(id);
    sel.innerHTML = "";
    for (const n of names) {
      const o = document.createElement("option");
      o.value = n;
      o.textContent = n;
      sel.appendChild(o);
    }
    sel.value = names[Math.min(pick, names.length - 1)] || "";
  }
}

// -- the query ---------------------------------------------------------------------------
function readInstance() {
  const inst = dict();
  state.features.forEach((f) => { if (f.group) inst[f.name] = 0; });
  document.querySelectorAll("[data-group]").forEach((sel) => {
    inst[state.features[Number(sel.value)].name] = 1;
  });
  document.querySelectorAll("#fields [data-feature]").forEach((el) => {
    const raw = el.value.trim();
    inst[el.dataset.feature] = raw === "" ? null : Number(raw);
  });
  return inst;
}

function readRequest() {
  const req = { instance: readInstance(), norm: $("opt-norm").value, k: Number($("opt-k").value) };
  if ($("opt-target").value !== "") req.target = JSON.parse($("opt-target").value);
  const immutable = [];
  const direction = dict();
  const bounds = dict();
  document.querySelectorAll("[data-constraint]").forEach((el) => {
    const name = el.dataset.name;
    const f = state.features.find((x) => x.name === name);
    if (el.dataset.constraint === "immutable" && el.checked) immutable.push(name);
    if (el.dataset.constraint === "direction" && !el.disabled && el.value !== (f.direction || "any")) direction[name] = el.value;
    if (el.dataset.constraint === "bounds" && el.value.trim() !== "") {
      bounds[name] = bounds[name] || [null, null];
      bounds[name][el.dataset.side === "lower" ? 0 : 1] = Number(el.value);
    }
  });
  req.immutable = immutable;
  if (Object.keys(direction).length) req.direction = direction;
  if (Object.keys(bounds).length) req.bounds = bounds;
  return req;
}

function fmt(v) {
  if (v === null || v === undefined) return "";
  if (typeof v === "number" && !Number.isInteger(v)) return String(Number(v.toPrecision(10)));
  return String(v);
}

function rangeText(r) {
  const lo = r.lower === null ? "-inf" : fmt(r.lower);
  const hi = r.upper === null ? "inf" : fmt(r.upper);
  return (r.lower_closed ? "[" : "(") + lo + ", " + hi + (r.upper_closed ? "]" : ")");
}

// The API's default cost of switching category in a one-hot group: the largest weight
// declared on its columns, else 1.
function groupCost(group) {
  const ws = state.groups[group].map((k) => state.features[k].weight).filter((w) => w !== null && w !== undefined);
  return ws.length ? Math.max(...ws) : 1;
}

// One row per changed feature, a one-hot group as one row (category before -> after), with
// its cost under the schema's default weights; largest first. Numbers stay numbers here:
// fillRows shows them rounded and keeps the exact value in data-value (and the tooltip).
function changeRows(changes) {
  const rows = [];
  const groups = dict();
  for (const [name, c] of Object.entries(changes)) {
    const f = state.features.find((x) => x.name === name);
    if (f.group) {
      const g = (groups[f.group] = groups[f.group] || { from: "", to: "" });
      const cat = name.startsWith(f.group + "=") ? name.slice(f.group.length + 1) : name;
      if (c.from === 1) g.from = cat;
      if (c.to === 1) g.to = cat;
      continue;
    }
    // another category code costs the weight once, however far the codes lie apart
    const moved = f.type === "nominal" ? 1 : Math.abs(c.to - c.from);
    rows.push([name, c.from, c.to, weightOf(f) * moved]);
  }
  for (const [g, c] of Object.entries(groups)) rows.push([g, c.from, c.to, groupCost(g)]);
  rows.sort((p, q) => q[3] - p[3]);
  return rows;
}

function fillRows(tbody, rows) {
  tbody.innerHTML = "";
  for (const cells of rows) {
    const tr = document.createElement("tr");
    cells.forEach((c, i) => {
      const el = document.createElement(i === 0 ? "th" : "td");
      if (i === 0) el.scope = "row"; else el.className = "num";
      if (typeof c === "number") {
        el.dataset.value = String(c);
        if (fmt(c) !== String(c)) el.title = String(c);
      }
      el.textContent = typeof c === "number" ? fmt(c) : c;
      tr.appendChild(el);
    });
    tbody.appendChild(tr);
  }
}

function clearAnswer() {
  state.lastAnswer = null;
  $("answer").hidden = true;
}

function showAnswer(a) {
  state.lastAnswer = a;
  $("answer").hidden = false;
  $("decision").textContent = `Decision: ${a.prediction}. Target: ${a.target === null ? "-" : a.target}.`;
  $("infeasible").hidden = a.feasible;
  $("found").hidden = !a.feasible;
  if (!a.feasible) {
    $("infeasible").textContent = "feasible: false. " + (a.reason || "");
    return;
  }
  $("distance").textContent = fmt(a.distance);
  $("distance").dataset.value = String(a.distance);
  // Certified optimal only when the API says so: with on_budget "best" a search out of its
  // budget answers its nearest find, optimal false, with a certified lower bound.
  const proven = a.optimal === true;
  const badge = $("optimal");
  badge.textContent = proven ? "certified optimal" : "not proven optimal";
  badge.className = proven ? "badge" : "badge unproven";
  const lb = $("lower-bound");
  lb.hidden = proven;
  lb.textContent = "";
  if (!proven) {
    const bound = a.lower_bound === null || a.lower_bound === undefined ? null : a.lower_bound;
    lb.dataset.value = String(bound);
    lb.textContent = bound === null
      ? "The search ran out of its budget: this answer is valid, but it is not proven to be the nearest."
      : `The search ran out of its budget: this answer is valid, but not proven the nearest. `
        + `No counterfactual is nearer than ${fmt(bound)} (certified lower bound).`;
  }
  fillRows($("changes").querySelector("tbody"), changeRows(a.changes));
  const region = $("region").querySelector("tbody");
  fillRows(region, Object.entries(a.region).map(([n, r]) => [n, rangeText(r)]));
  // the exact ends, for whoever needs more than the ten digits shown
  Object.values(a.region).forEach((r, i) => {
    const cell = region.rows[i].cells[1];
    cell.dataset.value = JSON.stringify(r);
    cell.title = JSON.stringify(r);
  });
  const alts = a.alternatives || [];
  $("alternatives-box").hidden = !alts.length;
  const ol = $("alternatives");
  ol.innerHTML = "";
  for (const alt of alts) {
    const li = document.createElement("li");
    const ch = Object.entries(alt.changes).map(([n, c]) => `${n} ${fmt(c.from)} -> ${fmt(c.to)}`).join(", ");
    li.textContent = `${alt.target}: distance ${fmt(alt.distance)}; ${ch}`;
    ol.appendChild(li);
  }
}

async function submitQuery(ev) {
  ev.preventDefault();
  cleanErrors();
  if (!state.model) return;
  // the latest query only: an answer to an earlier one, or to another model's, is dropped
  const seq = ++state.querySeq;
  const current = () => seq === state.querySeq;
  const fail = (err) => {
    // an old answer (and its picture) beside a new error would be read as its answer; a
    // picture still on its way for the old one is dropped too
    state.mapSeq++;
    clearAnswer();
    clearMap();
    showError(err);
  };
  const req = readRequest();
  for (const [name, v] of Object.entries(req.instance)) {
    if (v === null || Number.isNaN(v)) {
      fail({ field: "instance." + name, message: `feature '${name}' needs a number` });
      return;
    }
  }
  $("submit").disabled = true;
  try {
    const { body } = await api(`v1/models/${encodeURIComponent(state.model.id)}/counterfactuals`, {
      method: "POST", headers: headers(true), body: JSON.stringify(req),
    });
    if (!current()) return;
    showAnswer(body);
    await drawMap();
  } catch (err) {
    if (current()) fail(err);
  } finally {
    if (current()) $("submit").disabled = false;
  }
}

// -- the map picture -----------------------------------------------------------------------
function zoomRange(name) {
  const f = state.features.find((x) => x.name === name);
  const a = state.lastAnswer;
  const inst = readInstance();
  let lo = f.lower, hi = f.upper;
  if (!$("map-zoom").checked || lo === null || hi === null) return null;
  const x = inst[name];
  const c = a && a.feasible ? a.counterfactual[name] : x;
  const span = Math.max(Math.abs(c - x) * 3, (hi - lo) * 0.05, f.type === "continuous" ? 0 : 4);
  let a0 = Math.max(lo, Math.min(x, c) - span), a1 = Math.min(hi, Math.max(x, c) + span);
  if (f.type !== "continuous") {
    // whole bands: each integer in view gets the same width, with its value at the centre
    a0 = Math.ceil(a0) - 0.5;
    a1 = Math.floor(a1) + 0.5;
  }
  if (!(a1 > a0)) return null;
  return [a0, a1];
}

// What the map's counterfactual (the slice's nearest under the spec alone: only a and b
// move) breaks of the constraints this query sets in the form: the map route takes none.
function brokenConstraints(cf, a, b, inst) {
  const req = readRequest();
  const at = (n) => (n === a || n === b ? cf[n] : inst[n]);
  const out = [];
  for (const n of [a, b]) {
    if (cf[n] === inst[n]) continue;
    if (req.immutable.includes(n)) out.push(`${n} is immutable`);
    const d = req.direction && req.direction[n];
    if ((d === "increase" && cf[n] < inst[n]) || (d === "decrease" && cf[n] > inst[n])) out.push(`${n} may only ${d}`);
  }
  for (const [n, [lo, hi]] of Object.entries(req.bounds || {})) {
    const v = at(n);
    if ((lo !== null && v < lo) || (hi !== null && v > hi)) {
      out.push(`${n} must lie within [${lo === null ? "-inf" : fmt(lo)}, ${hi === null ? "inf" : fmt(hi)}]`);
    }
  }
  return out;
}

// Picture sizes asked for, in turn, when the default is more than a client's rate limit
// allows at all (43, 11, 3 and 1 answers).
const SMALLER_MAPS = [[240, 180], [120, 90], [60, 45], [32, 24]];

function clearMap() {
  const img = $("map-img");
  img.removeAttribute("src");
  img.alt = "Map slice not drawn";
  $("map-caption").textContent = "";
  $("map-b-name").textContent = "";
  $("legend").innerHTML = "";
}

async function drawMap() {
  $("err-map").textContent = "";
  // Pictures are asked for on every query and every pick of features: only the latest
  // one may be shown, whatever order the answers arrive in.
  const seq = ++state.mapSeq;
  const a = $("map-a").value, b = $("map-b").value;
  if (!state.model || !a || !b || mapNames().length < 2) return;
  // no size: the service's default, fitted to its CFMAPS_MAP_MAX_SIDE (480x360 or less)
  const req = { features: [a, b], instance: readInstance(), norm: $("opt-norm").value };
  if ($("opt-target").value !== "") req.target = JSON.parse($("opt-target").value);
  const ra = zoomRange(a), rb = zoomRange(b);
  if (ra) req.a_range = ra;
  if (rb) req.b_range = rb;
  try {
    // A picture is charged by its size (an answer per 1,024 pixels): under a rate limit
    // below the default's 169 answers a minute it is refused whole (429 naming `width`,
    // which costs nothing), so ask again for smaller ones before giving up.
    let res, small = false;
    for (const size of [null, ...SMALLER_MAPS]) {
      const sent = size ? { ...req, width: size[0], height: size[1] } : req;
      res = await fetch(`v1/models/${encodeURIComponent(state.model.id)}/map.png`, {
        method: "POST", headers: headers(true), body: JSON.stringify(sent),
      });
      if (res.ok) { small = size !== null; break; }
      const body = await res.json().catch(() => ({}));
      if (seq !== state.mapSeq) return;  // superseded: the newer picture asks for itself
      // too dear, or (a smaller size tried) wider than CFMAPS_MAP_MAX_SIDE allows: smaller
      const smaller = (res.status === 429 && body.field === "width")
        || (size !== null && res.status === 422 && ["width", "height"].includes(body.field));
      if (!smaller || size === SMALLER_MAPS.at(-1)) throw new Error(body.message || res.statusText);
    }
    const blob = await res.blob();
    if (seq !== state.mapSeq) return;
    if (state.mapUrl) URL.revokeObjectURL(state.mapUrl);
    state.mapUrl = URL.createObjectURL(blob);
    const img = $("map-img");
    img.src = state.mapUrl;
    const ext = JSON.parse(res.headers.get("X-Map-Extent"));
    // the values an axis shows: on integer features the integers whose bands are in view
    const span = (name, lo, hi) => {
      const f = state.features.find((x) => x.name === name);
      return f.type === "continuous" ? `${fmt(lo)} to ${fmt(hi)}` : `${Math.ceil(lo)} to ${Math.floor(hi)}`;
    };
    const classes = JSON.parse(res.headers.get("X-Map-Classes"));
    const colours = JSON.parse(res.headers.get("X-Map-Colours"));
    const cf = JSON.parse(res.headers.get("X-Map-Counterfactual"));
    const at = cf && `${a} = ${fmt(cf[a])}, ${b} = ${fmt(cf[b])}`;
    const outside = cf && (cf[a] < ext[0] || cf[a] > ext[1] || cf[b] < ext[2] || cf[b] > ext[3]);
    const broken = cf ? brokenConstraints(cf, a, b, req.instance) : [];
    let said;
    if (!cf) said = "No counterfactual in this slice.";
    else if (broken.length) {
      // the picture's point obeys the spec only: never call it the nearest when it
      // breaks what this query asks (a point that obeys them is also their nearest)
      said = `The map applies the model's spec but not this query's constraints: its diamond (${at}`
        + (outside ? ", outside the picture" : "") + `) breaks them (${broken.join("; ")}), so it is no answer to this query.`;
    } else {
      said = `Nearest in this slice: ${at}` + (outside ? " (outside the picture)." : ".");
    }
    if (small) said += " Drawn small: the service's rate limit allows no bigger picture.";
    img.alt = `Classes over ${a} (${span(a, ext[0], ext[1])}) and ${b} (${span(b, ext[2], ext[3])}). ` + said;
    $("map-caption").textContent = `${a}: ${span(a, ext[0], ext[1])} (left to right). ` + said;
    $("map-b-name").textContent = `${b}: ${span(b, ext[2], ext[3])}`;
    const legend = $("legend");
    legend.innerHTML = "";
    classes.forEach((c, i) => {
      const li = document.createElement("li");
      const sw = document.createElement("span");
      sw.className = "swatch";
      sw.style.background = colours[i];
      sw.setAttribute("aria-hidden", "true");
      li.append(sw, document.createTextNode(String(c)));
      legend.appendChild(li);
    });
  } catch (err) {
    if (seq !== state.mapSeq) return;
    clearMap();  // an old picture under a new error would be read as the answer
    $("err-map").textContent = "Map: " + err.message;
  }
}

// The page's icon, made here: without one the browser asks for /favicon.ico (a 404 in its
// console), and the content security policy refuses a data: URL for it (img-src is 'self'
// and blob: only). This runs before the page's load, when the browser would look for one.
function setIcon() {
  // a 16x16 PNG in the map's blue (#0072B2)
  const png = atob("iVBORw0KGgoAAAANSUhEUgAAABAAAAAQCAIAAACQkWg2AAAAFUlEQVR42mNgKNpEGhrVMKph+GoAAIsyJBDHpIaQAAAAAElFTkSuQmCC");
  const link = document.createElement("link");
  link.rel = "icon";
  link.href = URL.createObjectURL(new Blob([Uint8Array.from(png, (c) => c.charCodeAt(0))], { type: "image/png" }));
  document.head.appendChild(link);
}
setIcon();

document.addEventListener("DOMContentLoaded", () => {
  $("query").addEventListener("submit", submitQuery);
  $("reload").addEventListener("click", loadModels);
  $("model").addEventListener("change", (e) => selectModel(e.target.value).catch((err) => {
    $("model-status").textContent = err.message;
  }));
  $("map-draw").addEventListener("click", drawMap);
  $("map-a").addEventListener("change", drawMap);
  $("map-b").addEventListener("change", drawMap);
  $("map-zoom").addEventListener("change", drawMap);
  loadModels();
});
