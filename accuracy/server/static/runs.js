// Runs page: start a compare job, and refresh while jobs are queued or running.
(function () {
  "use strict";
  const me = document.currentScript;
  const form = document.getElementById("newjob");
  if (form) {
    form.addEventListener("submit", async e => {
      e.preventDefault();
      const f = new FormData(form);
      const msg = document.getElementById("jobmsg");
      const resp = await fetch("/api/jobs", {
        method: "POST", headers: { "content-type": "application/json", "x-accuracy-request": "1" },
        body: JSON.stringify({ my_run_id: f.get("my_run_id"), golden_run_id: f.get("golden_run_id"),
                               replay: f.get("replay") === "on" }),
      });
      const body = await resp.json();
      if (!resp.ok) { msg.textContent = body.error || "could not start the job"; return; }
      msg.textContent = "started " + body.id.slice(0, 8);
      setTimeout(() => window.location.reload(), 1000);
    });
  }
  if (Number(me.dataset.active) > 0) setTimeout(() => window.location.reload(), 2000);
})();
