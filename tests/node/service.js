// A back-end on the official Node service SDK (azure-iothub), unmodified, driven by
// tests/python/test_node_sdk.py: reads a JSON request on stdin, prints a JSON result on stdout.
//
//   {"op": "send", "connectionString": ..., "sends": [{"deviceId", "body", "messageId",
//     "ack", "expiryTimeUtc", "properties"}]}
//     -> {"sends": [null | "error text", ...]}
//   {"op": "burst", "connectionString": ..., "devices": [...], "count": n, "inflight": k}
//     -> one line {"accepted": messageId, "device": id} per send as soon as the hub accepts it
//        ({"failed": ..., "error": ...} ends that worker), then {"done": true}
//   {"op": "feedback", "connectionString": ..., "originalIds": [...], "abandonFirst": bool,
//     "timeoutMs": n}
//     -> {"batches": [{"records": [...], "settled": "abandon" | "complete"}]}
//   {"op": "fileNotifications", "connectionString": ..., "count": n, "abandonFirst": bool,
//     "timeoutMs": n}
//     -> {"notifications": [{"notification": {...}, "settled": "abandon" | "complete"}]}
//
// The hub's CA comes from NODE_EXTRA_CA_CERTS. Every wait is bounded by timeoutMs.
'use strict';

const { Client } = require('azure-iothub');
// The SDK's own Message class (it vendors azure-iot-common).
const { Message } = require('azure-iothub/dist/common-core/message');

const { readStdin } = require('./stdin');

async function send(client, sends) {
  const results = [];
  for (const s of sends) {
    const message = new Message(s.body);
    if (s.messageId) message.messageId = s.messageId;
    if (s.ack) message.ack = s.ack;
    if (s.expiryTimeUtc) message.expiryTimeUtc = s.expiryTimeUtc;
    for (const [k, v] of Object.entries(s.properties || {})) message.properties.add(k, v);
    try {
      await client.send(s.deviceId, message);
      results.push(null);
    } catch (e) {
      results.push(String(e && (e.message || e)));
    }
  }
  return { sends: results };
}

async function burst(client, request) {
  let next = 0;
  async function worker() {
    while (next < request.count) {
      const i = next++;
      const message = new Message(`burst body ${i}`);
      message.messageId = `burst-${i}`;
      const device = request.devices[i % request.devices.length];
      try {
        await client.send(device, message);
        process.stdout.write(JSON.stringify({ accepted: message.messageId, device }) + '\n');
      } catch (e) {
        process.stdout.write(JSON.stringify({ failed: message.messageId, error: String(e && (e.message || e)) }) + '\n');
        return;
      }
    }
  }
  await Promise.all(Array.from({ length: request.inflight }, worker));
  return { done: true };
}

function feedback(client, request) {
  const wanted = new Set(request.originalIds);
  const batches = [];
  let abandoned = false;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve({ batches, timedOut: true }), request.timeoutMs);
    client.getFeedbackReceiver((err, receiver) => {
      if (err) { clearTimeout(timer); reject(err); return; }
      receiver.on('errorReceived', (e) => batches.push({ error: String(e) }));
      receiver.on('message', (msg) => {
        const records = JSON.parse(msg.getData().toString('utf-8'));
        if (request.abandonFirst && !abandoned) {
          abandoned = true;
          batches.push({ records, settled: 'abandon' });
          receiver.abandon(msg, () => {});
          return;
        }
        batches.push({ records, settled: 'complete' });
        receiver.complete(msg, () => {
          for (const r of records) wanted.delete(r.originalMessageId || r.OriginalMessageId);
          if (wanted.size === 0) { clearTimeout(timer); resolve({ batches }); }
        });
      });
    });
  });
}

function fileNotifications(client, request) {
  const received = [];
  let abandoned = false;
  let completed = 0;
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve({ notifications: received, timedOut: true }), request.timeoutMs);
    client.getFileNotificationReceiver((err, receiver) => {
      if (err) { clearTimeout(timer); reject(err); return; }
      receiver.on('errorReceived', (e) => received.push({ error: String(e) }));
      receiver.on('message', (msg) => {
        const notification = JSON.parse(msg.getData().toString('utf-8'));
        if (request.abandonFirst && !abandoned) {
          abandoned = true;
          received.push({ notification, settled: 'abandon' });
          receiver.abandon(msg, () => {});
          return;
        }
        received.push({ notification, settled: 'complete' });
        receiver.complete(msg, () => {
          completed += 1;
          if (completed === request.count) { clearTimeout(timer); resolve({ notifications: received }); }
        });
      });
    });
  });
}

async function main() {
  const request = await readStdin();
  const client = Client.fromConnectionString(request.connectionString);
  await client.open();
  let result;
  try {
    if (request.op === 'send') result = await send(client, request.sends);
    else if (request.op === 'burst') result = await burst(client, request);
    else if (request.op === 'fileNotifications') result = await fileNotifications(client, request);
    else result = await feedback(client, request);
  } finally {
    await client.close();
  }
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
}

main().catch((e) => { process.stderr.write(String(e && (e.stack || e)) + '\n'); process.exit(1); });
