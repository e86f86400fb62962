/*
 * rmq_client.h: the C client of the message store (docs/protocol.md, version 1).
 *
 * One rmq_client is one ZeroMQ DEALER socket connected to the engine. Every call
 * sends one request, waits for the reply with the same request id, and returns.
 *
 *     rmq_error err;
 *     rmq_client *client = rmq_connect("tcp://127.0.0.1:10911", 5000, NULL, &err);
 *     rmq_outgoing_message msg = {.body = "hello", .body_len = 5, .tags = "new"};
 *     rmq_send_result sent;
 *     if (rmq_send(client, "orders", NULL, &msg, &sent, &err) != 0)
 *         fprintf(stderr, "%s (%d): %s\n", err.name, err.code, err.message);
 *     rmq_close(client);
 *
 * Return values. Every call that can fail returns 0 on success. On failure it
 * returns the error code (never 0) and, when `err` is not NULL, fills *err:
 *   - code > 0: the engine refused the request; code and name are the engine's
 *     stable ErrorCode (docs/protocol.md section 7.3), e.g. 6 TOPIC_NOT_FOUND.
 *     The engine did nothing for the request (see the protocol for the two
 *     exceptions in `send`).
 *   - code < 0: the client gave up on its own; see RMQ_ERR_* below. After
 *     RMQ_ERR_TIMEOUT the outcome of the request is unknown (a send may or may
 *     not have been stored).
 *
 * Ownership. Strings and buffers passed in are only read during the call and
 * can be freed as soon as it returns. Results come back in caller-provided
 * structs. Structs that hold messages (rmq_message, rmq_message_list,
 * rmq_pull_result) own their memory and must be released with their *_free
 * function; after a failed call they are left empty (freeing them is allowed
 * and does nothing). Every pointer inside a returned message stays valid until
 * that message is freed. rmq_send_result holds no pointers (nothing to free);
 * its contents are unspecified after a failed call.
 *
 * Following the master. An engine that is a replica, or a master whose lease ran out,
 * refuses every write (send, rmq_create_topic, rmq_commit_offset, pop, ack, change
 * invisible, transactions) with 27 NOT_MASTER, and names the master's endpoint. The client
 * then connects to that endpoint, sends the same request there once more (the refusing
 * engine did nothing with it, so nothing is stored twice) and stays there for every later
 * call; rmq_endpoint tells where it is. A NOT_MASTER that names no master (an election under
 * way, or a replica that has not heard from its master yet) is returned as it is. Reads are
 * served by replicas too and never move the client. rmq_route_get asks an engine where the
 * master is without writing anything.
 *
 * A broker set's address ("tcp://h:10911,tcp://h:10921,tcp://h:10931"). The client starts on
 * the first engine and follows the set's master through a failover within each call's
 * deadline (timeout_ms from the call, for the whole call): its socket sends heartbeats, and a
 * connection that breaks (the engine died), is refused (nothing listens) or goes silent for
 * RMQ_HEARTBEAT_TIMEOUT_MS (a paused engine) is noticed at once, not at the deadline. The
 * client then asks every engine its `route` (each within RMQ_ROUTE_PROBE_MS), moves to the
 * one that is master and sends the same request again: the same bytes, so each message keeps
 * the UNIQ_KEY the client gave it, and a consumer drops a duplicate by it (a request sent when
 * the connection broke may have been stored). A NOT_MASTER naming the master is followed at
 * once, one naming none makes the client look; BUSY, SERVICE_NOT_AVAILABLE and
 * SLAVE_NOT_AVAILABLE are sent again on the same engine after a pause. With no master by the
 * deadline the last error is returned (NOT_MASTER, or RMQ_ERR_CONNECTION_LOST); a request that
 * gets no answer while its connection stays up is RMQ_ERR_TIMEOUT, never sent again. A call
 * takes at most its timeout_ms plus RMQ_ROUTE_PROBE_MS.
 *
 * Threads. A client is not thread-safe: use one client per thread, or a lock.
 * Different clients are independent.
 */
#ifndef RMQ_CLIENT_H
#define RMQ_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Errors the client reports by itself (the engine's codes are all > 0). */
#define RMQ_ERR_TIMEOUT (-1)          /* "TIMEOUT": no reply before the deadline */
#define RMQ_ERR_INVALID_ARGUMENT (-2) /* "INVALID_ARGUMENT": a NULL or malformed argument; nothing sent */
#define RMQ_ERR_BAD_REPLY (-3)        /* "BAD_REPLY": the reply could not be decoded */
#define RMQ_ERR_TRANSPORT (-4)        /* "TRANSPORT": a ZeroMQ call failed (e.g. bad endpoint) */
#define RMQ_ERR_NO_MEMORY (-5)        /* "NO_MEMORY": an allocation failed */
/* "CONNECTION_LOST": on a broker set's address, the engine's connection broke, was refused or
 * went silent, and no master was found before the deadline; a send may or may not be stored. */
#define RMQ_ERR_CONNECTION_LOST (-6)

/* A request frame larger than this is refused locally, before sending, with the engine's
 * MESSAGE_ILLEGAL (8), the code of a body too large: the engine would drop the frame and the
 * connection with it, without a reply (client_frame_bytes_max; docs/protocol.md 1.5). */
#define RMQ_REQUEST_BYTES_MAX 4259840u
#define RMQ_MESSAGE_BODY_BYTES_MAX 4194304u /* the engine's default message_body_bytes_max */
#define RMQ_MESSAGE_ILLEGAL 8               /* engine ErrorCode MESSAGE_ILLEGAL */
#define RMQ_NOT_MASTER 27                   /* engine ErrorCode NOT_MASTER: a replica refused a write */
#define RMQ_BUSY 20                         /* engine ErrorCode BUSY: the writer is overloaded, nothing stored */
#define RMQ_SLAVE_NOT_AVAILABLE 28          /* engine ErrorCode SLAVE_NOT_AVAILABLE: too few replicas in sync */

/* A broker set's address: its engines separated by commas, at most this many. */
#define RMQ_SET_ENGINES_MAX 8
/* On a set's address the socket sends a ZMTP PING every RMQ_HEARTBEAT_IVL_MS, and a connection
 * that answers nothing for RMQ_HEARTBEAT_TIMEOUT_MS is taken as broken (a paused engine). */
#define RMQ_HEARTBEAT_IVL_MS 250
#define RMQ_HEARTBEAT_TIMEOUT_MS 1000
/* The longest a `route` asked while looking for the master may take. */
#define RMQ_ROUTE_PROBE_MS 500
/* The pause between rounds of looking for the master: the first, doubling up to the last. */
#define RMQ_LOOK_PAUSE_MS_MIN 50
#define RMQ_LOOK_PAUSE_MS_MAX 100

/* The longest endpoint the client reads ("tcp://[IPv6 address]:port" is at most 59 bytes). */
#define RMQ_ENDPOINT_MAX 255

typedef struct rmq_error {
    int code;          /* engine ErrorCode (> 0) or RMQ_ERR_* (< 0); 0 = no error */
    char name[64];     /* e.g. "TOPIC_NOT_FOUND", "TIMEOUT"; NUL-terminated */
    char message[512]; /* human-readable detail, UTF-8, possibly truncated; do not parse */
} rmq_error;

typedef struct rmq_client rmq_client;

/* CURVE keys, each a 40-character Z85 string (as printed by zmq_curve_keypair or
 * pyzmq's zmq.curve_keypair). All three are required together. */
typedef struct rmq_curve_keys {
    const char *server_public_key; /* the engine's public key */
    const char *client_public_key;
    const char *client_secret_key;
} rmq_curve_keys;

/* A name/value pair of UTF-8 strings (message properties). */
typedef struct rmq_property {
    const char *name;
    const char *value;
} rmq_property;

/* One message to send. Only `body`/`body_len` are required; zero-initialise the rest. */
typedef struct rmq_outgoing_message {
    const void *body;               /* 1 .. 4 MiB bytes, any content (zero bytes too) */
    size_t body_len;
    const char *tags;               /* NULL: no tag */
    const char *const *keys;        /* key_count UTF-8 strings, non-empty, no spaces */
    size_t key_count;
    const rmq_property *properties; /* property_count pairs; not KEYS, TAGS, __CRC32# */
    size_t property_count;
    int32_t flag;                   /* stored and returned unchanged; 0 is the default */
} rmq_outgoing_message;

/* Where and when a send goes. NULL for rmq_send/rmq_send_batch means "the engine picks the
 * queue, stored for consumers at once". Zero-initialise what you do not use.
 *
 * Delayed (at most one of delay_ms, deliver_at_ms and delay_level; 0 = not given): the batch is
 * stored now and reaches its queue (the one chosen now) at its time. A time more than the
 * engine's timer_max_delay_ms (3 days by default) away is refused with 24 DELAY_ILLEGAL; a
 * deliver time already past is stored for consumers at once.
 *
 * Transactional (`transaction` with `producer_group`): stored as half messages, invisible
 * until rmq_end_transaction commits them (by the msg_id of their send results) or rolls them
 * back. A half left undecided is offered to its group's rmq_transaction_checks. A
 * transactional send cannot be delayed.
 *
 * The send results of a batch that waits (for its time or its decision) name its records in
 * the engine's system topic (queue 0), not the queue it goes to. */
typedef struct rmq_send_options {
    int has_queue_id;           /* nonzero: send to queue_id */
    int32_t queue_id;
    const char *sharding_key;   /* NULL: none; used only without a queue_id */
    int64_t delay_ms;           /* nonzero: reaches its queue this many ms from now */
    int64_t deliver_at_ms;      /* nonzero: reaches its queue at this time (ms since the epoch) */
    int32_t delay_level;        /* nonzero: RocketMQ 4's delay level, 1 (1 s) .. 18 (2 h) */
    int transaction;            /* nonzero: a transactional send (half messages) */
    const char *producer_group; /* required with `transaction`: the group that answers the checks */
} rmq_send_options;

/* The outcome of one sent message (the reply's results[i], protocol 4.1). */
typedef struct rmq_send_result {
    char status[32];          /* "PUT_OK" or "FLUSH_DISK_TIMEOUT" */
    int32_t status_code;      /* PutStatus: 0 PUT_OK, 1 FLUSH_DISK_TIMEOUT */
    char msg_id[65];          /* 32 uppercase hex characters */
    int32_t queue_id;
    int64_t queue_offset;
    int64_t commit_log_offset;
    int64_t store_timestamp;  /* ms since the epoch */
    char uniq_key[65];        /* the message's UNIQ_KEY when the client sent one (on a broker set's
                                 address it gives each message one; or the message's own property);
                                 "" when the engine made it (or the application's is over 64 bytes) */
} rmq_send_result;

/* A stored message: the 19 fields of the message object (protocol 6.1).
 * Strings are NUL-terminated UTF-8. All pointers point into one block owned by
 * the message; release it with rmq_message_free (or the list/pull free). */
typedef struct rmq_message {
    const char *topic;
    int32_t queue_id;
    int64_t queue_offset;
    int64_t commit_log_offset;
    int32_t store_size;
    const char *msg_id;
    const unsigned char *body;      /* body_len bytes (followed by a NUL not counted) */
    size_t body_len;
    uint32_t body_crc;
    const char *tags;               /* NULL when the message has no tag */
    const char *const *keys;        /* key_count keys, in the order sent */
    size_t key_count;
    const char *uniq_key;           /* NULL when absent */
    const rmq_property *properties; /* user properties plus UNIQ_KEY, in reply order */
    size_t property_count;
    int32_t flag;
    int32_t sys_flag;
    int64_t born_timestamp;         /* ms since the epoch */
    const char *born_host;          /* "a.b.c.d:port" */
    int64_t store_timestamp;        /* ms since the epoch */
    const char *store_host;         /* "a.b.c.d:port" */
    int32_t reconsume_times;
    void *storage;                  /* private: the block everything above points into */
} rmq_message;

typedef struct rmq_message_list {
    rmq_message *items; /* count messages; NULL when count is 0 */
    size_t count;
} rmq_message_list;

/* Optional pull settings. NULL for rmq_pull means all defaults. */
typedef struct rmq_pull_options {
    int32_t max_wait_ms;      /* 0: answer at once; > 0: long poll (the call's timeout grows by this) */
    const char *subscription; /* NULL: "*"; else tags joined by "||" */
} rmq_pull_options;

typedef struct rmq_pull_result {
    char status[32];      /* GetStatus name, e.g. "FOUND", "OFFSET_OVERFLOW_ONE" */
    int32_t status_code;  /* GetStatus number (protocol 5.1) */
    int64_t next_offset;  /* always continue from here */
    int64_t min_offset;
    int64_t max_offset;
    rmq_message_list messages; /* empty unless status is FOUND */
} rmq_pull_result;

/* Connects a client. `endpoint` is e.g. "tcp://127.0.0.1:10911", or a broker set's address:
 * its engines separated by commas (at most RMQ_SET_ENGINES_MAX), see "A broker set's address"
 * above. `timeout_ms` (> 0) is the deadline of every call; `curve` is NULL for no encryption.
 * Returns NULL on failure (with *err filled). The connection itself is made in
 * the background: on one endpoint, an engine that is not there shows up as RMQ_ERR_TIMEOUT on
 * the first call, not here. */
rmq_client *rmq_connect(const char *endpoint, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err);

/* Closes the socket without waiting for unsent requests. NULL is allowed. */
void rmq_close(rmq_client *client);

/* The endpoint the client's requests go to now: the one given to rmq_connect, or the master
 * it moved to after a NOT_MASTER (see "Following the master" above). Valid until the next
 * call on the client or rmq_close; NULL for a NULL client. */
const char *rmq_endpoint(const rmq_client *client);

/* Sends one message. `options` may be NULL. On success *result holds its outcome. */
int rmq_send(rmq_client *client, const char *topic, const rmq_send_options *options,
             const rmq_outgoing_message *message, rmq_send_result *result, rmq_error *err);

/* Sends `count` messages as one all-or-nothing batch to one queue. `results` is
 * a caller-provided array of `count` entries, filled in message order. */
int rmq_send_batch(rmq_client *client, const char *topic, const rmq_send_options *options,
                   const rmq_outgoing_message *messages, size_t count, rmq_send_result *results,
                   rmq_error *err);

/* Reads up to `max_messages` (engine default 32, capped at 1024) from one queue,
 * starting at `offset`. `options` may be NULL. Free *result with rmq_pull_result_free. */
int rmq_pull(rmq_client *client, const char *topic, int32_t queue_id, int64_t offset, int32_t max_messages,
             const rmq_pull_options *options, rmq_pull_result *result, rmq_error *err);

/* Finds up to `max_results` (engine default 64, also its cap) messages of `topic`
 * carrying `key` as a key or as uniq_key. Free *result with rmq_message_list_free. */
int rmq_query_by_key(rmq_client *client, const char *topic, const char *key, int32_t max_results,
                     rmq_message_list *result, rmq_error *err);

/* Reads one message by its msg_id. Free *result with rmq_message_free. */
int rmq_get_by_id(rmq_client *client, const char *msg_id, rmq_message *result, rmq_error *err);

/* Creates `topic` with `queue_count` queues, or grows it to that many. */
int rmq_create_topic(rmq_client *client, const char *topic, int32_t queue_count, rmq_error *err);

/* Records that `group` will next consume `offset` of the queue. */
int rmq_commit_offset(rmq_client *client, const char *group, const char *topic, int32_t queue_id,
                      int64_t offset, rmq_error *err);

/* Reads the offset `group` committed for the queue into *offset; -1 if none. */
int rmq_fetch_offset(rmq_client *client, const char *group, const char *topic, int32_t queue_id,
                     int64_t *offset, rmq_error *err);

/* ---- pop consumers (protocol 4.12): take messages one by one, ack each ---- */

#define RMQ_RECEIPT_HANDLE_MAX 128

/* One popped message's delivery: its handle (for ack / change) and attempt (1 = first). */
typedef struct rmq_receipt {
    char handle[RMQ_RECEIPT_HANDLE_MAX + 1];
    int32_t attempt;
} rmq_receipt;

/* Optional pop settings. NULL for rmq_pop means all defaults. */
typedef struct rmq_pop_options {
    int has_queue_id;         /* nonzero: pop from queue_id; else the engine picks the queues */
    int32_t queue_id;
    int32_t invisible_ms;     /* 0: the engine default (30000) */
    int32_t max_wait_ms;      /* 0: answer at once; > 0: long poll (the call's timeout grows by this) */
    const char *subscription; /* NULL: "*" */
} rmq_pop_options;

typedef struct rmq_pop_result {
    rmq_message_list messages; /* empty when nothing is visible now */
    rmq_receipt *receipts;     /* messages.count entries, aligned with the messages */
} rmq_pop_result;

typedef struct rmq_pop_stats {
    int64_t ack_floor, pop_cursor, in_flight, due, redelivered, dead_lettered, journal_entries, segments,
        max_offset;
} rmq_pop_stats;

/* Takes up to `max_messages` for `group`; each stays invisible to the group's other pops for
 * the invisible time, then comes back (attempt + 1) unless acked. Free with rmq_pop_result_free. */
int rmq_pop(rmq_client *client, const char *group, const char *topic, int32_t max_messages,
            const rmq_pop_options *options, rmq_pop_result *result, rmq_error *err);

/* Acks `count` (1..1024) handles of one queue. *acked: how many are done; refused[i] (a
 * caller-provided array of `count`, or NULL) is set to the engine's code for a handle it
 * refused (22 INVALID_RECEIPT_HANDLE: stale or foreign), 0 for an acked one. */
int rmq_ack(rmq_client *client, const char *group, const char *topic, int32_t queue_id,
            const char *const *handles, size_t count, size_t *acked, int32_t *refused, rmq_error *err);

/* Makes a popped message invisible for `invisible_ms` from now (0: a nack, visible again at
 * once). On success `new_handle` (RMQ_RECEIPT_HANDLE_MAX + 1 bytes) holds the new handle; the
 * old one is stale (INVALID_RECEIPT_HANDLE) from now on. */
int rmq_change_invisible(rmq_client *client, const char *group, const char *topic, int32_t queue_id,
                         const char *handle, int32_t invisible_ms, char *new_handle, rmq_error *err);

/* Gives a popped message back now (rmq_change_invisible with 0 ms): it is redelivered with
 * attempt + 1, or dead-lettered after the last attempt. `new_handle` as for
 * rmq_change_invisible, or NULL when the new handle is not wanted. */
int rmq_nack(rmq_client *client, const char *group, const char *topic, int32_t queue_id, const char *handle,
             char *new_handle, rmq_error *err);

/* A pop group's ack floor and counts on one queue. */
int rmq_pop_stats_get(rmq_client *client, const char *group, const char *topic, int32_t queue_id,
                      rmq_pop_stats *stats, rmq_error *err);

void rmq_pop_result_free(rmq_pop_result *result);

/* ---- transactional messages: half messages decided by their producer ---- */

typedef enum rmq_transaction_decision {
    RMQ_TRANSACTION_COMMIT = 1,   /* the half message reaches its topic */
    RMQ_TRANSACTION_ROLLBACK = 2, /* it never does */
} rmq_transaction_decision;

/* The half messages of a producer group that waited for a decision past the engine's
 * transaction_timeout_ms: each must be answered with rmq_end_transaction (its msg_id). */
typedef struct rmq_check_result {
    rmq_message_list messages; /* the halves; topic and queue_id are where a commit puts each */
    int32_t *check_times;      /* messages.count entries: how many times each was offered (1 = first) */
} rmq_check_result;

/* Commits or rolls back the half message `msg_id` (the msg_id its transactional send
 * returned). `producer_group` may be NULL; when given, the half must be that group's. Returns 0
 * once the decision stands (a commit: once the message is stored in its topic); the same
 * decision again is answered 0 too. Engine errors: 25 TRANSACTION_NOT_FOUND (not a half
 * message, or not the group's), 26 TRANSACTION_ENDED (already decided the other way). */
int rmq_end_transaction(rmq_client *client, const char *msg_id, rmq_transaction_decision decision,
                        const char *producer_group, rmq_error *err);

/* Takes up to `max_messages` (1..1024, engine default 32) halves of `producer_group` due for a
 * check. `max_wait_ms` > 0 waits that long for one (long polling; the call's timeout grows by
 * it). A half is offered again after the engine's transaction_check_interval_ms, and rolled
 * back after transaction_check_max offers. Free *result with rmq_check_result_free. */
int rmq_transaction_checks(rmq_client *client, const char *producer_group, int32_t max_messages, int32_t max_wait_ms,
                           rmq_check_result *result, rmq_error *err);

void rmq_check_result_free(rmq_check_result *result);

/* Checks that the engine answers. */
int rmq_ping(rmq_client *client, rmq_error *err);

/* ---- route: where an engine stands in its broker set (protocol 4.14) ---- */

typedef struct rmq_route {
    char cluster_name[128];                     /* possibly truncated */
    char broker_name[128];                      /* possibly truncated */
    int64_t broker_id;                          /* this engine within its broker set */
    char endpoint[RMQ_ENDPOINT_MAX + 1];        /* the engine's own advertised endpoint */
    int elected;                                /* nonzero: its role is chosen on etcd */
    char role[16];                              /* "master" or "replica" */
    int64_t epoch;                              /* the broker set's epoch (0 when not elected) */
    int64_t master_id;                          /* the master's broker_id; -1: unknown or not elected */
    char master_endpoint[RMQ_ENDPOINT_MAX + 1]; /* where writes go; "" while unknown */
} rmq_route;

/* Asks the engine for its route: its role and the master's endpoint. Any engine of a broker
 * set answers, replicas too; the client does not move. *route is zeroed after a failure. */
int rmq_route_get(rmq_client *client, rmq_route *route, rmq_error *err);

/* ---- a cluster of broker sets (docs/cluster.md) ---- */

#define RMQ_BROKER_SETS_MAX 64
#define RMQ_BROKER_NAME_MAX 127
#define RMQ_TOPIC_NOT_FOUND 6          /* engine ErrorCode TOPIC_NOT_FOUND */
#define RMQ_SERVICE_NOT_AVAILABLE 14   /* engine ErrorCode SERVICE_NOT_AVAILABLE */

/* One broker set's queues of a topic: its queues 0..queue_count-1, written at its master. */
typedef struct rmq_broker_queues {
    char broker_name[RMQ_BROKER_NAME_MAX + 1];
    int32_t queue_count;
    char master_endpoint[RMQ_ENDPOINT_MAX + 1]; /* "" while the set elects its master */
} rmq_broker_queues;

/* A topic's route: every broker set serving it, sorted by name (count 0: none serves it). */
typedef struct rmq_topic_route {
    size_t count;
    rmq_broker_queues sets[RMQ_BROKER_SETS_MAX];
} rmq_topic_route;

/* Asks any engine of a cluster for a topic's route (protocol 4.14, `route` with a topic). An
 * engine not in a cluster answers its own queues of the topic, if it has it. */
int rmq_topic_route_get(rmq_client *client, const char *topic, rmq_topic_route *route, rmq_error *err);

/* A client of a whole cluster: routes asked of the engine it was given, sends spread over the
 * queues of every set serving a topic (in turn), each set reached at its master. */
typedef struct rmq_cluster rmq_cluster;

rmq_cluster *rmq_cluster_connect(const char *endpoint, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err);
void rmq_cluster_close(rmq_cluster *cluster);

/* Sends one message to the topic's next queue over the whole route; *result says where in its
 * set, broker_name which set. The route is asked again after 30 s or after a failed send. A set
 * with no master now (its connection lost and one look found none, or NOT_MASTER naming none) is
 * passed over: the message goes to the next queue of another set, with the same UNIQ_KEY, and
 * later sends pass that set over until it has a master again (looked at again at most once a
 * second). Each set's client is on the master the route names: the route names no replicas. */
int rmq_cluster_send(rmq_cluster *cluster, const char *topic, const rmq_outgoing_message *message,
                     rmq_send_result *result, char broker_name[RMQ_BROKER_NAME_MAX + 1], rmq_error *err);

/* Sends one message to the queue `sharding_key` hashes to (zlib's crc32 over the route's queues,
 * as every client does: the same key, the same queue of the same set). It waits for that set's
 * master until its deadline, or fails alone: other sets' sends are not held up. */
int rmq_cluster_send_keyed(rmq_cluster *cluster, const char *topic, const char *sharding_key,
                           const rmq_outgoing_message *message, rmq_send_result *result,
                           char broker_name[RMQ_BROKER_NAME_MAX + 1], rmq_error *err);

void rmq_message_free(rmq_message *message);
void rmq_message_list_free(rmq_message_list *list);
void rmq_pull_result_free(rmq_pull_result *result);

#ifdef __cplusplus
}
#endif

#endif /* RMQ_CLIENT_H */
