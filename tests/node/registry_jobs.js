// Import/export jobs through the official Node service SDK's Registry (azure-iothub),
// unmodified, driven by tests/python/test_node_jobs.py: reads a JSON request on stdin, prints a
// JSON result on stdout.
//
//   {"op": "export", "connectionString", "outputUri", "excludeKeys"} -> {"created", "job", "jobs"}
//   {"op": "import", "connectionString", "inputUri", "outputUri"}    -> {"created", "job", "jobs"}
//   {"op": "cancel", "connectionString", "inputUri", "outputUri"}
//     -> an import started, a second job tried (its error), the first cancelled:
//        {"created", "second": {"error", "statusCode"}, "job"}
//
// "job" is the job once finished (getJob polled every 50 ms, at most timeoutMs); "jobs" is
// listJobs afterwards. The hub's CA comes from NODE_EXTRA_CA_CERTS.
'use strict';

const { Registry } = require('azure-iothub');

const { readStdin } = require('./stdin');

const FINISHED = new Set(['completed', 'failed', 'cancelled']);

// Some Registry methods resolve to the body, others to {responseBody, httpResponse}.
function body(result) {
  return result && result.responseBody !== undefined ? result.responseBody : result;
}

async function waitJob(registry, jobId, timeoutMs) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const job = body(await registry.getJob(jobId));
    if (FINISHED.has(job.status)) return job;
    if (Date.now() > deadline) throw new Error(`job ${jobId} still ${job.status}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function main() {
  const request = await readStdin();
  const registry = Registry.fromConnectionString(request.connectionString);
  const timeoutMs = request.timeoutMs || 120000;
  let result;
  if (request.op === 'export') {
    const created = body(await registry.exportDevicesToBlob(request.outputUri, !!request.excludeKeys));
    const job = await waitJob(registry, created.jobId, timeoutMs);
    const jobs = body(await registry.listJobs());
    result = { created, job, jobs };
  } else if (request.op === 'import') {
    const created = body(await registry.importDevicesFromBlob(request.inputUri, request.outputUri));
    const job = await waitJob(registry, created.jobId, timeoutMs);
    const jobs = body(await registry.listJobs());
    result = { created, job, jobs };
  } else if (request.op === 'cancel') {
    const created = body(await registry.importDevicesFromBlob(request.inputUri, request.outputUri));
    let second = null;
    try {
      await registry.exportDevicesToBlob(request.outputUri, false);
    } catch (e) {
      second = { error: String(e && (e.message || e)), statusCode: e.response && e.response.statusCode };
    }
    await registry.cancelJob(created.jobId);
    const job = await waitJob(registry, created.jobId, timeoutMs);
    result = { created, second, job };
  } else {
    throw new Error(`unknown op ${request.op}`);
  }
  process.stdout.write(JSON.stringify(result) + '\n');
  process.exit(0);
}

main().catch((e) => { process.stderr.write(String(e && (e.stack || e)) + '\n'); process.exit(1); });
