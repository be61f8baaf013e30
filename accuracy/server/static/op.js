// Op page: both tensors' histograms overlaid (uPlot) and the |my - golden| heat map (canvas).
(function () {
  "use strict";
  const histEl = document.getElementById("hist");
  if (histEl) {
    const base = `/api/reports/${histEl.dataset.report}/rows/${histEl.dataset.idx}`;
    fetch(`${base}/histogram?bins=80`).then(r => r.json().then(b => [r.ok, b])).then(([ok, h]) => {
      if (!ok) { histEl.textContent = h.error || "histogram unavailable"; return; }
      const mids = h.edges.slice(0, -1).map((e, i) => (e + h.edges[i + 1]) / 2);
      const step = uPlot.paths.stepped({ align: 0 });
      new uPlot({
        width: Math.max(400, histEl.clientWidth || 900), height: 300,
        scales: { x: { time: false } },
        axes: [{ label: "value" }, { label: "count" }],
        series: [{ label: "value" },
          { label: "my (device)", stroke: "#dc2626", fill: "rgba(220,38,38,0.18)", paths: step },
          { label: "golden", stroke: "#2563eb", fill: "rgba(37,99,235,0.18)", paths: step }],
      }, [mids, h.counts[0], h.counts[1]], histEl);
      const note = [];
      if (h.nan[0] || h.nan[1]) note.push(`nan: my ${h.nan[0]}, golden ${h.nan[1]}`);
      if (h.inf[0] || h.inf[1]) note.push(`inf: my ${h.inf[0]}, golden ${h.inf[1]}`);
      document.getElementById("histnote").textContent = note.join(" · ");
      histEl.dataset.ready = "1";
    });
  }

  const canvas = document.getElementById("heat");
  if (canvas) {
    const base = `/api/reports/${canvas.dataset.report}/rows/${canvas.dataset.idx}`;
    fetch(`${base}/heatmap?max_cells=128`).then(r => r.json()).then(h => {
      if (!h.values) return;
      const ctx = canvas.getContext("2d");
      const cw = canvas.width / h.grid_cols, ch = canvas.height / h.grid_rows;
      const max = h.max > 0 ? h.max : 1;
      for (let i = 0; i < h.grid_rows; i++) {
        for (let j = 0; j < h.grid_cols; j++) {
          const t = Math.min(1, h.values[i][j] / max);
          // white (no error) -> yellow -> red (largest error)
          const g = Math.round(255 * (1 - t * 0.85)), b = Math.round(255 * (1 - Math.min(1, t * 2)));
          ctx.fillStyle = `rgb(255,${g},${b})`;
          ctx.fillRect(j * cw, i * ch, Math.ceil(cw), Math.ceil(ch));
        }
      }
      document.getElementById("heatinfo").textContent =
        `${h.rows}×${h.cols} shown as ${h.grid_rows}×${h.grid_cols} cells (max per cell); max ${h.max.toPrecision(4)}`;
    });
  }
})();
