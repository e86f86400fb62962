/*
 * rmq_cluster.c: a client of a cluster of broker sets (docs/cluster.md), over the public API.
 *
 * The engine it is given answers a topic's route (rmq_topic_route_get): the sets serving the
 * topic, their queue counts and their masters. A send goes to the next queue of the whole
 * route, in turn, through a client of that set's master, kept open (a client follows its
 * set's NOT_MASTER by itself). The route is asked again after ROUTE_TTL_MS, after a failed
 * send, and for another topic; a set whose master moved gets a new client.
 */
#define _POSIX_C_SOURCE 200809L

#include "rmq_client.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#define ROUTE_TTL_MS 30000
#define TOPIC_MAX 255

typedef struct set_client {
    char broker_name[RMQ_BROKER_NAME_MAX + 1];
    rmq_client *client; /* NULL until the set is first sent to */
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
    cluster->first = rmq_connect(endpoint, timeout_ms, curve, err);
    if (cluster->first == NULL) {
        free(cluster);
        return NULL;
    }
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

/* The route of `topic`, asked again when it is another topic's, old, or dropped after a failure. */
static int fresh_route(rmq_cluster *cluster, const char *topic, rmq_error *err) {
    if (strcmp(cluster->topic, topic) == 0 && now_ms() - cluster->route_at_ms < ROUTE_TTL_MS) return 0;
    if (strlen(topic) > TOPIC_MAX) return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "topic too long");
    cluster->topic[0] = '\0';
    int rc = rmq_topic_route_get(cluster->first, topic, &cluster->route, err);
    if (rc != 0) return rc;
    strcpy(cluster->topic, topic);
    cluster->route_at_ms = now_ms();
    return 0;
}

/* The client of a set's master, opened (again, if the master moved) as needed. */
static rmq_client *set_client_for(rmq_cluster *cluster, const rmq_broker_queues *set, rmq_error *err) {
    set_client *found = NULL;
    for (size_t i = 0; i < cluster->set_count && found == NULL; i++) {
        if (strcmp(cluster->sets[i].broker_name, set->broker_name) == 0) found = &cluster->sets[i];
    }
    if (found == NULL) {
        if (cluster->set_count == RMQ_BROKER_SETS_MAX) {
            fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "more broker sets than RMQ_BROKER_SETS_MAX");
            return NULL;
        }
        found = &cluster->sets[cluster->set_count++];
        strcpy(found->broker_name, set->broker_name);
    }
    if (found->client != NULL && strcmp(rmq_endpoint(found->client), set->master_endpoint) != 0) {
        rmq_close(found->client);
        found->client = NULL;
    }
    if (found->client == NULL) {
        rmq_curve_keys keys = {cluster->keys[0], cluster->keys[1], cluster->keys[2]};
        found->client = rmq_connect(set->master_endpoint, cluster->timeout_ms, cluster->use_curve ? &keys : NULL, err);
    }
    return found->client;
}

int rmq_cluster_send(rmq_cluster *cluster, const char *topic, const rmq_outgoing_message *message,
                     rmq_send_result *result, char broker_name[RMQ_BROKER_NAME_MAX + 1], rmq_error *err) {
    if (cluster == NULL || topic == NULL || message == NULL || result == NULL || broker_name == NULL) {
        return fail(err, RMQ_ERR_INVALID_ARGUMENT, "INVALID_ARGUMENT", "cluster, topic, message or result is NULL");
    }
    broker_name[0] = '\0';
    int rc = fresh_route(cluster, topic, err);
    if (rc != 0) return rc;
    int64_t total = 0;
    for (size_t i = 0; i < cluster->route.count; i++) total += cluster->route.sets[i].queue_count;
    if (total == 0) {
        cluster->topic[0] = '\0';
        return fail(err, RMQ_TOPIC_NOT_FOUND, "TOPIC_NOT_FOUND", "no broker set of the cluster serves the topic");
    }
    int64_t k = (int64_t)(cluster->turn++ % (uint64_t)total);
    const rmq_broker_queues *set = cluster->route.sets;
    while (k >= set->queue_count) {
        k -= set->queue_count;
        set++;
    }
    if (set->master_endpoint[0] == '\0') {
        cluster->topic[0] = '\0';
        return fail(err, RMQ_SERVICE_NOT_AVAILABLE, "SERVICE_NOT_AVAILABLE", "the broker set is electing its master");
    }
    rmq_client *client = set_client_for(cluster, set, err);
    if (client == NULL) return err != NULL && err->code != 0 ? err->code : RMQ_ERR_TRANSPORT;
    rmq_send_options options = {0};
    options.has_queue_id = 1;
    options.queue_id = (int32_t)k;
    rc = rmq_send(client, topic, &options, message, result, err);
    if (rc != 0) {
        cluster->topic[0] = '\0'; /* the next send asks for the route again: the set may have a new master */
        return rc;
    }
    strcpy(broker_name, set->broker_name);
    return 0;
}
