// The official Node client (npm rocketmq-client-nodejs, installed in examples/rocketmq5 by
// `make clients`) as a conformance driver: reads a JSON array of commands on stdin, runs them in
// order against the gRPC endpoint given as the first argument, prints a JSON array of results.
//
//   {"op": "send", "topic": T, "messages": [{"body_b64", "tag", "keys", "properties", "message_group"}],
//    "credentials": {"access_key", "secret_key"} (optional: the producer signs its calls with them)}
//       -> {"receipts": [{"message_id", "offset"}]}
// A command with "catch": true answers {"error": message} instead of ending the run when it fails.
//   {"op": "receive", "group": G, "topic": T, "count": N, "invisible_ms": I, "ack": bool}
//       -> {"messages": [{"message_id", "body_b64", "tag", "keys", "properties", "born_timestamp",
//                         "delivery_attempt", "message_group", "corrupted"}]}
//          (receives until N came or 20 s passed)
//   {"op": "push", "group": G, "topic": T, "fail_b64": [bodies the listener fails], "deliveries": N}
//       -> {"deliveries": [[body_b64, delivery_attempt]]}   (a PushConsumer, until N deliveries or 30 s)
'use strict';

const path = require('node:path');
const { createRequire } = require('node:module');

const examples = createRequire(path.join(__dirname, '..', '..', 'examples', 'rocketmq5', 'package.json'));
const { Producer, SimpleConsumer, PushConsumer, ConsumeResult } = examples('rocketmq-client-nodejs');

const RECEIVE_DEADLINE_MS = 20000;

async function send(endpoints, command, state) {
  if (!state.producer) {
    const credentials = command.credentials;
    const sessionCredentials = credentials
      ? { accessKey: credentials.access_key, accessSecret: credentials.secret_key } : undefined;
    state.producer = new Producer({ endpoints, sessionCredentials });
    await state.producer.startup();
  }
  const receipts = [];
  for (const m of command.messages) {
    const receipt = await state.producer.send({
      topic: command.topic,
      tag: m.tag,
      keys: m.keys || [],
      properties: new Map(Object.entries(m.properties || {})),
      messageGroup: m.message_group,
      body: Buffer.from(m.body_b64, 'base64'),
    });
    receipts.push({ message_id: receipt.messageId, offset: Number(receipt.offset) });
  }
  return { receipts };
}

async function receive(endpoints, command) {
  const consumer = new SimpleConsumer({
    consumerGroup: command.group,
    endpoints,
    subscriptions: new Map().set(command.topic, command.tag || '*'),
    awaitDuration: 1000,
  });
  await consumer.startup();
  const messages = [];
  const deadline = Date.now() + RECEIVE_DEADLINE_MS;
  try {
    while (messages.length < command.count && Date.now() < deadline) {
      for (const m of await consumer.receive(32, command.invisible_ms || 15000)) {
        messages.push({
          message_id: m.messageId,
          body_b64: m.body.toString('base64'),
          tag: m.tag === undefined || m.tag === '' ? null : m.tag,
          keys: m.keys,
          properties: Object.fromEntries(m.properties),
          born_timestamp: m.bornTimestamp.getTime(),
          delivery_attempt: m.deliveryAttempt,
          message_group: m.messageGroup || null,
          corrupted: m.corrupted === true,
        });
        if (command.ack) {
          await consumer.ack(m);
        }
      }
    }
  } finally {
    await consumer.shutdown();
  }
  return { messages };
}

async function push(endpoints, command) {
  const deliveries = [];
  const fail = new Set(command.fail_b64 || []);
  let done;
  const enough = new Promise((resolve) => { done = resolve; });
  const consumer = new PushConsumer({
    endpoints,
    consumerGroup: command.group,
    subscriptions: new Map([[command.topic, '*']]),
    messageListener: {
      async consume(m) {
        const body = m.body.toString('base64');
        deliveries.push([body, m.deliveryAttempt]);
        if (deliveries.length >= command.deliveries) {
          done();
        }
        return fail.has(body) ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  await Promise.race([enough, new Promise((resolve) => setTimeout(resolve, 30000))]);
  await consumer.shutdown().catch(() => {});
  return { deliveries };
}

async function main() {
  const endpoints = process.argv[2];
  const commands = JSON.parse(require('node:fs').readFileSync(0, 'utf8'));
  const state = {};
  const results = [];
  try {
    for (const command of commands) {
      try {
        if (command.op === 'send') {
          results.push(await send(endpoints, command, state));
        } else if (command.op === 'receive') {
          results.push(await receive(endpoints, command));
        } else if (command.op === 'push') {
          results.push(await push(endpoints, command));
        } else {
          throw new Error(`unknown op ${command.op}`);
        }
      } catch (err) {
        if (!command.catch) throw err;
        results.push({ error: String(err.message || err) });
      }
    }
  } finally {
    if (state.producer) {
      await state.producer.shutdown().catch(() => {});
    }
  }
  process.stdout.write(JSON.stringify(results));
  process.exit(0);
}

main().catch((err) => {
  process.stderr.write(`${err.stack || err}\n`);
  process.exit(1);
});
