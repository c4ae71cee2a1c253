// A job's checkpoints table and its logs, each fetched on demand.
import { api, quiet, routeMissing } from "./api.js";
import { $, el, toast } from "./dom.js";
import { ago } from "./format.js";

export async function loadCheckpoints(current, signal) {
  try {
    const { items } = await api(`/v1/jobs/${current.id}/checkpoints`, { signal });
    // keep_last deletes old checkpoints' files: their rows stay, marked, so the step history reads right.
    const rows = items.map((c) =>
      el("tr", c.available === false ? { class: "pruned", title: "pruned by keep_last: its files are gone" } : {},
        el("td", { class: "num" }, String(c.step)), el("td", { class: "num" }, c.epoch ?? "–"),
        el("td", { class: "mono" }, c.available === false ? `${c.path} (pruned)` : c.path),
        el("td", { title: c.created_at }, ago(c.created_at))));
    $("checkpoints").tBodies[0].replaceChildren(...rows);
    $("checkpoints-empty").hidden = rows.length > 0;
  } catch (err) {
    if (!quiet(err)) toast(`Could not load checkpoints: ${err.detail}`, "error");
  }
}

export function fillRanks(job) {
  // nproc_per_node "gpu": the ranks are known once placed; until then "all ranks" and the launcher.
  const product = (job.spec.parallel?.nproc_per_node ?? 1) * (job.spec.parallel?.nnodes ?? 1);
  const world = Number.isInteger(product) ? product : 0;
  const rankSel = $("log-rank");
  if (rankSel.options.length !== world + 2) {
    const ranks = Array.from({ length: world }, (_, r) => el("option", { value: String(r) }, `rank ${r}`));
    rankSel.replaceChildren(el("option", { value: "all" }, "all ranks"), ...ranks, el("option", { value: "launcher" }, "launcher"));
    rankSel.value = "all"; // every rank's output as printed, each line prefixed [rank N]
  }
}

export async function loadLogs(current, signal) {
  const pre = $("logs");
  const rank = $("log-rank").value || "all";
  const query = new URLSearchParams({ tail: "300" });
  if (rank !== "all") query.set("rank", rank); // a rank number, or "launcher" for torchrun's own log
  try {
    const res = await api(`/v1/jobs/${current.id}/logs?${query}`, { signal, raw: true, headers: { Accept: "text/plain" } });
    const text = await res.text();
    const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
    pre.textContent = text || "(empty)";
    if (atBottom) pre.scrollTop = pre.scrollHeight;
  } catch (err) {
    if (quiet(err)) return;
    if (err.status === 404) {
      // No log for that rank yet, or a server without the logs endpoint: show what the job row keeps.
      current.logsMissing = routeMissing(err);
      const tail = current.job?.error?.log_tail;
      pre.textContent = tail ? `${tail}\n\n(the failing rank's last lines)` : current.logsMissing ? "This API does not serve logs yet." : "No log yet.";
    } else {
      pre.textContent = `Could not load logs: ${err.detail}`;
    }
  }
}
