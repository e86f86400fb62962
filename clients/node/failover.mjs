// What a client on a broker set's address needs to follow a failover (docs/replication.md,
// "Failover"): the set's engines, the socket options that make a paused engine's connection
// break, the search for the master by `route` (docs/protocol.md 4.14) on short-lived sockets,
// the pauses between rounds of it, and the UNIQ_KEY each message keeps across its attempts.
//
// The constants are the same in every client of the store.

import { randomBytes } from "node:crypto";
import { Dealer } from "zeromq";
import { Decoder, Encoder } from "@msgpack/msgpack";

/** A ZMTP PING this often on a set's sockets. */
export const HEARTBEAT_IVL_MS = 250;
/** No traffic this long after a PING (a paused or cut-off engine), or no handshake: the connection breaks. */
export const HEARTBEAT_TIMEOUT_MS = 1000;
/** The longest one `route` may take while the client looks for the master. */
export const ROUTE_PROBE_MS = 500;
/** The pause between rounds of looking for the master: the first, doubled each round up to the last. */
export const LOOK_PAUSE_FIRST_MS = 50;
export const LOOK_PAUSE_MAX_MS = 100;

/** Socket options of a connection that must break, not stay silent, when its engine stops answering. */
export const WATCHED_SOCKET_OPTIONS = Object.freeze({
  heartbeatInterval: HEARTBEAT_IVL_MS,
  heartbeatTimeout: HEARTBEAT_TIMEOUT_MS,
  handshakeInterval: HEARTBEAT_TIMEOUT_MS,
});

/**
 * Socket events that say a watched connection is gone: `disconnect` (a reset or close by the
 * engine, or heartbeats unanswered) and `connect:retry` (the connection was refused: nothing
 * listens there). zeromq.js 6.8 reports a refusal as `connect:delay`, `close`, `connect:retry`.
 */
export const BROKEN_EVENTS = new Set(["disconnect", "connect:retry"]);

const encoder = new Encoder({ useBigInt64: true });
const decoder = new Decoder({ useBigInt64: true });

/** The engines of an address: one endpoint, or a broker set's separated by commas. */
export function endpointsOf(address) {
  if (!address.includes(",")) return [address];
  const endpoints = address.split(",").map((part) => part.trim()).filter((part) => part !== "");
  if (endpoints.length === 0) throw new TypeError(`the address ${JSON.stringify(address)} names no engine`);
  return endpoints;
}

/** The pause after one of `previousMs` (undefined: the first). */
export function nextPauseMs(previousMs) {
  return previousMs === undefined ? LOOK_PAUSE_FIRST_MS : Math.min(previousMs * 2, LOOK_PAUSE_MAX_MS);
}

/**
 * The `route` reply of one engine, asked on a socket of its own; undefined when the connection
 * is refused or breaks, or no answer comes within `timeoutMs`.
 */
export async function askRoute(endpoint, socketOptions, timeoutMs = ROUTE_PROBE_MS) {
  const socket = new Dealer({ ...socketOptions, linger: 0 });
  let timer;
  try {
    const givenUp = new Promise((resolve) => {
      timer = setTimeout(resolve, timeoutMs);
      for (const type of BROKEN_EVENTS) socket.events.on(type, () => resolve(undefined));
    });
    socket.connect(endpoint);
    const answered = (async () => {
      await socket.send(encoder.encode({ v: 1, op: "route", id: 1 }));
      const frames = await socket.receive();
      return decoder.decode(frames[frames.length - 1]);
    })().catch(() => undefined); // the socket closed under it: given up already
    const reply = await Promise.race([answered, givenUp]);
    return reply !== null && typeof reply === "object" && reply.ok === true ? reply : undefined;
  } finally {
    clearTimeout(timer);
    socket.close();
  }
}

/** Among `{endpoint, reply}` answers, the endpoint of the master of the highest epoch; undefined if none. */
function masterAmong(answers) {
  let best;
  for (const { endpoint, reply } of answers) {
    if (reply?.role !== "master") continue;
    const epoch = Number(reply.epoch ?? 0);
    if (best === undefined || epoch > best.epoch) best = { endpoint, epoch };
  }
  return best?.endpoint;
}

/**
 * One round of looking for the master of a set: every engine is asked its `route` at once, each
 * within ROUTE_PROBE_MS. The one that just failed (`failed`) counts last: its answer is waited
 * for only when no other engine is master. Resolves to the master's endpoint, or undefined.
 */
export async function findMaster(endpoints, failed, socketOptions) {
  const ask = (endpoint) => askRoute(endpoint, socketOptions).then((reply) => ({ endpoint, reply }));
  const last = endpoints.includes(failed) ? ask(failed) : undefined;
  const found = masterAmong(await Promise.all(endpoints.filter((e) => e !== failed).map(ask)));
  if (found !== undefined || last === undefined) {
    last?.catch(() => undefined);
    return found;
  }
  return masterAmong([await last]);
}

/**
 * UNIQ_KEYs of one client: 32 uppercase hex characters, 8 random bytes (the process id in the
 * first two) then a counter, the shape the engine makes (docs/protocol.md 6.3). A message keeps
 * the key it was given here through every attempt of its send, so a consumer can drop a
 * duplicate stored by an attempt whose answer was lost.
 */
export class UniqKeys {
  constructor() {
    const prefix = Buffer.concat([Buffer.from([(process.pid >> 8) & 0xff, process.pid & 0xff]), randomBytes(6)]);
    this.prefix = prefix.toString("hex").toUpperCase();
    this.counter = 0n;
  }

  next() {
    const key = this.prefix + this.counter.toString(16).toUpperCase().padStart(16, "0");
    this.counter = (this.counter + 1n) & 0xffffffffffffffffn;
    return key;
  }
}
