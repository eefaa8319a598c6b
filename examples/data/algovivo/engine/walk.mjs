// Runs an algovivo policy file on an algovivo mesh file in algovivo itself (its release bundle and
// WebAssembly build, beside this file), deterministically from rest, as algovivo's test/nn does:
// each step policy.step() then system.step(). Prints {"pos": [steps + 1][N][2]} as JSON.
// Usage: node walk.mjs MESH POLICY STEPS
import { readFileSync } from "fs";
import { fileURLToPath } from "url";
import * as algovivo from "./algovivo.min.js";

const [mesh, policyFile, steps] = process.argv.slice(2);
if (!policyFile || !(Number(steps) >= 0)) {
  console.error("usage: node walk.mjs MESH POLICY STEPS (STEPS a non-negative integer)");
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
console.log(JSON.stringify({ pos }));
