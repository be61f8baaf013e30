// Report page: the divergence chart (uPlot) and the server-paged, sortable, filterable table.
(function () {
  "use strict";
  const chartEl = document.getElementById("chart");
  const rid = chartEl.dataset.report;
  const COLORS = { pass: "#16a34a", warning: "#d97706", error: "#dc2626", unmatched: "#6b7280" };
  const VERDICTS = ["pass", "warning", "error"];
  let plot = null;
  let series = null;

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

  async function drawChart() {
    const metric = document.getElementById("metric").value;
    const log = document.getElementById("logscale").checked;
    const resp = await fetch(`/api/reports/${rid}/series?metric=${metric}&max_points=8000`);
    if (!resp.ok) { chartEl.textContent = "chart unavailable"; return; }
    series = await resp.json();
    const xs = series.idx;
    const ys = VERDICTS.map(v => series.value.map((y, i) => {
      if (series.verdict[i] !== v || y === null) return null;
      return log ? (y > 0 ? y : null) : y;
    }));
    const bands = backwardBands(series);
    const opts = {
      width: Math.max(400, chartEl.clientWidth || 900), height: 300,
      scales: { x: { time: false }, y: { distr: log ? 3 : 1 } },
      axes: [{ label: "op index (execution order)" },
             { label: metric, size: 70, values: (u, splits) => distinctLabels(splits) }],
      legend: { show: true },
      cursor: { points: { size: 8 }, dataIdx: (u, sidx, idx) => idx },
      series: [{ label: "#" }].concat(VERDICTS.map(v => ({
        label: v, stroke: COLORS[v], fill: COLORS[v], width: 0,
        paths: () => null, points: { show: true, size: 5, stroke: COLORS[v], fill: COLORS[v] },
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
      },
    };
    if (plot) plot.destroy();
    plot = new uPlot(opts, [xs].concat(ys), chartEl);
    chartEl.dataset.points = String(xs.length);
    plot.over.addEventListener("click", () => {
      const i = plot.cursor.idx;
      if (i !== null && i !== undefined && xs[i] !== undefined) {
        window.location.href = `/ui/reports/${rid}/rows/${xs[i]}`;
      }
    });
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
      const cells = [a, r.op, `${r.io} ${r.tensor_index}`, r.phase, r.module, r.verdict, r.cosine, r.max_abs_err,
                     r.max_rel_err, r.local_error_ratio, r.message, r.quant];
      for (const c of cells) {
        const td = document.createElement("td");
        if (c instanceof Node) td.appendChild(c); else td.textContent = fmt(c);
        tr.appendChild(td);
      }
      return tr;
    }));
    const end = Math.min(state.offset + LIMIT, state.total);
    info.textContent = state.total ? `${state.offset + 1}–${end} of ${state.total}` : "no rows";
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
  document.getElementById("metric").addEventListener("change", drawChart);
  document.getElementById("logscale").addEventListener("change", drawChart);
  drawChart().then(() => { document.body.dataset.chart = "ready"; });
})();
