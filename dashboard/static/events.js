// GET /v1/jobs/{id}/events read with fetch() (EventSource cannot send an Authorization header), parsed as
// server-sent events and handed to `onEvent(type, payload)`. A dropped stream resumes from the last event id.
import { api, quiet, routeMissing } from "./api.js";
import { sleep } from "./dom.js";

// Resolves when the stream is done: `stop()` says so, the job is gone, or the key was refused. Resolves to
// "unsupported" on a server without the stream (the caller polls instead).
export async function streamEvents(id, { signal, stop, onEvent }) {
  let lastId = null;
  let failures = 0;
  while (!stop()) {
    let resumeNow = false;
    try {
      const headers = { Accept: "text/event-stream" };
      if (lastId) headers["Last-Event-ID"] = lastId;
      const res = await api(`/v1/jobs/${id}/events`, { signal, headers, raw: true });
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      let event = { type: "message", data: [], id: null };
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        failures = 0;
        buffer += value;
        let nl;
        while ((nl = buffer.search(/\r?\n/)) >= 0) {
          const line = buffer.slice(0, nl);
          buffer = buffer.slice(nl + (buffer[nl] === "\r" ? 2 : 1));
          if (line === "") {
            if (event.data.length) {
              if (event.id !== null) lastId = event.id;
              // "reconnect": the stream reached its lifetime on the server; the loop reopens it from lastId.
              if (event.type === "reconnect") resumeNow = true;
              else deliver(event, onEvent);
            }
            event = { type: "message", data: [], id: null };
            continue;
          }
          if (line.startsWith(":")) continue;
          const colon = line.indexOf(":");
          const field = colon < 0 ? line : line.slice(0, colon);
          let val = colon < 0 ? "" : line.slice(colon + 1);
          if (val.startsWith(" ")) val = val.slice(1);
          if (field === "event") event.type = val;
          else if (field === "data") event.data.push(val);
          else if (field === "id") event.id = val;
        }
      }
    } catch (err) {
      if (quiet(err)) return "done";
      if (err.status === 404 && routeMissing(err)) return "unsupported";
      if (err.status === 404) return "done"; // the job is gone
    }
    if (stop()) return "done";
    if (resumeNow) continue;
    failures += 1;
    await sleep(Math.min(500 * failures, 5000), signal); // dropped: resume from lastId
  }
  return "done";
}

function deliver(event, onEvent) {
  let payload;
  try {
    payload = JSON.parse(event.data.join("\n"));
  } catch {
    return;
  }
  onEvent(event.type, payload);
}
