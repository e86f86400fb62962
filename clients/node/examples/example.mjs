// Send, pull and query against a running engine:
//
//     node clients/node/examples/example.mjs [ENDPOINT]
//
// ENDPOINT defaults to tcp://127.0.0.1:10911.

import { StoreClient, StoreError } from "../index.mjs";

const endpoint = process.argv[2] ?? "tcp://127.0.0.1:10911";
const client = new StoreClient(endpoint, { timeoutMs: 5000 });

try {
  await client.createTopic("orders", 4);

  // One message; a string body is sent as UTF-8 bytes.
  const result = await client.send("orders", {
    body: "hello",
    tags: "new",
    keys: ["order-1"],
    properties: { shop: "north" },
  });
  console.log(`stored ${result.msg_id} at queue ${result.queue_id}, offset ${result.queue_offset}`);

  // A batch goes to one queue, all or nothing.
  const batch = await client.send("orders", [Buffer.from([0x00, 0x01]), { body: "second", keys: ["order-2"] }],
    { queueId: result.queue_id });
  console.log(`stored a batch at offsets ${batch.map((r) => r.queue_offset).join(", ")}`);

  // Pull waits up to a second for the messages to be dispatched (long polling).
  const reply = await client.pull("orders", result.queue_id, result.queue_offset, { maxWaitMs: 1000 });
  for (const message of reply.messages) {
    console.log(`pulled offset ${message.queue_offset}: ${message.body.length} bytes, tags ${message.tags}`);
  }
  console.log(`${reply.status}; continue from ${reply.next_offset}`);

  // Keys are indexed asynchronously as well; give the index a moment.
  await new Promise((resolve) => setTimeout(resolve, 200));
  const found = await client.queryByKey("orders", "order-1");
  console.log(`query found ${found.length} message(s) with key order-1`);

  const again = await client.getById(result.msg_id);
  console.log(`get_by_id: ${again.body.toString("utf8")}`);
} catch (err) {
  if (!(err instanceof StoreError)) throw err;
  console.error(`${err.codeName} (${err.code}): ${err.message}`);
  process.exitCode = 1;
} finally {
  client.close();
}
