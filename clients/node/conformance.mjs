#!/usr/bin/env node
// Conformance driver of the Node client (clients/conformance.md).
//
//     node clients/node/conformance.mjs ENDPOINT [--server-key Z85 --public-key Z85 --secret-key Z85]
//                                               [--timeout-ms N] < commands.json > results.json
//
// Reads a JSON array of commands on stdin, makes one client call per command, in order, on
// one client, and writes a JSON array with one result per command on stdout. Exit status 0
// when every command ran, whatever the engine answered; 2 for bad arguments or bad input.
//
// Integers: a JSON integer outside ±(2^53 − 1) is read exactly (as a BigInt) and written
// exactly, so offsets and timestamps up to 2^63 − 1 survive the round trip.

import { ClusterClient, StoreClient, StoreError } from "./index.mjs";

const USAGE = "usage: node conformance.mjs ENDPOINT [--server-key Z85 --public-key Z85 --secret-key Z85] [--timeout-ms N]";

class UsageError extends Error {}

function parseArgs(argv) {
  const options = { endpoint: undefined, timeoutMs: 5000, curve: {} };
  const keyOptions = { "--server-key": "serverKey", "--public-key": "publicKey", "--secret-key": "secretKey" };
  for (let i = 0; i < argv.length; i++) {
    let arg = argv[i];
    let value;
    const eq = arg.indexOf("=");
    if (arg.startsWith("--") && eq > 0) {
      value = arg.slice(eq + 1);
      arg = arg.slice(0, eq);
    }
    const takeValue = () => {
      if (value !== undefined) return value;
      if (i + 1 >= argv.length) throw new UsageError(`${arg} needs a value`);
      return argv[++i];
    };
    if (arg in keyOptions) {
      options.curve[keyOptions[arg]] = takeValue();
    } else if (arg === "--timeout-ms") {
      const text = takeValue();
      const ms = Number(text);
      if (!/^[0-9]+$/.test(text) || !Number.isSafeInteger(ms) || ms <= 0) {
        throw new UsageError(`--timeout-ms must be a positive integer, not ${JSON.stringify(text)}`);
      }
      options.timeoutMs = ms;
    } else if (arg === "-h" || arg === "--help") {
      process.stdout.write(`${USAGE}\n`);
      process.exit(0);
    } else if (arg.startsWith("-")) {
      throw new UsageError(`unknown option ${arg}`);
    } else if (options.endpoint === undefined) {
      options.endpoint = arg;
    } else {
      throw new UsageError(`unexpected argument ${arg}`);
    }
  }
  if (options.endpoint === undefined) throw new UsageError("ENDPOINT is required");
  const given = Object.keys(options.curve).length;
  if (given !== 0 && given !== 3) {
    throw new UsageError("--server-key, --public-key and --secret-key go together");
  }
  if (given === 0) options.curve = undefined;
  return options;
}

// -- JSON with exact integers ----------------------------------------------------------

const BIGINT_MARK = "\u0000bigint";
// Strings are matched first so that digits inside them are left alone.
const TOKENS = /"(?:[^"\\]|\\.)*"|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?/g;

function parseJson(text) {
  const marked = text.replace(TOKENS, (token) => {
    if (token[0] === "\"" || !/^-?\d+$/.test(token)) return token;
    const value = BigInt(token);
    if (value >= BigInt(Number.MIN_SAFE_INTEGER) && value <= BigInt(Number.MAX_SAFE_INTEGER)) return token;
    return JSON.stringify(BIGINT_MARK + token);
  });
  return JSON.parse(marked, (key, value) =>
    typeof value === "string" && value.startsWith(BIGINT_MARK) ? BigInt(value.slice(BIGINT_MARK.length)) : value);
}

function toJson(value) {
  if (value === null || value === undefined) return "null";
  switch (typeof value) {
    case "bigint":
      return value.toString();
    case "number":
    case "boolean":
    case "string":
      return JSON.stringify(value);
    default:
      break;
  }
  if (Array.isArray(value)) return `[${value.map(toJson).join(",")}]`;
  const entries = Object.keys(value)
    .filter((key) => value[key] !== undefined)
    .map((key) => `${JSON.stringify(key)}:${toJson(value[key])}`);
  return `{${entries.join(",")}}`;
}

// -- commands -------------------------------------------------------------------------

/** A command's message: `body_b64` becomes the body; every other field goes to the client as is. */
function commandMessage(message) {
  if (message === null || typeof message !== "object" || Array.isArray(message)) return message;
  const { body_b64: bodyB64, ...rest } = message;
  if (bodyB64 === undefined) return rest;
  if (typeof bodyB64 !== "string") throw new TypeError("body_b64 must be a base64 string");
  return { ...rest, body: Buffer.from(bodyB64, "base64") };
}

/** A message object for the result: `body` is replaced by `body_b64`, in place. */
function resultMessage(message) {
  const out = {};
  for (const [key, value] of Object.entries(message)) {
    if (key === "body") out.body_b64 = Buffer.from(value).toString("base64");
    else out[key] = value;
  }
  return out;
}

const OPERATIONS = {
  async send(client, c) {
    const options = {
      queueId: c.queue_id, shardingKey: c.sharding_key, waitStore: c.wait_store, delayMs: c.delay_ms,
      deliverAtMs: c.deliver_at_ms, delayLevel: c.delay_level, transaction: c.transaction, producerGroup: c.producer_group,
    };
    const messages = Array.isArray(c.messages) ? c.messages.map(commandMessage) : c.messages;
    if (Array.isArray(messages) && messages.length === 1) {
      return { results: [await client.send(c.topic, messages[0], options)] };
    }
    return { results: await client.send(c.topic, messages, options) };
  },
  async pull(client, c) {
    const reply = await client.pull(c.topic, c.queue_id, c.offset, {
      maxMessages: c.max_messages, maxBytes: c.max_bytes, maxWaitMs: c.max_wait_ms, subscription: c.subscription,
    });
    return {
      status: reply.status,
      next_offset: reply.next_offset,
      min_offset: reply.min_offset,
      max_offset: reply.max_offset,
      messages: reply.messages.map(resultMessage),
    };
  },
  async query_by_key(client, c) {
    const messages = await client.queryByKey(c.topic, c.key, {
      maxResults: c.max_results, beginTimestamp: c.begin_timestamp, endTimestamp: c.end_timestamp,
    });
    return { messages: messages.map(resultMessage) };
  },
  async get_by_id(client, c) {
    return { message: resultMessage(await client.getById(c.msg_id)) };
  },
  async commit_offset(client, c) {
    await client.commitOffset(c.group, c.topic, c.queue_id, c.offset);
    return {};
  },
  async fetch_offset(client, c) {
    return { offset: await client.fetchOffset(c.group, c.topic, c.queue_id) };
  },
  async ping(client) {
    await client.ping();
    return {};
  },
  async pop(client, c) {
    const popped = await client.pop(c.group, c.topic, {
      queueId: c.queue_id, maxMessages: c.max_messages, invisibleMs: c.invisible_ms, maxWaitMs: c.max_wait_ms,
    });
    const receipts = popped.map((m) => ({ receipt_handle: m.receipt_handle, attempt: m.attempt }));
    const messages = popped.map(({ receipt_handle: _h, attempt: _a, ...message }) => resultMessage(message));
    return { messages, receipts };
  },
  async ack(client, c) {
    const reply = await client.request("ack", {
      group: c.group, topic: c.topic, queue_id: c.queue_id, receipt_handles: c.receipt_handles,
    });
    const codes = new Map(reply.failed.map((f) => [f.receipt_handle, f.error.code]));
    return { acked: reply.acked, refused: c.receipt_handles.map((h) => codes.get(h) ?? 0) };
  },
  async change_invisible(client, c) {
    const message = { topic: c.topic, queue_id: c.queue_id, receipt_handle: c.receipt_handle };
    return { receipt_handle: await client.changeInvisibleDuration(c.group, message, c.invisible_ms) };
  },
  async pop_stats(client, c) {
    return await client.popStats(c.group, c.topic, c.queue_id);
  },
  async end_transaction(client, c) {
    return { decision: await client.endTransaction(c.msg_id, c.decision, { producerGroup: c.producer_group }) };
  },
  async transaction_checks(client, c) {
    const checks = await client.transactionChecks(c.producer_group, {
      maxMessages: c.max_messages, maxWaitMs: c.max_wait_ms,
    });
    return { checks: checks.map(resultMessage) };
  },
  // Not in the contract's table; handy to set up a scenario.
  async create_topic(client, c) {
    return await client.createTopic(c.topic, c.queue_count);
  },
  async list_topics(client) {
    return { topics: await client.listTopics() };
  },
  async route(client) {
    return await client.route();
  },
  // No request: where the client's calls go now (it moves to the master a NOT_MASTER names).
  async endpoint(client) {
    return { endpoint: client.endpoint };
  },
  async topic_route(client, c) {
    const sets = await client.topicRoute(c.topic);
    return { sets: sets.map((s) => ({ broker_name: s.broker_name, queues: s.queues, master_endpoint: s.master_endpoint })) };
  },
  // One send after another, each of one message `${body_prefix}${n}`, until `count` are done or
  // `duration_ms` has passed; each answers when it started (ms since the epoch), how long it
  // took, where it went and its outcome. Sent ones make no error of the command.
  async send_loop(client, c) {
    const sends = [];
    const until = Date.now() + (c.duration_ms ?? 60_000);
    for (let n = 0; n < (c.count ?? 1) && Date.now() < until; n++) {
      const started = Date.now();
      const outcome = await run(client, {
        op: "send", topic: c.topic, queue_id: c.queue_id,
        messages: [{ body_b64: Buffer.from(`${c.body_prefix ?? ""}${n}`).toString("base64") }],
      });
      const sent = { n, started_ms: started, took_ms: Date.now() - started, ok: outcome.ok, endpoint: client.endpoint };
      if (outcome.ok) {
        const [result] = outcome.results;
        Object.assign(sent, { queue_id: result.queue_id, queue_offset: result.queue_offset, msg_id: result.msg_id });
      } else {
        Object.assign(sent, { code: outcome.code, name: outcome.name, message: outcome.message });
      }
      sends.push(sent);
    }
    return { sends };
  },
  // `count` messages of body_b64, each to the next queue of the topic's whole route.
  async cluster_send(client, c) {
    cluster ??= new ClusterClient(client.endpoint, { timeoutMs: client.timeoutMs });
    const sent = [];
    for (let i = 0; i < (c.count ?? 1); i++) {
      const result = await cluster.send(c.topic, { body: Buffer.from(c.body_b64, "base64") }, { shardingKey: c.sharding_key });
      sent.push({ broker_name: result.broker_name, queue_id: result.queue_id });
    }
    return { sent };
  },
};
let cluster; // the ClusterClient of cluster_send, made at its first use

async function run(client, command) {
  try {
    return { ok: true, ...(await OPERATIONS[command.op](client, command)) };
  } catch (err) {
    if (err instanceof StoreError) {
      return { ok: false, code: err.code, name: err.codeName, message: err.message };
    }
    if (err instanceof TypeError) {
      // The client refused the arguments before sending anything.
      return { ok: false, code: -5, name: "INVALID_ARGUMENT", message: err.message };
    }
    throw err;
  }
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return Buffer.concat(chunks).toString("utf8");
}

async function main() {
  let options;
  let commands;
  try {
    options = parseArgs(process.argv.slice(2));
    try {
      commands = parseJson(await readStdin());
    } catch (err) {
      throw new UsageError(`standard input is not JSON: ${err.message}`);
    }
    if (!Array.isArray(commands)) throw new UsageError("standard input must hold a JSON array of commands");
    commands.forEach((command, index) => {
      if (command === null || typeof command !== "object" || !Object.hasOwn(OPERATIONS, command.op)) {
        throw new UsageError(`command ${index} has no known "op": ${toJson(command)}`);
      }
    });
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`conformance: ${err.message}\n${USAGE}\n`);
    process.exitCode = 2;
    return;
  }

  let client;
  try {
    client = new StoreClient(options.endpoint, { timeoutMs: options.timeoutMs, curve: options.curve });
  } catch (err) {
    process.stderr.write(`conformance: ${err.message}\n${USAGE}\n`);
    process.exitCode = 2;
    return;
  }
  const results = [];
  try {
    for (const command of commands) results.push(await run(client, command));
  } finally {
    client.close();
  }
  process.stdout.write(`${toJson(results)}\n`);
}

main().catch((err) => {
  process.stderr.write(`conformance: ${err.stack ?? err}\n`);
  process.exitCode = 1;
});
