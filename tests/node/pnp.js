// IoT Plug and Play through the official Node SDKs, unmodified, driven by
// tests/python/test_pnp.py: a device (azure-iot-device with azure-iot-device-mqtt, the `modelId`
// option) and the service's DigitalTwinClient (azure-iothub) in one process. Configuration is
// one JSON object on stdin:
//
//   {"deviceConnectionString", "serviceConnectionString", "deviceId", "modelId", "timeoutMs"}
//
// The device connects with the model id, reports a root and a component property, and answers
// the commands `reboot` and `thermostat1*getMaxMinReport`. The service reads the digital twin,
// patches a component property (with the etag it read), and invokes both commands. Prints one
// JSON line:
//
//   {"digitalTwin", "etag", "desired" (the device's desired patch after the update),
//    "root": {"status", "requestId", "body"}, "component": {...}}
//
// and exits 0; exits 2 when timeoutMs passes first, 1 on an error (stderr says which).
// The hub's CA comes from NODE_EXTRA_CA_CERTS, the SDKs from NODE_PATH.
'use strict';

const { Client } = require('azure-iot-device');
const { Mqtt } = require('azure-iot-device-mqtt');
const { DigitalTwinClient, IoTHubTokenCredentials } = require('azure-iothub');

// Each step on stderr, so a run that times out says where.
function step(name) {
  process.stderr.write(`step: ${name}\n`);
}

function readStdin() {
  return new Promise((resolve, reject) => {
    let text = '';
    process.stdin.setEncoding('utf-8');
    process.stdin.on('data', (chunk) => { text += chunk; });
    process.stdin.on('end', () => resolve(JSON.parse(text)));
    process.stdin.on('error', reject);
  });
}

function call(fn) {
  return new Promise((resolve, reject) => fn((err, value) => (err ? reject(err) : resolve(value))));
}

function plainBody(value) {
  // The SDK attaches its raw HTTP response as `_response`; only the digital twin is wanted.
  if (value && typeof value === 'object') {
    const out = Array.isArray(value) ? [] : {};
    for (const [k, v] of Object.entries(value)) if (k !== '_response') out[k] = v;
    return out;
  }
  return value;
}

async function main() {
  const config = await readStdin();
  const timer = setTimeout(() => {
    process.stderr.write('timed out\n');
    process.exit(2);
  }, config.timeoutMs || 60000);

  const device = Client.fromConnectionString(config.deviceConnectionString, Mqtt);
  await device.setOptions({ modelId: config.modelId });
  device.onDeviceMethod('reboot', (request, response) => {
    response.send(200, { rebooted: true, delay: request.payload && request.payload.delay }, () => {});
  });
  device.onDeviceMethod('thermostat1*getMaxMinReport', (request, response) => {
    step('component command received');
    response.send(201, { maxTemp: 30.5, since: request.payload }, () => {});
  });
  await device.open();
  step('device open');
  const twin = await device.getTwin();
  step('twin received');
  const desired = new Promise((resolve) => {
    twin.on('properties.desired', (patch) => {
      if (patch && patch.thermostat1 && patch.thermostat1.targetTemperature === 23.5) resolve(patch);
    });
  });
  await call((done) => twin.properties.reported.update(
    { serialNumber: 'node-1', thermostat1: { __t: 'c', maxTemp: 25 } }, done));
  step('reported');

  const service = new DigitalTwinClient(new IoTHubTokenCredentials(config.serviceConnectionString));
  const read = await service.getDigitalTwin(config.deviceId);
  const etag = read._response.headers.get('etag');
  step('digital twin read');
  await service.updateDigitalTwin(config.deviceId,
    [{ op: 'add', path: '/thermostat1/targetTemperature', value: 23.5 }], etag);
  step('digital twin updated');
  const desiredPatch = await desired;
  step('desired patch received');
  const root = await service.invokeCommand(config.deviceId, 'reboot', { delay: 3 },
    { connectTimeoutInSeconds: 5, responseTimeoutInSeconds: 10 });
  step('root command answered');
  const component = await service.invokeComponentCommand(config.deviceId, 'thermostat1',
    'getMaxMinReport', '2026-11-27T00:00:00Z', { responseTimeoutInSeconds: 10 });
  const command = (r) => ({ status: r.xMsCommandStatuscode, requestId: r.xMsRequestId, body: r.body });
  process.stdout.write(JSON.stringify({
    digitalTwin: plainBody(read),
    etag,
    desired: desiredPatch,
    root: command(root),
    component: command(component),
  }) + '\n');
  clearTimeout(timer);
  await device.close();
  process.stdout.write('', () => process.exit(0));
}

main().catch((e) => {
  process.stderr.write(`${e && e.stack ? e.stack : e}\n`);
  process.exit(1);
});
