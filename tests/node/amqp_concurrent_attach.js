// Two links of one device identity attached at the same instant from two sessions of one AMQP
// connection (issue 70, point 5), with rhea, the AMQP client under the Node device SDK, speaking
// as that SDK does: TLS with a plain AMQP header (no SASL), a device SAS token put on `$cbs`
// for each identity, then the identity's links. Driven by
// tests/python/test_amqp_concurrent_attach.py.
//
// Line protocol: the first stdin line is the request; the script answers with one JSON line on
// stdout once every race is done ("raced"), waits for a second stdin line ({"op": "finish"}:
// the service side has done its part meanwhile), then answers "done" and closes.
//
//   {"host", "port", "servername", "kind": "c2d" | "telemetry", "later": bool, "settleMs",
//    "waitMs", "timeoutMs",
//    "races": [{"a", "aToken", "b" (optional), "bToken", "c2dMessageId" (c2d), "messageId"}]}
//
// Each race runs on a connection of its own, one after another, and the connections stay open
// until the end:
//   1. connect; on the connection's first session a `$cbs` sender and receiver; put-token for A
//      (and B), each answered 200 before anything else;
//   2. sessions 1, 2 (and 3) begun, each answered;
//   3. in one tick and one TLS write (the socket corked), before any answer: session 1 and
//      session 2 each attach A's link of `kind` (`/devices/A/messages/devicebound` receivers, or
//      `/devices/A/messages/events` senders), session 3 B's telemetry sender;
//   4. the race is settled when both of A's links were answered and then one of them was
//      detached, or the connection ended, or settleMs passed with both still attached; then
//      100 ms more for anything right behind, and the two links' states are kept ("atSettle");
//   5. telemetry: one message on each of A's links still attached ("{messageId}-s{session}"),
//      each awaiting its disposition;
//   6. with "later": a fourth session attaches a third link of A's kind once the race is
//      settled; settled the same way (one of A's links detached, or settleMs), then telemetry
//      sends once more on each of A's links still attached ("{messageId}-later-s{session}");
//   7. one message on B's link ("messageId"), awaiting its disposition.
//
//   "raced" -> {"phase": "raced", "races": [race]}
//   race = {"i", "cbs": [status...], "connection": conn, "links": [link, link], "b": link | null,
//           "later": link | null, "atSettle": [{"session", "opened", "closed", "error"}] (A's two
//           links when the race had settled), "settledAfterMs"}
//   conn = {"open": bool (open now), "closed": {"condition", "description"} | null (a close
//           frame came), "disconnected": bool, "error": text | null}
//   link = {"session", "address", "opened": bool, "closed": bool, "error": {"condition",
//           "description"} | null, "openedAtMs", "closedAtMs", "sent": outcome | null,
//           "sentLater": outcome | null, "received": [{"messageId", "body"}]}
//   outcome = "accepted" | "rejected" | "released" | "modified" | {"error": ...}
//
// After {"op": "finish"}: for kind c2d, waits until every race whose connection is still open
// got its c2dMessageId on one of A's links, or waitMs passed; then
//   "done" -> {"phase": "done", "races": [race]} (the same records, brought up to date), every
//   connection closed.
//
// Exits 0 after "done"; 2 when timeoutMs passes first (the line then carries what was done, with
// "timedOut"); 1 when the script itself fails. The hub's CA comes from NODE_EXTRA_CA_CERTS, rhea
// from NODE_PATH.
'use strict';

const readline = require('readline');
const rhea = require('rhea');

const out = { phase: 'start', races: [] };

function finish(code) {
  process.stdout.write(`${JSON.stringify(out)}\n`, () => process.exit(code));
}

function log(text) {
  process.stderr.write(`${new Date().toISOString()} ${text}\n`);
}

function errorOf(e) {
  if (!e) return null;
  return {
    condition: e.condition === undefined ? null : String(e.condition),
    description: e.description === undefined ? null : String(e.description),
  };
}

function text(body) {
  if (body === undefined || body === null) return null;
  if (Buffer.isBuffer(body)) return body.toString('utf8');
  if (body.typecode === 0x75) return Buffer.from(body.content).toString('utf8');
  if (typeof body === 'string') return body;
  return JSON.stringify(body);
}

// Lines from stdin, one at a time.
const lines = [];
const lineWaiters = [];
const input = readline.createInterface({ input: process.stdin });
input.on('line', (line) => {
  if (!line.trim()) return;
  const waiter = lineWaiters.shift();
  if (waiter) waiter(line);
  else lines.push(line);
});
// stdin closed (the driver gave up): whatever waits for a line gets this, and fails.
input.on('close', () => {
  lines.push('{"op": "eof"}');
  while (lineWaiters.length) lineWaiters.shift()(lines[lines.length - 1]);
});
function nextLine() {
  if (lines.length) return Promise.resolve(lines.shift());
  return new Promise((resolve) => lineWaiters.push(resolve));
}

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

// Resolves once `test()` holds (checked every 20 ms), or after `ms`; the result says which.
function until(test, ms) {
  return new Promise((resolve) => {
    const deadline = Date.now() + ms;
    const tick = () => {
      if (test()) resolve(true);
      else if (Date.now() >= deadline) resolve(false);
      else setTimeout(tick, 20);
    };
    tick();
  });
}

function connect(request, race) {
  const container = rhea.create_container({ id: `race-${race.i}` });
  const connection = container.connect({
    transport: 'tls',
    host: request.host,
    port: request.port,
    servername: request.servername || 'localhost',
    hostname: request.servername || 'localhost',
    reconnect: false,
    idle_time_out: 120000,
  });
  const conn = { open: false, closed: null, disconnected: false, error: null };
  race.connection = conn;
  connection.on('connection_open', () => { conn.open = true; });
  connection.on('connection_close', (context) => {
    conn.open = false;
    conn.closed = errorOf(context.connection.error) || { condition: null, description: null };
  });
  connection.on('connection_error', (context) => {
    const e = context.connection.error;
    conn.error = String((e && e.condition) || e);
  });
  connection.on('disconnected', (context) => {
    conn.open = false;
    conn.disconnected = true;
    if (context.error) conn.error = conn.error || String(context.error);
  });
  connection.on('protocol_error', (context) => { conn.error = `protocol error: ${context.error}`; });
  connection.on('error', (context) => { conn.error = conn.error || String(context.error || 'error'); });
  // Link and session errors are recorded by their own handlers; these keep rhea from raising them.
  for (const event of ['receiver_error', 'sender_error', 'session_error']) connection.on(event, () => {});
  return connection;
}

// Puts a device token on $cbs; resolves with the reply's status-code.
function putTokens(connection, tokens) {
  return new Promise((resolve, reject) => {
    const statuses = new Array(tokens.length).fill(null);
    const receiver = connection.open_receiver({ source: { address: '$cbs' } });
    const sender = connection.open_sender({ target: { address: '$cbs' } });
    let sent = false;
    receiver.on('message', (context) => {
      const i = Number(String(context.message.correlation_id).replace('put-', ''));
      const props = context.message.application_properties || {};
      statuses[i] = props['status-code'] === undefined ? null : Number(props['status-code']);
      if (statuses.every((s) => s !== null)) resolve(statuses);
    });
    const send = () => {
      if (sent || !receiver.is_open() || !sender.sendable()) return;
      sent = true;
      tokens.forEach(({ audience, token }, i) => sender.send({
        to: '$cbs',
        reply_to: 'cbs',
        message_id: `put-${i}`,
        application_properties: {
          operation: 'put-token',
          type: 'servicebus.windows.net:sastoken',
          name: audience,
        },
        body: token,
      }));
    };
    receiver.on('receiver_open', send);
    sender.on('sendable', send);
    connection.on('disconnected', () => reject(new Error('disconnected while putting tokens')));
  });
}

function beginSession(connection) {
  return new Promise((resolve, reject) => {
    const session = connection.create_session();
    session.on('session_open', () => resolve(session));
    session.on('session_close', () => reject(new Error('session refused')));
    session.begin();
  });
}

function track(link, record) {
  const start = record.start;
  const opened = () => { record.opened = true; record.openedAtMs = Date.now() - start; };
  const closed = (context) => {
    const l = context.receiver || context.sender;
    if (!record.closed) record.closedAtMs = Date.now() - start;
    record.closed = true;
    record.error = record.error || errorOf(l && l.error);
  };
  link.on('receiver_open', opened);
  link.on('sender_open', opened);
  link.on('receiver_error', closed);
  link.on('sender_error', closed);
  link.on('receiver_close', closed);
  link.on('sender_close', closed);
  link.on('message', (context) => {
    const m = context.message;
    record.received.push({ messageId: m.message_id === undefined ? null : String(m.message_id), body: text(m.body) });
  });
}

function linkRecord(session, address, start) {
  return {
    session, address, opened: false, closed: false, error: null, openedAtMs: null, closedAtMs: null,
    sent: null, sentLater: null, received: [], start,
  };
}

function plainRecord(record) {
  if (!record) return null;
  const { start, ...rest } = record;
  return rest;
}

// Sends one message on `sender`; resolves with its outcome.
function sendOne(sender, message, ms) {
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve({ error: `no disposition within ${ms} ms` }), ms);
    const done = (outcome) => { clearTimeout(timer); resolve(outcome); };
    if (!sender.is_open() || sender.is_closed()) {
      done({ error: 'the link is not open' });
      return;
    }
    let delivery;
    const on = (outcome) => (context) => { if (context.delivery === delivery) done(outcome); };
    sender.on('accepted', on('accepted'));
    sender.on('rejected', (context) => {
      if (context.delivery === delivery) {
        done({ rejected: errorOf(context.delivery.remote_state && context.delivery.remote_state.error) });
      }
    });
    sender.on('released', on('released'));
    sender.on('modified', on('modified'));
    sender.on('sender_close', () => done({ error: `the link closed: ${JSON.stringify(errorOf(sender.error))}` }));
    const go = () => { delivery = sender.send(message); };
    if (sender.sendable()) go();
    else sender.once('sendable', go);
  });
}

async function race(request, spec, i) {
  const record = { i, cbs: null, connection: null, links: [], b: null, later: null, settledAfterMs: null, atSettle: null };
  out.races.push(record);
  const connection = connect(request, record);
  const tokens = [{ audience: `${request.servername || 'localhost'}/devices/${spec.a}`, token: spec.aToken }];
  if (spec.b) tokens.push({ audience: `${request.servername || 'localhost'}/devices/${spec.b}`, token: spec.bToken });
  record.cbs = await putTokens(connection, tokens);
  if (record.cbs.some((s) => s !== 200)) throw new Error(`put-token answered ${record.cbs}`);
  const s1 = await beginSession(connection);
  const s2 = await beginSession(connection);
  const s3 = spec.b ? await beginSession(connection) : null;

  // The race: every attach written in this tick, before any answer, and in one TLS write (rhea
  // writes each frame on its own; corked, they reach the hub together).
  const socket = connection.socket;
  socket.cork();
  setImmediate(() => socket.uncork());
  const start = Date.now();
  const kind = request.kind;
  const aAddress = kind === 'c2d' ? `/devices/${spec.a}/messages/devicebound` : `/devices/${spec.a}/messages/events`;
  const links = [];
  for (const [n, session] of [[1, s1], [2, s2]]) {
    const r = linkRecord(n, aAddress, start);
    record.links.push(r);
    const link = kind === 'c2d'
      ? session.open_receiver({ source: { address: aAddress }, autoaccept: true })
      : session.open_sender({ target: { address: aAddress } });
    track(link, r);
    links.push(link);
  }
  let bLink = null;
  if (spec.b) {
    record.b = linkRecord(3, `/devices/${spec.b}/messages/events`, start);
    bLink = s3.open_sender({ target: { address: record.b.address } });
    track(bLink, record.b);
  }
  const conn = record.connection;
  const [l1, l2] = record.links;
  const answered = () => (l1.opened || l1.closed) && (l2.opened || l2.closed) && (!record.b || record.b.opened || record.b.closed);
  const ended = () => conn.disconnected || conn.closed !== null;
  await until(() => ended() || (answered() && (l1.closed || l2.closed)), 10000);
  if (!ended() && !(l1.closed || l2.closed)) {
    // Both attached: give a late detach (or close) settleMs to come.
    await until(() => ended() || l1.closed || l2.closed, request.settleMs || 1500);
  }
  // Anything that follows right behind the first detach.
  await sleep(100);
  record.settledAfterMs = Date.now() - start;
  record.atSettle = [l1, l2].map(({ session, opened, closed, error }) => ({ session, opened, closed, error }));
  log(`race ${i}: links ${JSON.stringify([l1, l2].map(plainRecord))} connection ${JSON.stringify(conn)}`);

  if (kind === 'telemetry') {
    await Promise.all(links.map((link, n) => {
      if (record.links[n].closed || ended()) return null;
      return sendOne(link, {
        message_id: `${spec.messageId}-s${n + 1}`,
        body: rhea.message.data_section(Buffer.from(JSON.stringify({ race: i, session: n + 1 }))),
      }, 15000).then((outcome) => { record.links[n].sent = outcome; });
    }));
  }
  if (request.later && !ended()) {
    // A third link of the same kind, from a fourth session, once the race is settled.
    const s4 = await beginSession(connection);
    const later = linkRecord(4, aAddress, Date.now());
    record.later = later;
    const link = kind === 'c2d'
      ? s4.open_receiver({ source: { address: aAddress }, autoaccept: true })
      : s4.open_sender({ target: { address: aAddress } });
    track(link, later);
    links.push(link);
    const all = [l1, l2, later];
    const live = () => all.filter((l) => l.opened && !l.closed).length;
    await until(() => ended() || ((later.opened || later.closed) && live() <= 1), 10000);
    if (!ended() && live() > 1) await until(() => ended() || live() <= 1, request.settleMs || 1500);
    await sleep(100);
    if (kind === 'telemetry') {
      await Promise.all(links.map((l, n) => {
        if (all[n].closed || ended()) return null;
        return sendOne(l, {
          message_id: `${spec.messageId}-later-s${all[n].session}`,
          body: rhea.message.data_section(Buffer.from(JSON.stringify({ race: i, session: all[n].session, later: true }))),
        }, 15000).then((outcome) => { all[n].sentLater = outcome; });
      }));
    }
  }
  if (bLink && !ended() && !record.b.closed) {
    record.b.sent = await sendOne(bLink, {
      message_id: spec.messageId,
      body: rhea.message.data_section(Buffer.from(JSON.stringify({ race: i, from: spec.b }))),
    }, 15000);
  }
  return { connection, record };
}

function snapshot(phase, races) {
  out.phase = phase;
  out.races = races.map(({ record }) => ({
    ...record,
    connection: { ...record.connection },
    links: record.links.map(plainRecord),
    b: plainRecord(record.b),
    later: plainRecord(record.later),
  }));
  return out;
}

async function main() {
  const request = JSON.parse(await nextLine());
  const timer = setTimeout(() => {
    log(`timed out in phase ${out.phase}`);
    out.timedOut = out.phase;
    finish(2);
  }, request.timeoutMs || 60000);
  const races = [];
  out.phase = 'racing';
  for (let i = 0; i < request.races.length; i++) {
    races.push(await race(request, request.races[i], i));
    // Keep `out` current for a timeout's answer.
    snapshot('racing', races);
  }
  process.stdout.write(`${JSON.stringify(snapshot('raced', races))}\n`);

  const next = JSON.parse(await nextLine());
  if (next.op !== 'finish') throw new Error(`unexpected ${JSON.stringify(next)}`);
  out.phase = 'finishing';
  if (request.kind === 'c2d') {
    const got = ({ record }, n) => record.links.some((l) => l.received.some((m) => m.messageId === request.races[n].c2dMessageId));
    await until(() => races.every((r, n) => !r.record.connection.open || got(r, n)), request.waitMs || 20000);
    // A second delivery (on the other link) would follow right behind.
    await sleep(300);
  }
  const result = snapshot('done', races);
  clearTimeout(timer);
  for (const { connection } of races) {
    if (connection.is_open()) connection.close();
  }
  await until(() => races.every(({ connection }) => !connection.is_open()), 3000);
  process.stdout.write(`${JSON.stringify(result)}\n`, () => process.exit(0));
}

main().catch((e) => {
  log(`failed in phase ${out.phase}: ${e && e.stack ? e.stack : e}`);
  out.failed = { phase: out.phase, error: String((e && e.message) || e) };
  finish(1);
});
