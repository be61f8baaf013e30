// Report page: the divergence chart (uPlot) and the server-paged, sortable, filterable table.
(function () {
  "use strict";
  const chartEl = document.getElementById("chart");
  const rid = chartEl.dataset.report;
  const COLORS = { pass: "#16a34a", warning: "#d97706", error: "#dc2626", unmatched: "#6b7280" };
  const VERDICTS = ["pass", "warning", "error"];
  let plot = null;
  let series = null;

  // a name that may break after each dot first (as the server's `dotbreak` filter)
  function dotBreak(name) {
    const frag = document.createDocumentFragment();
    String(name ?? "").split(".").forEach((part, i) => {
      if (i) { frag.append("."); frag.append(document.createElement("wbr")); }
      frag.append(part);
    });
    return frag;
  }

  function fmt(v) {
    if (v === null || v === undefined) return "";
    if (typeof v === "number") return Number.isInteger(v) ? String(v) : v.toPrecision(6);
    return String(v);
  }

  function backwardBands(s) {
    const bands = [];
    let start = null;
    for (let i = 0; i < s.idx.length; i++) {
      const bw = s.phase[i] === "backward";
      if (bw && start === null) start = s.idx[i];
      if (!bw && start !== null) { bands.push([start, s.idx[i - 1]]); start = null; }
    }
    if (start !== null) bands.push([start, s.idx[s.idx.length - 1]]);
    return bands;
  }

  // The view lives in the address (?metric=&log=&verdict=&phase=&op=&module=&sort=&order=
  // &offset=), so a link or a reload shows the same chart and table.
  const url = new URLSearchParams(window.location.search);
  const metricSel = document.getElementById("metric");
  const logBox = document.getElementById("logscale");
  const DEFAULT_METRIC = "rel_euc_dist";  // the offline report's chart (compare/html.py)
  const wanted = url.get("metric");
  if (wanted && [...metricSel.options].some(o => o.value === wanted)) metricSel.value = wanted;
  if (url.has("log")) logBox.checked = url.get("log") !== "0";
  else logBox.checked = metricSel.value === DEFAULT_METRIC;

  function remember(changes) {
    const p = new URLSearchParams(window.location.search);
    for (const [k, v] of Object.entries(changes)) {
      if (v === null || v === "" || v === undefined) p.delete(k); else p.set(k, v);
    }
    const q = p.toString();
    history.replaceState(null, "", window.location.pathname + (q ? "?" + q : ""));
  }

  async function fetchSeries(metric) {
    if (metric === DEFAULT_METRIC) {
      const resp = await fetch(`/ui/reports/${rid}/chart?max_points=8000`);
      if (!resp.ok) return null;
      const s = await resp.json();
      // not judged: drawn at the floor, apart from the judged points (its distance is noise)
      s.value = s.value.map((y, i) => (s.verdict[i] === "not judged" || y === null || y <= 0)
        ? s.floor : Math.min(s.ceiling, Math.max(s.floor, y)));
      return s;
    }
    const resp = await fetch(`/api/reports/${rid}/series?metric=${encodeURIComponent(metric)}&max_points=8000`);
    return resp.ok ? resp.json() : null;
  }

  const SERIES = [["pass", COLORS.pass], ["not judged", "#9ca3af"], ["warning", COLORS.warning],
                  ["error", COLORS.error]];

  async function drawChart() {
    const metric = metricSel.value;
    const log = logBox.checked;
    series = await fetchSeries(metric);
    if (!series) { chartEl.textContent = "chart unavailable"; return; }
    const xs = series.idx;
    const ys = SERIES.map(([v]) => series.value.map((y, i) => {
      if (series.verdict[i] !== v || y === null) return null;
      return log ? (y > 0 ? y : null) : y;
    }));
    const bands = backwardBands(series);
    const culprit = chartEl.dataset.culprit === undefined ? null : Number(chartEl.dataset.culprit);
    const yScale = { distr: log ? 3 : 1 };
    if (metric === DEFAULT_METRIC && log) yScale.range = [series.floor, series.ceiling];
    const opts = {
      width: Math.max(400, chartEl.clientWidth || 900), height: 300,
      scales: { x: { time: false }, y: yScale },
      axes: [{ label: "op outputs in execution order (row #)" },
             log ? { label: metric === DEFAULT_METRIC ? "rel. Euclidean distance" : metric, size: 70,
                     splits: decades, values: (u, splits) => splits.map(v => (v > 0 ? "1e" + Math.round(Math.log10(v)) : "")) }
                 : { label: metric, size: 70, values: (u, splits) => distinctLabels(splits) }],
      legend: { show: true },
      cursor: { points: { size: 8 }, dataIdx: (u, sidx, idx) => idx },
      series: [{ label: "#" }].concat(SERIES.map(([v, c]) => ({
        label: v, stroke: c, fill: v === "not judged" ? "#fff" : c, width: 0,
        paths: () => null,  // errors drawn larger and last, as the offline chart does
        points: { show: true, size: v === "error" ? 9 : v === "warning" ? 7 : 5, stroke: c,
                  fill: v === "not judged" ? "#fff" : c },
      }))),
      hooks: {
        drawClear: [u => {
          const ctx = u.ctx;
          ctx.save();
          ctx.fillStyle = "rgba(99,102,241,0.12)";
          for (const [a, b] of bands) {
            const x0 = u.valToPos(a, "x", true), x1 = u.valToPos(b, "x", true);
            ctx.fillRect(x0, u.bbox.top, Math.max(1, x1 - x0), u.bbox.height);
          }
          ctx.restore();
        }],
        draw: [u => placeCulprit(u, culprit)],
      },
    };
    if (plot) plot.destroy();
    plot = new uPlot(opts, [xs].concat(ys), chartEl);
    chartEl.dataset.points = String(xs.length);
    chartEl.dataset.metric = metric;
    chartEl.dataset.log = log ? "1" : "0";
    plot.over.addEventListener("click", () => {
      const i = plot.cursor.idx;
      if (i !== null && i !== undefined && xs[i] !== undefined) {
        window.location.href = `/ui/reports/${rid}/rows/${xs[i]}`;
      }
    });
  }

  // Log axis ticks: whole decades only, at most 8 labels (every decade of 1e-12..1e1 overlapped).
  function decades(u, axisIdx, min, max) {
    const lo = Math.ceil(Math.log10(min) - 1e-9), hi = Math.floor(Math.log10(max) + 1e-9);
    const step = Math.max(1, Math.ceil((hi - lo + 1) / 8));
    const out = [];
    for (let e = hi; e >= lo; e -= step) out.unshift(Math.pow(10, e));
    return out.length ? out : [min, max];
  }

  // The culprit: a dashed red line at its row, as in the offline report; a DOM element over
  // the plot (not canvas pixels), so it is also there for tests and screen readers.
  function placeCulprit(u, culprit) {
    let m = u.over.querySelector(".culprit-marker");
    if (culprit === null || Number.isNaN(culprit)) { if (m) m.remove(); return; }
    const x = u.valToPos(culprit, "x");
    if (!(x >= 0 && x <= u.over.clientWidth + 1)) { if (m) m.remove(); return; }
    if (!m) {
      m = document.createElement("div");
      m.className = "culprit-marker"; m.id = "culprit-marker";
      const label = document.createElement("span");
      label.textContent = "culprit " + (chartEl.dataset.culpritOp || "");
      m.appendChild(label);
      u.over.appendChild(m);
    }
    m.style.left = x.toFixed(1) + "px";
    m.dataset.index = String(culprit);
  }

  // Tick labels with just enough significant digits to tell every tick apart
  // (cosine ticks 0.99995 and 0.9999 must not both read "1").
  function distinctLabels(splits) {
    for (let d = 2; d <= 12; d++) {
      const out = splits.map(v => (v === null ? "" : String(+Number(v).toPrecision(d))));
      if (new Set(out).size === out.length) return out;
    }
    return splits.map(v => String(v));
  }

  // ---- table ----
  const table = document.getElementById("rows");
  const tbody = table.querySelector("tbody");
  const form = document.getElementById("filters");
  const info = document.getElementById("pageinfo");
  const LIMIT = 50;
  // the first page is rendered by the server: its total lets "next" work before any fetch
  const state = { offset: 0, sort: "idx", order: "asc", total: Number(table.dataset.total) || 0 };

  const TABLE_KEYS = ["verdict", "phase", "op", "module"];

  // Filters, order and page from the address, applied before the first fetch.
  function fromUrl() {
    let changed = false;
    for (const k of TABLE_KEYS) {
      const v = url.get(k);
      if (v && form.elements[k]) { form.elements[k].value = v; changed = true; }
    }
    if (url.get("sort")) { state.sort = url.get("sort"); changed = true; }
    if (url.get("order") === "desc") { state.order = "desc"; changed = true; }
    const off = Number(url.get("offset"));
    if (Number.isInteger(off) && off > 0) { state.offset = off; changed = true; }
    if (changed) {
      const th = table.querySelector(`th[data-sort="${CSS.escape(state.sort)}"]`);
      if (th) th.classList.add("sorted-" + state.order);
    }
    return changed;
  }

  function params() {
    const p = new URLSearchParams();
    for (const [k, v] of new FormData(form).entries()) if (v) p.append(k, v);
    p.set("sort", state.sort); p.set("order", state.order);
    p.set("offset", state.offset); p.set("limit", LIMIT);
    return p;
  }

  async function loadRows() {
    const resp = await fetch(`/api/reports/${rid}/rows?${params()}`);
    const body = await resp.json();
    if (!resp.ok) { info.textContent = body.error || "error"; return; }
    state.total = body.total;
    tbody.replaceChildren(...body.items.map(r => {
      const tr = document.createElement("tr");
      tr.className = "v-" + r.verdict;
      const a = document.createElement("a");
      a.href = `/ui/reports/${rid}/rows/${r.index}`; a.textContent = r.index;
      const cells = [a, dotBreak(r.op), `${r.io} ${r.tensor_index}`, r.phase, dotBreak(r.module),
                     shortSource(r.source),
                     r.verdict, r.cosine, r.max_abs_err, r.max_rel_err, ratioCell(r), r.message, r.quant];
      cells.forEach((c, i) => {
        const td = document.createElement("td");
        if (c instanceof Node) td.appendChild(c); else td.textContent = fmt(c);
        if (i === 1 || i === 4) td.className = "name";
        if (i === 5) { td.className = "src"; td.title = r.source || ""; }
        if (i === 10) { td.className = "ratio"; if (typeof r.local_bound === "number") td.title = boundNote(r); }
        if (i === 11) td.className = "msg";
        tr.appendChild(td);
      });
      return tr;
    }));
    const end = Math.min(state.offset + LIMIT, state.total);
    info.textContent = state.total ? `${state.offset + 1}–${end} of ${state.total}` : "no rows";
    const f = Object.fromEntries(TABLE_KEYS.map(k => [k, form.elements[k] ? form.elements[k].value : ""]));
    remember({ ...f, sort: state.sort === "idx" ? null : state.sort,
               order: state.order === "asc" ? null : state.order, offset: state.offset || null });
  }

  function shortSource(src) {
    return src ? String(src).split("/").pop() : "";
  }

  // A local error ratio with the honest kernel's bound it is judged against (2075 passes
  // under a bound of 2733 for fp16, K=64).
  function ratioCell(r) {
    if (typeof r.local_bound !== "number") return r.local_error_ratio;
    const span = document.createElement("span");
    span.append(fmt(r.local_error_ratio) + " ");
    const b = document.createElement("span");
    b.className = "muted"; b.textContent = `(bound ${Number(r.local_bound.toPrecision(3))})`;
    span.appendChild(b);
    return span;
  }

  function boundNote(r) {
    const at = r.compute_precision ? ` at ${r.compute_precision}` : "";
    const k = r.reduction_length ? `, K=${r.reduction_length}` : "";
    const ratio = typeof r.local_error_ratio === "number" ? Number(r.local_error_ratio.toPrecision(4)) : "?";
    return `local error ratio ${ratio}; an honest kernel reaches ${Number(r.local_bound.toPrecision(4))}${at}${k}`;
  }

  table.querySelectorAll("th[data-sort]").forEach(th => th.addEventListener("click", () => {
    const col = th.dataset.sort;
    state.order = state.sort === col && state.order === "asc" ? "desc" : "asc";
    state.sort = col; state.offset = 0;
    table.querySelectorAll("th").forEach(h => h.classList.remove("sorted-asc", "sorted-desc"));
    th.classList.add("sorted-" + state.order);
    loadRows();
  }));
  form.addEventListener("submit", e => { e.preventDefault(); state.offset = 0; loadRows(); });
  document.getElementById("prev").addEventListener("click", () => {
    state.offset = Math.max(0, state.offset - LIMIT); loadRows();
  });
  document.getElementById("next").addEventListener("click", () => {
    if (state.offset + LIMIT < state.total) { state.offset += LIMIT; loadRows(); }
  });
  // log is on by default for the distance (the offline chart's axis), off for the others
  function rememberChart() {
    const dflt = metricSel.value === DEFAULT_METRIC;
    remember({ metric: dflt ? null : metricSel.value,
               log: logBox.checked === dflt ? null : (logBox.checked ? "1" : "0") });
  }
  metricSel.addEventListener("change", () => {
    logBox.checked = metricSel.value === DEFAULT_METRIC;
    rememberChart(); drawChart();
  });
  logBox.addEventListener("change", () => { rememberChart(); drawChart(); });
  const tableReady = fromUrl() ? loadRows() : Promise.resolve();
  Promise.all([drawChart(), tableReady]).then(() => { document.body.dataset.chart = "ready"; });
})();
