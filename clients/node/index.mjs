// Node.js client of the message store: the protocol of docs/protocol.md over a ZeroMQ DEALER socket.
//
//     import { StoreClient } from "rmqpy-client";
//
//     const client = new StoreClient("tcp://127.0.0.1:10911");
//     await client.createTopic("orders", 4);
//     const result = await client.send("orders", { body: "hello", keys: ["order-1"], tags: "new" });
//     const reply = await client.pull("orders", result.queue_id, result.queue_offset);
//     const found = await client.queryByKey("orders", "order-1");
//     client.close();
//
// One client may have many calls in flight. Every request carries a fresh id, and one reader
// per socket hands each reply to the call waiting for that id; replies with an unknown id are
// dropped. Every call has a deadline and fails with a StoreTimeoutError (code -1, TIMEOUT) when
// it passes. After a timeout the socket is retired: new calls go out on a fresh socket, and the
// old one is closed (linger 0, dropping any frame never sent) once its last call has settled.
//
// Following the master: a replica (or a master whose lease ran out) refuses every write with
// NOT_MASTER (27) and names the master's endpoint beside the error. The client then moves to
// that endpoint for good (`endpoint` changes; later calls go there) and sends the same request
// there once more: the refusing engine did nothing with it, so nothing is stored twice.
//
// A broker set's address (its engines separated by commas) makes the client follow a failover
// (docs/replication.md, "Failover"): each call keeps one deadline, a connection that breaks, is
// refused or goes silent (heartbeats, failover.mjs) sends the call again, with the same UNIQ_KEYs,
// to the master that `route` names, and the caller sees an error only once the deadline passes.
//
// Integers: replies are decoded with 64-bit integers as BigInt and then narrowed, so every
// integer within Number.MAX_SAFE_INTEGER (all offsets, ids and timestamps in practice) is a
// plain number, and a larger one stays a BigInt instead of silently losing precision.
// Integer arguments may be safe-integer numbers or BigInts.

import { Dealer, curveKeyPair } from "zeromq";
import { Decoder, Encoder } from "@msgpack/msgpack";
import zlib from "node:zlib";
import {
  BROKEN_EVENTS, ROUTE_PROBE_MS, UniqKeys, WATCHED_SOCKET_OPTIONS, askRoute, endpointsOf, findMaster, nextPauseMs,
} from "./failover.mjs";

export { curveKeyPair };

export const PROTOCOL_VERSION = 1;
export const DEFAULT_ENDPOINT = "tcp://127.0.0.1:10911";
export const DEFAULT_TIMEOUT_MS = 5000;
export const DEFAULT_MAX_IN_FLIGHT = 256;
/**
 * The protocol's frame limit (docs/protocol.md 1.5), the engine's default client_frame_bytes_max.
 * ZeroMQ drops a larger frame at the engine without a reply, so `request` refuses it before
 * sending, as MESSAGE_ILLEGAL (the code the engine gives a body too large).
 */
export const FRAME_BYTES_MAX = 4 * 1024 * 1024 + 64 * 1024;
export const MESSAGE_BODY_BYTES_MAX = 4 * 1024 * 1024;
const MESSAGE_ILLEGAL = 8;
const NOT_MASTER = 27;
/** Refusals of a moment (SLAVE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE, BUSY): on a set, tried again on the same engine. */
const REFUSED_FOR_NOW = new Set([14, 20, 28]);

/** Codes of failures raised by the client itself; the engine's own codes are all positive. */
export const ClientErrorCode = Object.freeze({
  TIMEOUT: -1,
  CLOSED: -2,
  BAD_REPLY: -3,
  SEND_FAILED: -4,
  CONNECTION_LOST: -6,
});

const encoder = new Encoder({ useBigInt64: true, ignoreUndefined: true });
const decoder = new Decoder({ useBigInt64: true });

const SAFE_MIN = BigInt(Number.MIN_SAFE_INTEGER);
const SAFE_MAX = BigInt(Number.MAX_SAFE_INTEGER);

/** A refused request (engine error, `code` > 0) or a client-side failure (`code` < 0). */
export class StoreError extends Error {
  constructor(code, codeName, message, op, details = {}) {
    super(message);
    this.name = "StoreError";
    /** Stable numeric code: docs/protocol.md 7.3, or a ClientErrorCode. */
    this.code = code;
    /** The code's name, e.g. "TOPIC_NOT_FOUND" or "TIMEOUT". */
    this.codeName = codeName;
    /** The operation that failed, e.g. "pull". */
    this.op = op;
    /** The refusal's fields beside `error`, e.g. `master_endpoint` of NOT_MASTER; {} if none. */
    this.details = details;
  }

  toString() {
    return `${this.name}: ${this.codeName} (${this.code}): ${this.message}`;
  }
}

/** No reply before the deadline. For `send` the outcome is unknown (docs/protocol.md 4.1, Retries). */
export class StoreTimeoutError extends StoreError {
  constructor(message, op) {
    super(ClientErrorCode.TIMEOUT, "TIMEOUT", message, op);
    this.name = "StoreTimeoutError";
  }
}

// -- argument checks ------------------------------------------------------------
// Only types are checked here; ranges are the engine's business. A wrongly typed topic or
// queue_id would otherwise come back with id 0, which no call can be matched to.

function checkString(name, value) {
  if (typeof value !== "string") {
    throw new TypeError(`${name} must be a string, not ${describe(value)}`);
  }
}

function checkInt(name, value) {
  if (!(typeof value === "bigint" || Number.isSafeInteger(value))) {
    throw new TypeError(`${name} must be an integer (a safe-integer number or a BigInt), not ${describe(value)}`);
  }
}

function checkOptional(check, name, value) {
  if (value !== undefined && value !== null) check(name, value);
}

function checkBoolean(name, value) {
  if (typeof value !== "boolean") {
    throw new TypeError(`${name} must be a boolean, not ${describe(value)}`);
  }
}

const TIMER_MS_MAX = 2 ** 31 - 1; // setTimeout fires at once for anything longer

function checkTimeout(name, value) {
  if (!Number.isSafeInteger(value) || value <= 0 || value > TIMER_MS_MAX) {
    throw new TypeError(`${name} must be an integer number of milliseconds from 1 to ${TIMER_MS_MAX}, not ${describe(value)}`);
  }
}

function describe(value) {
  if (value === null) return "null";
  if (typeof value === "string") return `the string ${JSON.stringify(value)}`;
  if (typeof value === "number") return `the number ${value}`;
  return typeof value;
}

// -- encoding ---------------------------------------------------------------------

/** A body as bytes: strings become UTF-8, byte views are sent as they are (msgpack bin). */
function toBytes(body) {
  if (typeof body === "string") return Buffer.from(body, "utf8");
  if (body instanceof Uint8Array) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body);
  if (ArrayBuffer.isView(body)) return new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
  throw new TypeError(`a message body must be a Buffer, Uint8Array, ArrayBuffer or string, not ${describe(body)}`);
}

/**
 * The wire map of one message. A bare body (bytes or string) is a message with only a body.
 * `bornTimestamp` is accepted for `born_timestamp`; other fields go out as given, so an
 * unknown one is refused by the engine (INVALID_FIELD) rather than dropped here.
 */
function toWireMessage(message) {
  if (typeof message === "string" || ArrayBuffer.isView(message) || message instanceof ArrayBuffer) {
    return { body: toBytes(message) };
  }
  if (message === null || typeof message !== "object") {
    throw new TypeError(`a message must be an object or a body, not ${describe(message)}`);
  }
  const { body, bornTimestamp, ...rest } = message;
  const wire = { body: toBytes(body), ...rest };
  if (bornTimestamp !== undefined) wire.born_timestamp = bornTimestamp;
  // null means "none" here; the engine takes nil only for the nullable tags and born_timestamp.
  if (wire.keys === null) delete wire.keys;
  if (wire.properties === null) delete wire.properties;
  if (typeof wire.keys === "string") {
    wire.keys = [wire.keys];
  } else if (wire.keys !== undefined && wire.keys !== null && !Array.isArray(wire.keys)) {
    wire.keys = Array.from(wire.keys);
  }
  if (wire.properties instanceof Map) wire.properties = Object.fromEntries(wire.properties);
  return wire;
}

const INT32_MIN = -(2 ** 31);
const UINT32_LIMIT = 2 ** 32;

/**
 * A copy of a request value in which integer numbers outside the 32-bit range are BigInts.
 * With useBigInt64 on, @msgpack/msgpack writes a *number* beyond 32 bits as a float64, which
 * the engine refuses for integer fields; a BigInt goes out as int64/uint64. Bodies are kept as
 * they are (no copy).
 */
function widenIntegers(value) {
  if (typeof value === "number") {
    return Number.isSafeInteger(value) && (value >= UINT32_LIMIT || value < INT32_MIN) ? BigInt(value) : value;
  }
  if (value === null || typeof value !== "object" || ArrayBuffer.isView(value) || value instanceof ArrayBuffer) {
    return value;
  }
  if (Array.isArray(value)) return value.map(widenIntegers);
  const out = Object.create(null); // so that a key named "__proto__" stays an ordinary key
  for (const key of Object.keys(value)) out[key] = widenIntegers(value[key]);
  return out;
}

// -- decoding ---------------------------------------------------------------------

/** Narrow BigInts that fit into a safe number and expose bodies as Buffers (views, no copy). */
function normalize(value) {
  if (typeof value === "bigint") {
    return value >= SAFE_MIN && value <= SAFE_MAX ? Number(value) : value;
  }
  if (value instanceof Uint8Array) {
    return Buffer.isBuffer(value) ? value : Buffer.from(value.buffer, value.byteOffset, value.byteLength);
  }
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) value[i] = normalize(value[i]);
    return value;
  }
  if (value !== null && typeof value === "object") {
    for (const key of Object.keys(value)) value[key] = normalize(value[key]);
  }
  return value;
}

/**
 * The top-level `id` of a reply frame the decoder refused (for example a stored property
 * named "__proto__", which @msgpack/msgpack will not decode), so that the waiting call fails
 * at once instead of timing out. Returns undefined when the frame gives no usable id.
 */
function peekReplyId(frame) {
  try {
    const bytes = frame instanceof Uint8Array ? frame : new Uint8Array(frame);
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    let pos = 0;
    const head = bytes[pos++];
    let entries;
    if (head >= 0x80 && head <= 0x8f) entries = head & 0x0f;
    else if (head === 0xde) { entries = view.getUint16(pos); pos += 2; }
    else if (head === 0xdf) { entries = view.getUint32(pos); pos += 4; }
    else return undefined;
    for (let i = 0; i < entries; i++) {
      const keyEnd = skipValue(bytes, view, pos);
      const isId = keyEnd - pos === 3 && bytes[pos] === 0xa2 && bytes[pos + 1] === 0x69 && bytes[pos + 2] === 0x64;
      const valueEnd = skipValue(bytes, view, keyEnd);
      if (isId) return normalize(decoder.decode(bytes.subarray(keyEnd, valueEnd)));
      pos = valueEnd;
    }
  } catch {
    // Not even the envelope is readable.
  }
  return undefined;
}

/** The position just past the msgpack value that starts at `pos`. */
function skipValue(bytes, view, pos) {
  const head = bytes[pos++];
  if (head === undefined) throw new RangeError("truncated msgpack value");
  if (head <= 0x7f || head >= 0xe0) return pos; // positive and negative fixint
  if (head <= 0x8f) return skipValues(bytes, view, pos, 2 * (head & 0x0f)); // fixmap
  if (head <= 0x9f) return skipValues(bytes, view, pos, head & 0x0f); // fixarray
  if (head <= 0xbf) return pos + (head & 0x1f); // fixstr
  switch (head) {
    case 0xc0: case 0xc2: case 0xc3: return pos;
    case 0xc4: case 0xd9: return pos + 1 + bytes[pos];
    case 0xc5: case 0xda: return pos + 2 + view.getUint16(pos);
    case 0xc6: case 0xdb: return pos + 4 + view.getUint32(pos);
    case 0xc7: return pos + 2 + bytes[pos];
    case 0xc8: return pos + 3 + view.getUint16(pos);
    case 0xc9: return pos + 5 + view.getUint32(pos);
    case 0xcc: case 0xd0: return pos + 1;
    case 0xcd: case 0xd1: case 0xd4: return pos + 2;
    case 0xd5: return pos + 3;
    case 0xca: case 0xce: case 0xd2: return pos + 4;
    case 0xd6: return pos + 5;
    case 0xcb: case 0xcf: case 0xd3: return pos + 8;
    case 0xd7: return pos + 9;
    case 0xd8: return pos + 17;
    case 0xdc: return skipValues(bytes, view, pos + 2, view.getUint16(pos));
    case 0xdd: return skipValues(bytes, view, pos + 4, view.getUint32(pos));
    case 0xde: return skipValues(bytes, view, pos + 2, 2 * view.getUint16(pos));
    case 0xdf: return skipValues(bytes, view, pos + 4, 2 * view.getUint32(pos));
    default: throw new RangeError(`msgpack type byte 0x${head.toString(16)} is not defined`);
  }
}

function skipValues(bytes, view, pos, count) {
  for (let i = 0; i < count; i++) pos = skipValue(bytes, view, pos);
  return pos;
}

function pause(ms) {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}

/** A message's wire map with a UNIQ_KEY property: its own if it has one, else the next of `uniqKeys`. */
function withUniqKey(wire, uniqKeys) {
  const properties = wire.properties ?? {};
  if (typeof properties.UNIQ_KEY === "string" && properties.UNIQ_KEY !== "") return wire;
  return { ...wire, properties: { ...properties, UNIQ_KEY: uniqKeys.next() } };
}

function envelopeless(reply) {
  const { v, id, ok, ...fields } = reply;
  return fields;
}

/** The StoreError of an `ok: false` reply, its fields beside `error` as `details`. */
function refusal(reply, op) {
  const { v, id, ok, error, ...details } = reply;
  const { code = 0, name = "UNKNOWN", message = "" } = error ?? {};
  return new StoreError(code, name, message, op, details);
}

/**
 * The master a NOT_MASTER refusal names, when it is another engine than `endpoint`, the one
 * that refused; undefined otherwise (an answer, another refusal, or no master known yet).
 */
function masterNamed(reply, endpoint) {
  if (reply.ok === true || reply.error?.code !== NOT_MASTER) return undefined;
  const master = reply.master_endpoint;
  return typeof master === "string" && master !== "" && master !== endpoint ? master : undefined;
}

// -- connections ------------------------------------------------------------------

/**
 * One DEALER socket, its send queue and the number of calls waiting for a reply on it. A watched
 * one (on a broker set's address) sends heartbeats, and its events are read while calls wait.
 */
class Connection {
  constructor(endpoint, socketOptions, { watched = false } = {}) {
    this.endpoint = endpoint;
    this.socket = new Dealer(watched ? { ...socketOptions, ...WATCHED_SOCKET_OPTIONS } : socketOptions);
    this.socket.connect(endpoint);
    this.watched = watched;
    this.watching = false;
    this.pending = 0;
    this.reading = false;
    this.retired = false;
    this.closed = false;
    // zeromq allows one blocked send at a time; chaining keeps them in order and one by one.
    this.sendChain = Promise.resolve();
  }

  close() {
    if (this.closed) return;
    this.closed = true;
    this.socket.close();
  }
}

// -- the client -------------------------------------------------------------------

export class StoreClient {
  /**
   * @param {string} endpoint e.g. "tcp://127.0.0.1:10911", or a broker set's address: its engines
   *   separated by commas, and the client follows the set's failovers (see `request`)
   * @param {object} [options]
   * @param {number} [options.timeoutMs=5000] deadline of every call, unless the call gives its own
   * @param {{serverKey: string, publicKey: string, secretKey: string}} [options.curve] CURVE keys, Z85
   * @param {number} [options.maxInFlight=256] calls sent and not yet answered; more wait their turn
   * @param {number} [options.frameBytesMax=FRAME_BYTES_MAX] the largest request sent: the engine's
   *   client_frame_bytes_max (raise it only with the engine's)
   * @param {boolean} [options.watchConnection=false] with one endpoint: a call whose connection breaks,
   *   is refused or goes silent fails at once with CONNECTION_LOST (-6) instead of at its deadline
   *   (always so on a broker set's address, where the call is sent again to the master)
   */
  constructor(endpoint = DEFAULT_ENDPOINT, options = {}) {
    checkString("endpoint", endpoint);
    const { timeoutMs = DEFAULT_TIMEOUT_MS, curve, maxInFlight = DEFAULT_MAX_IN_FLIGHT,
      frameBytesMax = FRAME_BYTES_MAX, watchConnection = false } = options;
    checkBoolean("watchConnection", watchConnection);
    checkTimeout("timeoutMs", timeoutMs);
    if (!Number.isSafeInteger(maxInFlight) || maxInFlight < 1) {
      throw new TypeError(`maxInFlight must be a positive integer, not ${describe(maxInFlight)}`);
    }
    /** The engines of the address given: one, or a broker set's. */
    this.endpoints = endpointsOf(endpoint);
    /** The engine calls go to now. */
    this.endpoint = this.endpoints[0];
    this.timeoutMs = timeoutMs;
    this._onSet = this.endpoints.length > 1;
    this._watched = this._onSet || watchConnection;
    this._uniqKeys = this._onSet ? new UniqKeys() : null;
    this._search = undefined; // the round of looking for the master under way, shared by the calls that wait for it
    this.maxInFlight = maxInFlight;
    this.frameBytesMax = frameBytesMax;
    this._socketOptions = { linger: 0 };
    if (curve !== undefined && curve !== null) {
      for (const name of ["serverKey", "publicKey", "secretKey"]) {
        const key = curve[name];
        const ok = (typeof key === "string" && key.length === 40) || (key instanceof Uint8Array && key.length === 32);
        if (!ok) throw new TypeError(`curve.${name} must be a 40-character Z85 string (or 32 bytes)`);
      }
      this._socketOptions.curveServerKey = curve.serverKey;
      this._socketOptions.curvePublicKey = curve.publicKey;
      this._socketOptions.curveSecretKey = curve.secretKey;
    }
    this._pending = new Map(); // request id -> call
    this._waiting = []; // calls waiting for an in-flight slot, oldest first
    this._inFlight = 0;
    this._nextId = 1;
    this._connection = null; // the socket new calls go out on
    this._connections = new Set(); // every socket not yet closed
    this._closed = false;
  }

  get closed() {
    return this._closed;
  }

  /**
   * Send one request and wait for its reply. Returns the whole reply map (`v`, `id`, `ok` and
   * the operation's fields); throws a StoreError when the engine refuses it or no reply comes.
   * `fields` use the wire names of docs/protocol.md (snake_case).
   *
   * A refusal NOT_MASTER naming another engine as the master moves the client there (see
   * `endpoint`) and sends the request there once more, with a deadline of its own.
   */
  async request(op, fields = {}, { timeoutMs } = {}) {
    if (this._closed) {
      throw new StoreError(ClientErrorCode.CLOSED, "CLOSED", "the client is closed", op);
    }
    checkString("op", op);
    for (const name of ["v", "op", "id"]) {
      if (Object.hasOwn(fields, name)) throw new TypeError(`fields must not set the envelope field ${name}`);
    }
    const timeout = timeoutMs ?? this.timeoutMs;
    checkTimeout("timeoutMs", timeout);
    const wireFields = widenIntegers(fields);
    if (this._onSet) return this._requestOnSet(op, wireFields, timeout);
    const first = await this._exchange(op, wireFields, timeout);
    let reply = first.reply;
    const master = masterNamed(reply, first.endpoint);
    if (master !== undefined) {
      // The refusing engine did nothing with the request, so sending it again stores nothing twice.
      this._moveTo(master);
      reply = (await this._exchange(op, wireFields, timeout)).reply;
    }
    if (reply.ok !== true) throw refusal(reply, op);
    return reply;
  }

  /**
   * A request on a broker set's address, within one deadline of `timeout` ms: a NOT_MASTER naming
   * another engine is followed at once; one naming none, or a connection that broke, was refused
   * or went silent, has the master looked for (`route` of every engine, failover.mjs) and the same
   * request sent there; SLAVE_NOT_AVAILABLE, SERVICE_NOT_AVAILABLE and BUSY are tried again on the
   * same engine after a pause. At the deadline the last error is thrown; a timeout with no broken
   * connection is thrown as it is (a busy master may have carried the request out).
   */
  async _requestOnSet(op, wireFields, timeout) {
    const deadline = performance.now() + timeout;
    let lastError;
    let pauseMs;
    let followed; // the master a NOT_MASTER named, followed at once (once per master)
    for (;;) {
      const remaining = Math.ceil(deadline - performance.now());
      if (remaining <= 0) {
        throw lastError ?? new StoreTimeoutError(`no reply to ${op} from ${this.endpoint} within ${timeout} ms`, op);
      }
      let outcome;
      try {
        outcome = await this._exchange(op, wireFields, remaining);
      } catch (err) {
        if (!(err instanceof StoreError) || err.code !== ClientErrorCode.CONNECTION_LOST) throw err;
        lastError = err;
        pauseMs = await this._lookForMaster(err.details.endpoint, deadline, pauseMs);
        continue;
      }
      const { reply, endpoint } = outcome;
      if (reply.ok === true) return reply;
      const code = reply.error?.code;
      if (code === NOT_MASTER) {
        lastError = refusal(reply, op);
        const master = masterNamed(reply, endpoint);
        if (master !== undefined && master !== followed) {
          followed = master; // the refusing engine stored nothing: sent again there at once
          this._moveTo(master);
        } else {
          pauseMs = await this._lookForMaster(endpoint, deadline, pauseMs);
        }
      } else if (REFUSED_FOR_NOW.has(code)) {
        lastError = refusal(reply, op);
        pauseMs = nextPauseMs(pauseMs);
        await pause(Math.min(pauseMs, deadline - performance.now()));
      } else {
        throw refusal(reply, op);
      }
    }
  }

  /**
   * One round of looking for the master, `failed` (the engine that just failed) asked last; the
   * client moves to the master found. When none is, a pause (after `pauseMs`, the last one) that
   * ends by the deadline. Resolves to the pause taken, or undefined when a master was found.
   */
  async _lookForMaster(failed, deadline, pauseMs) {
    this._search ??= findMaster(this.endpoints, failed, this._socketOptions).finally(() => {
      this._search = undefined;
    });
    const master = await this._search;
    if (master !== undefined && !this._closed) {
      this._moveTo(master);
      return undefined;
    }
    const next = nextPauseMs(pauseMs);
    await pause(Math.min(next, deadline - performance.now()));
    return next;
  }

  /**
   * One request on the current socket. Resolves to the reply, `ok` or not, and the endpoint
   * that gave it; rejects only when no reply comes (or the client is closed).
   */
  async _exchange(op, wireFields, timeout) {
    if (this._closed) {
      throw new StoreError(ClientErrorCode.CLOSED, "CLOSED", "the client is closed", op);
    }
    const id = this._takeId();
    const frame = encoder.encode({ v: PROTOCOL_VERSION, op, id, ...wireFields });
    if (frame.length > this.frameBytesMax) {
      throw new StoreError(MESSAGE_ILLEGAL, "MESSAGE_ILLEGAL",
        `the '${op}' request is ${frame.length} bytes; the engine drops requests over ${this.frameBytesMax} ` +
        `bytes (client_frame_bytes_max) without a reply; a message body is at most ${MESSAGE_BODY_BYTES_MAX} ` +
        `bytes (message_body_bytes_max): split the batch or make the body smaller`, op);
    }
    return new Promise((resolve, reject) => {
      const call = { id, op, frame, resolve, reject, connection: null, done: false, timer: null };
      call.timer = setTimeout(() => this._timedOut(call, timeout), timeout);
      this._pending.set(id, call);
      if (this._inFlight < this.maxInFlight) this._start(call);
      else this._waiting.push(call);
    });
  }

  /**
   * Store messages, all in one queue of `topic`. `messages` is one message or an array of them;
   * a message is `{body, tags?, keys?, properties?, flag?, bornTimestamp?}` or a bare body.
   * Returns the result (`status`, `status_code`, `msg_id`, `queue_id`, `queue_offset`,
   * `commit_log_offset`, `store_timestamp`) for one message, or the array of results for an array.
   *
   * Delayed (one of `delayMs` from now, `deliverAtMs` since the epoch, or RocketMQ 4's
   * `delayLevel`): stored now, in its queue at that time. Transactional (`transaction: true`
   * with `producerGroup`): stored as half messages, invisible until `endTransaction` commits
   * them by the `msg_id` of their results.
   */
  async send(topic, messages, {
    queueId, shardingKey, waitStore, delayMs, deliverAtMs, delayLevel, transaction, producerGroup, timeoutMs,
  } = {}) {
    checkString("topic", topic);
    checkOptional(checkInt, "queueId", queueId);
    checkOptional(checkString, "shardingKey", shardingKey);
    checkOptional(checkBoolean, "waitStore", waitStore);
    checkOptional(checkInt, "delayMs", delayMs);
    checkOptional(checkInt, "deliverAtMs", deliverAtMs);
    checkOptional(checkInt, "delayLevel", delayLevel);
    checkOptional(checkBoolean, "transaction", transaction);
    checkOptional(checkString, "producerGroup", producerGroup);
    const batch = Array.isArray(messages);
    const fields = { topic, messages: (batch ? messages : [messages]).map(toWireMessage) };
    // On a set a send may go out more than once: each message keeps one UNIQ_KEY through all.
    if (this._uniqKeys !== null) fields.messages = fields.messages.map((m) => withUniqKey(m, this._uniqKeys));
    if (queueId !== undefined && queueId !== null) fields.queue_id = queueId;
    if (shardingKey !== undefined && shardingKey !== null) fields.sharding_key = shardingKey;
    if (waitStore !== undefined && waitStore !== null) fields.wait_store = waitStore;
    if (delayMs !== undefined && delayMs !== null) fields.delay_ms = delayMs;
    if (deliverAtMs !== undefined && deliverAtMs !== null) fields.deliver_at_ms = deliverAtMs;
    if (delayLevel !== undefined && delayLevel !== null) fields.delay_level = delayLevel;
    if (transaction === true) fields.transaction = true;
    if (producerGroup !== undefined && producerGroup !== null) fields.producer_group = producerGroup;
    const reply = await this.request("send", fields, { timeoutMs });
    return batch ? reply.results : reply.results[0];
  }

  /**
   * Read messages of one queue from `offset`. Returns `{status, status_code, next_offset,
   * min_offset, max_offset, messages}`; always continue from `next_offset`. With `maxWaitMs`
   * the engine holds a pull that finds nothing new (long polling); the deadline grows by as much.
   */
  async pull(topic, queueId, offset, { maxMessages, maxBytes, maxWaitMs, subscription, timeoutMs } = {}) {
    checkString("topic", topic);
    checkInt("queueId", queueId);
    checkInt("offset", offset);
    checkOptional(checkInt, "maxMessages", maxMessages);
    checkOptional(checkInt, "maxBytes", maxBytes);
    checkOptional(checkInt, "maxWaitMs", maxWaitMs);
    checkOptional(checkString, "subscription", subscription);
    const fields = { topic, queue_id: queueId, offset };
    if (maxMessages !== undefined && maxMessages !== null) fields.max_messages = maxMessages;
    if (maxBytes !== undefined && maxBytes !== null) fields.max_bytes = maxBytes;
    if (subscription !== undefined && subscription !== null) fields.subscription = subscription;
    let deadline = timeoutMs ?? this.timeoutMs;
    if (maxWaitMs !== undefined && maxWaitMs !== null) {
      fields.max_wait_ms = maxWaitMs;
      deadline = Math.min(deadline + Number(maxWaitMs), TIMER_MS_MAX);
    }
    return envelopeless(await this.request("pull", fields, { timeoutMs: deadline }));
  }

  /** Messages of `topic` carrying `key` among their keys or as their uniq_key (oldest first). */
  async queryByKey(topic, key, { maxResults, beginTimestamp, endTimestamp, timeoutMs } = {}) {
    checkString("topic", topic);
    checkString("key", key);
    checkOptional(checkInt, "maxResults", maxResults);
    checkOptional(checkInt, "beginTimestamp", beginTimestamp);
    checkOptional(checkInt, "endTimestamp", endTimestamp);
    const fields = { topic, key };
    if (maxResults !== undefined && maxResults !== null) fields.max_results = maxResults;
    if (beginTimestamp !== undefined && beginTimestamp !== null) fields.begin_timestamp = beginTimestamp;
    if (endTimestamp !== undefined && endTimestamp !== null) fields.end_timestamp = endTimestamp;
    return (await this.request("query_by_key", fields, { timeoutMs })).messages;
  }

  /** The message with this msg_id (32 hex characters). */
  async getById(msgId, { timeoutMs } = {}) {
    checkString("msgId", msgId);
    return (await this.request("get_by_id", { msg_id: msgId }, { timeoutMs })).message;
  }

  /** The message whose record starts at this commit log offset. */
  async getByOffset(commitLogOffset, { timeoutMs } = {}) {
    checkInt("commitLogOffset", commitLogOffset);
    return (await this.request("get_by_offset", { commit_log_offset: commitLogOffset }, { timeoutMs })).message;
  }

  /** Record that `group` will next consume `offset` of this queue. */
  async commitOffset(group, topic, queueId, offset, { timeoutMs } = {}) {
    checkString("group", group);
    checkString("topic", topic);
    checkInt("queueId", queueId);
    checkInt("offset", offset);
    await this.request("commit_offset", { group, topic, queue_id: queueId, offset }, { timeoutMs });
  }

  /** The offset `group` committed for this queue, or -1 if it never committed one. */
  async fetchOffset(group, topic, queueId, { timeoutMs } = {}) {
    checkString("group", group);
    checkString("topic", topic);
    checkInt("queueId", queueId);
    return (await this.request("fetch_offset", { group, topic, queue_id: queueId }, { timeoutMs })).offset;
  }

  /**
   * Pop consumers (docs/protocol.md 4.12): take up to `maxMessages` for `group`. Each message
   * stays invisible to the group's other pops for `invisibleMs`, then comes back with
   * `attempt` + 1 unless acked. Resolves to the messages, each with `receipt_handle` and
   * `attempt` added. Without `queueId` the engine picks the queues.
   */
  async pop(group, topic, { queueId, maxMessages, invisibleMs, maxWaitMs, subscription, timeoutMs } = {}) {
    checkString("group", group);
    checkString("topic", topic);
    checkOptional(checkInt, "queueId", queueId);
    checkOptional(checkInt, "maxMessages", maxMessages);
    checkOptional(checkInt, "invisibleMs", invisibleMs);
    checkOptional(checkInt, "maxWaitMs", maxWaitMs);
    checkOptional(checkString, "subscription", subscription);
    const fields = { group, topic };
    if (queueId !== undefined && queueId !== null) fields.queue_id = queueId;
    if (maxMessages !== undefined && maxMessages !== null) fields.max_messages = maxMessages;
    if (invisibleMs !== undefined && invisibleMs !== null) fields.invisible_ms = invisibleMs;
    if (subscription !== undefined && subscription !== null) fields.subscription = subscription;
    let deadline = timeoutMs ?? this.timeoutMs;
    if (maxWaitMs !== undefined && maxWaitMs !== null) {
      fields.max_wait_ms = maxWaitMs;
      deadline = Math.min(deadline + Number(maxWaitMs), TIMER_MS_MAX);
    }
    const reply = await this.request("pop", fields, { timeoutMs: deadline });
    return reply.messages.map((message, i) => ({
      ...message, receipt_handle: reply.receipt_handles[i], attempt: reply.attempts[i],
    }));
  }

  /**
   * Acknowledge popped messages (their `receipt_handle`); one request per queue among them.
   * Resolves to the handles the engine refused (stale: delivered again or changed since), as
   * `{receipt_handle, error: {code, name, message}}`.
   */
  async ack(group, messages, { timeoutMs } = {}) {
    checkString("group", group);
    const byQueue = new Map();
    for (const message of messages) {
      const key = JSON.stringify([message.topic, Number(message.queue_id)]);
      if (!byQueue.has(key)) byQueue.set(key, []);
      byQueue.get(key).push(message.receipt_handle);
    }
    const failed = [];
    for (const [key, handles] of byQueue) {
      const [topic, queueId] = JSON.parse(key);
      for (let start = 0; start < handles.length; start += 1024) {
        const reply = await this.request("ack", {
          group, topic, queue_id: queueId, receipt_handles: handles.slice(start, start + 1024),
        }, { timeoutMs });
        failed.push(...reply.failed);
      }
    }
    return failed;
  }

  /** Make a popped message invisible for `invisibleMs` from now (0: a nack). Resolves to its new handle. */
  async changeInvisibleDuration(group, message, invisibleMs, { timeoutMs } = {}) {
    checkString("group", group);
    checkInt("invisibleMs", invisibleMs);
    const fields = {
      group, topic: message.topic, queue_id: message.queue_id, receipt_handle: message.receipt_handle,
      invisible_ms: invisibleMs,
    };
    return (await this.request("change_invisible", fields, { timeoutMs })).receipt_handle;
  }

  /** Give a popped message back now: it is redelivered with attempt + 1. */
  async nack(group, message, options = {}) {
    return this.changeInvisibleDuration(group, message, 0, options);
  }

  /** `ack_floor`, `pop_cursor`, `in_flight`, `due`, `redelivered`, `dead_lettered`, ... of a pop group on one queue. */
  async popStats(group, topic, queueId, { timeoutMs } = {}) {
    checkString("group", group);
    checkString("topic", topic);
    checkInt("queueId", queueId);
    return envelopeless(await this.request("pop_stats", { group, topic, queue_id: queueId }, { timeoutMs }));
  }

  /**
   * Transactional messages: commit (`"commit"`: the half message reaches its topic) or roll
   * back (`"rollback"`: it never does) the half message `msgId`, the `msg_id` its send
   * returned. With `producerGroup`, the half must be that group's. Resolves to the decision
   * that stands, once it does (a commit: once the message is stored). Refused with
   * TRANSACTION_NOT_FOUND (25) or TRANSACTION_ENDED (26: decided the other way already).
   */
  async endTransaction(msgId, decision, { producerGroup, timeoutMs } = {}) {
    checkString("msgId", msgId);
    checkString("decision", decision);
    checkOptional(checkString, "producerGroup", producerGroup);
    const fields = { msg_id: msgId, decision };
    if (producerGroup !== undefined && producerGroup !== null) fields.producer_group = producerGroup;
    return (await this.request("end_transaction", fields, { timeoutMs })).decision;
  }

  /** `endTransaction(msgId, "commit", options)`. */
  async commit(msgId, options = {}) {
    return this.endTransaction(msgId, "commit", options);
  }

  /** `endTransaction(msgId, "rollback", options)`. */
  async rollback(msgId, options = {}) {
    return this.endTransaction(msgId, "rollback", options);
  }

  /**
   * The half messages of `producerGroup` still undecided past the engine's
   * transaction_timeout_ms: answer each with `endTransaction` (its `msg_id`), or it is offered
   * again later and finally rolled back. Each is a stored message whose `topic` and `queue_id`
   * are where a commit puts it, with `check_times` (1 = first offer). With `maxWaitMs` the
   * engine holds the call until one is due (long polling); the deadline grows by as much.
   */
  async transactionChecks(producerGroup, { maxMessages, maxWaitMs, timeoutMs } = {}) {
    checkString("producerGroup", producerGroup);
    checkOptional(checkInt, "maxMessages", maxMessages);
    checkOptional(checkInt, "maxWaitMs", maxWaitMs);
    const fields = { producer_group: producerGroup };
    if (maxMessages !== undefined && maxMessages !== null) fields.max_messages = maxMessages;
    let deadline = timeoutMs ?? this.timeoutMs;
    if (maxWaitMs !== undefined && maxWaitMs !== null) {
      fields.max_wait_ms = maxWaitMs;
      deadline = Math.min(deadline + Number(maxWaitMs), TIMER_MS_MAX);
    }
    return (await this.request("transaction_checks", fields, { timeoutMs: deadline })).checks;
  }

  /** Create a topic or grow its queue count. Returns `{topic, queue_count}`. */
  async createTopic(topic, queueCount, { timeoutMs } = {}) {
    checkString("topic", topic);
    checkOptional(checkInt, "queueCount", queueCount);
    const fields = { topic };
    if (queueCount !== undefined && queueCount !== null) fields.queue_count = queueCount;
    return envelopeless(await this.request("create_topic", fields, { timeoutMs }));
  }

  /**
   * Delete a topic, its queues and its consumer offsets. Returns `{topic, deletion_offset}`.
   * After a timeout, call it again: TOPIC_NOT_FOUND then means the deletion took place.
   */
  async deleteTopic(topic, { timeoutMs } = {}) {
    checkString("topic", topic);
    return envelopeless(await this.request("delete_topic", { topic }, { timeoutMs }));
  }

  /** Every topic as `{topic, queue_count}`, sorted by name. */
  async listTopics({ timeoutMs } = {}) {
    return (await this.request("list_topics", {}, { timeoutMs })).topics;
  }

  /** A queue's `min_offset`, `max_offset`, `message_count`, earliest and latest store timestamps. */
  async queueStats(topic, queueId, { timeoutMs } = {}) {
    checkString("topic", topic);
    checkInt("queueId", queueId);
    return envelopeless(await this.request("queue_stats", { topic, queue_id: queueId }, { timeoutMs }));
  }

  /** The queue offset of the first message stored at or after (`"lower"`) or the last at or before (`"upper"`) `timestamp`. */
  async offsetForTime(topic, queueId, timestamp, { boundary, timeoutMs } = {}) {
    checkString("topic", topic);
    checkInt("queueId", queueId);
    checkInt("timestamp", timestamp);
    checkOptional(checkString, "boundary", boundary);
    const fields = { topic, queue_id: queueId, timestamp };
    if (boundary !== undefined && boundary !== null) fields.boundary = boundary;
    return (await this.request("offset_for_time", fields, { timeoutMs })).offset;
  }

  /** Engine offsets and settings, for diagnostics. */
  async status({ timeoutMs } = {}) {
    return envelopeless(await this.request("status", {}, { timeoutMs }));
  }

  /**
   * Where this engine stands in its broker set (docs/protocol.md 4.14): `cluster_name`,
   * `broker_name`, `broker_id`, `endpoint` (its own), `elected`, `role` ("master" or
   * "replica"), `epoch`, `master_id` and `master_endpoint` ("" while unknown). Every engine
   * answers, replicas too; the client does not move.
   */
  async route({ timeoutMs } = {}) {
    return envelopeless(await this.request("route", {}, { timeoutMs }));
  }

  /**
   * A topic's route in a cluster of broker sets (docs/protocol.md 4.14, `route` with a topic):
   * one `{broker_name, queues, master_endpoint}` per set serving it, sorted by name ([] if none).
   * Any engine of the cluster answers.
   */
  async topicRoute(topic, { timeoutMs } = {}) {
    checkString("topic", topic);
    return (await this.request("route", { topic }, { timeoutMs })).topic_route;
  }

  /** Resolves to true when the engine's front answers. */
  async ping({ timeoutMs } = {}) {
    return (await this.request("ping", {}, { timeoutMs })).pong === true;
  }

  /** Fail every outstanding call with CLOSED and close the sockets. Safe to call twice. */
  close() {
    if (this._closed) return;
    this._closed = true;
    for (const call of [...this._pending.values()]) {
      if (this._settle(call)) {
        call.reject(new StoreError(ClientErrorCode.CLOSED, "CLOSED", "the client was closed", call.op));
      }
    }
    for (const connection of this._connections) connection.close();
    this._connections.clear();
    this._connection = null;
  }

  // -- internals ------------------------------------------------------------------

  /** From now on calls go to `endpoint`; the current socket closes once its calls have settled. */
  _moveTo(endpoint) {
    if (this.endpoint === endpoint) return; // another call followed the same refusal first
    this.endpoint = endpoint;
    if (this._connection !== null) this._retire(this._connection);
  }

  _takeId() {
    // Ids are unique among outstanding calls and never 0 (the engine's id for unreadable requests).
    for (;;) {
      const id = this._nextId;
      this._nextId = id >= Number.MAX_SAFE_INTEGER ? 1 : id + 1;
      if (!this._pending.has(id)) return id;
    }
  }

  _currentConnection() {
    if (this._connection === null) {
      this._connection = new Connection(this.endpoint, this._socketOptions, { watched: this._watched });
      this._connections.add(this._connection);
    }
    return this._connection;
  }

  _start(call) {
    const connection = this._currentConnection();
    call.connection = connection;
    connection.pending += 1;
    this._inFlight += 1;
    const frame = call.frame;
    call.frame = null;
    connection.sendChain = connection.sendChain
      .then(() => {
        // A call that timed out while queued behind a blocked send is not sent at all.
        if (!call.done && !connection.closed) return connection.socket.send(frame);
        return undefined;
      })
      .catch((err) => {
        if (connection.closed || call.done) return;
        this._retire(connection);
        this._settle(call);
        call.reject(new StoreError(ClientErrorCode.SEND_FAILED, "SEND_FAILED",
          `could not send ${call.op} to ${this.endpoint}: ${err.message}`, call.op));
      });
    this._read(connection);
    if (connection.watched) this._watch(connection);
  }

  /**
   * The events of a watched socket while calls wait on it: a break, a refusal or silent
   * heartbeats fail those calls with CONNECTION_LOST at once (a set's calls go out again).
   * A pending read of events keeps Node running, so an idle watched socket is closed (`_settle`).
   */
  async _watch(connection) {
    if (connection.watching) return;
    connection.watching = true;
    try {
      while (connection.pending > 0 && !connection.closed) {
        let event;
        try {
          event = await connection.socket.events.receive();
        } catch {
          return; // the socket closed
        }
        if (BROKEN_EVENTS.has(event.type) && !connection.closed) {
          this._broken(connection, event.type);
          return;
        }
      }
    } finally {
      connection.watching = false;
    }
  }

  /** A watched socket whose connection broke (`disconnect`) or was refused (`connect:retry`). */
  _broken(connection, eventType) {
    this._retire(connection);
    const what = eventType === "disconnect" ? "broke (closed, reset or silent)" : "was refused";
    for (const call of [...this._pending.values()]) {
      if (call.connection === connection && this._settle(call)) {
        call.reject(new StoreError(ClientErrorCode.CONNECTION_LOST, "CONNECTION_LOST",
          `the connection to ${connection.endpoint} ${what} before the reply to ${call.op}`, call.op,
          { endpoint: connection.endpoint }));
      }
    }
  }

  async _read(connection) {
    if (connection.reading) return;
    connection.reading = true;
    try {
      while (connection.pending > 0 && !connection.closed) {
        let frames;
        try {
          frames = await connection.socket.receive();
        } catch (err) {
          if (!connection.closed) this._fail(connection, err);
          return;
        }
        this._dispatch(frames[frames.length - 1]);
      }
    } finally {
      connection.reading = false;
    }
  }

  _dispatch(frame) {
    let reply;
    try {
      reply = normalize(decoder.decode(frame));
    } catch (err) {
      const call = this._pending.get(peekReplyId(frame));
      if (call !== undefined && this._settle(call)) {
        call.reject(new StoreError(ClientErrorCode.BAD_REPLY, "BAD_REPLY",
          `the reply to ${call.op} could not be decoded: ${err.message}`, call.op));
      }
      return;
    }
    if (reply === null || typeof reply !== "object") return;
    const call = this._pending.get(reply.id);
    if (call === undefined) {
      if (reply.id === 0 && reply.ok === false) {
        // The engine could not read the envelope of one of our requests: a client bug (protocol 1.4).
        const error = reply.error ?? {};
        process.emitWarning(`the engine could not read a request: ${error.name} (${error.code}): ${error.message}`,
          { code: "RMQPY_UNREADABLE_REQUEST" });
      }
      return; // a late reply to a call that already timed out
    }
    const endpoint = call.connection.endpoint;
    if (!this._settle(call)) return;
    call.resolve({ reply, endpoint }); // request() turns a refusal into a StoreError, or follows it
  }

  _timedOut(call, timeoutMs) {
    if (call.done) return;
    // Retire first, so that calls started by settling this one go out on a fresh socket. The
    // old socket closes once its last call settles: frames never sent are dropped then.
    if (call.connection !== null) this._retire(call.connection);
    this._settle(call);
    call.reject(new StoreTimeoutError(`no reply to ${call.op} from ${this.endpoint} within ${timeoutMs} ms`, call.op));
  }

  /** A socket whose receive failed: fail its calls and stop using it. */
  _fail(connection, err) {
    this._retire(connection);
    for (const call of [...this._pending.values()]) {
      if (call.connection === connection && this._settle(call)) {
        call.reject(new StoreError(ClientErrorCode.BAD_REPLY, "BAD_REPLY",
          `receiving from ${this.endpoint} failed: ${err.message}`, call.op));
      }
    }
  }

  /** New calls go to a fresh socket; this one closes once its last call has settled. */
  _retire(connection) {
    connection.retired = true;
    if (this._connection === connection) this._connection = null;
    if (connection.pending === 0) this._closeConnection(connection);
  }

  _closeConnection(connection) {
    connection.close();
    this._connections.delete(connection);
  }

  /** Mark a call finished and free what it held; false if it already was. */
  _settle(call) {
    if (call.done) return false;
    call.done = true;
    clearTimeout(call.timer);
    this._pending.delete(call.id);
    const connection = call.connection;
    if (connection === null) {
      const index = this._waiting.indexOf(call);
      if (index >= 0) this._waiting.splice(index, 1);
      return true;
    }
    connection.pending -= 1;
    this._inFlight -= 1;
    if (connection.retired && connection.pending === 0) this._closeConnection(connection);
    if (connection.watched && connection.pending === 0) {
      // Idle: closed unless a call starts on it first (the next call of a loop does, at once).
      setImmediate(() => {
        if (connection.pending === 0 && !connection.closed) this._retire(connection);
      });
    }
    while (this._waiting.length > 0 && this._inFlight < this.maxInFlight && !this._closed) {
      this._start(this._waiting.shift());
    }
    return true;
  }
}

// `using client = new StoreClient(...)` where the runtime has explicit resource management.
if (typeof Symbol.dispose === "symbol") {
  StoreClient.prototype[Symbol.dispose] = function dispose() {
    this.close();
  };
}


const ROUTE_TTL_MS = 30_000;
/** A broker set passed over (no master) is looked at again at most this often. */
const PASSED_OVER_LOOK_MS = 1000;

/** Whether a failed send says its set has no master now (nothing was stored there). */
function noMaster(err) {
  return err instanceof StoreError && (err.code === ClientErrorCode.CONNECTION_LOST || err.code === NOT_MASTER);
}

/**
 * A client of a cluster of broker sets (docs/cluster.md). Routes are asked of the engine given;
 * each send goes to the next queue of the topic's whole route (in turn), or to the queue its
 * `shardingKey` hashes to, through a client of that set's master (which follows its set's
 * NOT_MASTER by itself, and learns at once that its connection broke). The route is asked again
 * after 30 s and after a failed send, and a set whose master moved gets a new client.
 *
 * A set with no master now (its connection broke, was refused or went silent, or it answered
 * NOT_MASTER) is passed over: a send without a key goes to the next queue of another set, with
 * the same UNIQ_KEYs, and later ones pass the set over until it has a master again (looked at
 * again at most once a second). A send with a key waits for its own set's master, up to its deadline.
 */
export class ClusterClient {
  /** @param {string} endpoint any engine of the cluster; options as StoreClient's */
  constructor(endpoint = DEFAULT_ENDPOINT, options = {}) {
    this.options = options;
    this.first = new StoreClient(endpoint, options);
    this._sets = new Map(); // broker name -> StoreClient of its master
    this._routes = new Map(); // topic -> { sets, at }
    this._passedOver = new Map(); // broker name -> when it was last looked at (ms), while it has no master
    this._uniqKeys = new UniqKeys();
    this._turn = 0;
  }

  async _route(topic) {
    const known = this._routes.get(topic);
    if (known !== undefined && Date.now() - known.at < ROUTE_TTL_MS) return known.sets;
    return this._freshRoute(topic);
  }

  /** The topic's route asked again: of the engine given, else of another set's master. */
  async _freshRoute(topic) {
    const askers = [this.first, ...this._sets.values()];
    let lastError;
    for (const client of askers) {
      try {
        const sets = await client.topicRoute(topic, { timeoutMs: ROUTE_PROBE_MS });
        this._routes.set(topic, { sets, at: Date.now() });
        return sets;
      } catch (err) {
        lastError = err;
      }
    }
    throw lastError;
  }

  _client(set) {
    let client = this._sets.get(set.broker_name);
    if (client !== undefined && client.endpoint !== set.master_endpoint) {
      client.close();
      client = undefined;
    }
    if (client === undefined) {
      client = new StoreClient(set.master_endpoint, { ...this.options, watchConnection: true });
      this._sets.set(set.broker_name, client);
    }
    return client;
  }

  /**
   * Whether a send may go to `set` now: not passed over, or passed over and found again with a
   * master (its engine answering `route` as master) when its once-a-second look is due.
   */
  async _hasMaster(topic, set) {
    const lookedAt = this._passedOver.get(set.broker_name);
    if (lookedAt === undefined) {
      if (set.master_endpoint !== "") return true;
      this._passedOver.set(set.broker_name, Date.now()); // electing its master: looked at again later
      return false;
    }
    if (Date.now() - lookedAt < PASSED_OVER_LOOK_MS) return false;
    this._passedOver.set(set.broker_name, Date.now());
    let fresh;
    try {
      fresh = (await this._freshRoute(topic)).find((s) => s.broker_name === set.broker_name);
    } catch {
      return false;
    }
    if (fresh === undefined || fresh.master_endpoint === "") return false;
    const route = await askRoute(fresh.master_endpoint, this.first._socketOptions);
    if (route?.role !== "master") return false;
    this._passedOver.delete(set.broker_name);
    Object.assign(set, fresh);
    return true;
  }

  /**
   * Send one message (`{body, tags?, keys?, properties?}`) to the topic's next queue over the
   * whole route, or with `shardingKey` to the queue it hashes to (the same key, the same queue of
   * the same set). Resolves to the send's result with `broker_name`, the set that stored it.
   */
  async send(topic, message, { shardingKey, timeoutMs } = {}) {
    checkOptional(checkString, "shardingKey", shardingKey);
    const timeout = timeoutMs ?? this.options.timeoutMs ?? DEFAULT_TIMEOUT_MS;
    checkTimeout("timeoutMs", timeout);
    const deadline = performance.now() + timeout;
    const sets = await this._route(topic);
    const queues = sets.flatMap((set) => Array.from({ length: set.queues }, (_, queueId) => ({ set, queueId })));
    if (queues.length === 0) {
      this._routes.delete(topic);
      throw new StoreError(6, "TOPIC_NOT_FOUND", `no broker set of the cluster serves topic ${topic}`, "send");
    }
    // Every attempt, at any set, carries the same UNIQ_KEY.
    const wire = withUniqKey(toWireMessage(message), this._uniqKeys);
    const start = shardingKey === undefined || shardingKey === null
      ? this._turn++ % queues.length : zlib.crc32(Buffer.from(shardingKey, "utf8")) % queues.length;
    if (shardingKey !== undefined && shardingKey !== null) {
      return this._sendKeyed(topic, wire, queues[start], deadline);
    }
    let lastError;
    const tried = new Set();
    for (const { set, queueId } of [...queues.slice(start), ...queues.slice(0, start)]) {
      if (tried.has(set.broker_name)) continue;
      tried.add(set.broker_name);
      if (!(await this._hasMaster(topic, set))) {
        lastError ??= new StoreError(14, "SERVICE_NOT_AVAILABLE", `broker set ${set.broker_name} has no master now`, "send");
        continue;
      }
      try {
        return await this._sendTo(topic, wire, set, queueId, deadline);
      } catch (err) {
        this._routes.delete(topic); // the set may have a new master: ask for the route again
        if (!noMaster(err)) throw err;
        this._passedOver.set(set.broker_name, Date.now());
        lastError = err;
      }
    }
    throw lastError;
  }

  /** A keyed send: its own queue's set only, waited for (its master looked for) up to the deadline. */
  async _sendKeyed(topic, wire, { set, queueId }, deadline) {
    let lastError;
    let pauseMs;
    while (performance.now() < deadline) {
      if (await this._hasMaster(topic, set)) {
        try {
          return await this._sendTo(topic, wire, set, queueId, deadline);
        } catch (err) {
          this._routes.delete(topic);
          if (!noMaster(err)) throw err;
          this._passedOver.set(set.broker_name, Date.now());
          lastError = err;
        }
      }
      lastError ??= new StoreError(14, "SERVICE_NOT_AVAILABLE", `broker set ${set.broker_name} has no master now`, "send");
      pauseMs = nextPauseMs(pauseMs);
      await pause(Math.min(pauseMs, deadline - performance.now()));
    }
    throw lastError ?? new StoreTimeoutError(`no broker set took the send to ${topic} in time`, "send");
  }

  async _sendTo(topic, wire, set, queueId, deadline) {
    const remaining = Math.max(1, Math.ceil(deadline - performance.now()));
    const [result] = await this._client(set).send(topic, [wire], { queueId, timeoutMs: remaining });
    return { ...result, broker_name: set.broker_name };
  }

  close() {
    for (const client of this._sets.values()) client.close();
    this._sets.clear();
    this.first.close();
  }
}
