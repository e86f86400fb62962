// Types of the Node.js client (index.mjs). Reply objects keep the protocol's field names
// (snake_case, docs/protocol.md); integers are numbers, or BigInts beyond Number.MAX_SAFE_INTEGER.

/// <reference types="node" />

export { curveKeyPair } from "zeromq";

export declare const PROTOCOL_VERSION: 1;
export declare const DEFAULT_ENDPOINT: string;
export declare const DEFAULT_TIMEOUT_MS: number;
export declare const DEFAULT_MAX_IN_FLIGHT: number;
/** The protocol's frame limit (4 259 840 bytes): a larger request is refused with MESSAGE_ILLEGAL (8) before sending. */
export declare const FRAME_BYTES_MAX: number;
export declare const MESSAGE_BODY_BYTES_MAX: number;

/** Codes of failures raised by the client itself (the engine's codes are positive). */
export declare const ClientErrorCode: Readonly<{
  TIMEOUT: -1;
  CLOSED: -2;
  BAD_REPLY: -3;
  SEND_FAILED: -4;
  /** The connection broke, was refused or went silent before the reply (a watched client). */
  CONNECTION_LOST: -6;
}>;

/** An integer: a safe-integer number, or a BigInt for anything larger. */
export type Int = number | bigint;

export type Body = Buffer | Uint8Array | ArrayBuffer | ArrayBufferView | string;

export interface Message {
  body: Body;
  tags?: string | null;
  /** Keys to index for queryByKey; each non-empty and without spaces. A string is one key. */
  keys?: Iterable<string> | string | null;
  properties?: Record<string, string> | Map<string, string> | null;
  flag?: number;
  bornTimestamp?: Int | null;
  [field: string]: unknown;
}

export interface SendResult {
  status: "PUT_OK" | "FLUSH_DISK_TIMEOUT" | string;
  status_code: number;
  msg_id: string;
  queue_id: number;
  queue_offset: Int;
  commit_log_offset: Int;
  store_timestamp: Int;
}

export interface StoredMessage {
  topic: string;
  queue_id: number;
  queue_offset: Int;
  commit_log_offset: Int;
  store_size: number;
  msg_id: string;
  body: Buffer;
  body_crc: number;
  tags: string | null;
  keys: string[];
  uniq_key: string | null;
  properties: Record<string, string>;
  flag: number;
  sys_flag: number;
  born_timestamp: Int;
  born_host: string;
  store_timestamp: Int;
  store_host: string;
  reconsume_times: number;
  [field: string]: unknown;
}

export interface PullResult {
  status: string;
  status_code: number;
  next_offset: Int;
  min_offset: Int;
  max_offset: Int;
  messages: StoredMessage[];
  [field: string]: unknown;
}

export interface CallOptions {
  /** Deadline of this call; defaults to the client's timeoutMs. */
  timeoutMs?: number;
}

export interface SendOptions extends CallOptions {
  queueId?: Int | null;
  shardingKey?: string | null;
  waitStore?: boolean | null;
  /**
   * Delayed delivery, at most one of the three: stored now, in its queue at its time. Further
   * than the engine's timer_max_delay_ms (3 days by default) is DELAY_ILLEGAL (24); a time
   * already past is stored for consumers at once.
   */
  delayMs?: Int | null;
  /** Wall-clock milliseconds since the epoch. */
  deliverAtMs?: Int | null;
  /** RocketMQ 4's delay levels: 1 (1 s), 2 (5 s), 3 (10 s), 4 (30 s), 5 (1 min) … 18 (2 h). */
  delayLevel?: Int | null;
  /** Half messages, invisible until endTransaction commits them; needs producerGroup. */
  transaction?: boolean | null;
  /** The group whose producers answer the transaction checks. */
  producerGroup?: string | null;
}

export type TransactionDecision = "commit" | "rollback";

export interface EndTransactionOptions extends CallOptions {
  /** When given, the half message must be this group's (else TRANSACTION_NOT_FOUND). */
  producerGroup?: string | null;
}

export interface TransactionChecksOptions extends CallOptions {
  /** 1 … 1024 (engine default 32). */
  maxMessages?: Int | null;
  /** Long polling: wait this long for a half to be due; the call's deadline grows by as much. */
  maxWaitMs?: Int | null;
}

/** A half message due for a check; `topic` and `queue_id` are where a commit puts it. */
export interface TransactionCheck extends StoredMessage {
  /** How many times it was offered (1 = first). */
  check_times: number;
}

export interface PullOptions extends CallOptions {
  maxMessages?: Int;
  maxBytes?: Int;
  /** Long polling; the call's deadline grows by as much. */
  maxWaitMs?: Int;
  subscription?: string;
}

export interface QueryOptions extends CallOptions {
  maxResults?: Int;
  beginTimestamp?: Int;
  endTimestamp?: Int;
}

export interface CurveKeys {
  /** The engine's public key, 40-character Z85. */
  serverKey: string | Uint8Array;
  publicKey: string | Uint8Array;
  secretKey: string | Uint8Array;
}

export interface StoreClientOptions {
  /** Deadline of every call in milliseconds (default 5000). */
  timeoutMs?: number;
  curve?: CurveKeys | null;
  /** Calls sent and not yet answered; more wait their turn (default 256). */
  maxInFlight?: number;
  /** The largest request sent (default FRAME_BYTES_MAX, the engine's default client_frame_bytes_max). */
  frameBytesMax?: number;
  /**
   * With one endpoint: a call whose connection breaks, is refused or goes silent fails at once
   * with CONNECTION_LOST (-6) instead of at its deadline (default false). Always so on a broker
   * set's address, where the call is sent again to the master instead.
   */
  watchConnection?: boolean;
}

export interface ClusterSendOptions extends CallOptions {
  /** The same key, the same queue of the same set; without one, the next queue of the route. */
  shardingKey?: string | null;
}

export interface PopOptions extends CallOptions {
  queueId?: Int;
  maxMessages?: Int;
  /** How long a popped message stays invisible to the group's other pops (engine default 30000). */
  invisibleMs?: Int;
  /** Long polling: wait this long for a message; the call's deadline grows by as much. */
  maxWaitMs?: Int;
  subscription?: string;
}

/** A popped message: a stored message with its delivery's handle and attempt (1 = first). */
export interface PoppedMessage extends StoredMessage {
  receipt_handle: string;
  attempt: number;
}

/** What ack, changeInvisibleDuration and nack read of a popped message. */
export type Receipt = Pick<PoppedMessage, "topic" | "queue_id" | "receipt_handle">;

/** A pop group's state on one queue (docs/protocol.md 4.12). */
export interface PopStats {
  ack_floor: Int;
  /** -1 before the group's first pop. */
  pop_cursor: Int;
  in_flight: Int;
  due: Int;
  redelivered: Int;
  dead_lettered: Int;
  journal_entries: Int;
  segments: Int;
  max_offset: Int;
  [field: string]: unknown;
}

/** Where an engine stands in its broker set: the `route` reply (docs/protocol.md 4.14). */
export interface Route {
  cluster_name: string;
  broker_name: string;
  /** This engine within its broker set. */
  broker_id: number;
  /** The engine's own advertised endpoint. */
  endpoint: string;
  /** Its role is chosen on etcd. */
  elected: boolean;
  role: "master" | "replica" | string;
  /** The broker set's epoch (0 when not elected). */
  epoch: Int;
  /** The master's broker_id; -1: unknown, or not elected. */
  master_id: number;
  /** Where writes go; "" while unknown. */
  master_endpoint: string;
  [field: string]: unknown;
}

export declare class StoreError extends Error {
  constructor(code: number, codeName: string, message: string, op?: string, details?: Record<string, unknown>);
  /** docs/protocol.md 7.3, or a ClientErrorCode (negative). */
  readonly code: number;
  /** e.g. "TOPIC_NOT_FOUND" or "TIMEOUT". */
  readonly codeName: string;
  readonly op: string | undefined;
  /** A refusal's fields beside `error`, e.g. `master_endpoint` of NOT_MASTER (27); {} if none. */
  readonly details: Record<string, unknown>;
}

export declare class StoreTimeoutError extends StoreError {
  constructor(message: string, op?: string);
}

/**
 * Following the master: a replica (or a master whose lease ran out) refuses every write with
 * NOT_MASTER (27), naming the master's endpoint. The client then moves to that endpoint for
 * good and sends the same request there once more (the refusing engine stored nothing, so
 * nothing is stored twice). A NOT_MASTER naming no master is thrown as it is.
 */
/** One broker set's queues of a topic (docs/protocol.md 4.14, `route` with a topic). */
export interface TopicRouteSet {
  broker_name: string;
  queues: number;
  master_endpoint: string;
  grpc_endpoint: string;
}

export declare class StoreClient {
  /**
   * `endpoint`: one engine, or a broker set's address (its engines separated by commas): then
   * each call keeps one deadline through a failover: a NOT_MASTER naming the master is followed,
   * a connection that breaks, is refused or goes silent (heartbeats every 250 ms, 1000 ms without
   * an answer) has the master looked for (`route` of each engine) and the same request sent there
   * (a send's messages keep their UNIQ_KEYs); the last error is thrown only at the deadline.
   */
  constructor(endpoint?: string, options?: StoreClientOptions);
  /** The engines of the address given: one, or a broker set's. */
  readonly endpoints: string[];
  /** Where requests go now: the (first) engine given, or the master followed since. */
  readonly endpoint: string;
  readonly timeoutMs: number;
  readonly maxInFlight: number;
  readonly frameBytesMax: number;
  readonly closed: boolean;

  /**
   * One raw request; `fields` use the protocol's names. Resolves to the whole reply map. A
   * NOT_MASTER naming another engine is followed: the request is sent there once more.
   */
  request(op: string, fields?: Record<string, unknown>, options?: CallOptions): Promise<Record<string, unknown>>;

  send(topic: string, message: Message | Body, options?: SendOptions): Promise<SendResult>;
  send(topic: string, messages: Array<Message | Body>, options?: SendOptions): Promise<SendResult[]>;
  pull(topic: string, queueId: Int, offset: Int, options?: PullOptions): Promise<PullResult>;
  queryByKey(topic: string, key: string, options?: QueryOptions): Promise<StoredMessage[]>;
  getById(msgId: string, options?: CallOptions): Promise<StoredMessage>;
  getByOffset(commitLogOffset: Int, options?: CallOptions): Promise<StoredMessage>;
  commitOffset(group: string, topic: string, queueId: Int, offset: Int, options?: CallOptions): Promise<void>;
  /** -1 when the group never committed an offset for the queue. */
  fetchOffset(group: string, topic: string, queueId: Int, options?: CallOptions): Promise<Int>;
  createTopic(topic: string, queueCount?: Int | null, options?: CallOptions): Promise<{ topic: string; queue_count: number }>;
  deleteTopic(topic: string, options?: CallOptions): Promise<{ topic: string; deletion_offset: Int }>;
  listTopics(options?: CallOptions): Promise<Array<{ topic: string; queue_count: number }>>;
  queueStats(topic: string, queueId: Int, options?: CallOptions): Promise<{
    min_offset: Int;
    max_offset: Int;
    message_count: Int;
    earliest_store_timestamp: Int;
    latest_store_timestamp: Int;
  }>;
  offsetForTime(topic: string, queueId: Int, timestamp: Int,
    options?: CallOptions & { boundary?: "lower" | "upper" }): Promise<Int>;
  status(options?: CallOptions): Promise<Record<string, unknown>>;
  pop(group: string, topic: string, options?: PopOptions): Promise<PoppedMessage[]>;
  /** Resolves to the handles refused (stale or foreign), each with its error. */
  ack(group: string, messages: Iterable<Receipt>, options?: CallOptions): Promise<Array<{
    receipt_handle: string;
    error: { code: number; name: string; message: string };
  }>>;
  /** Resolves to the new receipt handle (the old one is stale); 0 ms is a nack. */
  changeInvisibleDuration(group: string, message: Receipt, invisibleMs: Int, options?: CallOptions): Promise<string>;
  /** Redelivered now with attempt + 1; resolves to the new receipt handle. */
  nack(group: string, message: Receipt, options?: CallOptions): Promise<string>;
  popStats(group: string, topic: string, queueId: Int, options?: CallOptions): Promise<PopStats>;
  /**
   * Decide the half message `msgId` (the msg_id its transactional send returned). Resolves to
   * the decision once it stands; TRANSACTION_ENDED (26) when it was decided the other way.
   */
  endTransaction(msgId: string, decision: TransactionDecision, options?: EndTransactionOptions):
    Promise<TransactionDecision>;
  commit(msgId: string, options?: EndTransactionOptions): Promise<TransactionDecision>;
  rollback(msgId: string, options?: EndTransactionOptions): Promise<TransactionDecision>;
  /** Half messages of the group undecided past the engine's transaction_timeout_ms; answer each with endTransaction. */
  transactionChecks(producerGroup: string, options?: TransactionChecksOptions): Promise<TransactionCheck[]>;
  /** Where this engine stands in its broker set and where the master is; any engine answers. */
  route(options?: CallOptions): Promise<Route>;
  /** A topic's route in a cluster of broker sets: the sets serving it ([] if none). */
  topicRoute(topic: string, options?: CallOptions): Promise<TopicRouteSet[]>;
  ping(options?: CallOptions): Promise<boolean>;
  close(): void;
}

/** A client of a cluster of broker sets: sends spread over every queue of a topic's route. */
export declare class ClusterClient {
  constructor(endpoint?: string, options?: StoreClientOptions);
  /**
   * One message to the topic's next queue, or to the queue `shardingKey` hashes to; the result
   * names the set that stored it. Without a key, a set with no master now is passed over for the
   * next queue of another set (the same UNIQ_KEY), and by later sends until it has one again
   * (looked at again at most once a second); with a key, the send waits for its set's master.
   */
  send(topic: string, message: Message | Body, options?: ClusterSendOptions): Promise<SendResult & { broker_name: string }>;
  close(): void;
}
