// Twin queries through the official Node service SDK's Registry.createQuery (azure-iothub),
// unmodified, driven by tests/python/test_query.py: reads a JSON request on stdin, prints a
// JSON result on stdout.
//
//   {"connectionString", "sql", "pageSize", "asTwin"}
//     -> {"ids": [deviceId or deviceId/moduleId per row, in order], "pages": n, "rows": [first 3 rows]}
//
// Pages with nextAsTwin (or next for raw rows) while hasMoreResults. The hub's CA comes from
// NODE_EXTRA_CA_CERTS. At most 20,000 pages, so a hub that never ends a query fails the test
// instead of hanging it.
'use strict';

const { Registry } = require('azure-iothub');

const { readStdin } = require('./stdin');

async function main() {
  const request = await readStdin();
  const registry = Registry.fromConnectionString(request.connectionString);
  const query = registry.createQuery(request.sql, request.pageSize);
  const ids = [];
  const rows = [];
  let pages = 0;
  while (query.hasMoreResults) {
    if (++pages > 20000) throw new Error('the query never ended');
    // next() with no argument sends no token (unlike nextAsTwin), so pass the query's own.
    const { result } = request.asTwin ? await query.nextAsTwin() : await query.next(query.continuationToken);
    for (const row of result) {
      ids.push(row.moduleId ? `${row.deviceId}/${row.moduleId}` : row.deviceId);
      if (rows.length < 3) rows.push(request.asTwin ? { deviceId: row.deviceId, tags: row.tags } : row);
    }
  }
  process.stdout.write(JSON.stringify({ ids, pages, rows }) + '\n');
}

main().catch((e) => {
  process.stderr.write(String((e && e.stack) || e) + '\n');
  process.exit(1);
});
