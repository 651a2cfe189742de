// The console's only script: live parts over Server-Sent Events, and a confirmation
// before destructive actions. Pages work without it (they just do not update by
// themselves). No framework, no build step.
"use strict";

function live(el) {
  const source = new EventSource(el.dataset.live);
  source.addEventListener("parts", (event) => {
    const parts = JSON.parse(event.data);
    for (const [id, html] of Object.entries(parts)) {
      const target = document.getElementById(id);
      // Compared as the browser serializes both: the server's text and the browser's
      // serialization of the same markup differ (attributes, entities), and replacing
      // an unchanged part would reload its <audio> or <video> under the viewer.
      const parsed = document.createElement("template");
      parsed.innerHTML = html;
      if (target && target.innerHTML !== parsed.innerHTML) {
        target.innerHTML = html;
      }
    }
    document.body.dataset.liveUpdates = String(Number(document.body.dataset.liveUpdates || 0) + 1);
  });
  source.addEventListener("open", () => { document.body.dataset.live = "open"; });
}

function confirmations() {
  document.addEventListener("submit", (event) => {
    const form = event.target;
    if (form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
      event.preventDefault();
    }
  });
}

document.addEventListener("DOMContentLoaded", () => {
  document.querySelectorAll("[data-live]").forEach(live);
  confirmations();
});
