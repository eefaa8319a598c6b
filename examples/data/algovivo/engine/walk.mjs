// Runs an algovivo policy file on an algovivo mesh file in algovivo itself (its release bundle and
// WebAssembly build, beside this file), deterministically from rest, as algovivo's test/nn does:
// each step policy.step() then system.step(). Prints one line: how far the vertices' mean (algovivo's
// masses are equal, so the centre of mass) moved along +x; with OUT, writes {"pos": [steps + 1][N][2]} there
// as JSON (about 100 kB for the biped's 100 steps).
// Usage: node walk.mjs MESH POLICY STEPS [OUT]
import { readFileSync, writeFileSync } from "fs";
import { fileURLToPath } from "url";
import * as algovivo from "./algovivo.min.js";

const [mesh, policyFile, steps, out] = process.argv.slice(2);
if (!policyFile || !(Number(steps) >= 0)) {
  console.error("usage: node walk.mjs MESH POLICY STEPS [OUT] (STEPS a non-negative integer; OUT: a JSON file for the positions)");
  process.exit(2);
}
const wasm = await WebAssembly.instantiate(
  await WebAssembly.compile(readFileSync(fileURLToPath(new URL("algovivo.wasm", import.meta.url)))), {});
const m = JSON.parse(readFileSync(mesh));
const system = new algovivo.System({ wasmInstance: wasm });
system.set({ pos: m.pos, muscles: m.muscles, musclesL0: m.l0, triangles: m.triangles, trianglesRsi: m.rsi });
const policy = new algovivo.nn.MLPPolicy({ system, active: true });
policy.loadData(JSON.parse(readFileSync(policyFile)));
const pos = [system.pos.toArray()];
for (let i = 0; i < Number(steps); i++) {
  policy.step();
  system.step();
  pos.push(system.pos.toArray());
}
if (out) writeFileSync(out, JSON.stringify({ pos }));
const meanX = (p) => p.reduce((sum, v) => sum + v[0], 0) / p.length;
console.log(`${steps} steps: the centre of mass moved ${(meanX(pos[pos.length - 1]) - meanX(pos[0])).toFixed(4)} ` +
            `along +x${out ? `; positions in ${out}` : ""}`);
