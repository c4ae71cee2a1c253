// Which view is current. Each render bumps the generation; loops and streams of an older one stop themselves.
export const view = { generation: 0 };
export const isCurrent = (gen) => gen === view.generation;

export function show(id) {
  for (const v of ["login-view", "jobs-view", "job-view", "compare-view", "hosts-view", "sweeps-view", "usage-view"]) document.getElementById(v).hidden = v !== id;
  document.getElementById("signout").hidden = id === "login-view";
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("here", a.dataset.view === id);
}
