/*
 * rmq_set.h: what the cluster client (rmq_cluster.c) needs of rmq_client.c beyond the public
 * API, to treat each broker set as a set: internal to the library.
 */
#ifndef RMQ_SET_H
#define RMQ_SET_H

#include "rmq_client.h"

#define RMQ_UNIQ_KEY_MAX 32 /* the UNIQ_KEYs the client makes: 32 uppercase hex characters */

/* rmq_connect, but watched as a broker set's client is (heartbeats, the socket monitor, a master
 * looked for after a lost connection) even on one endpoint: a cluster's client of a set whose
 * route names only its master. */
rmq_client *rmq_connect_watched(const char *address, int timeout_ms, const rmq_curve_keys *curve, rmq_error *err);

/* Nonzero: a call whose look for the master finds none ends at once with the last error, not
 * at its deadline (a keyless send of a cluster, which goes to another set instead). */
void rmq_set_one_round(rmq_client *client, int one_round);

/* One round of looking for the master (at most RMQ_ROUTE_PROBE_MS): 1, with the client moved
 * there, if an engine of its address is master. */
int rmq_look_for_master(rmq_client *client);

/* A new UNIQ_KEY of the client's own (unique to it): 32 uppercase hex characters. */
void rmq_next_uniq_key(rmq_client *client, char key[RMQ_UNIQ_KEY_MAX + 1]);

#endif /* RMQ_SET_H */
