/*
 * Compiled against client/include/dlcp.h and linked with libdlcp_client (shared
 * or static) by tests/c_link.rs, then run against the fake reducer, which doubles
 * every tensor. Exits 0 and prints "C ABI OK" when every check passes.
 * Usage: abi_test SOCKET [JOB7_SOCKET], JOB7_SOCKET a server that serves job 7
 * only: attaching there for job 999 is refused naming both job ids.
 */
#define _POSIX_C_SOURCE 200112L /* setenv */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>

#include "dlcp.h"

_Static_assert(sizeof(dlcp_completion) == 48, "dlcp_completion is 48 bytes");
_Static_assert(offsetof(dlcp_completion, op_seq) == 0, "op_seq");
_Static_assert(offsetof(dlcp_completion, cookie) == 8, "cookie");
_Static_assert(offsetof(dlcp_completion, duration_ns) == 16, "duration_ns");
_Static_assert(offsetof(dlcp_completion, tensor) == 24, "tensor");
_Static_assert(offsetof(dlcp_completion, status) == 28, "status");
_Static_assert(offsetof(dlcp_completion, detail) == 32, "detail");
_Static_assert(offsetof(dlcp_completion, delivered_ppm) == 36, "delivered_ppm");
_Static_assert(offsetof(dlcp_completion, repairs) == 40, "repairs");
_Static_assert(offsetof(dlcp_completion, reserved) == 44, "reserved");
_Static_assert(sizeof(dlcp_tensor) == 4, "dlcp_tensor");
_Static_assert(sizeof(dlcp_world) == 24, "dlcp_world is 24 bytes");
_Static_assert(offsetof(dlcp_world, nodes) == 12, "nodes");

static int failures = 0;
#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (!(cond)) {                                                               \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                              \
        }                                                                            \
    } while (0)

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s SOCKET [JOB7_SOCKET]\n", argv[0]);
        return 2;
    }
    CHECK(strcmp(dlcp_strerror(DLCP_OK), "success") == 0);
    CHECK(strcmp(dlcp_strerror(DLCP_ERR_TIMEOUT), "no completion within the timeout") == 0);
    CHECK(strcmp(dlcp_strerror(12345), "unknown dlcp error code") == 0);
    CHECK(strcmp(dlcp_status_str(DLCP_STATUS_PEER_DOWN), "peer_down") == 0);
    CHECK(strlen(dlcp_version()) > 0);

    dlcp_client *c = (dlcp_client *)0x1;
    CHECK(dlcp_attach("/nonexistent/dlcpd.sock", 1, 0, 1, &c) == DLCP_ERR_CONNECT);
    CHECK(c == NULL);
    CHECK(strstr(dlcp_last_error(NULL), "cannot connect") != NULL);
    if (argc == 3) {
        /* The wrong job: refused at attach, the reason naming both job ids. */
        c = (dlcp_client *)0x1;
        CHECK(dlcp_attach(argv[2], 999, 0, 1, &c) == DLCP_ERR_REJECTED);
        CHECK(c == NULL);
        const char *why = dlcp_last_error(NULL);
        CHECK(strstr(why, "registered for job 999 but this daemon serves job 7") != NULL);
        if (!strstr(why, "job 999")) fprintf(stderr, "dlcp_last_error: %s\n", why);
    }
    CHECK(dlcp_attach(argv[1], 42, 0, 1, NULL) == DLCP_ERR_NULL_ARG);

    /* Defaults from the environment; an explicit argument wins. */
    setenv("DLCP_SOCKET", argv[1], 1);
    setenv("DLCP_JOB", "0x2d", 1); /* job 45 */
    setenv("LOCAL_RANK", "0", 1);
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    dlcp_client *e = NULL;
    CHECK(dlcp_attach_env(NULL, DLCP_JOB_FROM_ENV, DLCP_FROM_ENV, DLCP_FROM_ENV, &e) == DLCP_OK);
    dlcp_world w;
    memset(&w, 0xff, sizeof w);
    CHECK(dlcp_get_world(e, &w) == DLCP_OK);
    /* The fake reducer is rank 0 of 1 daemon; one trainer on it. */
    CHECK(w.rank == 0 && w.size == 1 && w.node_rank == 0 && w.nodes == 1 && w.local_rank == 0 && w.local_world == 1);
    CHECK(dlcp_get_world(e, NULL) == DLCP_ERR_NULL_ARG);
    CHECK(dlcp_detach(e) == DLCP_OK);
    setenv("DLCP_SOCKET", "/nonexistent/env.sock", 1);
    CHECK(dlcp_attach_env(NULL, 43, 0, 1, &e) == DLCP_ERR_CONNECT);
    CHECK(strstr(dlcp_last_error(NULL), "cannot connect") != NULL);
    CHECK(dlcp_attach_env(argv[1], 43, 0, 1, &e) == DLCP_OK); /* the explicit socket wins */
    CHECK(dlcp_detach(e) == DLCP_OK);
    if (argc == 3) {
        setenv("DLCP_JOB", "999", 1); /* the job comes from the environment */
        CHECK(dlcp_attach_env(argv[2], DLCP_JOB_FROM_ENV, 0, 1, &e) == DLCP_ERR_REJECTED);
        CHECK(strstr(dlcp_last_error(NULL), "registered for job 999 but this daemon serves job 7") != NULL);
    }
    setenv("LOCAL_RANK", "one", 1);
    CHECK(dlcp_attach_env(argv[1], 44, DLCP_FROM_ENV, 1, &e) == DLCP_ERR_INVALID_ARG);
    CHECK(strstr(dlcp_last_error(NULL), "$LOCAL_RANK is \"one\"") != NULL);

    CHECK(dlcp_attach(argv[1], 42, 0, 1, &c) == DLCP_OK);
    if (!c) return 1;

    enum { N = 1000 };
    dlcp_tensor t = 99, t2;
    CHECK(dlcp_alloc(c, "grad", N, &t) == DLCP_OK);
    CHECK(t == 0);
    CHECK(dlcp_alloc(c, "grad", N, &t2) == DLCP_ERR_NAME_IN_USE);
    CHECK(strstr(dlcp_last_error(c), "grad") != NULL);
    uint64_t len = 0;
    CHECK(dlcp_tensor_len(c, t, &len) == DLCP_OK && len == N);
    float *g = dlcp_tensor_data(c, t);
    CHECK(g != NULL);
    CHECK(dlcp_tensor_data(c, 7) == NULL);
    if (!g) return 1;
    for (int i = 0; i < N; i++) g[i] = 0.25f * (float)i - 3.0f;

    uint64_t seq = 0;
    CHECK(dlcp_submit(c, t, 0, 2, 10000, DLCP_FLAG_RESCALE, &seq) == DLCP_OK);
    CHECK(dlcp_submit(c, t, 0, 2, 0, 0, NULL) == DLCP_ERR_TENSOR_BUSY);
    dlcp_completion done;
    memset(&done, 0xff, sizeof done);
    CHECK(dlcp_wait(c, 10000, &done) == DLCP_OK);
    CHECK(done.op_seq == seq && done.tensor == t && done.status == DLCP_STATUS_OK);
    CHECK(done.delivered_ppm == 999000 && done.repairs == 3 && done.reserved == 0);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += g[i] != 2.0f * (0.25f * (float)i - 3.0f);
    CHECK(bad == 0);

    CHECK(dlcp_allreduce(c, t, 1, 2, 0, 0, 10000, &done) == DLCP_OK);
    CHECK(g[5] == 4.0f * (0.25f * 5.0f - 3.0f));
    CHECK(dlcp_allreduce(c, t, 2, 2, 0, 0, 10000, NULL) == DLCP_ERR_INVALID_ARG);
    CHECK(strstr(dlcp_last_error(c), "layer 2 is not below the layer count 2") != NULL);
    CHECK(dlcp_wait(c, 0, &done) == DLCP_ERR_TIMEOUT);

    /* A waiter that polls instead of blocking in dlcp_wait: the doorbell wakes it. */
    dlcp_fds fds = {-1, -1};
    CHECK(dlcp_wait_fds(c, &fds) == DLCP_OK && fds.completion >= 0 && fds.control >= 0);
    CHECK(dlcp_submit(c, t, 0, 2, 0, 0, &seq) == DLCP_OK);
    struct pollfd pfd = {.fd = fds.completion, .events = POLLIN};
    CHECK(poll(&pfd, 1, 10000) == 1 && (pfd.revents & POLLIN));
    CHECK(dlcp_wait(c, 0, &done) == DLCP_OK && done.op_seq == seq);
    CHECK(dlcp_wait(c, 0, &done) == DLCP_ERR_TIMEOUT);

    /* A descriptor the daemon rejects: the reason names the field and values. */
    CHECK(dlcp_allreduce(c, t, 0, 1, 200000, 0, 10000, &done) == DLCP_ERR_OP_FAILED);
    CHECK(done.status == DLCP_STATUS_INVALID_DESCRIPTOR);
    const char *why = dlcp_last_error(c);
    CHECK(strstr(why, "budget_ppm: loss budget 200000 ppm exceeds the cap 100000 ppm") != NULL);
    if (!strstr(why, "budget_ppm")) fprintf(stderr, "dlcp_last_error: %s\n", why);
    /* The same through submit + wait: the call succeeds, the reason is the last error. */
    uint64_t rseq = 0;
    CHECK(dlcp_submit(c, t, 0, 1, 300000, 0, &rseq) == DLCP_OK);
    CHECK(dlcp_wait_op(c, rseq, 10000, &done) == DLCP_OK && done.status == DLCP_STATUS_INVALID_DESCRIPTOR);
    CHECK(strstr(dlcp_last_error(c), "loss budget 300000 ppm") != NULL);

    uint64_t next = 0;
    CHECK(dlcp_next_op_seq(c, &next) == DLCP_OK && next == 6);
    CHECK(dlcp_set_next_op_seq(c, 100) == DLCP_OK);
    CHECK(dlcp_allreduce(c, t, 0, 1, 0, 0, 10000, &done) == DLCP_OK && done.op_seq == 100);
    CHECK(dlcp_next_op_seq(c, NULL) == DLCP_ERR_NULL_ARG);

    /* The other collectives (the fake doubles each tensor and reports the
     * shard N/4 .. N/4 + N/2 for reduce-scatter and allgather). */
    uint64_t off = 7, slen = 7;
    float before = g[5];
    CHECK(dlcp_reduce_scatter(c, t, 0, 1, 0, 0, DLCP_AVERAGE, 10000, &done, &off, &slen) == DLCP_OK);
    CHECK(done.op_seq == 101 && off == N / 4 && slen == N / 2 && g[5] == 2.0f * before);
    off = slen = 7;
    CHECK(dlcp_allgather(c, t, 0, 1, 0, 10000, NULL, &off, &slen) == DLCP_OK);
    CHECK(off == N / 4 && slen == N / 2 && g[5] == 4.0f * before);
    CHECK(dlcp_reduce_scatter(c, t, 0, 1, 0, 0, DLCP_SUM, 10000, NULL, NULL, NULL) == DLCP_OK);
    CHECK(dlcp_broadcast(c, t, 0, 0, 1, 0, 10000, &done) == DLCP_OK && done.op_seq == 104);
    CHECK(dlcp_barrier(c, 10000, &done) == DLCP_OK && done.op_seq == 105 && done.tensor == 0);
    CHECK(dlcp_reduce_scatter(c, t, 0, 1, 0, 0, 9, 10000, &done, &off, &slen) == DLCP_ERR_INVALID_ARG);
    CHECK(strstr(dlcp_last_error(c), "op: unknown reduction 9") != NULL);
    CHECK(dlcp_barrier(NULL, 10000, &done) == DLCP_ERR_NULL_ARG);
    CHECK(dlcp_detach(c) == DLCP_OK);
    CHECK(dlcp_detach(c) == DLCP_ERR_BAD_HANDLE);
    CHECK(dlcp_alloc(c, "x", 1, &t2) == DLCP_ERR_BAD_HANDLE);
    CHECK(dlcp_detach(NULL) == DLCP_OK);
    if (failures) {
        fprintf(stderr, "%d checks failed\n", failures);
        return 1;
    }
    printf("C ABI OK\n");
    return 0;
}
