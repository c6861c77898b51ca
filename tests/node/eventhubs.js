// A reader of the hub's Event Hubs-compatible endpoint on the official Node SDK
// (@azure/event-hubs, unmodified), driven by the Python suites through subprocess. Its
// configuration is one JSON argument (process.argv[2]):
//
//   {"connectionString": "Endpoint=sb://...;SharedAccessKeyName=...;SharedAccessKey=...;EntityPath=...",
//    "consumerGroup": "$Default", "customEndpointAddress": "amqps://localhost:5671",
//    "expected": n, "timeoutMs": n,
//    "startPosition": "earliest" | "latest" | {"sequenceNumber": n} | {"offset": "..."} |
//                     {"enqueuedOn": ms} (+ optional "isInclusive") |
//                     {"<partitionId>": <one of those objects>, ...},
//    "partitionId": "0"             (optional: read one partition instead of all),
//    "skipParsingBodyAsJson": bool  (optional, default true: see eventLine),
//    "exitOnError": bool            (optional: exit 3 on the first processError)}
//     -> one JSON line per received event on stdout:
//        {"partitionId", "sequenceNumber", "offset", "enqueuedTimeUtc" (ms), "body" (string),
//         "bodyType", "rawSections" ({header, footer, properties, applicationProperties}: each
//         section's set fields, or null when the event had no such section),
//         "properties", "systemProperties", "messageId", "correlationId",
//         "contentType", "partitionKey"}
//        exit 0 once `expected` events have arrived, 2 when timeoutMs passes first.
//
//   {"op": "properties", "connectionString", "consumerGroup", "customEndpointAddress", "timeoutMs"}
//     -> {"eventHub": {"name", "createdOn" (ms), "partitionIds", "isGeoDrEnabled"},
//         "partitions": [{"eventHubName", "partitionId", "beginningSequenceNumber",
//                         "lastEnqueuedSequenceNumber", "lastEnqueuedOffset",
//                         "lastEnqueuedOnUtc" (ms), "isEmpty"}, ...]}, exit 0 (2 on timeout).
//
// processError reports go to stderr as JSON lines {"error", "message", "code", "partitionId"}.
// stderr may also carry Node's own warnings (e.g. DEP0123 when customEndpointAddress is an IP
// address, since the SDK then uses it as the TLS server name), so readers must skip non-JSON.
//
// The hub's CA comes from NODE_EXTRA_CA_CERTS, the SDK from NODE_PATH, both set by the caller.
'use strict';

const {
  EventHubConsumerClient,
  earliestEventPosition,
  latestEventPosition,
} = require('@azure/event-hubs');

// A close that hangs (a hub that stopped answering detach/close) must not turn a result into a
// harness timeout: the answer is already on stdout by then.
const CLOSE_GRACE_MS = 5000;

// JSON cannot carry Date or Buffer; the SDK hands both out in systemProperties (creation-time,
// iothub-enqueuedtime, user-id, ...) and sometimes in properties, so normalize recursively.
function plain(value) {
  if (value === null || value === undefined) return null;
  if (value instanceof Date) return value.getTime();
  if (Buffer.isBuffer(value) || value instanceof Uint8Array) return Buffer.from(value).toString('utf-8');
  if (typeof value === 'bigint') return value.toString();
  if (Array.isArray(value)) return value.map(plain);
  if (typeof value === 'object') {
    const out = {};
    for (const [k, v] of Object.entries(value)) out[k] = plain(v);
    return out;
  }
  return value;
}

// The body as text. With skipParsingBodyAsJson (our default) a data section arrives as the exact
// bytes the device sent; otherwise the SDK has already JSON.parse()d it when it could, and the
// re-serialization below need not match the original bytes (whitespace, a quoted string).
function bodyText(body) {
  if (body === null || body === undefined) return null;
  if (Buffer.isBuffer(body) || body instanceof Uint8Array) return Buffer.from(body).toString('utf-8');
  if (typeof body === 'string') return body;
  if (typeof body === 'object') return JSON.stringify(plain(body));
  return String(body);
}

// Which AMQP sections the event arrived with, and the set fields of each (null when absent).
function rawSections(raw) {
  const section = (s) => (s === undefined || s === null ? null : plain(Object.fromEntries(
    Object.entries(s).filter(([, v]) => v !== undefined && v !== null))));
  return {
    header: section(raw.header),
    footer: section(raw.footer),
    properties: section(raw.properties),
    applicationProperties: section(raw.applicationProperties),
  };
}

function eventLine(partitionId, event) {
  let bodyType = null;
  let sections = null;
  try {
    const raw = event.getRawAmqpMessage();
    bodyType = raw.bodyType || null;
    sections = rawSections(raw);
  } catch (e) {
    // Only informational; never lose the event over it.
  }
  return {
    partitionId,
    sequenceNumber: event.sequenceNumber,
    offset: event.offset,
    enqueuedTimeUtc: plain(event.enqueuedTimeUtc),
    body: bodyText(event.body),
    bodyType,
    rawSections: sections,
    properties: plain(event.properties || {}),
    systemProperties: plain(event.systemProperties || {}),
    messageId: plain(event.messageId),
    correlationId: plain(event.correlationId),
    contentType: event.contentType === undefined ? null : event.contentType,
    partitionKey: event.partitionKey === undefined ? null : event.partitionKey,
  };
}

const POSITION_KEYS = ['offset', 'sequenceNumber', 'enqueuedOn', 'isInclusive'];

function eventPosition(spec) {
  if (spec === undefined || spec === null || spec === 'earliest') return earliestEventPosition;
  if (spec === 'latest') return latestEventPosition;
  if (typeof spec !== 'object') throw new Error(`unknown startPosition ${JSON.stringify(spec)}`);
  return { ...spec };
}

// One position for every partition, or a map partitionId -> position (the SDK accepts both).
function startPosition(spec) {
  if (spec && typeof spec === 'object' && !Object.keys(spec).some((k) => POSITION_KEYS.includes(k))) {
    const perPartition = {};
    for (const [id, p] of Object.entries(spec)) perPartition[id] = eventPosition(p);
    return perPartition;
  }
  return eventPosition(spec);
}

function writeLine(stream, obj) {
  stream.write(JSON.stringify(obj) + '\n');
}

// Exit only once stdout has taken everything: the caller reads events from it.
function finish(code) {
  process.stdout.write('', () => process.exit(code));
}

function withGrace(promise) {
  return Promise.race([
    Promise.resolve(promise).catch(() => {}),
    new Promise((resolve) => setTimeout(resolve, CLOSE_GRACE_MS).unref()),
  ]);
}

function newClient(config) {
  const options = {};
  if (config.customEndpointAddress) options.customEndpointAddress = config.customEndpointAddress;
  return new EventHubConsumerClient(config.consumerGroup || '$Default', config.connectionString, options);
}

async function properties(config) {
  const client = newClient(config);
  const abort = AbortSignal.timeout(config.timeoutMs);
  let code = 0;
  try {
    const hub = await client.getEventHubProperties({ abortSignal: abort });
    const partitions = [];
    for (const id of hub.partitionIds) {
      partitions.push(plain(await client.getPartitionProperties(id, { abortSignal: abort })));
    }
    writeLine(process.stdout, { eventHub: plain(hub), partitions });
  } catch (e) {
    // The SDK retries refused management calls until the signal fires; report that as the
    // same timeout exit as receive, with the last error it saw.
    if (!abort.aborted) throw e;
    writeLine(process.stderr, { error: 'Timeout', message: String(e && (e.message || e)) });
    code = 2;
  } finally {
    await withGrace(client.close());
  }
  finish(code);
}

function receive(config) {
  const client = newClient(config);
  let received = 0;
  let ending = false;
  let subscription = null;

  async function end(code) {
    if (ending) return;
    ending = true;
    clearTimeout(timer);
    if (subscription) await withGrace(subscription.close());
    await withGrace(client.close());
    finish(code);
  }

  const timer = setTimeout(() => {
    writeLine(process.stderr, { error: 'Timeout', message: `${received} of ${config.expected} events in ${config.timeoutMs} ms` });
    end(2);
  }, config.timeoutMs);

  const handlers = {
    processEvents: async (events, context) => {
      // Events already delivered while closing are still printed: a test counting exactly
      // `expected` must see any surplus rather than have it hidden.
      for (const event of events) {
        writeLine(process.stdout, eventLine(context.partitionId, event));
        received += 1;
      }
      // Not awaited: closing the subscription waits for this handler to return.
      if (received >= config.expected) end(0);
    },
    processError: async (err, context) => {
      writeLine(process.stderr, {
        error: (err && err.name) || 'Error',
        message: String(err && (err.message || err)),
        code: (err && err.code) || null,
        partitionId: (context && context.partitionId) || null,
      });
      if (config.exitOnError) end(3);
    },
  };
  const options = {
    startPosition: startPosition(config.startPosition),
    maxBatchSize: 100,
    // Short, so a batch smaller than maxBatchSize is handed over promptly instead of after 60 s.
    maxWaitTimeInSeconds: 1,
    skipParsingBodyAsJson: config.skipParsingBodyAsJson !== false,
  };
  subscription = config.partitionId !== undefined && config.partitionId !== null
    ? client.subscribe(String(config.partitionId), handlers, options)
    : client.subscribe(handlers, options);
}

function main() {
  if (process.argv.length < 3) {
    process.stderr.write('usage: node eventhubs.js \'{"connectionString": ..., ...}\'\n');
    process.exit(1);
  }
  const config = JSON.parse(process.argv[2]);
  if (!config.connectionString) throw new Error('connectionString is required');
  if (!(config.timeoutMs > 0)) throw new Error('timeoutMs must be a positive number');
  if (config.op === 'properties') return properties(config);
  if (!(Number.isInteger(config.expected) && config.expected > 0)) {
    throw new Error('expected must be a positive integer');
  }
  return receive(config);
}

Promise.resolve()
  .then(main)
  .catch((e) => {
    process.stderr.write(String(e && (e.stack || e)) + '\n');
    process.exit(1);
  });
