// Reads a Chrome trace with Chrome DevTools' own trace engine (@paulirish/trace_engine, the
// npm build of DevTools' models/trace) and prints what it made of it, as JSON:
//   node chrome_trace_engine.mjs ENGINE_DIR TRACE_FILE
const [engineDir, traceFile] = process.argv.slice(2);
const {analyzeTrace} = await import(`${engineDir}/analyze-trace.mjs`);
const {parsedTrace} = await analyzeTrace(traceFile);
const data = parsedTrace.data;
const processes = {};
for (const [pid, event] of data.Meta.processNames) processes[pid] = event.args.name;
const threads = [];
for (const [pid, proc] of data.Renderer.processes) {
  for (const [tid, thread] of proc.threads) {
    threads.push({pid, tid, name: thread.name, entries: thread.entries.map((e) => e.name),
                  roots: thread.tree ? thread.tree.roots.size : 0});
  }
}
console.log(JSON.stringify({generic: data.Meta.traceIsGeneric, processes, threads,
                            bounds: data.Meta.traceBounds}));
