"""The report page's ops table fits a 1400 px window in headless Chromium (#50: with a
`transformers` model's module names the last header read "fp8 figu", cut at the edge).

The page is rendered by the app (TestClient), its /static/ files are pointed at the package's
folder, and a script added at the end of the page measures the laid-out table into the DOM
that Chromium dumps: no server or network is needed, only the browser.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.browser
pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

import accuracy.server  # noqa: E402
from accuracy.server import create_app  # noqa: E402
from accuracy.server.reportindex import index_report  # noqa: E402

CHROMIUM = next((p for p in (os.environ.get("CHROMIUM"), shutil.which("chromium"),
                             shutil.which("chromium-browser"), "/usr/bin/chromium")
                 if p and Path(p).exists()), None)
STATIC = Path(accuracy.server.__file__).resolve().parent / "static"
LOCAL = {"base_url": "http://127.0.0.1", "headers": {"X-Accuracy-Request": "1"}}
MODULES = ["Qwen2ForCausalLM.model.layers.1.mlp.up_proj",
           "Qwen2ForCausalLM.model.layers.1.self_attn.rotary_emb",
           "Qwen2ForCausalLM.model.layers.0.post_attention_layernorm"]
OPS = ["aten._scaled_dot_product_flash_attention_for_cpu_backward.default", "aten.mm.default",
       "aten.native_layer_norm_backward.default"]
_MEASURE = """<script>
const box = document.querySelector("#rows").parentElement;
const last = [...document.querySelectorAll("#rows thead th")].pop();
document.body.dataset.measure = JSON.stringify({
  overflow: box.scrollWidth - box.clientWidth,
  lastRight: last.getBoundingClientRect().right, boxRight: box.getBoundingClientRect().right,
  lastText: last.textContent.trim(), width: window.innerWidth,
  cols: [...document.querySelectorAll("#rows thead th")]
          .map(t => Math.round(t.getBoundingClientRect().width))});
</script>"""


def _chromium(*args: str, profile: Path) -> subprocess.CompletedProcess:
    """Headless, offline (every name fails to resolve), in a throwaway profile."""
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update",
                           "--no-first-run", "--disable-dev-shm-usage",
                           f"--user-data-dir={profile}", "--host-resolver-rules=MAP * ~NOTFOUND",
                           *args], capture_output=True, text=True, timeout=90)


def _rows() -> list[dict]:
    return [{"index": i, "kind": "op", "io": "output", "tensor_index": 0, "phase": "backward",
             "op": OPS[i % 3], "module": MODULES[i % 3], "verdict": "error",
             "source": "/home/someone/project/src/model/modeling_qwen2.py:412",
             "cosine": 0.99502509, "max_abs_err": 0.788187, "max_rel_err": 0.428574,
             "local_error_ratio": 5245.1, "local_bound": 2732.95,
             "message": "rel_euc_dist 0.1 > 0.03; output deviation 1.68e+06x what its inputs' "
                        "deviation and its own rounding explain"} for i in range(30)]


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium not found (make browser-deps)")
def test_ops_table_fits_a_1400px_window(tmp_path):
    app = create_app(tmp_path / "data")
    with TestClient(**LOCAL, app=app) as c:
        rep = index_report(app.state.services.storage,
                           {"verdict": "error", "counts": {"error": 30}}, _rows(), name="qwen2")
        html = c.get(f"/ui/reports/{rep.id}").text
    html = re.sub(r'(src|href)="/static/', rf'\1="{STATIC.as_uri()}/', html)
    page = tmp_path / "report.html"
    page.write_text(html.replace("</main>", "</main>" + _MEASURE), encoding="utf-8")
    try:
        r = _chromium("--dump-dom", "--window-size=1400,900", page.as_uri(),
                      profile=tmp_path / "profile")
    except subprocess.TimeoutExpired:
        pytest.fail("Chromium did not answer in 90 s")
    m = re.search(r'data-measure="([^"]+)"', r.stdout)
    assert m, r.stderr[-2000:]
    got = json.loads(m.group(1).replace("&quot;", '"'))
    assert got["width"] == 1400 and got["lastText"] == "fp8 figures", got
    assert got["overflow"] <= 0 and got["lastRight"] <= got["boxRight"], \
        f"the ops table is wider than its box at 1400 px: {got}"
