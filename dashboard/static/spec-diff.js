// Pure comparison of job specs for the compare view: the fields whose values differ between the jobs, grouped
// by their top-level section. A field that is null, empty or missing counts as unset; a field unset in every
// job is never shown, so a script job beside a catalog job lists what really differs, not every default.

// Every leaf of a spec as "a.b.c" -> value, so nested fields compare one by one.
export function flatSpec(value, prefix = "", out = {}) {
  if (value && typeof value === "object" && !Array.isArray(value) && Object.keys(value).length) {
    for (const [k, v] of Object.entries(value)) flatSpec(v, prefix ? `${prefix}.${k}` : k, out);
  } else if (prefix) {
    out[prefix] = value;
  }
  return out;
}

const isUnset = (v) =>
  v === undefined || v === null || (Array.isArray(v) && !v.length) || (typeof v === "object" && !Array.isArray(v) && !Object.keys(v).length);

// The text of one value in the table; null for unset.
export const showValue = (v) => (isUnset(v) ? null : typeof v === "string" ? v : JSON.stringify(v));

// [{group, fields: [{field, path, values: [text or null per spec]}], onlyIn}], groups and fields sorted; `name`
// left out (the legend shows it). A group's fields drop the group prefix: "train" -> "lr", "schedule.name".
// `onlyIn` lists the specs that set the group's fields when the others set none of them (a script job has no
// `train` section): the view folds such a group into one line instead of a column of "unset".
export function specDiff(specs) {
  const flat = specs.map((s) => flatSpec(s || {}));
  const paths = [...new Set(flat.flatMap((f) => Object.keys(f)))].filter((p) => p !== "name").sort();
  const groups = new Map();
  for (const path of paths) {
    const values = flat.map((f) => showValue(f[path]));
    if (values.every((v) => v === null) || new Set(values).size === 1) continue;
    const dot = path.indexOf(".");
    const group = dot < 0 ? "job" : path.slice(0, dot);
    const field = dot < 0 ? path : path.slice(dot + 1);
    if (!groups.has(group)) groups.set(group, []);
    groups.get(group).push({ field, path, values });
  }
  // Top-level scalars (kind, retries, timeout_s) first as "job", then the sections in name order.
  const order = [...groups.keys()].sort((a, b) => (a === "job" ? -1 : b === "job" ? 1 : a.localeCompare(b)));
  return order.map((group) => ({ group, fields: groups.get(group), onlyIn: onlyIn(groups.get(group), specs.length) }));
}

function onlyIn(fields, count) {
  const setters = (f) => f.values.flatMap((v, i) => (v === null ? [] : [i]));
  const first = setters(fields[0]).join(",");
  if (!fields.every((f) => setters(f).join(",") === first)) return null;
  const used = new Set(fields.flatMap(setters));
  const bare = Array.from({ length: count }, (_, i) => i).filter((i) => !used.has(i));
  // Folded only when some spec sets the section's fields and another sets none of them.
  return bare.length && fields.every((f) => bare.every((i) => f.values[i] === null)) && first ? first.split(",").map(Number) : null;
}
