// The jobs table: polled every 2 s, with ticks that pick jobs for the compare view and survive each refresh.
import { api, quiet } from "./api.js";
import { $, badge, el, sleep, toast } from "./dom.js";
import { ago, fmtNum, fmtPriority, MISSING, progressPercent, ran, throughput, totalSteps } from "./format.js";
import { shown } from "./metric-names.js";
import { isCurrent, show } from "./view.js";

const JOBS_POLL_MS = 2000;
const picked = new Set();

export async function openJobs(gen, signal) {
  show("jobs-view");
  document.title = "Jobs · torchyard";
  while (isCurrent(gen)) {
    try {
      await refreshJobs(signal);
    } catch (err) {
      if (quiet(err)) return;
      if (err.status) toast(`Could not list jobs: ${err.detail}`, "error");
    }
    await sleep(JOBS_POLL_MS, signal);
  }
}

export function progressBar(status, step, total) {
  const pct = progressPercent(status, step, total);
  const bar = el("div", { class: `bar ${status}` });
  bar.style.width = `${pct}%`;
  const label = step === null || step === undefined ? MISSING : total ? `${step}/${total}` : String(step);
  return el("div", { class: "mini", dataset: { pct: String(Math.round(pct)) } }, el("div", { class: "progress" }, bar), el("span", {}, label));
}

export async function refreshJobs(signal) {
  const status = $("status-filter").value;
  const query = new URLSearchParams({ limit: "100" });
  if (status) query.append("status", status);
  const page = await api(`/v1/jobs?${query}`, { signal });
  const rows = page.items.map((job) => {
    const open = () => (location.hash = `#/jobs/${job.id}`);
    return el(
      "tr",
      { dataset: { jobId: job.id, status: job.status }, tabindex: "0", onclick: open, onkeydown: (e) => e.key === "Enter" && open() },
      el("td", { class: "pick", onclick: (e) => e.stopPropagation() }, pickBox(job.id)),
      el("td", { class: "name" }, el("a", { href: `#/jobs/${job.id}` }, job.name)),
      el("td", { class: "mono" }, job.id),
      el("td", {}, badge(job.status)),
      el("td", { class: "num", dataset: { col: "priority" } }, fmtPriority(job)),
      el("td", {}, progressBar(job.status, job.last_step, totalSteps(job.spec))),
      el("td", { class: "num" }, fmtNum(shown(job.latest_metrics, "train/loss"))),
      el("td", { class: "num" }, throughput(job.latest_metrics)),
      el("td", { class: "num" }, job.max_attempts ? `${job.attempt}/${job.max_attempts}` : String(job.attempt)),
      el("td", { title: job.created_at }, ago(job.created_at)),
      el("td", { class: "num" }, ran(job)),
    );
  });
  $("jobs-table").tBodies[0].replaceChildren(...rows);
  $("jobs-empty").hidden = rows.length > 0;
}

function pickBox(id) {
  const box = el("input", { type: "checkbox", "aria-label": `compare job ${id}`, dataset: { pick: id } });
  box.checked = picked.has(id);
  box.addEventListener("change", () => {
    if (box.checked) picked.add(id);
    else picked.delete(id);
    updateCompareButton();
  });
  return box;
}

function updateCompareButton() {
  const btn = $("compare-btn");
  btn.disabled = picked.size < 2;
  btn.textContent = picked.size ? `Compare (${picked.size})` : "Compare";
}

$("compare-btn").addEventListener("click", () => {
  if (picked.size >= 2) location.hash = `#/compare/${[...picked].join(",")}`;
});
$("status-filter").addEventListener("change", () => refreshJobs().catch(() => {}));
