// Devices and modules over AMQP through the official Node device SDK (azure-iot-device with
// azure-iot-device-amqp's Amqp and AmqpWs transports, unmodified), with the service side on
// azure-iothub and the built-in endpoint read by @azure/event-hubs; driven by
// tests/python/test_amqp_device.py. One JSON request on stdin, one JSON line on stdout:
//
//   {"op": "device", "transport": "Amqp" | "AmqpWs", "connectionString" | "sharedAccessSignature",
//    "x509": {"certFile", "keyFile"} (optional, with an `x509=true` connection string),
//    "module": bool (ModuleClient), "deviceId", "moduleId", "serviceConnectionString",
//    "connectionState": bool, "telemetry": [{"body", "messageId", "correlationId", "contentType",
//    "contentEncoding", "properties"}], "c2d": [{"messageId", "body", "properties", "plan":
//    ["complete" | "reject" | "abandon", ...]}], "twin": {"reported", "desired"},
//    "method": {"name", "payload", "status", "response"}, "timeoutMs"}
//     -> {"opened": true, "sent": [{"messageId", "result"}], "connectionState" (read once the
//         telemetry link is attached: open() alone attaches no device link),
//         "c2d": [{"messageId", "body", "ack", "properties", "action", "error"?}],
//         "twin": {"initial": {"desired", "reported"}, "serviceReported", "desiredPatch"},
//         "method": {"result": {"status", "payload"}, "request": {"methodName", "payload"}},
//         "closed": true, "events": [client 'error' / 'disconnect' events]}
//        or {"openError": {...}} when open() fails. The steps run in that order, each only when
//        asked for. C2D messages are sent by the service (Client.send, ack "full") once the
//        device listens; the device settles each delivery of a message with the next action of
//        its plan (its last action from then on), and the step ends when every plan is used up
//        and no delivery came for another second. The desired patch is sent (updateTwin with
//        etag "*") once the reported patch was answered, so the subscription (a PUT on the same
//        twin link, sent first) is in place. The method is invoked with connectTimeoutInSeconds.
//
//   {"op": "refusals", "transport", "good": connection string, "bad": [{"name",
//    "connectionString" | "sharedAccessSignature"}], "timeoutMs"}
//     -> {"bad": [{"name", "opened": bool, "error"}], "goodSent": result, "goodClosed": true}
//        The good device opens first and stays connected while each bad one tries to open.
//
//   {"op": "redirect", "iothubConnectionString" (HostName, SharedAccessKeyName,
//    SharedAccessKey), "deviceConnectionString", "telemetry": {...as above}, "consumerGroup",
//    "timeoutMs"}
//     -> {"sent", "redirect": {"condition", "info"}, "eventHubsConnectionString" (its key
//         elided), "event": {"body", "messageId", "correlationId", "contentType", "properties",
//         "systemProperties"}}
//        The device sends the message over Amqp; then, as the official @azure/event-hubs sample
//        iothubConnectionString.js does (rhea-promise, SASL PLAIN `{policy}@sas.root.{first
//        label of HostName}` with a token for `{HostName}/messages/events`, a receiver on
//        `amqps://{HostName}/messages/events/$management`, the `amqp:link:redirect` detach, the
//        entity taken from `info.address`), an Event Hubs connection string is built and an
//        EventHubConsumerClient reads from the earliest position until that message arrives.
//
// Exits 0 with that line; 2 when timeoutMs passes first (the line then carries what was done,
// with "timedOut": the step); 1 when a step throws (the line carries "failed": {"step",
// "error"}, stderr the stack). Every step is logged on stderr. The hub's CA comes from NODE_EXTRA_CA_CERTS, the SDKs from NODE_PATH.
'use strict';

const crypto = require('crypto');
const fs = require('fs');

const { Client, ModuleClient, Message } = require('azure-iot-device');
const { Amqp, AmqpWs } = require('azure-iot-device-amqp');
const { Client: ServiceClient, Registry } = require('azure-iothub');
const { Message: ServiceMessage } = require('azure-iothub/dist/common-core/message');

const { readStdin } = require('./stdin');

let out = {};
let currentStep = 'start';

function step(name) {
  currentStep = name;
  process.stderr.write(`step: ${name}\n`);
}

function describe(e) {
  return {
    name: (e && e.name) || (e && e.constructor && e.constructor.name) || 'Error',
    constructor: (e && e.constructor && e.constructor.name) || null,
    message: String((e && e.message) || e),
    condition: (e && e.amqpError && e.amqpError.condition) || undefined,
  };
}

function plain(value) {
  return value === undefined ? null : JSON.parse(JSON.stringify(value));
}

function finish(code) {
  process.stdout.write(JSON.stringify(out) + '\n', () => process.exit(code));
}

function transport(name) {
  switch (name) {
    case 'Amqp': return Amqp;
    case 'AmqpWs': return AmqpWs;
    default: throw new Error(`unknown transport ${name}`);
  }
}

function deviceClient(request) {
  const Kind = request.module ? ModuleClient : Client;
  const t = transport(request.transport || 'Amqp');
  if (request.sharedAccessSignature) return Kind.fromSharedAccessSignature(request.sharedAccessSignature, t);
  return Kind.fromConnectionString(request.connectionString, t);
}

function messageOf(spec) {
  const m = new Message(spec.body);
  for (const k of ['messageId', 'correlationId', 'contentType', 'contentEncoding']) {
    if (spec[k] !== undefined) m[k] = spec[k];
  }
  for (const [k, v] of Object.entries(spec.properties || {})) m.properties.add(k, v);
  return m;
}

function propertiesOf(message) {
  const props = {};
  for (let i = 0; i < message.properties.count(); i++) {
    const p = message.properties.getItem(i);
    props[p.key] = p.value;
  }
  return props;
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

async function sendTelemetry(client, specs) {
  const sent = [];
  for (const spec of specs) {
    const result = await client.sendEvent(messageOf(spec));
    sent.push({ messageId: spec.messageId, result: result && result.constructor ? result.constructor.name : null });
  }
  return sent;
}

async function c2d(client, request) {
  const plans = Object.fromEntries(request.c2d.map((m) => [m.messageId, m.plan]));
  const seen = {};
  const log = [];
  let lastDelivery = Date.now();
  const used = () => request.c2d.every((m) => (seen[m.messageId] || 0) >= m.plan.length
    && log.filter((l) => l.messageId === m.messageId && l.settled).length >= m.plan.length);
  client.on('message', (msg) => {
    lastDelivery = Date.now();
    const mid = msg.messageId;
    const n = seen[mid] || 0;
    seen[mid] = n + 1;
    const plan = plans[mid] || ['complete'];
    const action = plan[Math.min(n, plan.length - 1)];
    const entry = {
      messageId: mid === undefined ? null : mid,
      body: msg.data ? Buffer.from(msg.data).toString('utf-8') : null,
      ack: msg.ack === undefined ? null : msg.ack,
      properties: propertiesOf(msg),
      action,
      settled: false,
    };
    log.push(entry);
    client[action](msg).then(() => { entry.settled = true; }, (e) => { entry.error = describe(e); entry.settled = true; });
  });
  step('c2d: service sends');
  const service = ServiceClient.fromConnectionString(request.serviceConnectionString);
  await service.open();
  try {
    for (const spec of request.c2d) {
      const m = new ServiceMessage(spec.body);
      m.messageId = spec.messageId;
      m.ack = 'full';
      for (const [k, v] of Object.entries(spec.properties || {})) m.properties.add(k, v);
      await service.send(request.deviceId, m);
    }
  } finally {
    await service.close();
  }
  step('c2d: device settles');
  while (!used() || Date.now() - lastDelivery < 1000) await sleep(50);
  return log;
}

async function twinSteps(client, request, registry) {
  const spec = request.twin;
  step('twin: get');
  const twin = await client.getTwin();
  const result = {
    initial: { desired: plain(twin.properties.desired), reported: plain(twin.properties.reported) },
  };
  out.twin = result;
  let desiredSeen = null;
  if (spec.desired) {
    const [key, value] = Object.entries(spec.desired)[0];
    desiredSeen = new Promise((resolve) => {
      twin.on('properties.desired', (patch) => {
        if (patch && JSON.stringify(patch[key]) === JSON.stringify(value) && patch.$version !== undefined
          && patch.$version !== result.initial.desired.$version) resolve(patch);
      });
    });
  }
  if (spec.reported) {
    step('twin: patch reported');
    await new Promise((resolve, reject) => twin.properties.reported.update(spec.reported,
      (err) => (err ? reject(err) : resolve())));
    step('twin: service reads');
    // In a cluster the service's read may reach a node that applies the device's patch a
    // moment later (docs/cluster.md: reads are consistent per node): read until it shows.
    const shows = (reported) => Object.keys(spec.reported).every((k) => reported[k] !== undefined);
    const deadline = Date.now() + 10000;
    for (;;) {
      const read = request.module
        ? await registry.getModuleTwin(request.deviceId, request.moduleId)
        : await registry.getTwin(request.deviceId);
      result.serviceReported = plain(read.responseBody.properties.reported);
      if (shows(result.serviceReported) || Date.now() > deadline) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
  if (spec.desired) {
    step('twin: service patches desired');
    const patch = { properties: { desired: spec.desired } };
    if (request.module) await registry.updateModuleTwin(request.deviceId, request.moduleId, patch, '*');
    else await registry.updateTwin(request.deviceId, patch, '*');
    step('twin: device gets the desired patch');
    result.desiredPatch = plain(await desiredSeen);
  }
  return result;
}

async function methodSteps(client, request) {
  const spec = request.method;
  const result = { request: null };
  out.method = result;
  // DeviceClient.onDeviceMethod; ModuleClient names it onMethod.
  const register = request.module ? client.onMethod.bind(client) : client.onDeviceMethod.bind(client);
  register(spec.name, (req, res) => {
    result.request = { methodName: req.methodName, payload: req.payload === undefined ? null : req.payload };
    res.send(spec.status, spec.response, (err) => {
      if (err) result.sendError = describe(err);
    });
  });
  step('method: service invokes');
  const service = ServiceClient.fromConnectionString(request.serviceConnectionString);
  const params = { methodName: spec.name, payload: spec.payload, connectTimeoutInSeconds: 15, responseTimeoutInSeconds: 15 };
  const r = request.module
    ? await service.invokeDeviceMethod(request.deviceId, request.moduleId, params)
    : await service.invokeDeviceMethod(request.deviceId, params);
  result.result = plain(r.result);
  return result;
}

async function device(request) {
  const client = deviceClient(request);
  out.events = [];
  client.on('error', (e) => out.events.push({ event: 'error', error: describe(e) }));
  client.on('disconnect', (e) => out.events.push({ event: 'disconnect', error: e ? describe(e) : null }));
  if (request.x509) {
    await client.setOptions({
      cert: fs.readFileSync(request.x509.certFile, 'utf-8'),
      key: fs.readFileSync(request.x509.keyFile, 'utf-8'),
    });
  }
  step('open');
  try {
    await client.open();
  } catch (e) {
    out.openError = describe(e);
    return;
  }
  out.opened = true;
  const registry = request.serviceConnectionString ? Registry.fromConnectionString(request.serviceConnectionString) : null;
  if (request.telemetry) {
    step('telemetry');
    out.sent = await sendTelemetry(client, request.telemetry);
  }
  if (request.connectionState) {
    // After a link is attached: open() alone only puts a token on $cbs.
    step('connection state');
    const d = request.module
      ? await registry.getModule(request.deviceId, request.moduleId)
      : await registry.get(request.deviceId);
    out.connectionState = d.responseBody.connectionState;
  }
  if (request.c2d) {
    step('c2d');
    out.c2d = await c2d(client, request);
  }
  if (request.twin) await twinSteps(client, request, registry);
  if (request.method) await methodSteps(client, request);
  step('close');
  await client.close();
  out.closed = true;
}

async function refusals(request) {
  const good = Client.fromConnectionString(request.good, transport(request.transport || 'Amqp'));
  step('good: open');
  await good.open();
  out.bad = [];
  for (const bad of request.bad) {
    step(`bad: ${bad.name}`);
    const client = deviceClient({ ...bad, transport: request.transport });
    const entry = { name: bad.name, opened: false };
    out.bad.push(entry);
    try {
      await client.open();
      entry.opened = true;
      await client.close();
    } catch (e) {
      entry.error = describe(e);
    }
  }
  step('good: send');
  const result = await good.sendEvent(new Message('still served'));
  out.goodSent = result && result.constructor ? result.constructor.name : null;
  await good.close();
  out.goodClosed = true;
}

// The official sample's token (iothubConnectionString.js, generateSasToken).
function generateSasToken(resourceUri, signingKey, policyName, expiresInMins) {
  resourceUri = encodeURIComponent(resourceUri);
  const expiresInSeconds = Math.ceil(Date.now() / 1000 + expiresInMins * 60);
  const toSign = resourceUri + '\n' + expiresInSeconds;
  const hmac = crypto.createHmac('sha256', Buffer.from(signingKey, 'base64'));
  hmac.update(toSign);
  const base64UriEncoded = encodeURIComponent(hmac.digest('base64'));
  return `SharedAccessSignature sr=${resourceUri}&sig=${base64UriEncoded}&se=${expiresInSeconds}&skn=${policyName}`;
}

// The official sample's conversion (iothubConnectionString.js,
// convertIotHubToEventHubsConnectionString), with the redirect error kept for the caller.
async function convertIotHubToEventHubsConnectionString(connectionString) {
  const { Connection, ReceiverEvents, parseConnectionString, isAmqpError } = require('rhea-promise');
  const { ErrorNameConditionMapper: AMQPError } = require('@azure/core-amqp');
  const { HostName, SharedAccessKeyName, SharedAccessKey } = parseConnectionString(connectionString);
  const [iotHubName] = HostName.split('.');
  const token = generateSasToken(`${HostName}/messages/events`, SharedAccessKey, SharedAccessKeyName, 5);
  const connection = new Connection({
    transport: 'tls',
    host: HostName,
    hostname: HostName,
    username: `${SharedAccessKeyName}@sas.root.${iotHubName}`,
    port: 5671,
    reconnect: false,
    password: token,
  });
  step('redirect: connection open');
  await connection.open();
  step('redirect: receiver on messages/events/$management');
  const receiver = await connection.createReceiver({
    source: { address: `amqps://${HostName}/messages/events/$management` },
  });
  step('redirect: waiting for the redirect');
  return new Promise((resolve, reject) => {
    receiver.on(ReceiverEvents.receiverError, (context) => {
      const error = context.receiver && context.receiver.error;
      out.redirect = { condition: error && error.condition, description: error && error.description, info: plain(error && error.info) };
      if (isAmqpError(error) && error.condition === AMQPError.LinkRedirectError && error.info) {
        const { hostname } = error.info;
        const iotAddress = error.info.address;
        const regex = /:\d+\/(.*)\/\$management/i;
        const regexResults = regex.exec(iotAddress);
        if (!hostname || !regexResults) {
          reject(error);
        } else {
          const eventHubName = regexResults[1];
          resolve(`Endpoint=sb://${hostname}/;EntityPath=${eventHubName};SharedAccessKeyName=${SharedAccessKeyName};SharedAccessKey=${SharedAccessKey}`);
        }
      } else {
        reject(error);
      }
      connection.close().catch(() => {});
    });
  });
}

async function redirect(request) {
  const { EventHubConsumerClient, earliestEventPosition } = require('@azure/event-hubs');
  const dev = Client.fromConnectionString(request.deviceConnectionString, Amqp);
  step('device: open and send');
  await dev.open();
  out.sent = await sendTelemetry(dev, [request.telemetry]);
  await dev.close();
  const cs = await convertIotHubToEventHubsConnectionString(request.iothubConnectionString);
  out.eventHubsConnectionString = cs.replace(/SharedAccessKey=[^;]*/, 'SharedAccessKey=<key>');
  step('event hubs: subscribe');
  const consumer = new EventHubConsumerClient(request.consumerGroup || '$Default', cs);
  const errors = [];
  out.consumerErrors = errors;
  const event = await new Promise((resolve) => {
    const subscription = consumer.subscribe({
      processEvents: async (events) => {
        for (const e of events) {
          if (e.messageId === request.telemetry.messageId) {
            resolve({ subscription, event: e });
          }
        }
      },
      processError: async (err, context) => {
        errors.push({ partitionId: context && context.partitionId, error: describe(err) });
      },
    }, { startPosition: earliestEventPosition, maxWaitTimeInSeconds: 1 });
  });
  const e = event.event;
  out.event = {
    body: Buffer.isBuffer(e.body) ? e.body.toString('utf-8') : e.body,
    messageId: plain(e.messageId),
    correlationId: plain(e.correlationId),
    contentType: e.contentType === undefined ? null : e.contentType,
    properties: plain(e.properties || {}),
    systemProperties: plain(e.systemProperties || {}),
  };
  step('event hubs: close');
  await Promise.race([
    (async () => { await event.subscription.close(); await consumer.close(); })().catch(() => {}),
    sleep(5000),
  ]);
}

async function main() {
  const request = await readStdin();
  const timer = setTimeout(() => {
    process.stderr.write(`timed out in step ${currentStep}\n`);
    out.timedOut = currentStep;
    finish(2);
  }, request.timeoutMs || 60000);
  if (request.op === 'device') await device(request);
  else if (request.op === 'refusals') await refusals(request);
  else if (request.op === 'redirect') await redirect(request);
  else throw new Error(`unknown op ${request.op}`);
  clearTimeout(timer);
  finish(0);
}

main().catch((e) => {
  process.stderr.write(`failed in step ${currentStep}: ${e && e.stack ? e.stack : e}\n`);
  out.failed = { step: currentStep, error: describe(e) };
  finish(1);
});
