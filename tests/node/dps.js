// The Device Provisioning Service through the official Node SDKs, unmodified, driven by
// tests/python/test_dps_node.py: the service client (azure-iot-provisioning-service) and the
// device client (azure-iot-provisioning-device with its Mqtt, MqttWs, Http, Amqp and AmqpWs
// transports, SymmetricKeySecurityClient and X509Security), then the provisioned device on
// azure-iot-device over MQTT. One JSON request on stdin, one JSON line on stdout:
//
//   {"op": "service", "connectionString", "calls": [{"method", "args": [...]}, ...]}
//     -> {"results": [{"body", "status"} | {"error": {"name", "message", "statusCode"}}, ...]}
//        `method` is a ProvisioningServiceClient method, called in promise form, except:
//        - "runBulkEnrollmentOperation": in callback form (its promise never settles);
//        - "queryEnrollments" / "queryEnrollmentGroups" / "queryRegistrations" (args: [pageSize]
//          or [groupId, pageSize]): every page, following x-ms-continuation with next(token, cb)
//          -> {"pages": [{"items", "continuation"}]}.
//   {"op": "provision", "provisioningHost", "idScope", "transport", "registrationId",
//    "symmetricKey" | "groupKey" (the device key is derived from it) | "certFile" + "keyFile",
//    "payload", "telemetry"}
//     -> {"registration": registrationState} | {"error": {...}}; with "telemetry" (a body) and
//        a registration, the device then connects to the assigned hub with azure-iot-device-mqtt
//        (its key, or its certificate) and sends it: "sent": true | {"sendError": {...}}.
//
// Exits 0 with that line, 2 when timeoutMs passes first, 1 on a failure of the script itself.
// The hub's CA comes from NODE_EXTRA_CA_CERTS, the SDKs from NODE_PATH.
'use strict';

const crypto = require('crypto');
const fs = require('fs');

const { ProvisioningServiceClient } = require('azure-iot-provisioning-service');
const { ProvisioningDeviceClient } = require('azure-iot-provisioning-device');
const { SymmetricKeySecurityClient } = require('azure-iot-security-symmetric-key');
const { X509Security } = require('azure-iot-security-x509');
const { Client, Message } = require('azure-iot-device');
const { Mqtt: DeviceMqtt } = require('azure-iot-device-mqtt');

const { readStdin } = require('./stdin');

function transport(name) {
  switch (name) {
    case 'Mqtt': return new (require('azure-iot-provisioning-device-mqtt').Mqtt)();
    case 'MqttWs': return new (require('azure-iot-provisioning-device-mqtt').MqttWs)();
    case 'Http': return new (require('azure-iot-provisioning-device-http').Http)();
    case 'Amqp': return new (require('azure-iot-provisioning-device-amqp').Amqp)();
    case 'AmqpWs': return new (require('azure-iot-provisioning-device-amqp').AmqpWs)();
    default: throw new Error(`unknown transport ${name}`);
  }
}

function describe(e) {
  return {
    name: (e && e.name) || (e && e.constructor && e.constructor.name) || 'Error',
    message: String((e && e.message) || e),
    statusCode: (e && e.response && e.response.statusCode) || undefined,
    result: (e && e.result) || undefined,
  };
}

// A device key of a symmetric-key group: base64(HMAC-SHA256(base64decode(groupKey), registrationId)).
function deriveKey(groupKey, registrationId) {
  return crypto.createHmac('sha256', Buffer.from(groupKey, 'base64')).update(registrationId, 'utf8').digest('base64');
}

function allPages(query) {
  const pages = [];
  return new Promise((resolve, reject) => {
    const nextPage = (token) => query.next(token, (err, items, response) => {
      if (err) { reject(err); return; }
      const continuation = response.headers['x-ms-continuation'];
      pages.push({ items, continuation: continuation === undefined ? null : continuation });
      if (continuation !== undefined && pages.length < 100) nextPage(continuation);
      else resolve({ pages });
    });
    nextPage(null);
  });
}

async function serviceCall(client, { method, args = [] }) {
  if (method === 'runBulkEnrollmentOperation') {
    return new Promise((resolve, reject) => client.runBulkEnrollmentOperation(args[0], (err, body, response) => (
      err ? reject(err) : resolve({ body, status: response.statusCode }))));
  }
  if (method === 'queryEnrollments') return allPages(client.createIndividualEnrollmentQuery({ query: '*' }, args[0]));
  if (method === 'queryEnrollmentGroups') return allPages(client.createEnrollmentGroupQuery({ query: '*' }, args[0]));
  if (method === 'queryRegistrations') {
    return allPages(client.createEnrollmentGroupDeviceRegistrationStateQuery({ query: '*' }, args[0], args[1]));
  }
  if (typeof client[method] !== 'function') throw new Error(`no method ${method}`);
  const out = await client[method](...args);
  if (out && out.httpResponse) return { body: out.responseBody, status: out.httpResponse.statusCode };
  return { body: out === undefined ? null : out };
}

async function service(request) {
  const client = ProvisioningServiceClient.fromConnectionString(request.connectionString);
  const results = [];
  for (const call of request.calls) {
    try {
      results.push(await serviceCall(client, call));
    } catch (e) {
      results.push({ error: describe(e) });
    }
  }
  return { results };
}

async function provision(request) {
  let security;
  let deviceAuth;
  if (request.certFile) {
    const cert = { cert: fs.readFileSync(request.certFile, 'utf-8'), key: fs.readFileSync(request.keyFile, 'utf-8') };
    security = new X509Security(request.registrationId, cert);
    deviceAuth = { x509: cert };
  } else {
    const key = request.groupKey ? deriveKey(request.groupKey, request.registrationId) : request.symmetricKey;
    security = new SymmetricKeySecurityClient(request.registrationId, key);
    deviceAuth = { key };
  }
  const client = ProvisioningDeviceClient.create(request.provisioningHost, request.idScope,
    transport(request.transport), security);
  if (request.payload !== undefined) client.setProvisioningPayload(request.payload);
  let registration;
  try {
    registration = await client.register();
  } catch (e) {
    return { error: describe(e) };
  }
  const out = { registration, derivedKey: deviceAuth.key };
  if (request.telemetry === undefined) return out;

  const host = registration.assignedHub;
  const device = deviceAuth.x509
    ? Client.fromConnectionString(`HostName=${host};DeviceId=${registration.deviceId};x509=true`, DeviceMqtt)
    : Client.fromConnectionString(
      `HostName=${host};DeviceId=${registration.deviceId};SharedAccessKey=${deviceAuth.key}`, DeviceMqtt);
  try {
    if (deviceAuth.x509) await device.setOptions(deviceAuth.x509);
    await device.open();
    const message = new Message(request.telemetry);
    message.messageId = `${request.registrationId}-telemetry`;
    await device.sendEvent(message);
    out.sent = true;
  } catch (e) {
    out.sendError = describe(e);
  } finally {
    try { await device.close(); } catch (e) { /* already closed */ }
  }
  return out;
}

async function main() {
  const request = await readStdin();
  const timer = setTimeout(() => {
    process.stderr.write('timed out\n');
    process.exit(2);
  }, request.timeoutMs || 60000);
  const result = request.op === 'service' ? await service(request) : await provision(request);
  clearTimeout(timer);
  process.stdout.write(JSON.stringify(result) + '\n', () => process.exit(0));
}

main().catch((e) => {
  process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
