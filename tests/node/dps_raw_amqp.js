// DPS register requests over AMQP with bodies the SDKs never send, for
// tests/python/test_dps_bodies.py. It speaks as the Node provisioning transport
// (azure-iot-provisioning-device-amqp) does, with rhea, the AMQP client under it: SASL PLAIN as
// `{idScope}/registrations/{registrationId}` with a SAS token, a receiver and a sender on that
// address, each request an `iotdps-register` message with a correlation id and a data section.
// One JSON request on stdin, one JSON line on stdout:
//
//   {"host", "port", "idScope", "registrationId", "token", "bodies": [base64, ...], "timeoutMs"}
//     -> {"replies": [{"status": iotdps-status, "retryAfter": retry-after, "body": the reply's JSON}, ...]}
//        in the bodies' order
//
// Exits 0 with that line, 2 when timeoutMs passes first, 1 on a failure of the script itself.
// The hub's CA comes from NODE_EXTRA_CA_CERTS, rhea from NODE_PATH.
'use strict';

const rhea = require('rhea');

const { readStdin } = require('./stdin');

function text(body) {
  if (Buffer.isBuffer(body)) return body.toString('utf8');
  if (body && body.typecode === 0x75) return Buffer.from(body.content).toString('utf8');
  return String(body);
}

async function main() {
  const request = await readStdin();
  setTimeout(() => {
    process.stderr.write('timed out\n');
    process.exit(2);
  }, request.timeoutMs || 30000).unref();
  const address = `${request.idScope}/registrations/${request.registrationId}`;
  const bodies = request.bodies.map((b) => Buffer.from(b, 'base64'));
  const replies = new Array(bodies.length);
  let answered = 0;
  const container = rhea.create_container();
  const connection = container.connect({
    transport: 'tls',
    host: request.host,
    port: request.port,
    servername: 'localhost',
    hostname: 'localhost',
    username: address,
    password: request.token,
    reconnect: false,
  });
  connection.on('receiver_open', () => {
    const sender = connection.open_sender({ target: { address } });
    sender.once('sendable', () => {
      bodies.forEach((body, i) => sender.send({
        correlation_id: `request-${i}`,
        application_properties: {
          'iotdps-operation-type': 'iotdps-register',
          'iotdps-forceRegistration': false,
        },
        body: rhea.message.data_section(body),
      }));
    });
  });
  connection.on('message', (context) => {
    const m = context.message;
    const i = Number(String(m.correlation_id).replace('request-', ''));
    replies[i] = {
      status: m.application_properties && m.application_properties['iotdps-status'],
      retryAfter: m.application_properties && m.application_properties['retry-after'],
      body: JSON.parse(text(m.body)),
    };
    answered += 1;
    if (answered === bodies.length) {
      process.stdout.write(`${JSON.stringify({ replies })}\n`);
      connection.close();
      process.exit(0);
    }
  });
  connection.on('disconnected', (context) => {
    process.stderr.write(`disconnected: ${context.error || 'closed'}\n`);
    process.exit(1);
  });
  connection.open_receiver({ source: { address } });
}

main().catch((e) => {
  process.stderr.write(`${e.stack || e}\n`);
  process.exit(1);
});
