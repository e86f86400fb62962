/*
 * rmq_example.c: a command-line example of the C client.
 *
 *     rmq_example ENDPOINT send TOPIC BODY [KEY] [TAG]
 *     rmq_example ENDPOINT pull TOPIC QUEUE OFFSET
 *     rmq_example ENDPOINT query TOPIC KEY
 *     rmq_example ENDPOINT get MSG_ID
 *     rmq_example ENDPOINT ping
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rmq_client.h"

static void print_message(const rmq_message *m) {
    printf("%s queue %" PRId32 " offset %" PRId64 " msg_id %s tags %s keys", m->topic, m->queue_id,
           m->queue_offset, m->msg_id, m->tags ? m->tags : "-");
    for (size_t i = 0; i < m->key_count; i++) printf(" %s", m->keys[i]);
    printf(" body (%zu bytes) %.*s\n", m->body_len, (int)m->body_len, (const char *)m->body);
}

static int run(rmq_client *client, int argc, char **argv, rmq_error *err) {
    const char *command = argv[2];
    if (strcmp(command, "send") == 0 && argc >= 5 && argc <= 7) {
        const char *keys[] = {argc >= 6 ? argv[5] : NULL};
        rmq_outgoing_message message = {.body = argv[4], .body_len = strlen(argv[4]), .keys = keys,
                                        .key_count = argc >= 6, .tags = argc >= 7 ? argv[6] : NULL};
        rmq_send_result sent;
        if (rmq_send(client, argv[3], NULL, &message, &sent, err) != 0) return -1;
        printf("%s msg_id %s queue %" PRId32 " offset %" PRId64 "\n", sent.status, sent.msg_id, sent.queue_id,
               sent.queue_offset);
    } else if (strcmp(command, "pull") == 0 && argc == 6) {
        rmq_pull_result pulled;
        if (rmq_pull(client, argv[3], atoi(argv[4]), strtoll(argv[5], NULL, 10), 32, NULL, &pulled, err) != 0) return -1;
        printf("%s next_offset %" PRId64 "\n", pulled.status, pulled.next_offset);
        for (size_t i = 0; i < pulled.messages.count; i++) print_message(&pulled.messages.items[i]);
        rmq_pull_result_free(&pulled);
    } else if (strcmp(command, "query") == 0 && argc == 5) {
        rmq_message_list found;
        if (rmq_query_by_key(client, argv[3], argv[4], 64, &found, err) != 0) return -1;
        printf("%zu message(s)\n", found.count);
        for (size_t i = 0; i < found.count; i++) print_message(&found.items[i]);
        rmq_message_list_free(&found);
    } else if (strcmp(command, "get") == 0 && argc == 4) {
        rmq_message message;
        if (rmq_get_by_id(client, argv[3], &message, err) != 0) return -1;
        print_message(&message);
        rmq_message_free(&message);
    } else if (strcmp(command, "ping") == 0 && argc == 3) {
        if (rmq_ping(client, err) != 0) return -1;
        puts("pong");
    } else {
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ENDPOINT send TOPIC BODY [KEY] [TAG] | pull TOPIC QUEUE OFFSET | "
                        "query TOPIC KEY | get MSG_ID | ping\n", argv[0]);
        return 2;
    }
    rmq_error err;
    rmq_client *client = rmq_connect(argv[1], 5000, NULL, &err);
    if (client == NULL) {
        fprintf(stderr, "connect: %s (%d): %s\n", err.name, err.code, err.message);
        return 1;
    }
    int rc = run(client, argc, argv, &err);
    rmq_close(client);
    if (rc > 0) fprintf(stderr, "bad arguments; run %s without arguments for usage\n", argv[0]);
    if (rc < 0) fprintf(stderr, "%s (%d): %s\n", err.name, err.code, err.message);
    return rc == 0 ? 0 : rc > 0 ? 2 : 1;
}
