// A producer in another language, written from docs/protocol.md alone: it enqueues jobs for a
// fenced-worker app (tests/test_node_producer.py runs it against real workers).
// Usage: REDIS_URL=redis://... WORKER_KEY_PREFIX=shop: node producer.js
"use strict";
const crypto = require("node:crypto");
const Redis = require("ioredis");
const { encode } = require("@msgpack/msgpack");

const prefix = process.env.WORKER_KEY_PREFIX || "worker:";
const redis = new Redis(process.env.REDIS_URL); // redis://user:password@host:port/db
const db = redis.options.db || 0;

const DAY_MS = 86400000; // the job record outlives its due time by a day
const queueKey = (name) => (name === "default" ? `${prefix}queue` : `${prefix}queue:${name}`);
const wakeChannel = `${prefix}wake${db ? `@db${db}` : ""}`;

// Redis server time in ms: the one clock every process agrees on.
async function serverMs() {
  const [seconds, micros] = await redis.time();
  return Number(seconds) * 1000 + Math.floor(Number(micros) / 1000);
}

function record(fn, args, kwargs, nowMs) {
  return Buffer.from(encode({ t: null, f: fn, a: args, k: kwargs, et: nowMs }));
}

// A job with a new random id: the plain commands, record first, then the queue entry.
async function enqueue(fn, args, kwargs = {}, { deferMs = 0, queue = "default" } = {}) {
  const id = prefix + crypto.randomUUID().replaceAll("-", "");
  const now = await serverMs();
  const due = now + deferMs;
  const [[, set]] = await redis
    .multi()
    .set(`arq:job:${id}`, record(fn, args, kwargs, now), "PX", DAY_MS + deferMs, "NX")
    .zadd(queueKey(queue), due, id)
    .publish(wakeChannel, String(due))
    .exec();
  if (set !== "OK") throw new Error(`job id ${id} was taken`);
  return { id, due };
}

// A job with a unique key: the script writes it unless its job or result record exists.
const UNIQUE = `
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then
  return 0
end
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[1], ARGV[3], ARGV[4])
redis.call('PUBLISH', ARGV[5], ARGV[3])
return 1
`;

async function enqueueUnique(key, fn, args, kwargs = {}, { deferMs = 0, queue = "default" } = {}) {
  const id = `${prefix}unique:${key}`;
  const now = await serverMs();
  const due = now + deferMs;
  const keys = [queueKey(queue), `arq:job:${id}`, `arq:result:${id}`];
  const argv = [record(fn, args, kwargs, now), DAY_MS + deferMs, due, id, wakeChannel];
  const written = await redis.eval(UNIQUE, keys.length, ...keys, ...argv);
  return { id, due, written: written === 1 };
}

async function main() {
  const plain = await enqueue("note", ["plain"], { source: "node" });
  const first = await enqueueUnique("once", "note", ["unique"], { source: "node" });
  const again = await enqueueUnique("once", "note", ["unique"], { source: "node" });
  const later = await enqueue("note", ["deferred"], { source: "node" }, { deferMs: 2000 });
  console.log(JSON.stringify({ plain, first, again, later }));
  await redis.quit();
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
