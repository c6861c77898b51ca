// The hub's Prometheus text (GET /console/api/metrics): parsing, rates between two samples and
// latency quantiles from histogram buckets.

/** {name: [{labels: {k: v}, value}]} from Prometheus text format 0.0.4. */
export function parsePrometheus(text) {
  const out = {};
  for (const line of String(text || "").split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([^}]*)\})?\s+(\S+)/.exec(line);
    if (!m) continue;
    const labels = {};
    if (m[3]) {
      for (const lm of m[3].matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[lm[1]] = lm[2].replace(/\\(.)/g, "$1");
    }
    const value = Number(m[4] === "+Inf" ? Infinity : m[4]);
    (out[m[1]] ||= []).push({ labels, value });
  }
  return out;
}

/** Sum of a metric's samples (optionally only those whose labels pass `filter`); null when absent. */
export function total(samples, name, filter = () => true) {
  const list = samples && samples[name];
  if (!list) return null;
  return list.filter((s) => filter(s.labels)).reduce((a, s) => a + s.value, 0);
}

/** Per-second rate of a counter between two samples taken `seconds` apart; null when unknown. */
export function rate(before, now, name, seconds, filter) {
  if (!before || !now || !(seconds > 0)) return null;
  // A counter the hub has not registered yet has not counted anything.
  const a = total(before, name, filter) ?? 0, b = total(now, name, filter) ?? 0;
  return Math.max(0, (b - a) / seconds);
}

function buckets(samples, base) {
  return (samples?.[`${base}_bucket`] || [])
    .map((s) => ({ le: s.labels.le === "+Inf" ? Infinity : Number(s.labels.le), count: s.value }))
    .sort((x, y) => x.le - y.le);
}

/**
 * The q-quantile (0..1, seconds) of a histogram over the observations made between two samples
 * (or since start when `before` is null or nothing was observed in between), interpolated
 * linearly inside its bucket. {value, count, window: "recent" | "since start"}, or null without
 * observations.
 */
export function quantile(before, now, base, q) {
  const cur = buckets(now, base);
  if (!cur.length) return null;
  let window = "since start";
  let counts = cur.map((b) => b.count);
  if (before) {
    const prev = buckets(before, base);
    const delta = cur.map((b, i) => b.count - (prev[i] && prev[i].le === b.le ? prev[i].count : 0));
    if (delta[delta.length - 1] > 0) {
      counts = delta;
      window = "recent";
    }
  }
  const n = counts[counts.length - 1];
  if (!(n > 0)) return null;
  const rank = q * n;
  for (let i = 0; i < cur.length; i++) {
    if (counts[i] >= rank) {
      const lo = i === 0 ? 0 : cur[i - 1].le;
      const hi = cur[i].le;
      if (!Number.isFinite(hi)) return { value: lo, count: n, window, over: true };
      const below = i === 0 ? 0 : counts[i - 1];
      const inBucket = counts[i] - below;
      const frac = inBucket > 0 ? (rank - below) / inBucket : 1;
      return { value: lo + (hi - lo) * frac, count: n, window };
    }
  }
  return null;
}

/** "1.2 ms", "340 µs", "2.5 s". */
export function formatSeconds(s) {
  if (s === null || s === undefined || Number.isNaN(s)) return "—";
  if (s < 0.001) return `${Math.round(s * 1e6)} µs`;
  if (s < 1) return `${(s * 1000).toFixed(s < 0.01 ? 2 : 1)} ms`;
  return `${s.toFixed(2)} s`;
}

/** "12.3/s", "0/s". */
export function formatRate(r) {
  if (r === null || r === undefined) return "—";
  if (r === 0) return "0/s";
  if (r < 10) return `${r.toFixed(2)}/s`;
  return `${Math.round(r).toLocaleString()}/s`;
}

/** "1.5 MB". */
export function formatBytes(n) {
  if (n === null || n === undefined) return "—";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i && n < 10 ? 1 : 0)} ${units[i]}`;
}
