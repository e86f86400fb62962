/*
 * rmq_cluster.c: a client of a cluster of broker sets (docs/cluster.md), over the public API and
 * rmq_set.h.
 *
 * The engine it is given answers a topic's route (rmq_topic_route_get): the sets serving the
 * topic, their queue counts and their masters. A send goes to the next queue of the whole
 * route, in turn, through a client of that set's master, kept open (a client follows its
 * set's NOT_MASTER by itself). The route is asked again after ROUTE_TTL_MS, after a failed
 * send, and for another topic; a set whose master moved gets a new client.
 *
 * Each set's client is watched as a set's client is (rmq_connect_watched): it notices a lost
 * connection at once. The route names a set's master only (not its replicas), so that client's
 * address is the master alone: it cannot find a new master by itself, only the route (asked
 * again) names it. A keyless send whose set has no master (its connection lost and one look
 * found none, or NOT_MASTER naming none) goes to the next queue of another set, with the same
 * UNIQ_KEY, and that set is passed over by keyless sends until it has a master again, looked
 * at again at most every PASSED_LOOK_MS. A keyed send (rmq_cluster_send_keyed) waits for its
 * own set, or fails alone at its deadline.
 */
#define _POSIX_C_SOURCE 200809L

#include "rmq_client.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rmq_set.h"

#define ROUTE_TTL_MS 30000
#define PASSED_LOOK_MS 1000 /* a set passed over is looked at again at most this often */
#define TOPIC_MAX 255

typedef struct set_client {
    char broker_name[RMQ_BROKER_NAME_MAX + 1];
    rmq_client *client;   /* NULL until the set is first sent to */
    int64_t passed_at_ms; /* 0: in use; else when keyless sends last found it without a master */
} set_client;

struct rmq_cluster {
    rmq_client *first; /* the engine given: routes are asked of it */
    int timeout_ms;
    int use_curve;
    char keys[3][41];
    set_client sets[RMQ_BROKER_SETS_MAX];
    size_t set_count;
    char topic[TOPIC_MAX + 1]; /* the topic of the route held ("" : none) */
    rmq_topic_route route;
    int64_t route_at_ms;
    uint64_t turn;
};

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int fail(rmq_error *err, int code, const char *name, const char *message) {
    if (err != NULL) {
        err->code = code;
        strncpy(err->name, name, sizeof err->name - 1);
        err->name[sizeof err->name - 1] = '\0';
        strncpy(err->message, message, sizeof err->message - 1);
        err->message[sizeof err->message - 1] = '\0';
    }
    return code;
}

rmq_cluster *rmq_cluster_connect(const char *endpoint, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err) {
    rmq_cluster *cluster = calloc(1, sizeof *cluster);
    if (cluster == NULL) {
        fail(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the cluster client");
        return NULL;
    }
    /* Watched, and one look for a master at most: a dead engine given fails a route at once. */
    cluster->first = rmq_connect_watched(endpoint, timeout_ms, curve, err);
    if (cluster->first == NULL) {
        free(cluster);
        return NULL;
    }
    rmq_set_one_round(cluster->first, 1);
    cluster->timeout_ms = timeout_ms;
    if (curve != NULL) { /* rmq_connect checked them: 40 characters each */
        const char *given[3] = {curve->server_public_key, curve->client_public_key, curve->client_secret_key};
        for (int k = 0; k < 3; k++) memcpy(cluster->keys[k], given[k], 41);
        cluster->use_curve = 1;
    }
    return cluster;
}

void rmq_cluster_close(rmq_cluster *cluster) {
    if (cluster == NULL) return;
    for (size_t i = 0; i < cluster->set_count; i++) rmq_close(cluster->sets[i].client);
    rmq_close(cluster->first);
    memset(cluster->keys, 0, sizeof cluster->keys); /* the secret key does not outlive the client */
    free(cluster);
}

/* A fresh route of the topic from the engine given, or else (it is gone) from any set's client
 * in use: every engine answers routes. */
static int route_from_anyone(rmq_cluster *cluster, const char *topic, rmq_topic_route *route, rmq_error *err) {
    int rc = rmq_topic_route_get(cluster->first, topic, route, err);
    for (size_t i = 0; rc != 0 && i < cluster->set_count; i++) {
        rmq_client *client = cluster->sets[i].client;
        if (client != NULL && cluster->sets[i].passed_at_ms == 0) rc = rmq_topic_route_get(client, topic, route, err);
    }
    return rc;
}

/* The route of `topic`, asked again when it is another topic's, old, or dropped after a failure. */
static int fresh_route(rmq_cluster *cluster, const char *topic, rmq_error *err) {
    if (strcmp(cluster->topic, topic) == 0 && now_ms() - cluster->route_at_ms < ROUTE_TTL_MS) return 0;
    if (strlen(topic) > TOPIC_MAX) return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "topic too long");
    cluster->topic[0] = '\0';
    int rc = route_from_anyone(cluster, topic, &cluster->route, err);
    if (rc != 0) return rc;
    strcpy(cluster->topic, topic);
    cluster->route_at_ms = now_ms();
    return 0;
}

static set_client *find_set(rmq_cluster *cluster, const char *broker_name, rmq_error *err) {
    for (size_t i = 0; i < cluster->set_count; i++) {
        if (strcmp(cluster->sets[i].broker_name, broker_name) == 0) return &cluster->sets[i];
    }
    if (cluster->set_count == RMQ_BROKER_SETS_MAX) {
        fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "more broker sets than RMQ_BROKER_SETS_MAX");
        return NULL;
    }
    set_client *found = &cluster->sets[cluster->set_count++];
    strcpy(found->broker_name, broker_name);
    return found;
}

/* The client of a set's master, opened (again, if the master moved) as needed. A route that
 * names no master keeps the client there is, if any. */
static rmq_client *set_client_for(rmq_cluster *cluster, set_client *found, const rmq_broker_queues *set,
                                  rmq_error *err) {
    if (set->master_endpoint[0] == '\0') {
        if (found->client == NULL) {
            fail(err, RMQ_SERVICE_NOT_AVAILABLE, "SERVICE_NOT_AVAILABLE", "the broker set is electing its master");
        }
        return found->client;
    }
    if (found->client != NULL && strcmp(rmq_endpoint(found->client), set->master_endpoint) != 0) {
        rmq_close(found->client);
        found->client = NULL;
    }
    if (found->client == NULL) {
        rmq_curve_keys keys = {cluster->keys[0], cluster->keys[1], cluster->keys[2]};
        found->client = rmq_connect_watched(set->master_endpoint, cluster->timeout_ms,
                                            cluster->use_curve ? &keys : NULL, err);
    }
    return found->client;
}

/* Whether a set passed over has a master again: the route names another master than the one
 * its client is on (then cluster->route says so), or a look finds its master up. */
static int master_again(rmq_cluster *cluster, const char *topic, set_client *sc, rmq_broker_queues *set) {
    sc->passed_at_ms = now_ms();
    rmq_topic_route *route = malloc(sizeof *route);
    int named = 0;
    if (route != NULL && route_from_anyone(cluster, topic, route, NULL) == 0) {
        for (size_t i = 0; i < route->count; i++) {
            if (strcmp(route->sets[i].broker_name, set->broker_name) != 0) continue;
            strcpy(set->master_endpoint, route->sets[i].master_endpoint);
            named = set->master_endpoint[0] != '\0' &&
                    (sc->client == NULL || strcmp(rmq_endpoint(sc->client), set->master_endpoint) != 0);
        }
    }
    free(route);
    return named || (sc->client != NULL && rmq_look_for_master(sc->client));
}

static int no_master(int code) {
    return code == RMQ_ERR_CONNECTION_LOST || code == RMQ_NOT_MASTER || code == RMQ_SERVICE_NOT_AVAILABLE;
}

/* The route's k-th queue: its set (*set) and the queue id within it. */
static int32_t queue_at(rmq_topic_route *route, int64_t k, rmq_broker_queues **set) {
    rmq_broker_queues *s = route->sets;
    while (k >= s->queue_count) {
        k -= s->queue_count;
        s++;
    }
    *set = s;
    return (int32_t)k;
}

/* The message with a UNIQ_KEY made here added, unless it has one: the same key on every set a
 * keyless send tries. `properties` has room for message->property_count + 1. */
static rmq_outgoing_message with_uniq_key(rmq_cluster *cluster, const rmq_outgoing_message *message,
                                          rmq_property *properties, char key[RMQ_UNIQ_KEY_MAX + 1]) {
    rmq_outgoing_message keyed = *message;
    for (size_t i = 0; i < message->property_count; i++) {
        if (strcmp(message->properties[i].name, "UNIQ_KEY") == 0) return keyed;
    }
    if (message->property_count > 0) memcpy(properties, message->properties, message->property_count * sizeof *properties);
    rmq_next_uniq_key(cluster->first, key);
    properties[message->property_count] = (rmq_property){"UNIQ_KEY", key};
    keyed.properties = properties;
    keyed.property_count = message->property_count + 1;
    return keyed;
}

/* Sends to queue `queue_id` of `set` through its client; one look for its master at most if
 * `one_round`. */
static int send_to_set(rmq_cluster *cluster, const char *topic, set_client *sc, rmq_broker_queues *set,
                       int32_t queue_id, int one_round, const rmq_outgoing_message *message, rmq_send_result *result,
                       rmq_error *err) {
    rmq_client *client = set_client_for(cluster, sc, set, err);
    if (client == NULL) return err != NULL && err->code != 0 ? err->code : RMQ_ERR_TRANSPORT;
    rmq_set_one_round(client, one_round);
    rmq_send_options options = {0};
    options.has_queue_id = 1;
    options.queue_id = queue_id;
    return rmq_send(client, topic, &options, message, result, err);
}

static int check_send(rmq_cluster *cluster, const char *topic, const rmq_outgoing_message *message,
                      rmq_send_result *result, char *broker_name, rmq_error *err, int64_t *total) {
    if (cluster == NULL || topic == NULL || message == NULL || result == NULL || broker_name == NULL) {
        return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "cluster, topic, message or result is NULL");
    }
    if (message->property_count > 0 && message->properties == NULL) {
        return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "a message's properties are NULL");
    }
    broker_name[0] = '\0';
    int rc = fresh_route(cluster, topic, err);
    if (rc != 0) return rc;
    *total = 0;
    for (size_t i = 0; i < cluster->route.count; i++) *total += cluster->route.sets[i].queue_count;
    if (*total == 0) {
        cluster->topic[0] = '\0';
        return fail(err, RMQ_TOPIC_NOT_FOUND, "TOPIC_NOT_FOUND", "no broker set of the cluster serves the topic");
    }
    return 0;
}

int rmq_cluster_send(rmq_cluster *cluster, const char *topic, const rmq_outgoing_message *message,
                     rmq_send_result *result, char broker_name[RMQ_BROKER_NAME_MAX + 1], rmq_error *err) {
    int64_t total = 0;
    int rc = check_send(cluster, topic, message, result, broker_name, err, &total);
    if (rc != 0) return rc;
    rmq_property *properties = calloc(message->property_count + 1, sizeof *properties);
    if (properties == NULL) return fail(err, RMQ_ERR_NO_MEMORY, "NO_MEMORY", "cannot allocate the message");
    char key[RMQ_UNIQ_KEY_MAX + 1];
    rmq_outgoing_message keyed = with_uniq_key(cluster, message, properties, key);
    int64_t start = (int64_t)(cluster->turn++ % (uint64_t)total);
    rc = 0;
    for (int64_t step = 0; step < total; step++) {
        rmq_broker_queues *set = NULL;
        int32_t queue_id = queue_at(&cluster->route, (start + step) % total, &set);
        set_client *sc = find_set(cluster, set->broker_name, err);
        if (sc == NULL) {
            rc = err != NULL ? err->code : RMQ_ERR_INVALID_ARGUMENT;
            break;
        }
        if (sc->passed_at_ms != 0) {
            if (now_ms() - sc->passed_at_ms < PASSED_LOOK_MS || !master_again(cluster, topic, sc, set)) continue;
            sc->passed_at_ms = 0;
        }
        rc = send_to_set(cluster, topic, sc, set, queue_id, 1, &keyed, result, err);
        if (rc == 0) {
            strcpy(broker_name, set->broker_name);
            break;
        }
        if (!no_master(rc)) break;
        sc->passed_at_ms = now_ms(); /* the next queues of this set are passed over too */
    }
    free(properties);
    if (rc == 0 && broker_name[0] == '\0') {
        rc = fail(err, RMQ_SERVICE_NOT_AVAILABLE, "SERVICE_NOT_AVAILABLE",
                  "no broker set serving the topic has a master now");
    }
    if (rc != 0) cluster->topic[0] = '\0'; /* the next send asks for the route again: a set may have a new master */
    if (rc == 0 && keyed.properties != message->properties) snprintf(result->uniq_key, sizeof result->uniq_key, "%s", key);
    return rc;
}

/* zlib's crc32 of a string: the hash that picks a sharding key's queue in every client. */
static uint32_t crc32_of(const char *s) {
    uint32_t crc = 0xFFFFFFFFu;
    for (const unsigned char *p = (const unsigned char *)s; *p != '\0'; p++) {
        crc ^= *p;
        for (int bit = 0; bit < 8; bit++) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    return ~crc;
}

int rmq_cluster_send_keyed(rmq_cluster *cluster, const char *topic, const char *sharding_key,
                           const rmq_outgoing_message *message, rmq_send_result *result,
                           char broker_name[RMQ_BROKER_NAME_MAX + 1], rmq_error *err) {
    if (sharding_key == NULL) return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "sharding_key is NULL");
    int64_t total = 0;
    int rc = check_send(cluster, topic, message, result, broker_name, err, &total);
    if (rc != 0) return rc;
    rmq_broker_queues *set = NULL;
    int32_t queue_id = queue_at(&cluster->route, (int64_t)(crc32_of(sharding_key) % (uint64_t)total), &set);
    set_client *sc = find_set(cluster, set->broker_name, err);
    rc = sc == NULL ? RMQ_ERR_INVALID_ARGUMENT : send_to_set(cluster, topic, sc, set, queue_id, 0, message, result, err);
    if (rc != 0) {
        cluster->topic[0] = '\0';
        return rc;
    }
    strcpy(broker_name, set->broker_name);
    return 0;
}
