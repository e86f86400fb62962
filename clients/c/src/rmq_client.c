/*
 * rmq_client.c: connection, request/reply matching and the operations of
 * docs/protocol.md over one ZeroMQ DEALER socket.
 *
 * Every call: take a fresh request id, encode one msgpack map, send it as one
 * frame, then read frames until the one whose `id` matches (others are late
 * replies and are dropped) or until the deadline. After a timeout the socket is
 * closed (linger 0) and a new one is connected, so a reply that arrives late can
 * never be read by a later call. A refusal NOT_MASTER that names the master moves
 * the client to the master, where the same request goes once more (see call()).
 *
 * On a broker set's address (engines separated by commas) the client is watched: its
 * socket sends ZMTP heartbeats, and a socket monitor (an inproc PAIR socket) tells it at
 * once that the connection broke, was refused, or went silent. A call then keeps one
 * deadline, looks for the master with `route` (look_for_master) and sends the same frame
 * again there (call_on_set; the behaviour every client shares is in clients/c/README.md,
 * "A broker set's address").
 */
#define _POSIX_C_SOURCE 200809L

#include "rmq_client.h"

#include <assert.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <msgpuck.h>
#include <zmq.h>

#include "rmq_codec.h"
#include "rmq_set.h"

#define PROTOCOL_VERSION 1
#define Z85_KEY_CHARS 40
#define REPLY_FIELDS_MAX 12
#define UNIQ_PREFIX_CHARS 16
#define BUSY_BACKOFF_MS_MIN 20   /* the first pause before a BUSY send goes again; it doubles */
#define BUSY_BACKOFF_MS_MAX 2000

/* The monitor events that mean a watched socket's engine is out of reach. libzmq 4.3 reports a
 * connection that broke (a reset, a close, a heartbeat or a handshake left unanswered) as
 * DISCONNECTED, and a connection attempt that failed (refused: nothing listens) as CLOSED then
 * CONNECT_RETRIED. */
#define CONNECTION_LOST_EVENTS (ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED | ZMQ_EVENT_CONNECT_RETRIED)

/* exchange's outcome when a watched socket lost its connection; never returned to a caller. */
#define LINK_LOST (-100)

struct rmq_client {
    void *context;
    void *socket;  /* NULL after a failed reconnect; the next call retries */
    void *monitor; /* a watched client: the PAIR socket reading `socket`'s connection events */
    int lost;      /* a watched client: `socket`'s connection was lost since it was opened */
    char *endpoint; /* the engine requests go to now */
    char *set[RMQ_SET_ENGINES_MAX]; /* the engines of the address given (set_count 1: one endpoint) */
    size_t set_count;
    int watched;   /* heartbeats, a monitor and call_on_set: a set's address, or rmq_connect_watched */
    int one_round; /* a watched client's call ends when one look finds no master (rmq_set_one_round) */
    uint64_t monitor_count; /* numbers the monitors' inproc addresses */
    char uniq_prefix[UNIQ_PREFIX_CHARS + 1]; /* the UNIQ_KEYs the client makes: this, then uniq_count */
    uint64_t uniq_count;
    int timeout_ms;
    int use_curve;
    char server_public_key[Z85_KEY_CHARS + 1];
    char client_public_key[Z85_KEY_CHARS + 1];
    char client_secret_key[Z85_KEY_CHARS + 1];
    int64_t next_request_id; /* starts at 1: id 0 is what the engine uses for unreadable requests */
};

/* ---- errors ---------------------------------------------------------------------- */

static int set_error(rmq_error *err, int code, const char *name, const char *format, ...)
    __attribute__((format(printf, 4, 5)));

static int set_error(rmq_error *err, int code, const char *name, const char *format, ...) {
    assert(code != 0);
    if (err != NULL) {
        err->code = code;
        rmq_copy_utf8(err->name, sizeof err->name, name, strlen(name));
        va_list args;
        va_start(args, format);
        vsnprintf(err->message, sizeof err->message, format, args);
        va_end(args);
    }
    return code;
}

static int invalid_argument(rmq_error *err, const char *what) {
    return set_error(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "%s", what);
}

static int transport_error(rmq_error *err, const char *call) {
    return set_error(err, RMQ_ERR_TRANSPORT, "TRANSPORT", "%s: %s", call, zmq_strerror(zmq_errno()));
}

static int bad_reply(rmq_error *err, const char *why) {
    return set_error(err, RMQ_ERR_BAD_REPLY, "BAD_REPLY", "reply field '%s' is missing or malformed", why);
}

static void clear_error(rmq_error *err) {
    if (err != NULL) memset(err, 0, sizeof *err);
}

/* ---- socket ---------------------------------------------------------------------- */

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int64_t ms) {
    if (ms <= 0) return;
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Sets a watched socket's heartbeats and hands its connection events to a new PAIR socket
 * (*monitor). A paused engine keeps its TCP connection but answers no PING: libzmq drops the
 * connection after RMQ_HEARTBEAT_TIMEOUT_MS. Its listen queue still takes a new connection
 * whose handshake never ends: the handshake gets the same bound. */
static int watch(rmq_client *c, void *s, void **monitor) {
    int ivl = RMQ_HEARTBEAT_IVL_MS, timeout = RMQ_HEARTBEAT_TIMEOUT_MS, unbounded = 0, linger = 0;
    char address[64];
    snprintf(address, sizeof address, "inproc://rmq-monitor-%llu", (unsigned long long)c->monitor_count++);
    int rc = zmq_setsockopt(s, ZMQ_HEARTBEAT_IVL, &ivl, sizeof ivl);
    if (rc == 0) rc = zmq_setsockopt(s, ZMQ_HEARTBEAT_TIMEOUT, &timeout, sizeof timeout);
    if (rc == 0) rc = zmq_setsockopt(s, ZMQ_HANDSHAKE_IVL, &timeout, sizeof timeout);
    if (rc == 0) rc = zmq_socket_monitor(s, address, CONNECTION_LOST_EVENTS);
    if (rc != 0) return rc;
    void *m = zmq_socket(c->context, ZMQ_PAIR);
    if (m == NULL) return -1;
    /* RCVHWM 0: the monitor's pipe never fills, so libzmq never waits to report an event. */
    rc = zmq_setsockopt(m, ZMQ_RCVHWM, &unbounded, sizeof unbounded);
    if (rc == 0) rc = zmq_setsockopt(m, ZMQ_LINGER, &linger, sizeof linger);
    if (rc == 0) rc = zmq_connect(m, address);
    if (rc != 0) {
        zmq_close(m);
        return rc;
    }
    *monitor = m;
    return 0;
}

/* A DEALER connected to `endpoint` (and, when watched, its monitor) into *socket, *monitor. */
static int open_link(rmq_client *c, const char *endpoint, void **socket, void **monitor, rmq_error *err) {
    void *s = zmq_socket(c->context, ZMQ_DEALER);
    if (s == NULL) return transport_error(err, "zmq_socket");
    *monitor = NULL;
    int linger = 0;
    int rc = zmq_setsockopt(s, ZMQ_LINGER, &linger, sizeof linger);
    if (rc == 0 && c->use_curve) {
        rc = zmq_setsockopt(s, ZMQ_CURVE_SERVERKEY, c->server_public_key, Z85_KEY_CHARS);
        if (rc == 0) rc = zmq_setsockopt(s, ZMQ_CURVE_PUBLICKEY, c->client_public_key, Z85_KEY_CHARS);
        if (rc == 0) rc = zmq_setsockopt(s, ZMQ_CURVE_SECRETKEY, c->client_secret_key, Z85_KEY_CHARS);
    }
    if (rc != 0) {
        int code = transport_error(err, "zmq_setsockopt (are the CURVE keys valid Z85?)");
        zmq_close(s);
        return code;
    }
    if (c->watched && watch(c, s, monitor) != 0) {
        int code = transport_error(err, "zmq_socket_monitor");
        zmq_close(s);
        return code;
    }
    if (zmq_connect(s, endpoint) != 0) {
        int code = transport_error(err, "zmq_connect");
        zmq_close(s);
        if (*monitor != NULL) zmq_close(*monitor);
        *monitor = NULL;
        return code;
    }
    *socket = s;
    return 0;
}

static void close_link(void *socket, void *monitor) {
    if (socket != NULL) zmq_close(socket); /* first: the monitor stops with its socket */
    if (monitor != NULL) zmq_close(monitor);
}

static int open_socket(rmq_client *c, rmq_error *err) {
    assert(c->socket == NULL);
    c->lost = 0;
    return open_link(c, c->endpoint, &c->socket, &c->monitor, err);
}

static void drop_socket(rmq_client *c) {
    close_link(c->socket, c->monitor);
    c->socket = NULL;
    c->monitor = NULL;
}

/* Reads a monitor's pending events (each: a 6-byte frame, event id first, then the address):
 * 1 if one of them says the connection was lost. */
static int events_say_lost(void *monitor) {
    int lost = 0;
    for (;;) {
        zmq_msg_t part;
        zmq_msg_init(&part);
        if (zmq_msg_recv(&part, monitor, ZMQ_DONTWAIT) < 0) {
            zmq_msg_close(&part);
            return lost;
        }
        uint16_t event = 0;
        if (zmq_msg_size(&part) >= sizeof event) memcpy(&event, zmq_msg_data(&part), sizeof event);
        lost |= (event & CONNECTION_LOST_EVENTS) != 0;
        while (zmq_msg_more(&part) && zmq_msg_recv(&part, monitor, ZMQ_DONTWAIT) >= 0) {
        }
        zmq_msg_close(&part);
    }
}

/* Whether a watched client's connection was lost since its socket was opened. */
static int connection_lost(rmq_client *c) {
    if (c->monitor != NULL && !c->lost) c->lost = events_say_lost(c->monitor);
    return c->lost;
}

static int check_curve_key(const char *key, const char *what, rmq_error *err) {
    if (key == NULL || strlen(key) != Z85_KEY_CHARS) {
        return set_error(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT",
                         "%s must be a %d-character Z85 string", what, Z85_KEY_CHARS);
    }
    return 0;
}

static int copy_curve_keys(rmq_client *c, const rmq_curve_keys *curve, rmq_error *err) {
    int rc = check_curve_key(curve->server_public_key, "the server public key", err);
    if (rc == 0) rc = check_curve_key(curve->client_public_key, "the client public key", err);
    if (rc == 0) rc = check_curve_key(curve->client_secret_key, "the client secret key", err);
    if (rc != 0) return rc;
    if (!zmq_has("curve")) {
        return set_error(err, RMQ_ERR_TRANSPORT, "TRANSPORT", "this libzmq was built without CURVE");
    }
    memcpy(c->server_public_key, curve->server_public_key, Z85_KEY_CHARS + 1);
    memcpy(c->client_public_key, curve->client_public_key, Z85_KEY_CHARS + 1);
    memcpy(c->client_secret_key, curve->client_secret_key, Z85_KEY_CHARS + 1);
    c->use_curve = 1;
    return 0;
}

/* Splits an address into c->set: one endpoint, or a broker set's engines separated by commas. */
static int split_address(rmq_client *c, const char *address, rmq_error *err) {
    const char *p = address;
    for (;;) {
        const char *comma = strchr(p, ',');
        size_t len = comma != NULL ? (size_t)(comma - p) : strlen(p);
        if (len == 0 || len > RMQ_ENDPOINT_MAX) {
            return invalid_argument(err, "an engine of the address is empty or over RMQ_ENDPOINT_MAX bytes");
        }
        if (c->set_count == RMQ_SET_ENGINES_MAX) {
            return invalid_argument(err, "a broker set's address names more than RMQ_SET_ENGINES_MAX engines");
        }
        if ((c->set[c->set_count] = strndup(p, len)) == NULL) {
            return set_error(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the client");
        }
        c->set_count++;
        if (comma == NULL) return 0;
        p = comma + 1;
    }
}

/* The prefix of the client's UNIQ_KEYs: the process id's low 16 bits and 6 random bytes, in
 * hex (the shape rmqpy's producers use): two clients' keys never meet. */
static void make_uniq_prefix(rmq_client *c) {
    unsigned char bytes[8];
    unsigned pid = (unsigned)getpid() & 0xFFFFu;
    bytes[0] = (unsigned char)(pid >> 8);
    bytes[1] = (unsigned char)pid;
    FILE *random = fopen("/dev/urandom", "rb");
    if (random == NULL || fread(bytes + 2, 1, 6, random) != 6) {
        uint64_t mix = (uint64_t)now_ms() ^ ((uint64_t)(uintptr_t)c << 16) ^ (uint64_t)clock();
        for (int i = 2; i < 8; i++) bytes[i] = (unsigned char)(mix >> (8 * i));
    }
    if (random != NULL) fclose(random);
    for (int i = 0; i < 8; i++) snprintf(c->uniq_prefix + 2 * i, 3, "%02X", bytes[i]);
}

void rmq_next_uniq_key(rmq_client *c, char key[RMQ_UNIQ_KEY_MAX + 1]) {
    snprintf(key, RMQ_UNIQ_KEY_MAX + 1, "%s%016llX", c->uniq_prefix, (unsigned long long)c->uniq_count++);
}

static rmq_client *connect_client(const char *address, int timeout_ms, const rmq_curve_keys *curve, int watched,
                                  rmq_error *err) {
    clear_error(err);
    if (address == NULL) {
        invalid_argument(err, "endpoint is NULL");
        return NULL;
    }
    if (timeout_ms <= 0) {
        invalid_argument(err, "timeout_ms must be > 0");
        return NULL;
    }
    rmq_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        set_error(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the client");
        return NULL;
    }
    c->timeout_ms = timeout_ms;
    c->next_request_id = 1;
    make_uniq_prefix(c);
    if (split_address(c, address, err) != 0 || (c->endpoint = strdup(c->set[0])) == NULL) {
        if (err != NULL && err->code == 0) set_error(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the client");
        rmq_close(c);
        return NULL;
    }
    c->watched = watched || c->set_count > 1;
    if (curve != NULL && copy_curve_keys(c, curve, err) != 0) {
        rmq_close(c);
        return NULL;
    }
    c->context = zmq_ctx_new();
    if (c->context == NULL) {
        transport_error(err, "zmq_ctx_new");
        rmq_close(c);
        return NULL;
    }
    if (open_socket(c, err) != 0) {
        rmq_close(c);
        return NULL;
    }
    return c;
}

rmq_client *rmq_connect(const char *endpoint, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err) {
    return connect_client(endpoint, timeout_ms, curve, 0, err);
}

rmq_client *rmq_connect_watched(const char *address, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err) {
    return connect_client(address, timeout_ms, curve, 1, err);
}

void rmq_set_one_round(rmq_client *client, int one_round) {
    client->one_round = one_round;
}

void rmq_close(rmq_client *client) {
    if (client == NULL) return;
    drop_socket(client);
    if (client->context != NULL) {
        while (zmq_ctx_term(client->context) != 0 && zmq_errno() == EINTR) {
        }
    }
    /* The secret key should not outlive the client in freed memory. */
    memset(client->client_secret_key, 0, sizeof client->client_secret_key);
    for (size_t i = 0; i < client->set_count; i++) free(client->set[i]);
    free(client->endpoint);
    free(client);
}

/* ---- one call: send, then wait for the matching reply ------------------------- */

static void begin_request(rmq_client *c, rmq_buf *req, const char *op, uint32_t own_field_count,
                          int64_t *request_id) {
    *request_id = c->next_request_id++;
    rmq_buf_init(req, RMQ_REQUEST_BYTES_MAX);
    rmq_put_map(req, 3 + own_field_count);
    rmq_put_str(req, "v");
    rmq_put_int(req, PROTOCOL_VERSION);
    rmq_put_str(req, "op");
    rmq_put_str(req, op);
    rmq_put_str(req, "id");
    rmq_put_int(req, *request_id);
}

static int send_frame(rmq_client *c, const rmq_buf *req, int64_t deadline, rmq_error *err) {
    if (req->failed == RMQ_BUF_TOO_LARGE) {
        /* As the engine answers a body too large; it would drop this frame without a reply. */
        return set_error(err, RMQ_MESSAGE_ILLEGAL, "MESSAGE_ILLEGAL",
                         "the request is over %u bytes; the engine drops requests over %u bytes "
                         "(client_frame_bytes_max) without a reply; a message body is at most %u bytes "
                         "(message_body_bytes_max): split the batch or make the body smaller",
                         RMQ_REQUEST_BYTES_MAX, RMQ_REQUEST_BYTES_MAX, RMQ_MESSAGE_BODY_BYTES_MAX);
    }
    if (req->failed == RMQ_BUF_NO_MEMORY) {
        return set_error(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the request");
    }
    for (;;) {
        if (zmq_send(c->socket, req->data, req->len, ZMQ_DONTWAIT) >= 0) return 0;
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) return transport_error(err, "zmq_send");
        if (connection_lost(c)) return LINK_LOST;
        /* The outgoing queue is full (the engine is away): wait for room until the deadline. */
        int64_t remaining = deadline - now_ms();
        if (remaining <= 0) return RMQ_ERR_TIMEOUT;
        zmq_pollitem_t items[2] = {{c->socket, 0, ZMQ_POLLOUT, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, c->monitor != NULL ? 2 : 1, (long)remaining) < 0 && zmq_errno() != EINTR) {
            return transport_error(err, "zmq_poll");
        }
    }
}

/* Reads the next frame into *frame: 1 if one was read, 0 if none before the deadline,
 * LINK_LOST when a watched socket's connection was lost first, < 0 on error. A frame
 * already received is read before a loss is looked at: an answer that came is an answer. */
static int receive_frame(rmq_client *c, zmq_msg_t *frame, int64_t deadline, rmq_error *err) {
    for (;;) {
        if (zmq_msg_recv(frame, c->socket, ZMQ_DONTWAIT) >= 0) {
            if (!zmq_msg_more(frame)) return 1;
            /* Replies are single frames; drop a multi-part message whole. */
            while (zmq_msg_more(frame) && zmq_msg_recv(frame, c->socket, ZMQ_DONTWAIT) >= 0) {
            }
            continue;
        }
        if (zmq_errno() != EAGAIN && zmq_errno() != EINTR) return transport_error(err, "zmq_msg_recv");
        if (connection_lost(c)) return LINK_LOST;
        int64_t remaining = deadline - now_ms();
        if (remaining <= 0) return 0;
        zmq_pollitem_t items[2] = {{c->socket, 0, ZMQ_POLLIN, 0}, {c->monitor, 0, ZMQ_POLLIN, 0}};
        if (zmq_poll(items, c->monitor != NULL ? 2 : 1, (long)remaining) < 0 && zmq_errno() != EINTR) {
            return transport_error(err, "zmq_poll");
        }
    }
}

enum { REPLY_ID, REPLY_OK, REPLY_ERROR, REPLY_ENVELOPE_FIELDS };

/* Whether a frame answers request_id. An `ok: false` reply with id 0 answers it
 * too: the engine could not read our request (protocol 1.4). */
static int answers(const char *const *fields, int64_t request_id) {
    int64_t id = 0;
    int ok = 0;
    if (rmq_read_int64(fields[REPLY_ID], &id) != 0) return 0;
    if (id == request_id) return 1;
    return id == 0 && rmq_read_bool(fields[REPLY_OK], &ok) == 0 && !ok;
}

static int engine_error(const char *error, rmq_error *err) {
    static const char *const names[] = {"code", "name", "message"};
    const char *v[3];
    const char *p = error;
    int32_t code = 0;
    if (error == NULL || rmq_map_lookup(&p, names, 3, v) != 0 || rmq_read_int32(v[0], &code) != 0 || code == 0) {
        return bad_reply(err, "error");
    }
    if (err != NULL) {
        err->code = code;
        if (rmq_read_str_into(v[1], err->name, sizeof err->name) != 0) strcpy(err->name, "UNKNOWN");
        if (rmq_read_str_into(v[2], err->message, sizeof err->message) != 0) err->message[0] = '\0';
    }
    return code;
}

/* Copies an endpoint field whole: a cut endpoint would name another engine, or none. */
static int read_endpoint(const char *value, char out[RMQ_ENDPOINT_MAX + 1]) {
    const char *s = NULL;
    uint32_t len = 0;
    if (rmq_read_str(value, &s, &len) != 0 || len > RMQ_ENDPOINT_MAX || memchr(s, '\0', len) != NULL) return -1;
    memcpy(out, s, len);
    out[len] = '\0';
    return 0;
}

/* Where a refusal says the master is: its `master_endpoint`, beside `error` (protocol 7.3,
 * NOT_MASTER), copied into master[]; "" when the reply names none, or none that fits. */
static void read_master_endpoint(const char *reply, char master[RMQ_ENDPOINT_MAX + 1]) {
    static const char *const names[] = {"master_endpoint"};
    const char *v[1];
    const char *p = reply;
    if (rmq_map_lookup(&p, names, 1, v) != 0 || read_endpoint(v[0], master) != 0) master[0] = '\0';
}

/*
 * Sends the request once and waits for its reply until `deadline`. On success (`ok: true`)
 * returns 0, leaves the reply in *frame (the caller closes it) and points values[i] at the
 * reply's field names[i] (NULL if absent). Otherwise returns the error code with *err filled
 * (RMQ_ERR_TIMEOUT and LINK_LOST leave it to the caller) and *frame closed; a refusal's
 * master_endpoint goes to master[] (else ""). The request stays in *req, to be sent again.
 */
static int exchange_until(rmq_client *c, const rmq_buf *req, int64_t request_id, int64_t deadline,
                          const char *const *names, size_t count, const char **values, zmq_msg_t *frame,
                          char master[RMQ_ENDPOINT_MAX + 1], rmq_error *err) {
    assert(count + REPLY_ENVELOPE_FIELDS <= REPLY_FIELDS_MAX);
    master[0] = '\0';
    int rc = c->socket == NULL ? open_socket(c, err) : 0;
    if (rc == 0) rc = send_frame(c, req, deadline, err);
    zmq_msg_init(frame);
    while (rc == 0) {
        int got = receive_frame(c, frame, deadline, err);
        if (got < 0) rc = got;
        if (got == 0) rc = RMQ_ERR_TIMEOUT;
        if (got <= 0) break;
        const char *data = zmq_msg_data(frame);
        const char *end = data + zmq_msg_size(frame);
        const char *p = data;
        if (zmq_msg_size(frame) == 0 || mp_check(&p, end) != 0 || p != end) continue; /* unreadable: not ours */
        const char *all_names[REPLY_FIELDS_MAX] = {"id", "ok", "error"};
        const char *all_values[REPLY_FIELDS_MAX];
        for (size_t i = 0; i < count; i++) all_names[REPLY_ENVELOPE_FIELDS + i] = names[i];
        p = data;
        if (rmq_map_lookup(&p, all_names, REPLY_ENVELOPE_FIELDS + count, all_values) != 0) continue;
        if (!answers(all_values, request_id)) continue; /* a late reply to an earlier call */
        int ok = 0;
        if (rmq_read_bool(all_values[REPLY_OK], &ok) != 0) rc = bad_reply(err, "ok");
        else if (!ok) {
            rc = engine_error(all_values[REPLY_ERROR], err);
            read_master_endpoint(data, master);
        } else {
            for (size_t i = 0; i < count; i++) values[i] = all_values[REPLY_ENVELOPE_FIELDS + i];
            return 0;
        }
    }
    zmq_msg_close(frame);
    return rc;
}

/* After a timeout: a late reply must not reach a later call, and unsent frames must go. */
static int timed_out(rmq_client *c, int64_t timeout_ms, rmq_error *err) {
    drop_socket(c);
    rmq_error reopen_err;
    (void)open_socket(c, &reopen_err); /* on failure the next call retries */
    return set_error(err, RMQ_ERR_TIMEOUT, "TIMEOUT", "no reply from %s within %lld ms", c->endpoint,
                     (long long)timeout_ms);
}

/* exchange_until with a deadline timeout_ms from now, and a timeout's socket replaced. */
static int exchange(rmq_client *c, const rmq_buf *req, int64_t request_id, int64_t timeout_ms,
                    const char *const *names, size_t count, const char **values, zmq_msg_t *frame,
                    char master[RMQ_ENDPOINT_MAX + 1], rmq_error *err) {
    int rc = exchange_until(c, req, request_id, now_ms() + timeout_ms, names, count, values, frame, master, err);
    return rc == RMQ_ERR_TIMEOUT ? timed_out(c, timeout_ms, err) : rc;
}

/* Points the client at `endpoint` for this and every later call: a new socket connected there
 * (on the same endpoint too: a watched socket whose connection was lost starts afresh).
 * Returns 0, or nonzero (the client left where it was) when ZeroMQ cannot connect to it. */
static int move_to(rmq_client *c, const char *endpoint) {
    char *moved = strdup(endpoint);
    if (moved == NULL) return RMQ_ERR_NO_MEMORY;
    char *previous = c->endpoint;
    rmq_error ignored;
    drop_socket(c);
    c->endpoint = moved;
    if (open_socket(c, &ignored) == 0) {
        free(previous);
        return 0;
    }
    c->endpoint = previous;
    free(moved);
    (void)open_socket(c, &ignored); /* on failure the next call retries */
    return RMQ_ERR_TRANSPORT;
}

/* ---- a broker set's address: looking for the master --------------------------------- */

/* Reads a probe's reply: 1 if it answers `id`, with *master set when it says role "master". */
static int read_probe_reply(const zmq_msg_t *frame, int64_t id, int *master, int64_t *epoch) {
    static const char *const names[] = {"id", "ok", "role", "epoch"};
    const char *v[4];
    const char *data = zmq_msg_data((zmq_msg_t *)frame);
    const char *p = data;
    int64_t got = 0;
    int ok = 0;
    char role[16];
    if (zmq_msg_size((zmq_msg_t *)frame) == 0 || mp_check(&p, data + zmq_msg_size((zmq_msg_t *)frame)) != 0) return 0;
    p = data;
    if (rmq_map_lookup(&p, names, 4, v) != 0 || rmq_read_int64(v[0], &got) != 0 || got != id) return 0;
    *master = rmq_read_bool(v[1], &ok) == 0 && ok && rmq_read_str_into(v[2], role, sizeof role) == 0 &&
              strcmp(role, "master") == 0 && rmq_read_int64(v[3], epoch) == 0;
    return 1;
}

typedef struct probe {
    void *socket, *monitor;
    int64_t id;
    int done; /* answered, refused, lost or never sent */
} probe;

/* Reads what came on a probe's socket and monitor; the master's index and epoch into *best. */
static void read_probe(probe *pr, size_t i, size_t *best, int64_t *best_epoch) {
    zmq_msg_t frame;
    zmq_msg_init(&frame);
    while (!pr->done && zmq_msg_recv(&frame, pr->socket, ZMQ_DONTWAIT) >= 0) {
        int master = 0;
        int64_t epoch = 0;
        if (!zmq_msg_more(&frame) && read_probe_reply(&frame, pr->id, &master, &epoch)) {
            pr->done = 1;
            if (master && epoch > *best_epoch) {
                *best = i;
                *best_epoch = epoch;
            }
        }
    }
    zmq_msg_close(&frame);
    if (!pr->done && pr->monitor != NULL && events_say_lost(pr->monitor)) pr->done = 1;
}

/*
 * One round of looking for the master, at most RMQ_ROUTE_PROBE_MS: `route` is asked of every
 * engine of the set at once, each on a fresh socket (one that refuses the connection drops
 * out at once, one that does not answer in time is skipped). The engine the client is on (the
 * one that just failed) is waited for only while no other engine says it is master. The
 * master is the engine whose own route answers role "master", of the highest epoch if two do
 * (an old master not yet told). Returns its index in c->set, or c->set_count if none.
 */
static size_t look_for_master(rmq_client *c) {
    probe probes[RMQ_SET_ENGINES_MAX];
    memset(probes, 0, sizeof probes);
    size_t n = c->set_count, best = n;
    int64_t best_epoch = -1;
    int64_t deadline = now_ms() + RMQ_ROUTE_PROBE_MS;
    for (size_t i = 0; i < n; i++) {
        rmq_error ignored;
        rmq_buf req;
        probe *pr = &probes[i];
        pr->done = open_link(c, c->set[i], &pr->socket, &pr->monitor, &ignored) != 0;
        if (pr->done) continue;
        begin_request(c, &req, "route", 0, &pr->id);
        pr->done = req.failed != RMQ_BUF_OK || zmq_send(pr->socket, req.data, req.len, ZMQ_DONTWAIT) < 0;
        rmq_buf_free(&req);
    }
    for (;;) {
        int other = 0, current = 0;
        for (size_t i = 0; i < n; i++) {
            if (!probes[i].done) *(strcmp(c->set[i], c->endpoint) == 0 ? &current : &other) = 1;
        }
        int64_t remaining = deadline - now_ms();
        if (!other && (!current || best < n)) break;
        if (remaining <= 0) break;
        zmq_pollitem_t items[2 * RMQ_SET_ENGINES_MAX];
        size_t owner[2 * RMQ_SET_ENGINES_MAX], k = 0;
        for (size_t i = 0; i < n; i++) {
            if (probes[i].done) continue;
            items[k] = (zmq_pollitem_t){probes[i].socket, 0, ZMQ_POLLIN, 0};
            owner[k++] = i;
            if (probes[i].monitor == NULL) continue;
            items[k] = (zmq_pollitem_t){probes[i].monitor, 0, ZMQ_POLLIN, 0};
            owner[k++] = i;
        }
        if (zmq_poll(items, (int)k, (long)remaining) < 0 && zmq_errno() != EINTR) break;
        for (size_t j = 0; j < k; j++) {
            if (items[j].revents & ZMQ_POLLIN) read_probe(&probes[owner[j]], owner[j], &best, &best_epoch);
        }
    }
    for (size_t i = 0; i < n; i++) close_link(probes[i].socket, probes[i].monitor);
    return best;
}

int rmq_look_for_master(rmq_client *c) {
    size_t found = look_for_master(c);
    return found < c->set_count && move_to(c, c->set[found]) == 0;
}

static int retried_on_the_same_engine(int code) {
    return code == RMQ_BUSY || code == RMQ_SERVICE_NOT_AVAILABLE || code == RMQ_SLAVE_NOT_AVAILABLE;
}

/*
 * A watched client's call (the behaviour of "A broker set's address", clients/c/README.md):
 * one deadline for the whole call. The same frame (the same request id, the same UNIQ_KEYs)
 * goes again after a NOT_MASTER naming the master (at once, there), after SLAVE_NOT_AVAILABLE
 * (on the same engine, paused as a look), after BUSY and its kin (on the same engine, after the
 * busy backoff), and after a NOT_MASTER naming none or a lost
 * connection (to the master a look finds; the looks pause 50 ms, doubling to 100 ms). The
 * error of the last attempt is raised when the deadline passes with no master; a timeout
 * (no answer, the connection up) is raised at once and never sent again.
 */
static int call_on_set(rmq_client *c, const rmq_buf *req, int64_t request_id, int64_t timeout_ms,
                       const char *const *names, size_t count, const char **values, zmq_msg_t *frame,
                       rmq_error *err) {
    rmq_error own;
    rmq_error *e = err != NULL ? err : &own;
    int64_t deadline = now_ms() + timeout_ms;
    int busy_retries = 0;
    int waits = 0; /* SLAVE_NOT_AVAILABLE from the master so far */
    for (;;) {
        char master[RMQ_ENDPOINT_MAX + 1];
        clear_error(e);
        int rc = exchange_until(c, req, request_id, deadline, names, count, values, frame, master, e);
        if (rc == 0) return 0;
        if (rc == RMQ_ERR_TIMEOUT) return timed_out(c, timeout_ms, e);
        if (rc == RMQ_NOT_MASTER && master[0] != '\0' && strcmp(master, c->endpoint) != 0 && move_to(c, master) == 0) {
            continue; /* the refusing engine stored nothing */
        }
        if (rc == RMQ_SLAVE_NOT_AVAILABLE) {
            /* the set's master waits for its replicas to follow it again: asked as often as a look */
            int64_t pause = waits++ == 0 ? RMQ_LOOK_PAUSE_MS_MIN : RMQ_LOOK_PAUSE_MS_MAX;
            if (now_ms() + pause >= deadline) return rc;
            sleep_ms(pause);
            continue;
        }
        if (retried_on_the_same_engine(rc)) {
            int shift = busy_retries < 7 ? busy_retries++ : 7;
            int64_t pause = (int64_t)BUSY_BACKOFF_MS_MIN << shift;
            pause = pause < BUSY_BACKOFF_MS_MAX ? pause : BUSY_BACKOFF_MS_MAX;
            if (now_ms() + pause >= deadline) return rc;
            sleep_ms(pause);
            continue;
        }
        if (rc == LINK_LOST) {
            rc = set_error(e, RMQ_ERR_CONNECTION_LOST, "CONNECTION_LOST",
                           "the connection to %s broke, was refused or went silent, and no master of the "
                           "broker set was found within %lld ms", c->endpoint, (long long)timeout_ms);
        } else if (rc != RMQ_NOT_MASTER) {
            return rc; /* any other refusal, at once */
        }
        int64_t pause = RMQ_LOOK_PAUSE_MS_MIN;
        for (;;) {
            size_t found = look_for_master(c);
            if (found < c->set_count && now_ms() < deadline && move_to(c, c->set[found]) == 0) break;
            if (c->one_round || now_ms() >= deadline) return rc;
            int64_t remaining = deadline - now_ms();
            sleep_ms(pause < remaining ? pause : remaining);
            pause = pause * 2 < RMQ_LOOK_PAUSE_MS_MAX ? pause * 2 : RMQ_LOOK_PAUSE_MS_MAX;
            if (now_ms() >= deadline) return rc;
        }
    }
}

/*
 * Sends the request and waits for its reply (then frees *req). On one endpoint: a replica, or
 * a master that lost its lease, refuses every write with NOT_MASTER naming the master: the
 * client moves there for good and sends the request again, once. The refusing engine did
 * nothing with the request, so the second send cannot store anything twice. The resend has a
 * deadline of its own, and goes on a new socket, so reusing the request id is safe. A watched
 * client follows its broker set instead (call_on_set).
 */
static int call(rmq_client *c, rmq_buf *req, int64_t request_id, int64_t timeout_ms, const char *const *names,
                size_t count, const char **values, zmq_msg_t *frame, rmq_error *err) {
    int rc = 0;
    if (c->watched) {
        rc = call_on_set(c, req, request_id, timeout_ms, names, count, values, frame, err);
    } else {
        char master[RMQ_ENDPOINT_MAX + 1];
        rc = exchange(c, req, request_id, timeout_ms, names, count, values, frame, master, err);
        if (rc == RMQ_NOT_MASTER && master[0] != '\0' && strcmp(master, c->endpoint) != 0 &&
            move_to(c, master) == 0) {
            clear_error(err);
            rc = exchange(c, req, request_id, timeout_ms, names, count, values, frame, master, err);
        }
    }
    rmq_buf_free(req);
    return rc;
}

const char *rmq_endpoint(const rmq_client *client) {
    return client != NULL ? client->endpoint : NULL;
}

/* ---- operations -------------------------------------------------------------------- */

static int check_message(const rmq_outgoing_message *m, rmq_error *err) {
    if (m->body == NULL && m->body_len > 0) return invalid_argument(err, "a message body is NULL");
    if (m->key_count > 0 && m->keys == NULL) return invalid_argument(err, "a message's keys are NULL");
    for (size_t k = 0; k < m->key_count; k++) {
        if (m->keys[k] == NULL) return invalid_argument(err, "a message key is NULL");
    }
    if (m->property_count > 0 && m->properties == NULL) return invalid_argument(err, "a message's properties are NULL");
    for (size_t k = 0; k < m->property_count; k++) {
        if (m->properties[k].name == NULL || m->properties[k].value == NULL) {
            return invalid_argument(err, "a property name or value is NULL");
        }
    }
    if (m->key_count > UINT32_MAX || m->property_count > UINT32_MAX) return invalid_argument(err, "too many keys");
    return 0;
}

/* The message's own UNIQ_KEY property, or NULL. */
static const char *own_uniq_key(const rmq_outgoing_message *m) {
    for (size_t k = 0; k < m->property_count; k++) {
        if (strcmp(m->properties[k].name, "UNIQ_KEY") == 0) return m->properties[k].value;
    }
    return NULL;
}

/* A message's map; `uniq_key` (NULL: none) is added as its UNIQ_KEY property. */
static void put_message(rmq_buf *req, const rmq_outgoing_message *m, const char *uniq_key) {
    size_t property_count = m->property_count + (uniq_key != NULL);
    uint32_t fields = 1 + (m->tags != NULL) + (m->key_count > 0) + (property_count > 0) + (m->flag != 0);
    rmq_put_map(req, fields);
    rmq_put_str(req, "body");
    rmq_put_bin(req, m->body, m->body_len);
    if (m->tags != NULL) {
        rmq_put_str(req, "tags");
        rmq_put_str(req, m->tags);
    }
    if (m->key_count > 0) {
        rmq_put_str(req, "keys");
        rmq_put_array(req, (uint32_t)m->key_count);
        for (size_t k = 0; k < m->key_count; k++) rmq_put_str(req, m->keys[k]);
    }
    if (property_count > 0) {
        rmq_put_str(req, "properties");
        rmq_put_map(req, (uint32_t)property_count);
        for (size_t k = 0; k < m->property_count; k++) {
            rmq_put_str(req, m->properties[k].name);
            rmq_put_str(req, m->properties[k].value);
        }
        if (uniq_key != NULL) {
            rmq_put_str(req, "UNIQ_KEY");
            rmq_put_str(req, uniq_key);
        }
    }
    if (m->flag != 0) {
        rmq_put_str(req, "flag");
        rmq_put_int(req, m->flag);
    }
}

/* The delay and transaction fields of a send that has any (values as given: the engine checks them). */
static void put_delivery(rmq_buf *req, const rmq_send_options *o) {
    if (o->delay_ms != 0) {
        rmq_put_str(req, "delay_ms");
        rmq_put_int(req, o->delay_ms);
    }
    if (o->deliver_at_ms != 0) {
        rmq_put_str(req, "deliver_at_ms");
        rmq_put_int(req, o->deliver_at_ms);
    }
    if (o->delay_level != 0) {
        rmq_put_str(req, "delay_level");
        rmq_put_int(req, o->delay_level);
    }
    if (o->transaction) {
        rmq_put_str(req, "transaction");
        rmq_put_bool(req, 1);
    }
}

int rmq_send_batch(rmq_client *c, const char *topic, const rmq_send_options *options,
                   const rmq_outgoing_message *messages, size_t count, rmq_send_result *results, rmq_error *err) {
    clear_error(err);
    if (c == NULL || topic == NULL) return invalid_argument(err, "client or topic is NULL");
    if (count > 0 && (messages == NULL || results == NULL)) return invalid_argument(err, "messages or results is NULL");
    if (count > UINT32_MAX) return invalid_argument(err, "too many messages");
    for (size_t i = 0; i < count; i++) {
        int rc = check_message(&messages[i], err);
        if (rc != 0) return rc;
    }
    static const rmq_send_options defaults = {0};
    const rmq_send_options *o = options != NULL ? options : &defaults;
    int has_sharding_key = o->sharding_key != NULL;
    int has_producer_group = o->producer_group != NULL;
    uint32_t delivery = (o->delay_ms != 0) + (o->deliver_at_ms != 0) + (o->delay_level != 0) + (o->transaction != 0);
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "send", 2 + (o->has_queue_id != 0) + has_sharding_key + has_producer_group + delivery, &id);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    if (o->has_queue_id) {
        rmq_put_str(&req, "queue_id");
        rmq_put_int(&req, o->queue_id);
    }
    if (has_sharding_key) {
        rmq_put_str(&req, "sharding_key");
        rmq_put_str(&req, o->sharding_key);
    }
    if (delivery != 0) put_delivery(&req, o);
    if (has_producer_group) {
        rmq_put_str(&req, "producer_group");
        rmq_put_str(&req, o->producer_group);
    }
    /* On a set's address each message carries a UNIQ_KEY made here, in the frame every attempt
     * sends, so a message stored twice (sent again after a lost connection) has one key. */
    char (*made)[RMQ_UNIQ_KEY_MAX + 1] = NULL;
    if (c->watched && count > 0 && (made = calloc(count, sizeof *made)) == NULL) {
        rmq_buf_free(&req);
        return set_error(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the request");
    }
    rmq_put_str(&req, "messages");
    rmq_put_array(&req, (uint32_t)count);
    for (size_t i = 0; i < count; i++) {
        int make = made != NULL && own_uniq_key(&messages[i]) == NULL;
        if (make) rmq_next_uniq_key(c, made[i]);
        put_message(&req, &messages[i], make ? made[i] : NULL);
    }

    static const char *const names[] = {"results"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    const char *why = NULL;
    if (rc == 0) {
        rc = rmq_decode_send_results(v[0], results, count, &why);
        zmq_msg_close(&frame);
    }
    for (size_t i = 0; rc == 0 && i < count; i++) {
        const char *key = made != NULL && made[i][0] != '\0' ? made[i] : own_uniq_key(&messages[i]);
        if (key != NULL && strlen(key) < sizeof results[i].uniq_key) strcpy(results[i].uniq_key, key);
    }
    free(made);
    if (rc == 0 || why == NULL) return rc;
    return bad_reply(err, why);
}

int rmq_send(rmq_client *c, const char *topic, const rmq_send_options *options, const rmq_outgoing_message *message,
             rmq_send_result *result, rmq_error *err) {
    if (message == NULL || result == NULL) {
        clear_error(err);
        return invalid_argument(err, "message or result is NULL");
    }
    return rmq_send_batch(c, topic, options, message, 1, result, err);
}

enum { PULL_STATUS, PULL_STATUS_CODE, PULL_NEXT, PULL_MIN, PULL_MAX, PULL_MESSAGES, PULL_FIELDS };

int rmq_pull(rmq_client *c, const char *topic, int32_t queue_id, int64_t offset, int32_t max_messages,
             const rmq_pull_options *options, rmq_pull_result *result, rmq_error *err) {
    clear_error(err);
    if (result != NULL) memset(result, 0, sizeof *result);
    if (c == NULL || topic == NULL || result == NULL) return invalid_argument(err, "client, topic or result is NULL");
    int32_t max_wait_ms = options != NULL ? options->max_wait_ms : 0;
    int has_subscription = options != NULL && options->subscription != NULL;
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "pull", 4 + (max_wait_ms != 0) + has_subscription, &id);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    rmq_put_str(&req, "queue_id");
    rmq_put_int(&req, queue_id);
    rmq_put_str(&req, "offset");
    rmq_put_int(&req, offset);
    rmq_put_str(&req, "max_messages");
    rmq_put_int(&req, max_messages);
    if (max_wait_ms != 0) {
        rmq_put_str(&req, "max_wait_ms");
        rmq_put_int(&req, max_wait_ms);
    }
    if (has_subscription) {
        rmq_put_str(&req, "subscription");
        rmq_put_str(&req, options->subscription);
    }

    static const char *const names[PULL_FIELDS] = {"status", "status_code", "next_offset", "min_offset",
                                                   "max_offset", "messages"};
    const char *v[PULL_FIELDS];
    zmq_msg_t frame;
    int64_t timeout_ms = (int64_t)c->timeout_ms + (max_wait_ms > 0 ? max_wait_ms : 0);
    int rc = call(c, &req, id, timeout_ms, names, PULL_FIELDS, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = NULL;
    if (rmq_read_str_into(v[PULL_STATUS], result->status, sizeof result->status) != 0) why = "status";
    else if (rmq_read_int32(v[PULL_STATUS_CODE], &result->status_code) != 0) why = "status_code";
    else if (rmq_read_int64(v[PULL_NEXT], &result->next_offset) != 0) why = "next_offset";
    else if (rmq_read_int64(v[PULL_MIN], &result->min_offset) != 0) why = "min_offset";
    else if (rmq_read_int64(v[PULL_MAX], &result->max_offset) != 0) why = "max_offset";
    else rc = rmq_decode_message_list(v[PULL_MESSAGES], &result->messages, &why);
    zmq_msg_close(&frame);
    if (why == NULL) return 0;
    memset(result, 0, sizeof *result);
    if (rc == RMQ_ERR_NO_MEMORY) return set_error(err, rc, "NO_MEMORY", "cannot allocate the messages");
    return bad_reply(err, why);
}

/* Decodes the message list in reply field v into *result (closing the frame). */
static int finish_message_list(const char *v, zmq_msg_t *frame, rmq_message_list *result, rmq_error *err) {
    const char *why = NULL;
    int rc = rmq_decode_message_list(v, result, &why);
    zmq_msg_close(frame);
    if (rc == RMQ_ERR_NO_MEMORY) return set_error(err, rc, "NO_MEMORY", "cannot allocate the messages");
    return rc == 0 ? 0 : bad_reply(err, why);
}

int rmq_query_by_key(rmq_client *c, const char *topic, const char *key, int32_t max_results,
                     rmq_message_list *result, rmq_error *err) {
    clear_error(err);
    if (result != NULL) memset(result, 0, sizeof *result);
    if (c == NULL || topic == NULL || key == NULL || result == NULL) {
        return invalid_argument(err, "client, topic, key or result is NULL");
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "query_by_key", 3, &id);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    rmq_put_str(&req, "key");
    rmq_put_str(&req, key);
    rmq_put_str(&req, "max_results");
    rmq_put_int(&req, max_results);
    static const char *const names[] = {"messages"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    return rc != 0 ? rc : finish_message_list(v[0], &frame, result, err);
}

int rmq_get_by_id(rmq_client *c, const char *msg_id, rmq_message *result, rmq_error *err) {
    clear_error(err);
    if (result != NULL) memset(result, 0, sizeof *result);
    if (c == NULL || msg_id == NULL || result == NULL) return invalid_argument(err, "client, msg_id or result is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "get_by_id", 1, &id);
    rmq_put_str(&req, "msg_id");
    rmq_put_str(&req, msg_id);
    static const char *const names[] = {"message"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = "message";
    rc = v[0] == NULL ? RMQ_ERR_BAD_REPLY : rmq_decode_message(v[0], result, &why);
    zmq_msg_close(&frame);
    if (rc == RMQ_ERR_NO_MEMORY) return set_error(err, rc, "NO_MEMORY", "cannot allocate the message");
    return rc == 0 ? 0 : bad_reply(err, why);
}

int rmq_create_topic(rmq_client *c, const char *topic, int32_t queue_count, rmq_error *err) {
    clear_error(err);
    if (c == NULL || topic == NULL) return invalid_argument(err, "client or topic is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "create_topic", 2, &id);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    rmq_put_str(&req, "queue_count");
    rmq_put_int(&req, queue_count);
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, NULL, 0, NULL, &frame, err);
    if (rc == 0) zmq_msg_close(&frame);
    return rc;
}

static void put_queue(rmq_buf *req, const char *group, const char *topic, int32_t queue_id) {
    rmq_put_str(req, "group");
    rmq_put_str(req, group);
    rmq_put_str(req, "topic");
    rmq_put_str(req, topic);
    rmq_put_str(req, "queue_id");
    rmq_put_int(req, queue_id);
}

int rmq_commit_offset(rmq_client *c, const char *group, const char *topic, int32_t queue_id, int64_t offset,
                      rmq_error *err) {
    clear_error(err);
    if (c == NULL || group == NULL || topic == NULL) return invalid_argument(err, "client, group or topic is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "commit_offset", 4, &id);
    put_queue(&req, group, topic, queue_id);
    rmq_put_str(&req, "offset");
    rmq_put_int(&req, offset);
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, NULL, 0, NULL, &frame, err);
    if (rc == 0) zmq_msg_close(&frame);
    return rc;
}

int rmq_fetch_offset(rmq_client *c, const char *group, const char *topic, int32_t queue_id, int64_t *offset,
                     rmq_error *err) {
    clear_error(err);
    if (c == NULL || group == NULL || topic == NULL || offset == NULL) {
        return invalid_argument(err, "client, group, topic or offset is NULL");
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "fetch_offset", 3, &id);
    put_queue(&req, group, topic, queue_id);
    static const char *const names[] = {"offset"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    rc = rmq_read_int64(v[0], offset);
    zmq_msg_close(&frame);
    return rc == 0 ? 0 : bad_reply(err, "offset");
}

int rmq_ping(rmq_client *c, rmq_error *err) {
    clear_error(err);
    if (c == NULL) return invalid_argument(err, "client is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "ping", 0, &id);
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, NULL, 0, NULL, &frame, err);
    if (rc == 0) zmq_msg_close(&frame);
    return rc;
}

/* ---- route: where this engine stands in its broker set (protocol 4.14) ------------- */

enum {
    ROUTE_CLUSTER, ROUTE_BROKER_NAME, ROUTE_BROKER_ID, ROUTE_ENDPOINT, ROUTE_ELECTED, ROUTE_ROLE, ROUTE_EPOCH,
    ROUTE_MASTER_ID, ROUTE_MASTER_ENDPOINT, ROUTE_FIELDS
};

/* Reads the route reply's fields v[] into *route; NULL, or the name of the field that is wrong. */
static const char *read_route(const char *const *v, rmq_route *route) {
    if (rmq_read_str_into(v[ROUTE_CLUSTER], route->cluster_name, sizeof route->cluster_name) != 0) {
        return "cluster_name";
    }
    if (rmq_read_str_into(v[ROUTE_BROKER_NAME], route->broker_name, sizeof route->broker_name) != 0) {
        return "broker_name";
    }
    if (rmq_read_int64(v[ROUTE_BROKER_ID], &route->broker_id) != 0) return "broker_id";
    if (read_endpoint(v[ROUTE_ENDPOINT], route->endpoint) != 0) return "endpoint";
    if (rmq_read_bool(v[ROUTE_ELECTED], &route->elected) != 0) return "elected";
    if (rmq_read_str_into(v[ROUTE_ROLE], route->role, sizeof route->role) != 0) return "role";
    if (rmq_read_int64(v[ROUTE_EPOCH], &route->epoch) != 0) return "epoch";
    if (rmq_read_int64(v[ROUTE_MASTER_ID], &route->master_id) != 0) return "master_id";
    if (read_endpoint(v[ROUTE_MASTER_ENDPOINT], route->master_endpoint) != 0) return "master_endpoint";
    return NULL;
}

int rmq_route_get(rmq_client *c, rmq_route *route, rmq_error *err) {
    clear_error(err);
    if (route != NULL) memset(route, 0, sizeof *route);
    if (c == NULL || route == NULL) return invalid_argument(err, "client or route is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "route", 0, &id);
    static const char *const names[ROUTE_FIELDS] = {"cluster_name", "broker_name", "broker_id", "endpoint",
                                                    "elected", "role", "epoch", "master_id", "master_endpoint"};
    const char *v[ROUTE_FIELDS];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, ROUTE_FIELDS, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = read_route(v, route);
    zmq_msg_close(&frame);
    if (why == NULL) return 0;
    memset(route, 0, sizeof *route);
    return bad_reply(err, why);
}

/* ---- a topic's route in a cluster of broker sets (protocol 4.14, with a topic) ------- */

/* Reads the topic_route array into *route; NULL, or the name of the field that is wrong. */
static const char *read_topic_route(const char *value, rmq_topic_route *route) {
    if (value == NULL || mp_typeof(*value) != MP_ARRAY) return "topic_route";
    const char *p = value;
    uint32_t count = mp_decode_array(&p);
    if (count > RMQ_BROKER_SETS_MAX) return "topic_route";
    static const char *const names[] = {"broker_name", "queues", "master_endpoint"};
    for (uint32_t i = 0; i < count; i++) {
        const char *v[3];
        if (rmq_map_lookup(&p, names, 3, v) != 0) return "topic_route";
        rmq_broker_queues *set = &route->sets[i];
        const char *name = NULL;
        uint32_t len = 0;
        if (rmq_read_str(v[0], &name, &len) != 0 || len > RMQ_BROKER_NAME_MAX) return "broker_name";
        memcpy(set->broker_name, name, len);
        set->broker_name[len] = '\0';
        if (rmq_read_int32(v[1], &set->queue_count) != 0 || set->queue_count < 0) return "queues";
        if (read_endpoint(v[2], set->master_endpoint) != 0) return "master_endpoint";
    }
    route->count = count;
    return NULL;
}

int rmq_topic_route_get(rmq_client *c, const char *topic, rmq_topic_route *route, rmq_error *err) {
    clear_error(err);
    if (route != NULL) memset(route, 0, sizeof *route);
    if (c == NULL || topic == NULL || route == NULL) return invalid_argument(err, "client, topic or route is NULL");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "route", 1, &id);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    static const char *const names[] = {"topic_route"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = read_topic_route(v[0], route);
    zmq_msg_close(&frame);
    if (why == NULL) return 0;
    memset(route, 0, sizeof *route);
    return bad_reply(err, why);
}

/* ---- pop consumers ------------------------------------------------------------------ */

void rmq_pop_result_free(rmq_pop_result *result) {
    if (result == NULL) return;
    rmq_message_list_free(&result->messages);
    free(result->receipts);
    result->receipts = NULL;
}

/* Reads the aligned receipt_handles and attempts arrays into receipts[count]. */
static const char *read_receipts(const char *handles, const char *attempts, rmq_receipt *receipts, size_t count) {
    if (handles == NULL || attempts == NULL || mp_typeof(*handles) != MP_ARRAY || mp_typeof(*attempts) != MP_ARRAY) {
        return "receipt_handles";
    }
    const char *h = handles, *a = attempts;
    if (mp_decode_array(&h) != count || mp_decode_array(&a) != count) return "receipt_handles";
    for (size_t i = 0; i < count; i++) {
        const char *s = NULL;
        uint32_t len = 0;
        if (rmq_read_str(h, &s, &len) != 0 || len > RMQ_RECEIPT_HANDLE_MAX) return "receipt_handles";
        memcpy(receipts[i].handle, s, len);
        receipts[i].handle[len] = '\0';
        mp_next(&h);
        if (rmq_read_int32(a, &receipts[i].attempt) != 0) return "attempts";
        mp_next(&a);
    }
    return NULL;
}

int rmq_pop(rmq_client *c, const char *group, const char *topic, int32_t max_messages, const rmq_pop_options *options,
            rmq_pop_result *result, rmq_error *err) {
    clear_error(err);
    if (result != NULL) memset(result, 0, sizeof *result);
    if (c == NULL || group == NULL || topic == NULL || result == NULL) {
        return invalid_argument(err, "client, group, topic or result is NULL");
    }
    int has_queue = options != NULL && options->has_queue_id;
    int32_t invisible_ms = options != NULL ? options->invisible_ms : 0;
    int32_t max_wait_ms = options != NULL ? options->max_wait_ms : 0;
    int has_subscription = options != NULL && options->subscription != NULL;
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "pop", 3 + has_queue + (invisible_ms != 0) + (max_wait_ms != 0) + has_subscription, &id);
    rmq_put_str(&req, "group");
    rmq_put_str(&req, group);
    rmq_put_str(&req, "topic");
    rmq_put_str(&req, topic);
    rmq_put_str(&req, "max_messages");
    rmq_put_int(&req, max_messages);
    if (has_queue) {
        rmq_put_str(&req, "queue_id");
        rmq_put_int(&req, options->queue_id);
    }
    if (invisible_ms != 0) {
        rmq_put_str(&req, "invisible_ms");
        rmq_put_int(&req, invisible_ms);
    }
    if (max_wait_ms != 0) {
        rmq_put_str(&req, "max_wait_ms");
        rmq_put_int(&req, max_wait_ms);
    }
    if (has_subscription) {
        rmq_put_str(&req, "subscription");
        rmq_put_str(&req, options->subscription);
    }
    static const char *const names[] = {"messages", "receipt_handles", "attempts"};
    const char *v[3];
    zmq_msg_t frame;
    int64_t timeout_ms = (int64_t)c->timeout_ms + (max_wait_ms > 0 ? max_wait_ms : 0);
    int rc = call(c, &req, id, timeout_ms, names, 3, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = NULL;
    rc = rmq_decode_message_list(v[0], &result->messages, &why);
    if (rc == 0 && result->messages.count > 0) {
        result->receipts = calloc(result->messages.count, sizeof *result->receipts);
        if (result->receipts == NULL) rc = RMQ_ERR_NO_MEMORY;
        else why = read_receipts(v[1], v[2], result->receipts, result->messages.count);
    }
    zmq_msg_close(&frame);
    if (rc == 0 && why == NULL) return 0;
    rmq_pop_result_free(result);
    if (rc == RMQ_ERR_NO_MEMORY) return set_error(err, rc, "NO_MEMORY", "cannot allocate the messages");
    return bad_reply(err, why != NULL ? why : "messages");
}

int rmq_ack(rmq_client *c, const char *group, const char *topic, int32_t queue_id, const char *const *handles,
            size_t count, size_t *acked, int32_t *refused, rmq_error *err) {
    clear_error(err);
    if (c == NULL || group == NULL || topic == NULL || handles == NULL || acked == NULL) {
        return invalid_argument(err, "client, group, topic, handles or acked is NULL");
    }
    if (count == 0 || count > 1024) return invalid_argument(err, "an ack takes 1 to 1024 handles");
    for (size_t i = 0; i < count; i++) {
        if (handles[i] == NULL) return invalid_argument(err, "a handle is NULL");
        if (refused != NULL) refused[i] = 0;
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "ack", 4, &id);
    put_queue(&req, group, topic, queue_id);
    rmq_put_str(&req, "receipt_handles");
    rmq_put_array(&req, (uint32_t)count);
    for (size_t i = 0; i < count; i++) rmq_put_str(&req, handles[i]);
    static const char *const names[] = {"acked", "failed"};
    const char *v[2];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 2, v, &frame, err);
    if (rc != 0) return rc;
    int64_t done = 0;
    const char *why = NULL;
    if (rmq_read_int64(v[0], &done) != 0 || done < 0) why = "acked";
    else if (v[1] == NULL || mp_typeof(*v[1]) != MP_ARRAY) why = "failed";
    else {
        const char *p = v[1];
        uint32_t n = mp_decode_array(&p);
        static const char *const failure_names[] = {"receipt_handle", "error"};
        static const char *const error_names[] = {"code"};
        for (uint32_t k = 0; k < n && why == NULL; k++) {
            const char *f[2], *e[1], *s = NULL, *q = NULL;
            uint32_t len = 0;
            int32_t code = 0;
            if (rmq_map_lookup(&p, failure_names, 2, f) != 0 || rmq_read_str(f[0], &s, &len) != 0) {
                why = "failed";
            } else if ((q = f[1]) == NULL || rmq_map_lookup(&q, error_names, 1, e) != 0 ||
                       rmq_read_int32(e[0], &code) != 0) {
                why = "failed";
            } else if (refused != NULL) {
                for (size_t i = 0; i < count; i++) {
                    if (strlen(handles[i]) == len && memcmp(handles[i], s, len) == 0) refused[i] = code;
                }
            }
        }
    }
    zmq_msg_close(&frame);
    if (why != NULL) return bad_reply(err, why);
    *acked = (size_t)done;
    return 0;
}

int rmq_change_invisible(rmq_client *c, const char *group, const char *topic, int32_t queue_id, const char *handle,
                         int32_t invisible_ms, char *new_handle, rmq_error *err) {
    clear_error(err);
    if (c == NULL || group == NULL || topic == NULL || handle == NULL || new_handle == NULL || invisible_ms < 0) {
        return invalid_argument(err, "client, group, topic, handle or new_handle is NULL, or invisible_ms < 0");
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "change_invisible", 5, &id);
    put_queue(&req, group, topic, queue_id);
    rmq_put_str(&req, "receipt_handle");
    rmq_put_str(&req, handle);
    rmq_put_str(&req, "invisible_ms");
    rmq_put_int(&req, invisible_ms);
    static const char *const names[] = {"receipt_handle"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    const char *s = NULL;
    uint32_t len = 0;
    rc = rmq_read_str(v[0], &s, &len) != 0 || len > RMQ_RECEIPT_HANDLE_MAX ? RMQ_ERR_BAD_REPLY : 0;
    if (rc == 0) {
        memcpy(new_handle, s, len); /* never cut short: a truncated handle would be useless */
        new_handle[len] = '\0';
    }
    zmq_msg_close(&frame);
    return rc == 0 ? 0 : bad_reply(err, "receipt_handle");
}

int rmq_nack(rmq_client *c, const char *group, const char *topic, int32_t queue_id, const char *handle,
             char *new_handle, rmq_error *err) {
    char unused[RMQ_RECEIPT_HANDLE_MAX + 1];
    return rmq_change_invisible(c, group, topic, queue_id, handle, 0, new_handle != NULL ? new_handle : unused, err);
}

int rmq_pop_stats_get(rmq_client *c, const char *group, const char *topic, int32_t queue_id, rmq_pop_stats *stats,
                      rmq_error *err) {
    clear_error(err);
    if (c == NULL || group == NULL || topic == NULL || stats == NULL) {
        return invalid_argument(err, "client, group, topic or stats is NULL");
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "pop_stats", 3, &id);
    put_queue(&req, group, topic, queue_id);
    static const char *const names[] = {"ack_floor", "pop_cursor", "in_flight", "due", "redelivered",
                                        "dead_lettered", "journal_entries", "segments", "max_offset"};
    enum { STATS_FIELDS = sizeof names / sizeof names[0] };
    const char *v[STATS_FIELDS];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, STATS_FIELDS, v, &frame, err);
    if (rc != 0) return rc;
    int64_t *fields[STATS_FIELDS] = {&stats->ack_floor, &stats->pop_cursor, &stats->in_flight, &stats->due,
                                     &stats->redelivered, &stats->dead_lettered, &stats->journal_entries,
                                     &stats->segments, &stats->max_offset};
    const char *why = NULL;
    for (size_t i = 0; i < STATS_FIELDS && why == NULL; i++) {
        if (rmq_read_int64(v[i], fields[i]) != 0) why = names[i];
    }
    zmq_msg_close(&frame);
    return why == NULL ? 0 : bad_reply(err, why);
}

/* ---- transactional messages ---------------------------------------------------------- */

int rmq_end_transaction(rmq_client *c, const char *msg_id, rmq_transaction_decision decision,
                        const char *producer_group, rmq_error *err) {
    clear_error(err);
    if (c == NULL || msg_id == NULL) return invalid_argument(err, "client or msg_id is NULL");
    const char *wanted = decision == RMQ_TRANSACTION_COMMIT     ? "commit"
                         : decision == RMQ_TRANSACTION_ROLLBACK ? "rollback"
                                                                : NULL;
    if (wanted == NULL) return invalid_argument(err, "decision is neither RMQ_TRANSACTION_COMMIT nor _ROLLBACK");
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "end_transaction", 2 + (producer_group != NULL), &id);
    rmq_put_str(&req, "msg_id");
    rmq_put_str(&req, msg_id);
    rmq_put_str(&req, "decision");
    rmq_put_str(&req, wanted);
    if (producer_group != NULL) {
        rmq_put_str(&req, "producer_group");
        rmq_put_str(&req, producer_group);
    }
    static const char *const names[] = {"decision"};
    const char *v[1];
    zmq_msg_t frame;
    int rc = call(c, &req, id, c->timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    /* The decision that stands: the one asked for (the other way is TRANSACTION_ENDED). */
    const char *s = NULL;
    uint32_t len = 0;
    rc = rmq_read_str(v[0], &s, &len) != 0 || len != strlen(wanted) || memcmp(s, wanted, len) != 0;
    zmq_msg_close(&frame);
    return rc == 0 ? 0 : bad_reply(err, "decision");
}

void rmq_check_result_free(rmq_check_result *result) {
    if (result == NULL) return;
    rmq_message_list_free(&result->messages);
    free(result->check_times);
    result->check_times = NULL;
}

/* Reads each check's check_times (an extra field of its message map) into check_times[count]. */
static const char *read_check_times(const char *checks, int32_t *check_times, size_t count) {
    static const char *const names[] = {"check_times"};
    const char *p = checks;
    if (mp_decode_array(&p) != count) return "checks";
    for (size_t i = 0; i < count; i++) {
        const char *v[1];
        if (rmq_map_lookup(&p, names, 1, v) != 0 || rmq_read_int32(v[0], &check_times[i]) != 0) return "check_times";
    }
    return NULL;
}

int rmq_transaction_checks(rmq_client *c, const char *producer_group, int32_t max_messages, int32_t max_wait_ms,
                           rmq_check_result *result, rmq_error *err) {
    clear_error(err);
    if (result != NULL) memset(result, 0, sizeof *result);
    if (c == NULL || producer_group == NULL || result == NULL) {
        return invalid_argument(err, "client, producer_group or result is NULL");
    }
    rmq_buf req;
    int64_t id = 0;
    begin_request(c, &req, "transaction_checks", 2 + (max_wait_ms != 0), &id);
    rmq_put_str(&req, "producer_group");
    rmq_put_str(&req, producer_group);
    rmq_put_str(&req, "max_messages");
    rmq_put_int(&req, max_messages);
    if (max_wait_ms != 0) {
        rmq_put_str(&req, "max_wait_ms");
        rmq_put_int(&req, max_wait_ms);
    }
    static const char *const names[] = {"checks"};
    const char *v[1];
    zmq_msg_t frame;
    int64_t timeout_ms = (int64_t)c->timeout_ms + (max_wait_ms > 0 ? max_wait_ms : 0);
    int rc = call(c, &req, id, timeout_ms, names, 1, v, &frame, err);
    if (rc != 0) return rc;
    const char *why = NULL;
    if (v[0] == NULL || mp_typeof(*v[0]) != MP_ARRAY) why = "checks";
    else rc = rmq_decode_message_list(v[0], &result->messages, &why);
    if (rc == 0 && why == NULL && result->messages.count > 0) {
        result->check_times = calloc(result->messages.count, sizeof *result->check_times);
        if (result->check_times == NULL) rc = RMQ_ERR_NO_MEMORY;
        else why = read_check_times(v[0], result->check_times, result->messages.count);
    }
    zmq_msg_close(&frame);
    if (rc == 0 && why == NULL) return 0;
    rmq_check_result_free(result);
    if (rc == RMQ_ERR_NO_MEMORY) return set_error(err, rc, "NO_MEMORY", "cannot allocate the checks");
    return bad_reply(err, why != NULL ? why : "checks");
}
