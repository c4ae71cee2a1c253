// torchyard dashboard: plain JavaScript ES modules, no build step. This module routes between the views and
// handles signing in; each view is a module of its own. Every piece of server data is put on the page as text
// (textContent), never parsed as markup.
import { api, hasKey, setKey, whenUnauthorized } from "./api.js";
import { destroyCharts } from "./charts.js";
import { destroyCompare, openCompare } from "./compare.js";
import { $ } from "./dom.js";
import { openHosts } from "./hosts.js";
import { destroyUsage, openUsage } from "./usage.js";
import { openJob, wireJobButtons } from "./job-view.js";
import { openJobs } from "./jobs-list.js";
import { destroySweeps, openSweeps } from "./sweep.js";
import { show, view } from "./view.js";

let viewAbort = null;

function signOut(message) {
  setKey(null);
  route();
  if (message) {
    const e = $("login-error");
    e.textContent = message;
    e.hidden = false;
  }
}

function route() {
  view.generation += 1;
  const gen = view.generation;
  viewAbort?.abort();
  viewAbort = new AbortController();
  const signal = viewAbort.signal;
  destroyCharts();
  destroyCompare();
  destroySweeps();
  destroyUsage();
  if (!hasKey()) {
    show("login-view");
    $("key-input").focus();
    return;
  }
  const job = location.hash.match(/^#\/jobs\/([A-Za-z0-9_-]+)/);
  const compare = location.hash.match(/^#\/compare\/([A-Za-z0-9_,-]+)/);
  if (job) openJob(job[1], gen, signal);
  else if (compare) openCompare(compare[1].split(",").filter(Boolean), gen, signal);
  else if (/^#\/hosts\/?$/.test(location.hash)) openHosts(gen, signal);
  else if (/^#\/usage\/?$/.test(location.hash)) openUsage(gen, signal);
  else if (location.hash.startsWith("#/sweeps")) {
    show("sweeps-view");
    openSweeps(location.hash, gen, signal);
  }
  else openJobs(gen, signal);
}

$("login-form").addEventListener("submit", async (e) => {
  e.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  setKey(key, false);
  $("login-error").hidden = true;
  try {
    await api("/v1/jobs?limit=1");
  } catch (err) {
    if (err.status !== 401) {
      setKey(null);
      $("login-error").textContent = `Could not check the key: ${err.detail}`;
      $("login-error").hidden = false;
    }
    return;
  }
  setKey(key, true);
  $("key-input").value = "";
  route();
});

whenUnauthorized(signOut);
wireJobButtons(route);
$("signout").addEventListener("click", () => signOut());
window.addEventListener("hashchange", route);
route();
