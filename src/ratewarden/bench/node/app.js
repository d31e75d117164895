'use strict';
// ratewarden bench: rate-limiter-flexible behind a minimal fastify app, one Node process, for the
// live rows beside ratewarden (seed 001's subject). Started by ratewarden/bench/rlflx.py:
//
//   node app.js --client ioredis|iovalkey|valkey-glide --store redis|redis-cluster --store-url URL
//               --port P --points N --duration S
//   node app.js --client none --port P       (the same app without a limiter: the Node rows' baseline)
//
// Limiters as ratelimit_bench builds them: RateLimiterRedis on ioredis, RateLimiterValkey on iovalkey,
// RateLimiterValkeyGlide on valkey-glide; {points, duration}, no blockDuration, no in-memory block,
// no insurance limiter, the default key prefix; clients with their default options. One global
// preHandler consumes 1 point per request, keyed on X-Client-ID (else the peer address), as the
// Python apps key. The request log is off, as uvicorn's access log is on the Python side.
//
// /test and /heavy (100k Math.sqrt) are the limited routes; each handler run is counted, and
// /__bench__/{pid,stats,reset,health} (never limited) answer the harness as the Python apps do.

const { parseArgs } = require('node:util');
const Fastify = require('fastify');
const rlflx = require('rate-limiter-flexible');

const CLIENTS = ['ioredis', 'iovalkey', 'valkey-glide', 'none'];

function options() {
  const { values } = parseArgs({
    options: {
      client: { type: 'string' },
      store: { type: 'string', default: 'redis' },
      'store-url': { type: 'string' },
      port: { type: 'string' },
      points: { type: 'string', default: '100' },
      duration: { type: 'string', default: '60' },
    },
  });
  if (!CLIENTS.includes(values.client)) {
    throw new Error(`--client takes ${CLIENTS.join(', ')}, got ${values.client}`);
  }
  if (values.client !== 'none' && !['redis', 'redis-cluster'].includes(values.store)) {
    throw new Error(`--store takes redis or redis-cluster, got ${values.store}`);
  }
  return values;
}

// redis://host:port/db or redis+cluster://host:port (any one node) -> {host, port, db}
function address(url) {
  const parsed = new URL(url.replace(/^redis\+cluster:/, 'redis:'));
  const db = Number(parsed.pathname.replace('/', '') || 0);
  return { host: parsed.hostname || '127.0.0.1', port: Number(parsed.port || 6379), db };
}

// The client and its limiter, connected: ioredis/iovalkey wait for 'ready'.
async function connect(opts) {
  if (opts.client === 'none') return { client: null, limiter: null };
  const cluster = opts.store === 'redis-cluster';
  const { host, port, db } = address(opts['store-url']);
  const limits = { points: Number(opts.points), duration: Number(opts.duration) };
  if (opts.client === 'valkey-glide') {
    const glide = require('@valkey/valkey-glide');
    glide.Logger.init('off');
    const client = cluster
      ? await glide.GlideClusterClient.createClient({ addresses: [{ host, port }] })
      : await glide.GlideClient.createClient({ addresses: [{ host, port }], databaseId: db });
    return { client, limiter: new rlflx.RateLimiterValkeyGlide({ storeClient: client, ...limits }) };
  }
  const Lib = require(opts.client);
  const client = cluster ? new Lib.Cluster([{ host, port }]) : new Lib({ host, port, db });
  await new Promise((resolve, reject) => {
    client.once('ready', resolve);
    client.once('error', reject);
  });
  const Limiter = opts.client === 'ioredis' ? rlflx.RateLimiterRedis : rlflx.RateLimiterValkey;
  return { client, limiter: new Limiter({ storeClient: client, ...limits }) };
}

function heavy() {
  let total = 0;
  for (let j = 0; j < 100000; j += 1) total += Math.sqrt(j);
  return total;
}

function build(limiter) {
  const app = Fastify({ logger: false });
  const stats = { admitted: 0, errors: 0 };

  app.addHook('preHandler', async (request, reply) => {
    if (limiter === null || request.url.startsWith('/__bench__/')) return;
    const key = request.headers['x-client-id'] || request.ip;
    try {
      await limiter.consume(key, 1);
    } catch (err) {
      if (!(err instanceof rlflx.RateLimiterRes)) {
        stats.errors += 1;
        return reply.code(500).send({ status: 'error', detail: String(err && err.message) });
      }
      const seconds = Math.max(1, Math.ceil(err.msBeforeNext / 1000));
      return reply.code(429)
        .header('Retry-After', String(seconds))
        .header('X-RateLimit-Limit', String(limiter.points))
        .header('X-RateLimit-Remaining', '0')
        .header('X-RateLimit-Reset', String(seconds))
        .send({ status: 'rate_limited', retry_after: seconds });
    }
  });

  app.get('/test', async () => {
    stats.admitted += 1;
    return { status: 'ok' };
  });
  app.get('/heavy', async () => {
    stats.admitted += 1;
    return { status: 'ok', sum: Math.trunc(heavy()) };
  });
  app.get('/__bench__/health', async () => 'ok');
  app.get('/__bench__/pid', async () => String(process.pid));
  // The harness flushes the store before every iteration; this limiter keeps nothing in the process.
  app.get('/__bench__/reset', async () => 'ok');
  app.get('/__bench__/stats', async () => ({
    pid: process.pid, admitted: stats.admitted, without_store: null, errors: stats.errors,
  }));
  return app;
}

async function main() {
  const opts = options();
  const { client, limiter } = await connect(opts);
  if (limiter !== null) {
    // One consume before listening: a store or script the limiter cannot use (Valkey-only Lua on
    // Redis, say) fails the start, with its message, instead of every request.
    await limiter.consume('__ratewarden_probe__', 1).catch((err) => {
      if (!(err instanceof rlflx.RateLimiterRes)) throw err;
    });
    await limiter.delete('__ratewarden_probe__');
  }
  const app = build(limiter);
  await app.listen({ host: '127.0.0.1', port: Number(opts.port) });
  const stop = () => {
    app.close().finally(() => {
      const closed = client === null ? null : client.close ? client.close() : client.quit();
      Promise.resolve(closed).finally(() => process.exit(0));
    });
  };
  process.once('SIGTERM', stop);
  process.once('SIGINT', stop);
}

main().catch((err) => {
  process.stderr.write(`rlflx app failed at start: ${err && err.stack ? err.stack : err}\n`);
  process.exit(1);
});
