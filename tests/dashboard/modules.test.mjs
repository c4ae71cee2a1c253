// The dashboard's pure modules under node's test runner (no browser): what the page will print for a
// given job JSON. Run by test_modules.py.
import assert from "node:assert/strict";
import { test } from "node:test";

import { fmtBytes, fmtPriority, gpuState, progressPercent } from "../../dashboard/static/format.js";
import { errorIsHistory, preemptingJob, resumedFromStep, timeline } from "../../dashboard/static/lineage.js";
import { specDiff } from "../../dashboard/static/spec-diff.js";

test("a succeeded job's bar is full whatever its step count; others follow their steps", () => {
  assert.equal(progressPercent("succeeded", null, null), 100); // a script job: no steps, no total
  assert.equal(progressPercent("succeeded", 40, 128), 100);
  assert.equal(progressPercent("running", 32, 128), 25);
  assert.equal(progressPercent("failed", 500, 128), 100);
  assert.equal(progressPercent("cancelled", 7, null), 0);
});

test("priority shows as a number, a dash where the API sends none", () => {
  assert.equal(fmtPriority({ priority: 80 }), "80");
  assert.equal(fmtPriority({ priority: 0 }), "0");
  assert.equal(fmtPriority({}), "–");
});

test("bytes in binary units", () => {
  assert.equal(fmtBytes(3.531e8), "336.7 MiB");
  assert.equal(fmtBytes(512), "512 B");
});

test("a GPU cell names its job, or says busy for another owner's", () => {
  assert.deepEqual(gpuState({ index: 0, busy: true, job_id: "01abc" }), { state: "held", text: "01abc", jobId: "01abc" });
  assert.equal(gpuState({ index: 1, busy: true, job_id: null }).state, "busy");
  assert.equal(gpuState({ index: 2, busy: false, job_id: null }).text, "free");
  assert.deepEqual(gpuState({ index: 3, busy: false, job_id: null, state: "quarantined", reason: "2 device faults" }),
    { state: "quarantined", text: "quarantined: 2 device faults", jobId: null });
});

test("lineage: the step resumed from, and the job that preempted", () => {
  const job = {
    status: "succeeded", error: { type: "worker_lost" },
    attempts: [{ attempt: 1, resumed_from_step: null }, { attempt: 2, resumed_from_step: 740 }],
    transitions: [
      { at: "2026-11-25T10:00:00Z", from_status: "queued", to_status: "running", attempt: 1, reason: "placed on gpu-a" },
      { at: "2026-11-25T10:05:00Z", from_status: "running", to_status: "queued", attempt: 1,
        reason: "preempted by job 01HXYZ_ab-9 (priority 80)" },
    ],
  };
  assert.equal(resumedFromStep(job), 740);
  assert.equal(resumedFromStep({ attempts: [] }), null);
  assert.deepEqual(timeline(job).map((t) => t.preemptedBy), [null, "01HXYZ_ab-9"]);
  assert.equal(preemptingJob("cancelled by alice"), null);
  assert.equal(errorIsHistory(job), true);
  assert.equal(errorIsHistory({ ...job, status: "failed" }), false);
});

test("spec diff: a script job beside a catalog job lists only what differs, grouped, nothing unset on all sides", () => {
  const catalog = { kind: "catalog", name: "a", profile: null, eval: { every_steps: null }, train: { lr: 0.01, epochs: 1 },
    model: { name: "mlp", args: {} }, parallel: { nproc_per_node: 1 } };
  const script = { kind: "script", name: "b", code: null, args: [], entrypoint: "train.py", parallel: { nproc_per_node: 1 } };
  const groups = specDiff([catalog, script]);
  assert.deepEqual(groups.map((g) => g.group), ["job", "model", "train"]);
  assert.deepEqual(groups[0].fields.map((f) => [f.field, f.values]), [["entrypoint", [null, "train.py"]], ["kind", ["catalog", "script"]]]);
  assert.deepEqual(groups[2].fields.map((f) => f.field), ["epochs", "lr"]);
  // Sections only the catalog job has fold; the top-level fields, set on both sides in part, do not.
  assert.deepEqual(groups.map((g) => g.onlyIn), [null, [0], [0]]);
  const lr = (v) => ({ kind: "catalog", train: { lr: v, epochs: 1 } });
  assert.deepEqual(specDiff([lr(0.1), lr(0.2)]), [{ group: "train", onlyIn: null, fields: [{ field: "lr", path: "train.lr", values: ["0.1", "0.2"] }] }]);
  assert.deepEqual(specDiff([catalog, catalog]), []);
});

test("spec diff over random specs: every row differs and has a value; every differing set field has a row", () => {
  let seed = 7;
  const rand = (n) => ((seed = (seed * 1103515245 + 12345) % 2 ** 31), seed % n);
  const pick = () => [null, undefined, [], {}, 0, 1, "x", "y", [1], { v: rand(2) }][rand(10)];
  for (let round = 0; round < 300; round++) {
    const specs = Array.from({ length: 2 + rand(3) }, () => {
      const s = { train: {}, model: {} };
      for (const key of ["a", "b", "c"]) {
        const v = pick();
        if (v !== undefined) s.train[key] = v;
        const w = pick();
        if (w !== undefined) s[key] = w;
      }
      return s;
    });
    const rows = specDiff(specs).flatMap((g) => g.fields);
    for (const row of rows) {
      assert.ok(row.values.some((v) => v !== null), `${row.path} is unset everywhere`);
      assert.ok(new Set(row.values).size > 1, `${row.path} is the same everywhere`);
    }
    for (const key of ["a", "b", "c"]) {
      const shown = specs.map((s) => JSON.stringify(s.train[key] ?? null));
      const empty = (t) => t === "null" || t === "[]" || t === "{}";
      const differs = new Set(shown.map((t) => (empty(t) ? "null" : t))).size > 1;
      // A nested object is compared field by field, so only plain values are checked here.
      if (shown.some((t) => t.startsWith("{") && t !== "{}")) continue;
      assert.equal(rows.some((r) => r.path === `train.${key}`), differs, `train.${key}: ${shown}`);
    }
  }
});

test("Lightning's names fill the loss columns; train/loss first where both are logged", async () => {
  const { shown } = await import("../../dashboard/static/metric-names.js");
  assert.equal(shown({ train_loss_step: 0.4, val_loss: 0.6 }, "train/loss"), 0.4);
  assert.equal(shown({ train_loss: 0.5 }, "train/loss"), 0.5);
  assert.equal(shown({ "train/loss": 0.1, train_loss: 0.5 }, "train/loss"), 0.1);
  assert.equal(shown({ val_loss: 0.6 }, "eval/loss"), 0.6);
  assert.equal(shown({ lr: 0.01 }, "train/loss"), undefined);
  assert.equal(shown(undefined, "train/loss"), undefined);
});
