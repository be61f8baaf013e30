// Draws a monitor series (data from the JSON block #data). Names are untrusted: they reach the
// page through textContent only (uPlot's legend does the same).
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("data").textContent);
  // "nan": a measured NaN (black in the heat map); null: not measured (grey)
  const num = (v) => (v === "inf" ? Infinity : v === "-inf" ? -Infinity : v === "nan" ? NaN : v);
  // steps are whole numbers: ticks at integer increments only, labelled as integers
  const stepIncrs = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1e3, 2e3, 5e3, 1e4, 2e4, 5e4, 1e5,
                     2e5, 5e5, 1e6, 2e6, 5e6, 1e7];
  const stepAxis = () => ({ incrs: stepIncrs,
    values: (u, ticks) => ticks.map((v) => (Number.isInteger(v) ? String(v) : "")) });
  const steps = data.steps;
  const width = () => Math.max(600, Math.min(window.innerWidth - 80, 1400));
  // what fired first: the page opens on its figure, its step and layer marked
  const fx = data.focus && typeof data.focus.step === "number" ? data.focus : null;
  if (fx) {
    document.getElementById("focus").textContent =
      "opened on " + (fx.figure || "the loss") + ": step " + fx.step + " flagged (" +
      (fx.why || []).join("; ") + ")" + (fx.layer ? "; layer " + fx.layer + " marked" : "");
  }
  const marker = () => ({ hooks: { draw: [(u) => {
    if (!fx) return;
    const x = u.valToPos(fx.step, "x", true);
    const c = u.ctx;
    c.save(); c.strokeStyle = "#000"; c.setLineDash([4, 3]); c.lineWidth = 1;
    c.beginPath(); c.moveTo(x, u.bbox.top); c.lineTo(x, u.bbox.top + u.bbox.height);
    c.stroke(); c.restore();
  }] } });

  const ev = document.getElementById("events");
  for (const e of data.events) {
    const d = document.createElement("div");
    const what = e.kind === "capture"
      ? "capture: " + (e.exact ? "re-run exact" : "re-run NOT exact") +
        (e.culprit ? ", culprit " + e.culprit.op + " in " + (e.culprit.module || "-") : "")
      : e.kind + ": " + (e.reasons ? e.reasons.join("; ") : (e.message || ""));
    d.textContent = "step " + e.step + " \u2014 " + what;
    ev.appendChild(d);
  }

  const finite = (arr) => arr.map((v) => { v = num(v); return Number.isFinite(v) ? v : null; });
  // steps whose loss is NaN, Inf or was not given: the line has a gap there, marked with a
  // red cross on the top edge and listed under the chart
  const lossGaps = [];
  data.loss.forEach((v, i) => { if (!Number.isFinite(num(v))) lossGaps.push(i); });
  const gapMarks = () => ({ hooks: { draw: [(u) => {
    const c = u.ctx, y = u.bbox.top + 6, r = 5;
    c.save(); c.strokeStyle = "#d00"; c.lineWidth = 2;
    for (const i of lossGaps) {
      const x = u.valToPos(steps[i], "x", true);
      c.beginPath(); c.moveTo(x - r, y - r); c.lineTo(x + r, y + r);
      c.moveTo(x + r, y - r); c.lineTo(x - r, y + r); c.stroke();
    }
    c.restore();
  }] } });
  if (lossGaps.length) {
    const shown = lossGaps.slice(0, 20).map((i) => steps[i]).join(", ");
    document.getElementById("lossgaps").textContent =
      "\u00d7 loss NaN, Inf or not recorded at step" + (lossGaps.length > 1 ? "s " : " ") +
      shown + (lossGaps.length > 20 ? " and " + (lossGaps.length - 20) + " more" : "");
  }
  new uPlot({
    width: width(), height: 220,
    series: [{ label: "step" }, { label: "loss", stroke: "#1f77b4" },
             { label: "grad norm", stroke: "#d62728", scale: "g" }],
    axes: [stepAxis(), {}, { scale: "g", side: 1 }],
    scales: { x: { time: false } }, plugins: [marker(), gapMarks()],
  }, [steps, finite(data.loss), finite(data.grad_norm)], document.getElementById("top"));

  const sel = document.getElementById("fig");
  const opening = fx && fx.figure && data.figures[fx.figure] ? fx.figure : "module/act_norm";
  for (const key of Object.keys(data.figures)) {
    const o = document.createElement("option");
    o.value = key; o.textContent = key;
    if (key === opening) o.selected = true;
    sel.appendChild(o);
  }
  const colour = (i, n) => "hsl(" + Math.round((360 * i) / Math.max(1, n)) + ",65%,45%)";
  let plot = null;

  function lines() {
    const f = data.figures[sel.value];
    if (!f) return;
    const logy = document.getElementById("log").checked;
    const cols = f.names.map((_, j) => f.values.map((row) => {
      const v = num(row[j]);
      return Number.isFinite(v) && (!logy || v > 0) ? v : null;
    }));
    // a figure measured on some steps only (parameter norms, update ratios and optimizer
    // state every N steps): a dot per measured step, never a line across the steps between
    const sparse = f.values.some((row) => row.every((v) => v === null));
    const series = [{ label: "step" }].concat(f.names.map((n, j) => ({
      label: n, stroke: colour(j, f.names.length),
      width: fx && n === fx.layer ? 3 : 1,
      points: sparse ? { show: true, size: 5 } : {},
    })));
    if (plot) plot.destroy();
    plot = new uPlot({
      width: width(), height: 320, series: series, axes: [stepAxis(), {}],
      scales: { x: { time: false }, y: logy ? { distr: 3 } : {} }, plugins: [marker()],
    }, [steps].concat(cols), document.getElementById("lines"));
    heat(f, /_(nan|inf)$/.test(sel.value));
  }

  // counts: a cell holding NaN or Inf is black whatever the layer's usual count (a NaN born
  // at the flagged step is what the page opens on); no count: white; not measured: grey
  function heat(f, counts) {
    const canvas = document.getElementById("heat");
    const rows = f.names.length, ncol = steps.length;
    const lw = 280;  // the names column (canvas text: never parsed as HTML)
    const cw = Math.max(1, Math.floor((width() - lw) / Math.max(1, ncol)));
    const ch = 12;
    canvas.width = lw + cw * ncol; canvas.height = ch * rows;
    const ctx = canvas.getContext("2d");
    ctx.font = "10px monospace"; ctx.fillStyle = "#000"; ctx.textBaseline = "middle";
    for (let j = 0; j < rows; j++) {
      const n = f.names[j];
      ctx.fillText(n.length > 44 ? "\u2026" + n.slice(-43) : n, 2, j * ch + ch / 2, lw - 4);
    }
    const ratio = [];
    for (let j = 0; j < rows; j++) {
      const vals = f.values.map((r) => Math.abs(num(r[j]))).filter((v) => Number.isFinite(v));
      vals.sort((a, b) => a - b);
      const med = vals.length ? vals[Math.floor(vals.length / 2)] : NaN;
      ratio.push(f.values.map((r) => {
        const v = Math.abs(num(r[j]));
        if (r[j] === null) return null;
        if (!Number.isFinite(v)) return Infinity;
        return med > 0 ? Math.log10(Math.max(v, 1e-30) / med) : (v > 0 ? Infinity : 0);
      }));
    }
    for (let j = 0; j < rows; j++) {
      for (let i = 0; i < ncol; i++) {
        const r = ratio[j][i];
        let c;
        const v = num(f.values[i][j]);
        if (r === null) c = "#ddd";
        else if (counts) c = v > 0 || !Number.isFinite(v) ? "#000" : "#fff";
        else if (!Number.isFinite(r)) c = "#000";
        else {
          const t = Math.max(-1, Math.min(1, r / 2));
          const a = Math.round(255 * (1 - Math.abs(t)));
          c = t >= 0 ? "rgb(255," + a + "," + a + ")" : "rgb(" + a + "," + a + ",255)";
        }
        ctx.fillStyle = c;
        ctx.fillRect(lw + i * cw, j * ch, cw, ch);
      }
    }
    if (fx) {  // the flagged step's column (its bin) and the layer's row, outlined
      let col = -1;
      for (let i = 0; i < ncol; i++) if (steps[i] <= fx.step) col = i;
      const row = f.names.indexOf(fx.layer);
      ctx.strokeStyle = "#0a0"; ctx.lineWidth = 2;
      if (col >= 0) ctx.strokeRect(lw + col * cw, 0, cw, ch * rows);
      if (row >= 0) ctx.strokeRect(lw, row * ch, cw * ncol, ch);
    }
    const hover = document.getElementById("hover");
    canvas.onmousemove = (e) => {
      const b = canvas.getBoundingClientRect();
      const i = Math.floor(((e.clientX - b.left) * canvas.width / b.width - lw) / cw);
      const j = Math.floor(((e.clientY - b.top) * canvas.height / b.height) / ch);
      if (i < 0 || j < 0 || i >= ncol || j >= rows) return;
      const v = f.values[i][j];
      hover.textContent = f.names[j] + " @ step " + steps[i] + ": " + (v === null ? "not measured" : v);
    };
  }

  sel.onchange = lines;
  document.getElementById("log").onchange = lines;
  lines();
})();
