// Weir console: the only script. Asks before revoking; refreshes the live engine and tenant tables.
// It sets textContent only, so nothing it reads can become markup.
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const form of document.querySelectorAll("form[data-confirm]")) {
    form.addEventListener("submit", (event) => {
      if (!window.confirm(form.dataset.confirm)) event.preventDefault();
    });
  }
  const table = document.getElementById("engine");
  if (!table) return;
  const status = document.getElementById("live-status");
  async function refresh() {
    try {
      const answer = await fetch(table.dataset.source, { credentials: "same-origin", cache: "no-store" });
      if (answer.status === 401) { status.textContent = "Session ended: log in again."; return; }
      if (!answer.ok) throw new Error("HTTP " + answer.status);
      const body = await answer.json();
      const known = new Set();
      for (const row of body.data) {
        known.add(row.version);
        const tr = [...table.tBodies[0].rows].find((r) => r.dataset.version === row.version);
        if (!tr) { window.location.reload(); return; }  // a version was loaded
        for (const cell of tr.querySelectorAll("td[data-field]")) {
          cell.textContent = String(row[cell.dataset.field]);
        }
      }
      const tenants = document.getElementById("live-tenants");
      if (tenants && body.tenants) {
        for (const row of body.tenants) {
          const key = row.model + "|" + row.tenant;
          const tr = [...tenants.tBodies[0].rows].find((r) => r.dataset.key === key);
          if (!tr) { window.location.reload(); return; }  // a tenant's first request
          for (const cell of tr.querySelectorAll("td[data-field]")) {
            cell.textContent = String(row[cell.dataset.field]);
          }
        }
      }
      status.textContent = "Updated " + new Date().toLocaleTimeString() + ".";
    } catch (error) {
      status.textContent = "Refresh failed (" + error.message + "); retrying.";
    }
    window.setTimeout(refresh, 3000);
  }
  window.setTimeout(refresh, 3000);
});
