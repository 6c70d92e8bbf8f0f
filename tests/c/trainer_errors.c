/*
 * A C trainer against a real dlcpd, for tests/trainer_errors.rs: prints where it
 * stands in its job and, in mode "all", the text dlcp_last_error gives for a
 * descriptor the daemon rejects and for an op that times out.
 * Usage: trainer_errors SOCKET JOB world|all. Exits 0 if every call returned
 * the code expected (the test then checks the printed texts).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dlcp.h"

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s SOCKET JOB world|all\n", argv[0]);
        return 2;
    }
    dlcp_client *c = NULL;
    if (dlcp_attach(argv[1], strtoull(argv[2], NULL, 0), 0, 1, &c) != DLCP_OK) {
        fprintf(stderr, "attach: %s\n", dlcp_last_error(NULL));
        return 1;
    }
    dlcp_world w;
    if (dlcp_get_world(c, &w) != DLCP_OK) {
        fprintf(stderr, "get_world: %s\n", dlcp_last_error(c));
        return 1;
    }
    printf("world rank %u size %u node %u/%u local %u/%u\n", w.rank, w.size, w.node_rank, w.nodes, w.local_rank,
           w.local_world);
    if (strcmp(argv[3], "all") == 0) {
        dlcp_tensor pad, t;
        /* Tensor id 1: another op id than the Python trainer's (op, tensor 0). */
        if (dlcp_alloc(c, "pad", 16, &pad) != DLCP_OK || dlcp_alloc(c, "grad", 1024, &t) != DLCP_OK) {
            fprintf(stderr, "alloc: %s\n", dlcp_last_error(c));
            return 1;
        }
        float *g = dlcp_tensor_data(c, t);
        for (int i = 0; i < 1024; i++) g[i] = (float)i;
        dlcp_completion done;
        int rc = dlcp_allreduce(c, t, 0, 1, 200000, 0, 30000, &done);
        printf("descriptor rc %d status %u: %s\n", rc, done.status, dlcp_last_error(c));
        if (rc != DLCP_ERR_OP_FAILED) return 1;
        rc = dlcp_allreduce(c, t, 0, 1, 0, 0, 60000, &done);
        printf("timeout rc %d status %u: %s\n", rc, done.status, dlcp_last_error(c));
        if (rc != DLCP_ERR_OP_FAILED) return 1;
    }
    fflush(stdout);
    return dlcp_detach(c) == DLCP_OK ? 0 : 1;
}
