// Copies the built uPlot files from node_modules into static/vendor/ (run `npm ci && npm run vendor`
// after changing the uplot version in package.json). The copies are committed: the service needs no
// npm, no build step and no CDN at run time.
import { copyFileSync, mkdirSync, readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const src = join(here, "node_modules", "uplot");
const out = join(here, "static", "vendor");
mkdirSync(out, { recursive: true });
const files = [
  ["dist/uPlot.iife.min.js", "uPlot.iife.min.js"],
  ["dist/uPlot.min.css", "uPlot.min.css"],
  ["LICENSE", "uPlot.LICENSE"],
];
for (const [from, to] of files) copyFileSync(join(src, from), join(out, to));
const { version } = JSON.parse(readFileSync(join(src, "package.json"), "utf8"));
console.log(`vendored uPlot ${version} into ${out}`);
