// Decodes broker messages with the CloudEvents JavaScript SDK, as a JavaScript consumer
// would: reads a JSON array of {binding, headers, key, body (base64)} on stdin and writes a
// JSON array of {attributes, dataKind, data (base64), error} on stdout.
import { HTTP, Kafka } from "cloudevents";

function decode(m) {
  const body = Buffer.from(m.body, "base64");
  switch (m.binding) {
    case "http": {
      // Node's http module hands header names lowercased.
      const headers = Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k.toLowerCase(), v]));
      return HTTP.toEvent({ headers, body: body.toString("utf8") });
    }
    case "kafka":
      return Kafka.toEvent({ headers: m.headers, key: m.key, value: body });
    case "nats": {
      // The SDK has no NATS binding. The NATS binding's headers follow the HTTP binding's
      // (ce- prefix, percent-encoded values), except datacontenttype, which NATS carries as
      // ce-datacontenttype and HTTP as Content-Type.
      const headers = Object.fromEntries(Object.entries(m.headers).map(([k, v]) => [k.toLowerCase(), v]));
      if ("ce-datacontenttype" in headers) {
        headers["content-type"] = headers["ce-datacontenttype"];
        delete headers["ce-datacontenttype"];
      }
      return HTTP.toEvent({ headers, body: body.toString("utf8") });
    }
  }
  throw new Error(`unknown binding ${m.binding}`);
}

function data(d) {
  if (d === undefined || d === null) return ["none", Buffer.alloc(0)];
  if (typeof d === "string") return ["string", Buffer.from(d, "utf8")];
  if (Buffer.isBuffer(d)) return ["bytes", d];
  // data_base64 becomes a typed array with one element per byte.
  if (ArrayBuffer.isView(d)) return ["bytes", Buffer.from(Array.from(d))];
  return ["json", Buffer.from(JSON.stringify(d), "utf8")];
}

const chunks = [];
for await (const c of process.stdin) chunks.push(c);
const out = JSON.parse(Buffer.concat(chunks).toString("utf8")).map((m) => {
  try {
    const ev = decode(m);
    const attributes = {};
    for (const [k, v] of Object.entries(ev)) {
      if (k !== "data" && k !== "data_base64" && v !== undefined) attributes[k] = String(v);
    }
    const [dataKind, bytes] = data(ev.data);
    return { attributes, dataKind, data: bytes.toString("base64") };
  } catch (e) {
    return { error: String(e && e.message ? e.message : e) };
  }
});
process.stdout.write(JSON.stringify(out));
