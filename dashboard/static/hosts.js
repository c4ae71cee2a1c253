// The hosts view: each worker's host with its GPUs as cells (the job that holds each), its CPU slots in use,
// when its worker last reported, and its state (draining, drained; a quarantined GPU's reason in its cell). Polled like the jobs table.
import { api, quiet, routeMissing } from "./api.js";
import { $, el, jobLink, sleep, toast } from "./dom.js";
import { ago, gpuState } from "./format.js";
import { isCurrent, show } from "./view.js";

const HOSTS_POLL_MS = 2000;

export async function openHosts(gen, signal) {
  show("hosts-view");
  document.title = "Hosts · torchyard";
  while (isCurrent(gen)) {
    try {
      // The running jobs the caller may see, for their names: a GPU cell names its job, not only its id.
      const [{ items }, names] = await Promise.all([api("/v1/hosts", { signal }), runningNames(signal)]);
      if (!isCurrent(gen)) return;
      $("hosts").replaceChildren(...items.map((h) => hostCard(h, names)));
      $("hosts-empty").hidden = items.length > 0;
    } catch (err) {
      if (quiet(err)) return;
      if (routeMissing(err)) {
        $("hosts-empty").textContent = "This API does not list hosts yet.";
        $("hosts-empty").hidden = false;
        return;
      }
      if (err.status) toast(`Could not list hosts: ${err.detail}`, "error");
    }
    await sleep(HOSTS_POLL_MS, signal);
  }
}

// The admin names every owner's running jobs (owner=*); any other key its own, as the API answers it 403 there.
async function runningNames(signal) {
  for (const everyone of [true, false]) {
    try {
      const page = await api(`/v1/jobs?status=running&status=cancelling&limit=500${everyone ? "&owner=*" : ""}`, { signal });
      return new Map(page.items.map((j) => [j.id, j.name]));
    } catch (err) {
      if (quiet(err)) throw err;
      if (!(everyone && err.status === 403)) break;
    }
  }
  return new Map(); // ids alone still say which job holds a GPU
}

function hostCard(host, names) {
  const used = host.gpus.filter((g) => g.busy).length;
  const cells = host.gpus.map((gpu) => {
    const s = gpuState(gpu);
    return el("div", { class: `gpu ${s.state}`, dataset: { gpu: String(gpu.index), state: s.state, ...(s.jobId ? { jobId: s.jobId } : {}) } },
      el("span", { class: "gpu-index" }, `GPU ${gpu.index}`),
      ...(s.jobId ? [el("span", { class: "gpu-job name" }, names.get(s.jobId) ?? ""), jobLink(s.jobId)] : [el("span", { class: "gpu-job" }, s.text)]));
  });
  const facts = [
    host.gpus.length ? `${used}/${host.gpus.length} GPUs in use` : "no GPUs",
    `CPU slots ${host.cpu_slots.used}/${host.cpu_slots.total} used`,
    host.alive ? `last seen ${ago(host.last_seen)}` : "worker stopped",
    `queues ${host.queues.join(", ") || "–"}`,
  ];
  if (host.executor !== "local") facts.push(`executor ${host.executor}`);
  // A drain says why; "drained" once nothing runs there any more (GET /v1/hosts derives it).
  const state = host.state && host.state !== "ready"
    ? [el("span", { class: "badge queued", dataset: { hostState: host.state } }, `${host.state}: ${host.reason ?? ""}`)] : [];
  return el("div", { class: `card host${host.alive ? "" : " gone"}`, dataset: { hostId: host.id, alive: String(host.alive) } },
    el("div", { class: "host-head" }, el("h2", { class: "mono" }, host.id),
      el("span", { class: `badge ${host.alive ? "running" : "cancelled"}` }, host.alive ? "alive" : "down"), ...state),
    el("p", { class: "meta", dataset: { cpuSlots: `${host.cpu_slots.used}/${host.cpu_slots.total}` } }, facts.join(" · ")),
    cells.length ? el("div", { class: "gpus" }, ...cells) : el("p", { class: "empty" }, "CPU-only host"));
}
