// Building the page: elements from data (always as text, never parsed as markup), the toast, the connection
// light, and an abortable sleep for the views' polling loops.

export const $ = (id) => document.getElementById(id);

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c ?? ""));
  return node;
}

export const badge = (status) => el("span", { class: `badge ${status}`, "data-status": status }, status);

export const jobLink = (id, text = id) => el("a", { href: `#/jobs/${id}`, class: "mono", title: `job ${id}`, dataset: { jobLink: id } }, text);

let toastTimer = null;
export function toast(message, kind = "info") {
  const t = $("toast");
  t.textContent = message;
  t.className = `toast ${kind}`;
  t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => (t.hidden = true), 5000);
}

export function setConnection(ok) {
  const c = $("conn");
  c.textContent = ok ? "connected" : "API unreachable";
  c.className = ok ? "conn ok" : "conn bad";
}

export const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const t = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => { clearTimeout(t); resolve(); }, { once: true });
  });
