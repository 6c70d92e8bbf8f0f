/*
 * allreduce.c — a minimal C trainer using libdlcp_client.
 *
 * Attaches to the local dlcpd, allocates two gradient tensors in the shared arena,
 * and for a few "steps" writes a gradient straight into each (no copy), allreduces
 * it (layer order as in a backward pass: last layer first) and prints a checksum of
 * the reduced values, which are read in place too.
 *
 * Build (from the repository root, after `cargo build --release -p dlcp-client`):
 *   make -C examples/c
 * or by hand:
 *   cc -std=c11 -O2 -Wall -I client/include examples/c/allreduce.c \
 *      -L target/release -ldlcp_client -Wl,-rpath,"$PWD/target/release" -o allreduce
 * Run:
 *   ./allreduce /run/dlcp/dlcpd.sock [job_id] [local_rank] [local_world] [steps]
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "dlcp.h"

#define LAYERS 2

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s SOCKET [JOB] [LOCAL_RANK] [LOCAL_WORLD] [STEPS]\n", argv[0]);
        return 2;
    }
    const char *sock = argv[1];
    uint64_t job = argc > 2 ? strtoull(argv[2], NULL, 0) : 1;
    uint32_t rank = argc > 3 ? (uint32_t)strtoul(argv[3], NULL, 0) : 0;
    uint32_t world = argc > 4 ? (uint32_t)strtoul(argv[4], NULL, 0) : 1;
    int steps = argc > 5 ? atoi(argv[5]) : 3;
    const uint64_t sizes[LAYERS] = {1000, 4096};
    const char *names[LAYERS] = {"layer0.grad", "layer1.grad"};

    dlcp_client *c = NULL;
    int rc = dlcp_attach(sock, job, rank, world, &c);
    if (rc != DLCP_OK) {
        fprintf(stderr, "attach: %s (%s)\n", dlcp_last_error(NULL), dlcp_strerror(rc));
        return 1;
    }
    dlcp_tensor t[LAYERS];
    float *grad[LAYERS];
    for (int l = 0; l < LAYERS; l++) {
        if (dlcp_alloc(c, names[l], sizes[l], &t[l]) != DLCP_OK || !(grad[l] = dlcp_tensor_data(c, t[l]))) {
            fprintf(stderr, "alloc %s: %s\n", names[l], dlcp_last_error(c));
            dlcp_detach(c);
            return 1;
        }
    }
    for (int step = 0; step < steps; step++) {
        /* Backward pass: the last layer's gradient is ready first. */
        for (int l = LAYERS - 1; l >= 0; l--) {
            for (uint64_t i = 0; i < sizes[l]; i++)
                grad[l][i] = 0.001f * (float)(i % 97) + 0.5f * (float)rank + (float)step; /* "gradient" */
            dlcp_completion done;
            rc = dlcp_allreduce(c, t[l], (uint32_t)l, LAYERS, 0 /* reliable */, 0, 30000, &done);
            if (rc != DLCP_OK) {
                fprintf(stderr, "step %d %s: %s\n", step, names[l], dlcp_last_error(c));
                dlcp_detach(c);
                return 1;
            }
            double sum = 0;
            for (uint64_t i = 0; i < sizes[l]; i++) sum += grad[l][i]; /* the result, read in place */
            printf("step %d %-12s op %" PRIu64 " delivered %u ppm, %" PRIu64 " us, sum %.3f\n", step, names[l],
                   done.op_seq, done.delivered_ppm, done.duration_ns / 1000, sum);
        }
    }
    dlcp_detach(c);
    return 0;
}
