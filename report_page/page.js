// page.js: the search report's own code (report.py inlines it, with page.html and page.css, into
// one offline page). It decodes the data report.py wrote into the page (gzip, base64), hands the
// figures built there to Plotly, and writes the tables and the node panel, with textContent only,
// never innerHTML: a candidate's or a model's text stays text. The page's Content-Security-Policy
// runs this script and plotly.js alone, by their hashes.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  // Elements are built with text nodes only: a string from the data never becomes markup.
  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v; else e.setAttribute(k, v);
    }
    for (const k of kids) {
      if (k === null || k === undefined || k === false) continue;
      e.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return e;
  }
  const num = (x, d = 3) => (x === null || x === undefined ? "-" : Number(x).toFixed(d));
  const noise = (s) => (s === null || s === undefined ? "" : " \u00b1" + (200 * s).toFixed(1) + "%");
  const PLOT = { displaylogo: false, responsive: true, displayModeBar: "hover" };
  let D = null, run = 0, byId = new Map(), where = new Map();

  async function load() {
    const text = $("report-data").textContent.trim();
    const bin = atob(text), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
    return JSON.parse(await new Response(stream).text());
  }

  function plot(id, fig, config) {
    const div = $(id);
    if (!fig) {
      Plotly.purge(div);
      div.replaceChildren(el("p", { class: "none" }, "nothing to draw for this run"));
      return null;
    }
    if (!div.data) div.replaceChildren();
    Plotly.react(div, fig.data, fig.layout, Object.assign({}, PLOT, config || {}));
    return div;
  }

  // The charts below the first screen are drawn as they come into view: the page is ready sooner.
  const pending = new Map();
  const watcher = "IntersectionObserver" in window ? new IntersectionObserver((entries) => {
    for (const e of entries) {
      if (e.isIntersecting && pending.has(e.target.id)) {
        plot(e.target.id, pending.get(e.target.id));
        pending.delete(e.target.id);
        watcher.unobserve(e.target);
        document.body.dataset.pending = String(pending.size);
      }
    }
  }, { rootMargin: "300px" }) : null;
  function later(id, fig) {
    if (!watcher) { plot(id, fig); return; }
    pending.set(id, fig);
    document.body.dataset.pending = String(pending.size);
    watcher.unobserve($(id));
    watcher.observe($(id));
  }

  function link(id, k) {  // a node of run k (default: the run shown)
    const where = k === undefined ? run : k;
    const a = el("a", { class: "node-link", href: "#run=" + where + "&node=" + encodeURIComponent(id) }, id);
    a.addEventListener("click", (ev) => {
      ev.preventDefault();
      if (where === run) showNode(id); else showRun(where, id);
    });
    return a;
  }

  function header() {
    const notes = $("notes");
    const complete = D.runs.every((r) => r.state.complete);
    $("status").textContent = D.runs.map((r) => (D.runs.length > 1 ? r.name + ": " : "") + r.state.text).join(" | ");
    if (!complete) $("status").classList.add("bad");
    for (const r of D.runs) {
      for (const t of r.state.notes.concat(r.notes)) notes.append(el("li", {}, (D.runs.length > 1 ? r.name + ": " : "") + t));
    }
    const cpu = D.runs.filter((r) => r.ledger.cpu);  // the note says which kernels: CPU code, or Triton interpreted
    if (cpu.length) notes.append(el("li", {}, (D.runs.length > 1 && cpu.length < D.runs.length ? cpu.map((r) => r.name).join(", ") + ": " : "") +
      cpu[0].ledger.cpu));
  }

  function ledger() {
    const labels = [];
    for (const r of D.runs) for (const [k] of r.ledger.rows) if (!labels.includes(k)) labels.push(k);
    const table = el("table", { class: "ledger" });
    for (const label of labels) {
      const tr = el("tr", {}, el("th", {}, label));
      for (const r of D.runs) {
        const row = r.ledger.rows.find(([k]) => k === label);
        tr.append(el("td", {}, row ? row[1] : ""));
      }
      table.append(tr);
    }
    $("ledger").replaceChildren(table);
  }

  function showRun(k, nodeId) {
    run = k;
    const r = D.runs[k];
    byId = new Map(r.nodes.map((n) => [n.id, n]));
    $("run-picker").value = String(k);
    const tree = plot("tree", r.figures.tree, { scrollZoom: true });
    where = new Map();  // node id -> its place in the tree, to ring the node shown
    for (const t of r.figures.tree ? r.figures.tree.data : []) {
      if (t.mode === "markers" && t.customdata) t.customdata.forEach((id, i) => where.set(id, [t.x[i], t.y[i]]));
    }
    if (tree && !tree.dataset.wired) {
      tree.dataset.wired = "1";
      tree.on("plotly_click", (ev) => { const p = ev.points && ev.points[0]; if (p && p.customdata) showNode(p.customdata); });
    }
    for (const id of ["gate", "confusion", "reliability"]) later(id, r.figures[id]);
    $("gate-words").textContent = r.ledger.rows.find(([k]) => k === "gate")[1] +
      (r.calibration ? ". " + r.calibration.n + " measured children with a parsed forecast: accuracy " +
        (r.calibration.accuracy === null ? "-" : (100 * r.calibration.accuracy).toFixed(0) + "%") +
        (r.calibration.ece === null ? "" : ", ECE " + num(r.calibration.ece)) : "");
    const ids = $("node-ids");
    ids.replaceChildren(...r.nodes.map((n) => el("option", { value: n.id })));
    showNode(nodeId && byId.has(nodeId) ? nodeId : r.best || "seed");
  }

  function section(box, title, ...kids) { box.append(el("h4", {}, title), ...kids.filter((k) => k)); }

  function measurementBlock(m, g, isSeed, what) {
    if (!m) return [el("p", { class: "none" }, what)];
    const out = [];
    if (m.status === "forecast") {
      return [el("p", {}, el("span", { class: "tag skip" }, "not measured"),
        "admitted on its forecast: expected " + num(m.forecast_speedup) + "x")];
    }
    const head = el("p", {}, el("span", { class: "tag " + (m.ok ? "good" : "bad") }, m.status));
    if (m.ok) {
      head.append(num(m.speedup) + "x over the reference" + noise(m.noise) + " (two standard errors)");
      if (g) {
        head.append(el("br"), isSeed ? "against 1.0: " : num(g.ratio) + "x its parent: ",
          el("span", { class: "tag " + (g.within_noise ? "noise" : g.ratio > 1 ? "good" : "bad") },
            g.within_noise === null ? "noise not recorded" : g.within_noise ? "within the noise" :
              g.ratio > 1 ? "faster beyond the noise" : "slower beyond the noise"));
      }
    }
    out.push(head);
    if (m.cases && m.cases.length) {
      const t = el("table", { class: "cases" }, el("tr", {}, el("th", {}, "case"), el("th", {}, "reference ms"),
        el("th", {}, "candidate ms"), el("th", {}, "speedup"), el("th", {}, "noise")));
      for (const c of m.cases) {
        t.append(el("tr", {}, el("td", {}, c.case), el("td", {}, num(c.reference_ms, 4)), el("td", {}, num(c.candidate_ms, 4)),
          el("td", {}, c.speedup === null ? "-" : num(c.speedup) + "x"), el("td", {}, c.noise === null ? "-" : (100 * c.noise).toFixed(1) + "%")));
        for (const f of c.flags) t.append(el("tr", {}, el("td", { colspan: "5" }, "flag: " + f)));
      }
      out.push(t);
    }
    for (const f of m.flags || []) out.push(el("p", { class: "hint" }, "flag: " + f));
    if (m.message) out.push(el("pre", { class: "message" }, m.message));
    out.push(el("p", { class: "hint" }, [m.seconds !== null && m.seconds !== undefined ? num(m.seconds, 1) + " s" : null,
      m.worker ? "on " + m.worker : null, m.device ? m.device : null, m.cached ? "from the measurement cache" : null,
      m.line ? "events.jsonl line " + m.line : null].filter((x) => x).join(", ")));
    return out;
  }

  function forecastBlock(n) {
    const f = n.forecast;
    if (!f) return [el("p", { class: "none" }, n.id === "seed" ? "the seed is the anchor of every forecast" : "no forecast (no gate)")];
    const out = [];
    if (f.probs === null) {
      out.push(el("p", {}, el("span", { class: "tag bad" }, f.deferred ? "deferred by the forecaster" : "did not parse"),
        f.parse_error || f.reasoning || ""));
    } else {
      const b = D.bins[f.predicted_bin - 1];
      const p = el("p", { id: "forecast-words" }, "forecast bin " + b.bin + " (" + b.name + ", " + b.label + "), confidence " +
        num(f.confidence) + ", expected speedup ~" + num(f.expected_speedup, 2) + "x");
      if (n.measured_bin) {
        const off = Math.abs(n.measured_bin - f.predicted_bin);
        p.append(el("br"), "measured bin " + n.measured_bin + (n.measurement && n.measurement.ok ? "" : " (by the audit)") + ": ",
          el("span", { class: "tag " + (off === 0 ? "good" : off === 1 ? "noise" : "bad") },
            off === 0 ? "the forecast bin" : off === 1 ? "one bin off" : off + " bins off"));
      }
      out.push(p);
      const div = el("div", { id: "forecast-chart" });
      out.push(div);
      requestAnimationFrame(() => {
        if (!div.isConnected) return;  // another node was shown meanwhile
        const colors = f.probs.map((_, i) => (i + 1 === f.predicted_bin ? "#1f77b4" : "#9ecae1"));
        const lines = f.probs.map((_, i) => (i + 1 === n.measured_bin ? 3 : 0));
        Plotly.react(div, [{
          type: "bar", x: D.bins.map((b) => b.bin + ": " + b.label), y: f.probs, marker: { color: colors, line: { color: "#e6a100", width: lines } },
          hovertemplate: "%{x}<br>p = %{y:.3f}<extra></extra>",
        }], {
          height: 200, margin: { l: 40, r: 6, t: 6, b: 70 }, yaxis: { range: [0, 1.25], tickvals: [0, 0.25, 0.5, 0.75, 1], title: { text: "p" } },
          xaxis: { tickangle: -40, tickfont: { size: 10 } }, plot_bgcolor: "white",
          annotations: n.measured_bin ? [{ x: D.bins[n.measured_bin - 1].bin + ": " + D.bins[n.measured_bin - 1].label,
            y: f.probs[n.measured_bin - 1], text: "measured", showarrow: true, arrowhead: 2, ay: -28, font: { size: 11 } }] : [],
        }, { displaylogo: false, displayModeBar: false, responsive: true });
      });
    }
    out.push(el("p", { class: "hint" }, [f.model ? "by " + f.model : null, f.readout ? f.readout + " read-out" : null,
      f.tokens_in ? f.tokens_in + " tokens in, " + f.tokens_out + " out" : null].filter((x) => x).join(", ")));
    return out;
  }

  // The diff against the parent, from difflib's opcodes over the two codes' lines: changed lines
  // with three lines of context around them, long unchanged stretches folded.
  function diffBlock(n) {
    const pre = el("pre", { class: "diff", id: "node-diff" });
    const old = byId.get(n.parent).code.split("\n"), now = n.code.split("\n");
    const line = (cls, text) => pre.append(cls ? el("span", { class: cls }, text) : text + "\n");
    if (n.diff.every(([tag]) => tag === "equal")) return el("p", { class: "none" }, "the same code as its parent");
    n.diff.forEach(([tag, i1, i2, j1, j2], k) => {
      if (tag === "equal") {
        const head = k === 0 ? 0 : 3, tail = k === n.diff.length - 1 ? 0 : 3;
        if (i2 - i1 <= head + tail + 1) { for (let i = i1; i < i2; i++) line(null, " " + old[i]); return; }
        for (let i = i1; i < i1 + head; i++) line(null, " " + old[i]);
        line("hunk", "@@ " + (i2 - i1 - head - tail) + " unchanged lines (" + (j1 + head + 1) + "-" + (j2 - tail) + ") @@");
        for (let i = i2 - tail; i < i2; i++) line(null, " " + old[i]);
        return;
      }
      for (let i = i1; i < i2; i++) line("del", "-" + old[i]);
      for (let j = j1; j < j2; j++) line("add", "+" + now[j]);
    });
    return pre;
  }

  function collapsed(title, text, missing) {
    return el("details", {}, el("summary", {}, title), text ? el("pre", {}, text) : el("p", { class: "none" }, missing));
  }

  function showNode(id) {
    const r = D.runs[run], n = byId.get(id);
    if (!n) return;
    const box = $("node");
    box.replaceChildren();
    box.dataset.node = n.id;
    box.append(el("h3", { class: "node-title", id: "node-title" }, n.id, " ",
      el("span", { class: "sub" }, n.id === "seed" ? "the seed" : "step " + n.step + ", child " + n.index + " of " + n.call)));
    const kids = r.nodes.filter((c) => c.parent === n.id);
    const facts = el("dl", { class: "facts" });
    const fact = (k, ...v) => facts.append(el("dt", {}, k), el("dd", {}, ...v));
    fact("parent", n.parent ? link(n.parent) : "none: the root");
    if (kids.length) {
      const dd = [];
      kids.forEach((c, i) => { if (i) dd.push(" "); dd.push(link(c.id)); });
      fact("children", ...dd);
    }
    fact("archive", n.archive.kept ? "kept; " + n.archive.visits + " PUCT visits" +
      (n.archive.score !== null ? ", score " + num(n.archive.score) + " at the end" : "") +
      (n.archive.picked_at.length ? "; picked as a parent at step " + n.archive.picked_at.join(", ") : "")
      : n.measurement && n.measurement.ok ? "not kept (a sibling was better: its parent keeps its best children)" : "not in the archive");
    if (n.best_path) fact("best", n.id === r.best ? "the best kernel of the search" : "on the path to the best kernel");
    box.append(facts);
    section(box, "Measurement", ...measurementBlock(n.measurement, n.gain, n.id === "seed",
      n.in_flight ? "sent, no result yet" : "not measured by the search"));
    if (n.audit || n.audit_requested) {
      section(box, "Audit (measured outside the budget; the search never saw it)",
        ...measurementBlock(n.audit, n.audit_gain, false, "requested, no result yet"));
    }
    const fbox = el("div", { id: "node-forecast" }, ...forecastBlock(n));
    section(box, "Forecast", fbox);
    section(box, "Gate", el("p", { id: "node-gate" }, n.gate.text),
      n.gate.threshold_note ? el("p", { class: "hint" }, "in force then: " + n.gate.threshold_note) : null);
    if (n.id !== "seed") {
      const mut = r.mutations[n.call] || {};
      const how = Object.entries(n.mutation || {}).filter(([k]) => k !== "reply").map(([k, v]) => k + ": " + v).join("; ");
      section(box, "Mutation", el("p", {}, "by " + (mut.mutator || "?") + (how ? " (" + how + ")" : "") +
        (mut.failed && mut.failed.length ? "; " + mut.failed.length + " of this call's " + mut.proposed + " mutations failed" : "") +
        (mut.duplicates ? "; " + mut.duplicates + " repeated earlier code" : "")),
        el("details", { open: "" }, el("summary", {}, "diff against its parent"),
          n.diff ? diffBlock(n) : el("p", { class: "none" }, "no diff (a parent's code is missing)")));
    }
    box.append(el("details", { open: "" }, el("summary", {}, "code"),
      n.code === null ? el("p", { class: "none" }, "not in this run's files") : el("pre", { id: "node-code" }, n.code)));
    if (n.id !== "seed") {
      const mut = r.mutations[n.call] || {};
      const catalog = mut.mutator === "catalog" ? "the catalog mutator is no language model" : "not recorded in this log";
      section(box, "What the models said",
        collapsed("the mutator's prompt", mut.prompt, catalog),
        collapsed("the mutator's answer", n.reply, catalog),
        collapsed("the forecaster's answer", n.forecast && (n.forecast.raw || n.forecast.reasoning),
          !n.forecast ? "no forecast" : n.forecast.readout === "logits" ? "the logits read-out writes no answer: its " +
            "probabilities are read from the next token" : "not recorded in this log"));
    }
    history.replaceState(null, "", "#run=" + run + "&node=" + encodeURIComponent(n.id));
    const at = where.get(n.id);
    if (at && $("tree").data) {
      Plotly.relayout("tree", { shapes: [{ type: "circle", xref: "x", yref: "y", xsizemode: "pixel", ysizemode: "pixel",
        xanchor: at[0], yanchor: at[1], x0: -13, x1: 13, y0: -13, y1: 13, line: { color: "#000000", width: 2 } }] });
    }
  }

  function fromHash() {
    const h = new URLSearchParams(location.hash.slice(1));
    const k = Number(h.get("run") || 0);
    return [k >= 0 && k < D.runs.length ? k : 0, h.get("node")];
  }

  async function main() {
    D = await load();
    header();
    ledger();
    $("audit").replaceChildren(...D.runs.map((r, k) => {
      const p = el("p", {}, D.runs.length > 1 ? el("b", {}, r.name + ": ") : null, r.audit_text);
      if (r.audit.miss_nodes && r.audit.miss_nodes.length) {
        p.append(" Faster than their parent: ");
        r.audit.miss_nodes.forEach((id, i) => p.append(i ? ", " : "", link(id, k)));
        p.append(".");
      }
      return p;
    }));
    const curve = plot("curve", D.curve);
    if (curve) curve.on("plotly_click", (ev) => {
      const p = ev.points && ev.points[0];
      if (p && Array.isArray(p.customdata)) showRun(p.customdata[0], p.customdata[1]);
    });
    const picker = $("run-picker");
    if (D.runs.length > 1) {
      picker.hidden = false;
      D.runs.forEach((r, k) => picker.append(el("option", { value: String(k) }, r.name + " (" + r.config.gate + " gate)")));
      picker.addEventListener("change", () => showRun(Number(picker.value)));
    }
    $("find").addEventListener("change", (ev) => showNode(ev.target.value.trim()));
    $("go-best").addEventListener("click", () => showNode(D.runs[run].best || "seed"));
    $("go-seed").addEventListener("click", () => showNode("seed"));
    const [k, nodeId] = fromHash();
    showRun(k, nodeId);
    document.body.dataset.ready = String(Math.round(performance.now()));
  }

  main().catch((e) => {
    $("status").textContent = "This page could not be drawn: " + e;
    $("status").classList.add("bad");
    console.error(e);
  });
})();
