/*
 * rmq_conformance.c: the conformance driver of the C client (clients/conformance.md).
 *
 *     rmq_conformance ENDPOINT [--server-key Z85 --public-key Z85 --secret-key Z85] [--timeout-ms N]
 *
 * Reads a JSON array of commands on stdin, calls the client once per command and
 * writes a JSON array of results on stdout. Exit status 0 when every command ran
 * (whatever the engine answered); 2 when the arguments or a command are malformed,
 * in which case nothing is written to stdout and the reason goes to stderr.
 *
 * Beyond the table of clients/conformance.md: `route` (result: the route reply's fields,
 * protocol 4.14) and `endpoint` (no request; result: `endpoint`, where the client's requests
 * go now, which moves to the master when a replica refuses a write with NOT_MASTER);
 * `topic_route` and `cluster_send`, through the cluster client (rmq_cluster.c); `send_loop`,
 * paced single sends timed one by one (for the failover tests: ENDPOINT may be a broker set's
 * address).
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base64.h"
#include "json.h"
#include "rmq_client.h"

#define DEFAULT_TIMEOUT_MS 5000
#define DEFAULT_MAX_MESSAGES 32
#define DEFAULT_MAX_RESULTS 64
#define EXIT_BAD_INPUT 2

static void die(const char *format, ...) __attribute__((format(printf, 1, 2), noreturn));

static void die(const char *format, ...) {
    va_list args;
    va_start(args, format);
    fputs("rmq_conformance: ", stderr);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(EXIT_BAD_INPUT);
}

/* ---- reading command fields ------------------------------------------------------ */

/* A string field, NULL when absent or null (if optional). */
static const char *string_field(const json_value *cmd, const char *name, int required) {
    const json_value *v = json_get(cmd, name);
    if (v == NULL || v->type == JSON_NULL) {
        if (required) die("command lacks the string field '%s'", name);
        return NULL;
    }
    if (v->type != JSON_STRING) die("field '%s' must be a string", name);
    if (strlen(v->string) != v->string_len) die("field '%s' holds a NUL character, which C strings cannot carry", name);
    return v->string;
}

/* An integer field: 1 and *out when present, 0 when absent or null (if optional). */
static int int_field(const json_value *cmd, const char *name, int required, int64_t min, int64_t max, int64_t *out) {
    const json_value *v = json_get(cmd, name);
    if (v == NULL || v->type == JSON_NULL) {
        if (required) die("command lacks the integer field '%s'", name);
        return 0;
    }
    if (v->type != JSON_INT) die("field '%s' must be an integer", name);
    if (v->integer < min || v->integer > max) {
        die("field '%s' = %" PRId64 " is outside %" PRId64 " .. %" PRId64, name, v->integer, min, max);
    }
    *out = v->integer;
    return 1;
}

static int32_t int32_field(const json_value *cmd, const char *name, int required, int32_t fallback) {
    int64_t v = fallback;
    int_field(cmd, name, required, INT32_MIN, INT32_MAX, &v);
    return (int32_t)v;
}

static int64_t int64_field(const json_value *cmd, const char *name) {
    int64_t v = 0;
    int_field(cmd, name, 1, INT64_MIN, INT64_MAX, &v);
    return v;
}

/* An optional boolean field: 0 when absent, null or false. */
static int bool_field(const json_value *cmd, const char *name) {
    const json_value *v = json_get(cmd, name);
    if (v == NULL || v->type == JSON_NULL) return 0;
    if (v->type != JSON_BOOL) die("field '%s' must be a boolean", name);
    return v->boolean;
}

/* ---- writing results ------------------------------------------------------------- */

static void write_str(FILE *out, const char *s) {
    if (s == NULL) fputs("null", out);
    else json_write_string(out, s, strlen(s));
}

static void write_error(FILE *out, const rmq_error *err) {
    fprintf(out, "{\"ok\":false,\"code\":%d,\"name\":", err->code);
    write_str(out, err->name);
    fputs(",\"message\":", out);
    write_str(out, err->message);
    fputc('}', out);
}

/* A message object without its closing brace, so that a caller can add fields. */
static void write_message_fields(FILE *out, const rmq_message *m) {
    fputs("{\"topic\":", out);
    write_str(out, m->topic);
    fprintf(out, ",\"queue_id\":%" PRId32 ",\"queue_offset\":%" PRId64 ",\"commit_log_offset\":%" PRId64
                 ",\"store_size\":%" PRId32 ",\"msg_id\":",
            m->queue_id, m->queue_offset, m->commit_log_offset, m->store_size);
    write_str(out, m->msg_id);
    fputs(",\"body_b64\":\"", out);
    base64_write(out, m->body, m->body_len);
    fprintf(out, "\",\"body_crc\":%" PRIu32 ",\"tags\":", m->body_crc);
    write_str(out, m->tags);
    fputs(",\"keys\":[", out);
    for (size_t i = 0; i < m->key_count; i++) {
        if (i > 0) fputc(',', out);
        write_str(out, m->keys[i]);
    }
    fputs("],\"uniq_key\":", out);
    write_str(out, m->uniq_key);
    fputs(",\"properties\":{", out);
    for (size_t i = 0; i < m->property_count; i++) {
        if (i > 0) fputc(',', out);
        write_str(out, m->properties[i].name);
        fputc(':', out);
        write_str(out, m->properties[i].value);
    }
    fprintf(out, "},\"flag\":%" PRId32 ",\"sys_flag\":%" PRId32 ",\"born_timestamp\":%" PRId64 ",\"born_host\":",
            m->flag, m->sys_flag, m->born_timestamp);
    write_str(out, m->born_host);
    fprintf(out, ",\"store_timestamp\":%" PRId64 ",\"store_host\":", m->store_timestamp);
    write_str(out, m->store_host);
    fprintf(out, ",\"reconsume_times\":%" PRId32, m->reconsume_times);
}

static void write_message(FILE *out, const rmq_message *m) {
    write_message_fields(out, m);
    fputc('}', out);
}

static void write_message_list(FILE *out, const rmq_message_list *list) {
    fputc('[', out);
    for (size_t i = 0; i < list->count; i++) {
        if (i > 0) fputc(',', out);
        write_message(out, &list->items[i]);
    }
    fputc(']', out);
}

/* ---- commands -------------------------------------------------------------------- */

/* The memory behind one outgoing message (freed after the send). */
typedef struct outgoing {
    unsigned char *body;
    const char **keys;
    rmq_property *properties;
} outgoing;

static void read_keys(const json_value *keys, rmq_outgoing_message *m, outgoing *o) {
    if (keys == NULL || keys->type == JSON_NULL) return;
    if (keys->type != JSON_ARRAY) die("'keys' must be an array of strings");
    o->keys = calloc(keys->count + 1, sizeof *o->keys);
    if (o->keys == NULL) die("out of memory");
    for (size_t k = 0; k < keys->count; k++) {
        const json_value *key = &keys->items[k];
        if (key->type != JSON_STRING || strlen(key->string) != key->string_len) die("'keys' must hold strings without NUL");
        o->keys[k] = key->string;
    }
    m->keys = o->keys;
    m->key_count = keys->count;
}

static void read_properties(const json_value *props, rmq_outgoing_message *m, outgoing *o) {
    if (props == NULL || props->type == JSON_NULL) return;
    if (props->type != JSON_OBJECT) die("'properties' must be an object of strings");
    o->properties = calloc(props->count + 1, sizeof *o->properties);
    if (o->properties == NULL) die("out of memory");
    for (size_t k = 0; k < props->count; k++) {
        const json_value *value = &props->items[k];
        if (value->type != JSON_STRING || strlen(value->string) != value->string_len) {
            die("'properties' values must be strings without NUL");
        }
        o->properties[k].name = props->names[k];
        o->properties[k].value = value->string;
    }
    m->properties = o->properties;
    m->property_count = props->count;
}

static void read_message(const json_value *spec, rmq_outgoing_message *m, outgoing *o) {
    if (spec->type != JSON_OBJECT) die("each message must be an object");
    const char *body = string_field(spec, "body_b64", 1);
    size_t body_len = 0;
    if (base64_decode(body, strlen(body), &o->body, &body_len) != 0) die("'body_b64' is not padded base64");
    m->body = o->body;
    m->body_len = body_len;
    m->tags = string_field(spec, "tags", 0);
    read_keys(json_get(spec, "keys"), m, o);
    read_properties(json_get(spec, "properties"), m, o);
    m->flag = int32_field(spec, "flag", 0, 0);
}

static void run_send(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *topic = string_field(cmd, "topic", 1);
    rmq_send_options options = {0};
    int64_t queue_id = 0;
    options.has_queue_id = int_field(cmd, "queue_id", 0, INT32_MIN, INT32_MAX, &queue_id);
    options.queue_id = (int32_t)queue_id;
    options.sharding_key = string_field(cmd, "sharding_key", 0);
    int_field(cmd, "delay_ms", 0, INT64_MIN, INT64_MAX, &options.delay_ms);
    int_field(cmd, "deliver_at_ms", 0, INT64_MIN, INT64_MAX, &options.deliver_at_ms);
    options.delay_level = int32_field(cmd, "delay_level", 0, 0);
    options.transaction = bool_field(cmd, "transaction");
    options.producer_group = string_field(cmd, "producer_group", 0);
    const json_value *specs = json_get(cmd, "messages");
    if (specs == NULL || specs->type != JSON_ARRAY) die("'send' needs a 'messages' array");
    size_t count = specs->count;
    rmq_outgoing_message *messages = calloc(count + 1, sizeof *messages);
    outgoing *owned = calloc(count + 1, sizeof *owned);
    rmq_send_result *results = calloc(count + 1, sizeof *results);
    if (messages == NULL || owned == NULL || results == NULL) die("out of memory");
    for (size_t i = 0; i < count; i++) read_message(&specs->items[i], &messages[i], &owned[i]);

    rmq_error err;
    int rc = count == 1 ? rmq_send(client, topic, &options, &messages[0], &results[0], &err)
                        : rmq_send_batch(client, topic, &options, messages, count, results, &err);
    if (rc != 0) {
        write_error(out, &err);
    } else {
        fputs("{\"ok\":true,\"results\":[", out);
        for (size_t i = 0; i < count; i++) {
            const rmq_send_result *r = &results[i];
            fputs(i > 0 ? ",{\"status\":" : "{\"status\":", out);
            write_str(out, r->status);
            fprintf(out, ",\"status_code\":%" PRId32 ",\"msg_id\":", r->status_code);
            write_str(out, r->msg_id);
            fprintf(out, ",\"queue_id\":%" PRId32 ",\"queue_offset\":%" PRId64 ",\"commit_log_offset\":%" PRId64
                         ",\"store_timestamp\":%" PRId64 "}",
                    r->queue_id, r->queue_offset, r->commit_log_offset, r->store_timestamp);
        }
        fputs("]}", out);
    }
    for (size_t i = 0; i < count; i++) {
        free(owned[i].body);
        free(owned[i].keys);
        free(owned[i].properties);
    }
    free(messages);
    free(owned);
    free(results);
}

static void run_pull(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    int64_t offset = int64_field(cmd, "offset");
    int32_t max_messages = int32_field(cmd, "max_messages", 0, DEFAULT_MAX_MESSAGES);
    rmq_pull_options options = {0};
    options.max_wait_ms = int32_field(cmd, "max_wait_ms", 0, 0);
    options.subscription = string_field(cmd, "subscription", 0);
    rmq_pull_result result;
    rmq_error err;
    if (rmq_pull(client, topic, queue_id, offset, max_messages, &options, &result, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"status\":", out);
    write_str(out, result.status);
    fprintf(out, ",\"next_offset\":%" PRId64 ",\"min_offset\":%" PRId64 ",\"max_offset\":%" PRId64 ",\"messages\":",
            result.next_offset, result.min_offset, result.max_offset);
    write_message_list(out, &result.messages);
    fputc('}', out);
    rmq_pull_result_free(&result);
}

static void run_query_by_key(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *topic = string_field(cmd, "topic", 1);
    const char *key = string_field(cmd, "key", 1);
    int32_t max_results = int32_field(cmd, "max_results", 0, DEFAULT_MAX_RESULTS);
    rmq_message_list result;
    rmq_error err;
    if (rmq_query_by_key(client, topic, key, max_results, &result, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"messages\":", out);
    write_message_list(out, &result);
    fputc('}', out);
    rmq_message_list_free(&result);
}

static void run_get_by_id(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *msg_id = string_field(cmd, "msg_id", 1);
    rmq_message message;
    rmq_error err;
    if (rmq_get_by_id(client, msg_id, &message, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"message\":", out);
    write_message(out, &message);
    fputc('}', out);
    rmq_message_free(&message);
}

static void run_commit_offset(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    int64_t offset = int64_field(cmd, "offset");
    rmq_error err;
    if (rmq_commit_offset(client, group, topic, queue_id, offset, &err) != 0) write_error(out, &err);
    else fputs("{\"ok\":true}", out);
}

static void run_fetch_offset(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    int64_t offset = 0;
    rmq_error err;
    if (rmq_fetch_offset(client, group, topic, queue_id, &offset, &err) != 0) write_error(out, &err);
    else fprintf(out, "{\"ok\":true,\"offset\":%" PRId64 "}", offset);
}

static void run_ping(FILE *out, rmq_client *client, const json_value *cmd) {
    (void)cmd;
    rmq_error err;
    if (rmq_ping(client, &err) != 0) write_error(out, &err);
    else fputs("{\"ok\":true}", out);
}

static void run_route(FILE *out, rmq_client *client, const json_value *cmd) {
    (void)cmd;
    rmq_route route;
    rmq_error err;
    if (rmq_route_get(client, &route, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"cluster_name\":", out);
    write_str(out, route.cluster_name);
    fputs(",\"broker_name\":", out);
    write_str(out, route.broker_name);
    fprintf(out, ",\"broker_id\":%" PRId64 ",\"endpoint\":", route.broker_id);
    write_str(out, route.endpoint);
    fprintf(out, ",\"elected\":%s,\"role\":", route.elected ? "true" : "false");
    write_str(out, route.role);
    fprintf(out, ",\"epoch\":%" PRId64 ",\"master_id\":%" PRId64 ",\"master_endpoint\":", route.epoch,
            route.master_id);
    write_str(out, route.master_endpoint);
    fputc('}', out);
}

static void run_topic_route(FILE *out, rmq_client *client, const json_value *cmd) {
    rmq_topic_route route;
    rmq_error err;
    if (rmq_topic_route_get(client, string_field(cmd, "topic", 1), &route, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"sets\":[", out);
    for (size_t i = 0; i < route.count; i++) {
        fputs(i > 0 ? ",{\"broker_name\":" : "{\"broker_name\":", out);
        write_str(out, route.sets[i].broker_name);
        fprintf(out, ",\"queues\":%" PRId32 ",\"master_endpoint\":", route.sets[i].queue_count);
        write_str(out, route.sets[i].master_endpoint);
        fputc('}', out);
    }
    fputs("]}", out);
}

/* The cluster client of `cluster_send`, made at its first use from the driver's arguments. */
static rmq_cluster *cluster_client;
static const char *driver_endpoint;
static const rmq_curve_keys *driver_keys;
static int driver_timeout_ms;

/* `count` messages of `body_b64`, each to the next queue of the topic's whole route. */
static void run_cluster_send(FILE *out, rmq_client *client, const json_value *cmd) {
    (void)client;
    const char *topic = string_field(cmd, "topic", 1);
    int32_t count = int32_field(cmd, "count", 0, 1);
    const char *sharding_key = string_field(cmd, "sharding_key", 0);
    const char *body = string_field(cmd, "body_b64", 1);
    unsigned char *bytes = NULL;
    size_t body_len = 0;
    if (base64_decode(body, strlen(body), &bytes, &body_len) != 0) die("'body_b64' is not padded base64");
    rmq_error err;
    if (cluster_client == NULL) {
        cluster_client = rmq_cluster_connect(driver_endpoint, driver_timeout_ms, driver_keys, &err);
        if (cluster_client == NULL) die("cannot connect: %s (%d): %s", err.name, err.code, err.message);
    }
    rmq_outgoing_message message = {0};
    message.body = bytes;
    message.body_len = body_len;
    char *sent = NULL;
    size_t sent_len = 0;
    FILE *list = open_memstream(&sent, &sent_len);
    if (list == NULL) die("out of memory");
    int failed = 0;
    for (int32_t i = 0; i < count && !failed; i++) {
        rmq_send_result result;
        char broker[RMQ_BROKER_NAME_MAX + 1];
        int rc = sharding_key != NULL
                     ? rmq_cluster_send_keyed(cluster_client, topic, sharding_key, &message, &result, broker, &err)
                     : rmq_cluster_send(cluster_client, topic, &message, &result, broker, &err);
        if (rc != 0) {
            failed = 1;
            break;
        }
        fputs(i > 0 ? ",{\"broker_name\":" : "{\"broker_name\":", list);
        write_str(list, broker);
        fprintf(list, ",\"queue_id\":%" PRId32 "}", result.queue_id);
    }
    fclose(list);
    if (failed) write_error(out, &err);
    else fprintf(out, "{\"ok\":true,\"sent\":[%s]}", sent);
    free(sent);
    free(bytes);
}

static int64_t monotonic_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* `count` sends of one message each ("<body_prefix><i>"), `interval_ms` apart, none started
 * `duration_ms` after the first or once `stop_file` exists, whatever each answers: each send's outcome, where the client was after it, and when it started and ended
 * (CLOCK_MONOTONIC ms, the clock of Python's time.monotonic). After each send a line
 * "sent <i> <ok>" goes to stderr, so that a test can act while the loop runs. */
static void run_send_loop(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *topic = string_field(cmd, "topic", 1);
    const char *prefix = string_field(cmd, "body_prefix", 1);
    int32_t count = int32_field(cmd, "count", 1, 0);
    int32_t interval_ms = int32_field(cmd, "interval_ms", 0, 0);
    int32_t duration_ms = int32_field(cmd, "duration_ms", 0, INT32_MAX);
    const char *stop_file = string_field(cmd, "stop_file", 0);
    if (count < 1 || interval_ms < 0 || duration_ms < 1) {
        die("'send_loop' needs count >= 1, interval_ms >= 0 and duration_ms >= 1");
    }
    int64_t stop_at = monotonic_ms() + duration_ms;
    fputs("{\"ok\":true,\"sends\":[", out);
    for (int32_t i = 0; i < count && (i == 0 || monotonic_ms() < stop_at); i++) {
        if (stop_file != NULL && access(stop_file, F_OK) == 0) break;
        char body[512];
        int len = snprintf(body, sizeof body, "%s%" PRId32, prefix, i);
        if (len < 0 || (size_t)len >= sizeof body) die("'body_prefix' is too long");
        rmq_outgoing_message message = {.body = body, .body_len = (size_t)len};
        rmq_send_result result;
        rmq_error err;
        int64_t started = monotonic_ms();
        int rc = rmq_send(client, topic, NULL, &message, &result, &err);
        int64_t ended = monotonic_ms();
        fprintf(out, "%s{\"i\":%" PRId32 ",\"started_ms\":%" PRId64 ",\"ended_ms\":%" PRId64 ",\"endpoint\":",
                i > 0 ? "," : "", i, started, ended);
        write_str(out, rmq_endpoint(client));
        if (rc != 0) {
            fprintf(out, ",\"ok\":false,\"code\":%d,\"name\":", err.code);
            write_str(out, err.name);
            fputs(",\"message\":", out);
            write_str(out, err.message);
        } else {
            fputs(",\"ok\":true,\"msg_id\":", out);
            write_str(out, result.msg_id);
            fputs(",\"uniq_key\":", out);
            write_str(out, result.uniq_key);
            fprintf(out, ",\"queue_id\":%" PRId32 ",\"queue_offset\":%" PRId64, result.queue_id,
                    result.queue_offset);
        }
        fputc('}', out);
        fprintf(stderr, "sent %" PRId32 " %d\n", i, rc == 0);
        fflush(stderr);
        if (interval_ms > 0 && i + 1 < count) {
            struct timespec pause = {interval_ms / 1000, (long)(interval_ms % 1000) * 1000000L};
            nanosleep(&pause, NULL);
        }
    }
    fputs("]}", out);
}

/* Not a request: where the client's requests go now (it moves to the master a NOT_MASTER names). */
static void run_endpoint(FILE *out, rmq_client *client, const json_value *cmd) {
    (void)cmd;
    fputs("{\"ok\":true,\"endpoint\":", out);
    write_str(out, rmq_endpoint(client));
    fputc('}', out);
}

static void run_pop(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t max_messages = int32_field(cmd, "max_messages", 0, DEFAULT_MAX_MESSAGES);
    rmq_pop_options options = {0};
    options.has_queue_id = json_get(cmd, "queue_id") != NULL;
    options.queue_id = int32_field(cmd, "queue_id", 0, 0);
    options.invisible_ms = int32_field(cmd, "invisible_ms", 0, 0);
    options.max_wait_ms = int32_field(cmd, "max_wait_ms", 0, 0);
    rmq_pop_result result;
    rmq_error err;
    if (rmq_pop(client, group, topic, max_messages, &options, &result, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"messages\":", out);
    write_message_list(out, &result.messages);
    fputs(",\"receipts\":[", out);
    for (size_t i = 0; i < result.messages.count; i++) {
        if (i > 0) fputc(',', out);
        fputs("{\"receipt_handle\":", out);
        write_str(out, result.receipts[i].handle);
        fprintf(out, ",\"attempt\":%" PRId32 "}", result.receipts[i].attempt);
    }
    fputs("]}", out);
    rmq_pop_result_free(&result);
}

static void run_ack(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    const json_value *list = json_get(cmd, "receipt_handles");
    if (list == NULL || list->type != JSON_ARRAY || list->count == 0) die("ack needs receipt_handles");
    const char **handles = calloc(list->count, sizeof *handles);
    int32_t *refused = calloc(list->count, sizeof *refused);
    if (handles == NULL || refused == NULL) die("out of memory");
    for (size_t i = 0; i < list->count; i++) {
        if (list->items[i].type != JSON_STRING) die("a receipt handle is not a string");
        handles[i] = list->items[i].string;
    }
    size_t acked = 0;
    rmq_error err;
    if (rmq_ack(client, group, topic, queue_id, handles, list->count, &acked, refused, &err) != 0) {
        write_error(out, &err);
    } else {
        fprintf(out, "{\"ok\":true,\"acked\":%zu,\"refused\":[", acked);
        for (size_t i = 0; i < list->count; i++) fprintf(out, i > 0 ? ",%" PRId32 : "%" PRId32, refused[i]);
        fputs("]}", out);
    }
    free(handles);
    free(refused);
}

static void run_change_invisible(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    const char *handle = string_field(cmd, "receipt_handle", 1);
    int32_t invisible_ms = int32_field(cmd, "invisible_ms", 1, 0);
    char new_handle[RMQ_RECEIPT_HANDLE_MAX + 1];
    rmq_error err;
    if (rmq_change_invisible(client, group, topic, queue_id, handle, invisible_ms, new_handle, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"receipt_handle\":", out);
    write_str(out, new_handle);
    fputc('}', out);
}

static void run_pop_stats(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *group = string_field(cmd, "group", 1);
    const char *topic = string_field(cmd, "topic", 1);
    int32_t queue_id = int32_field(cmd, "queue_id", 1, 0);
    rmq_pop_stats st;
    rmq_error err;
    if (rmq_pop_stats_get(client, group, topic, queue_id, &st, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fprintf(out,
            "{\"ok\":true,\"ack_floor\":%" PRId64 ",\"pop_cursor\":%" PRId64 ",\"in_flight\":%" PRId64
            ",\"due\":%" PRId64 ",\"redelivered\":%" PRId64 ",\"dead_lettered\":%" PRId64
            ",\"journal_entries\":%" PRId64 ",\"segments\":%" PRId64 ",\"max_offset\":%" PRId64 "}",
            st.ack_floor, st.pop_cursor, st.in_flight, st.due, st.redelivered, st.dead_lettered, st.journal_entries,
            st.segments, st.max_offset);
}

static void run_end_transaction(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *msg_id = string_field(cmd, "msg_id", 1);
    const char *decision = string_field(cmd, "decision", 1);
    const char *producer_group = string_field(cmd, "producer_group", 0);
    rmq_transaction_decision d = RMQ_TRANSACTION_COMMIT;
    if (strcmp(decision, "rollback") == 0) d = RMQ_TRANSACTION_ROLLBACK;
    else if (strcmp(decision, "commit") != 0) die("'decision' must be \"commit\" or \"rollback\"");
    rmq_error err;
    if (rmq_end_transaction(client, msg_id, d, producer_group, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"decision\":", out);
    write_str(out, decision);
    fputc('}', out);
}

static void run_transaction_checks(FILE *out, rmq_client *client, const json_value *cmd) {
    const char *producer_group = string_field(cmd, "producer_group", 1);
    int32_t max_messages = int32_field(cmd, "max_messages", 0, DEFAULT_MAX_MESSAGES);
    int32_t max_wait_ms = int32_field(cmd, "max_wait_ms", 0, 0);
    rmq_check_result result;
    rmq_error err;
    if (rmq_transaction_checks(client, producer_group, max_messages, max_wait_ms, &result, &err) != 0) {
        write_error(out, &err);
        return;
    }
    fputs("{\"ok\":true,\"checks\":[", out);
    for (size_t i = 0; i < result.messages.count; i++) {
        if (i > 0) fputc(',', out);
        write_message_fields(out, &result.messages.items[i]);
        fprintf(out, ",\"check_times\":%" PRId32 "}", result.check_times[i]);
    }
    fputs("]}", out);
    rmq_check_result_free(&result);
}

typedef void (*command_fn)(FILE *out, rmq_client *client, const json_value *cmd);

static const struct {
    const char *op;
    command_fn run;
} commands[] = {
    {"send", run_send},
    {"pull", run_pull},
    {"query_by_key", run_query_by_key},
    {"get_by_id", run_get_by_id},
    {"commit_offset", run_commit_offset},
    {"fetch_offset", run_fetch_offset},
    {"ping", run_ping},
    {"pop", run_pop},
    {"ack", run_ack},
    {"change_invisible", run_change_invisible},
    {"pop_stats", run_pop_stats},
    {"end_transaction", run_end_transaction},
    {"transaction_checks", run_transaction_checks},
    {"route", run_route},
    {"endpoint", run_endpoint},
    {"topic_route", run_topic_route},
    {"cluster_send", run_cluster_send},
    {"send_loop", run_send_loop},
};

static void run_command(FILE *out, rmq_client *client, const json_value *cmd, size_t index) {
    if (cmd->type != JSON_OBJECT) die("command %zu is not an object", index);
    const char *op = string_field(cmd, "op", 1);
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        if (strcmp(commands[i].op, op) == 0) {
            commands[i].run(out, client, cmd);
            return;
        }
    }
    die("command %zu has the unknown op '%s'", index, op);
}

/* ---- main ------------------------------------------------------------------------ */

static char *read_all(FILE *in, size_t *len) {
    size_t cap = 65536, used = 0;
    char *data = malloc(cap);
    if (data == NULL) die("out of memory");
    for (;;) {
        if (used == cap) {
            cap *= 2;
            data = realloc(data, cap);
            if (data == NULL) die("out of memory");
        }
        size_t n = fread(data + used, 1, cap - used, in);
        used += n;
        if (n == 0) break;
    }
    if (ferror(in)) die("cannot read standard input");
    *len = used;
    return data;
}

static void usage(void) {
    die("usage: rmq_conformance ENDPOINT [--server-key Z85 --public-key Z85 --secret-key Z85] [--timeout-ms N]");
}

int main(int argc, char **argv) {
    const char *endpoint = NULL;
    rmq_curve_keys keys = {NULL, NULL, NULL};
    long timeout_ms = DEFAULT_TIMEOUT_MS;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        const char *value = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(arg, "--server-key") == 0 && value) keys.server_public_key = argv[++i];
        else if (strcmp(arg, "--public-key") == 0 && value) keys.client_public_key = argv[++i];
        else if (strcmp(arg, "--secret-key") == 0 && value) keys.client_secret_key = argv[++i];
        else if (strcmp(arg, "--timeout-ms") == 0 && value) {
            char *end = NULL;
            timeout_ms = strtol(argv[++i], &end, 10);
            if (*end != '\0' || timeout_ms <= 0 || timeout_ms > INT32_MAX) usage();
        } else if (arg[0] != '-' && endpoint == NULL) endpoint = arg;
        else usage();
    }
    int key_count = (keys.server_public_key != NULL) + (keys.client_public_key != NULL) +
                    (keys.client_secret_key != NULL);
    if (endpoint == NULL || (key_count != 0 && key_count != 3)) usage();

    size_t len = 0;
    char *input = read_all(stdin, &len);
    char error[256] = "";
    json_value *doc = json_parse(input, len, error, sizeof error);
    if (doc == NULL) die("standard input is not valid JSON: %s", error);
    if (doc->type != JSON_ARRAY) die("standard input must be a JSON array of commands");

    rmq_error err;
    driver_endpoint = endpoint;
    driver_keys = key_count ? &keys : NULL;
    driver_timeout_ms = (int)timeout_ms;
    rmq_client *client = rmq_connect(endpoint, (int)timeout_ms, key_count ? &keys : NULL, &err);
    if (client == NULL) die("cannot connect: %s (%d): %s", err.name, err.code, err.message);

    /* Results are collected first, so a malformed command leaves stdout empty. */
    char *results = NULL;
    size_t results_len = 0;
    FILE *out = open_memstream(&results, &results_len);
    if (out == NULL) die("out of memory");
    fputc('[', out);
    for (size_t i = 0; i < doc->count; i++) {
        if (i > 0) fputc(',', out);
        run_command(out, client, &doc->items[i], i);
    }
    fputs("]\n", out);
    fclose(out);
    rmq_cluster_close(cluster_client);
    rmq_close(client);
    fwrite(results, 1, results_len, stdout);
    free(results);
    json_free(doc);
    free(input);
    return fflush(stdout) == 0 ? 0 : 1;
}
