// Scheduled jobs and automatic device configurations through the official Node service SDK
// (azure-iothub's JobClient and Registry), unmodified, driven by
// tests/python/test_node_fleet.py: reads a JSON request on stdin, prints a JSON result.
//
//   {"op": "twinJob", "connectionString", "jobId", "condition", "patch"}
//     -> {"created", "job" (once finished), "listed": [jobIds of completed twin jobs], "pages"}
//   {"op": "configuration", "connectionString", "configuration"}
//     -> {"added", "got", "updated", "removed": status code of the removal}
//
// Every wait is bounded (60 s for a job, 1,000 pages for a listing).
'use strict';

const { JobClient, Registry } = require('azure-iothub');

const { readStdin } = require('./stdin');

async function twinJob(request) {
  const jobs = JobClient.fromConnectionString(request.connectionString);
  const created = await jobs.scheduleTwinUpdate(request.jobId, request.condition, request.patch, new Date(), 60);
  const deadline = Date.now() + 60000;
  let job;
  for (;;) {
    job = (await jobs.getJob(request.jobId)).jobStatus;
    if (['completed', 'failed', 'cancelled'].includes(job.status) || Date.now() > deadline) break;
    await new Promise((r) => setTimeout(r, 100));
  }
  // One job per page: the continuation header must carry the listing to its end.
  const query = jobs.createQuery('scheduleUpdateTwin', 'completed', 1);
  const listed = [];
  let pages = 0;
  while (query.hasMoreResults) {
    if (++pages > 1000) throw new Error('the listing never ended');
    const { result } = await query.next(query.continuationToken);
    for (const j of result) listed.push(j.jobId);
  }
  return { created: created.jobStatus, job, listed, pages };
}

async function configuration(request) {
  const registry = Registry.fromConnectionString(request.connectionString);
  const added = (await registry.addConfiguration(request.configuration)).responseBody;
  const got = (await registry.getConfiguration(request.configuration.id)).responseBody;
  got.priority += 1;
  got.etag = 'stale-but-forced';
  const updated = (await registry.updateConfiguration(got, true)).responseBody;
  const removed = await registry.removeConfiguration(request.configuration.id);
  return { added, got, updated, removed: removed.httpResponse.statusCode };
}

async function main() {
  const request = await readStdin();
  const result = request.op === 'twinJob' ? await twinJob(request) : await configuration(request);
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + '\n');
  process.exit(1);
});
