/*
 * dlcp.h — C API of the dlcp trainer client (libdlcp_client.so / libdlcp_client.a).
 *
 * A trainer attaches to the local dlcpd over its Unix control socket, allocates
 * named f32 (or f16, bf16) tensors in a shared-memory arena, writes gradients straight into them
 * (dlcp_tensor_data), submits allreduce operations (or reduce-scatter, allgather,
 * broadcast, barrier) and waits for completions; the result replaces the
 * tensor's contents in place.
 *
 *     dlcp_client *c;
 *     dlcp_tensor g;
 *     if (dlcp_attach("/run/dlcp/dlcpd.sock", job, local_rank, local_world, &c) != DLCP_OK)
 *         fprintf(stderr, "%s\n", dlcp_last_error(NULL));
 *     dlcp_alloc(c, "layer3.grad", n, &g);
 *     float *grad = dlcp_tensor_data(c, g);   // write the gradient here, once
 *     ...
 *     dlcp_completion done;
 *     int rc = dlcp_allreduce(c, g, 3, 12, 10000, 0, 30000, &done);
 *     if (rc != DLCP_OK) fprintf(stderr, "%s\n", dlcp_last_error(c));
 *     // grad[] now holds the reduced values
 *     dlcp_detach(c);
 *
 * Conventions:
 *  - Every function returning int returns DLCP_OK (0) or a negative DLCP_ERR_*
 *    code; dlcp_last_error() then says what happened. No function aborts or
 *    unwinds into the caller on bad input.
 *  - A dlcp_client* is an opaque token the library never dereferences: NULL,
 *    garbage and detached handles give DLCP_ERR_NULL_ARG / DLCP_ERR_BAD_HANDLE.
 *    Handle values are never reused within a process.
 *  - Output pointers must point to writable storage of their type (NULL gives
 *    DLCP_ERR_NULL_ARG unless documented as optional). String arguments must be
 *    NUL-terminated; names must be UTF-8.
 *  - A handle may be used from several threads; calls on one handle are
 *    serialised, each holding the handle while it runs. dlcp_wait and
 *    dlcp_wait_op do not hold it while they sleep, so other threads' calls go
 *    on meanwhile; the blocking collectives (dlcp_allreduce ... dlcp_barrier)
 *    hold it from their submit to their completion.
 *  - Tensor handles are assigned in allocation order (0, 1, 2, ...) and double
 *    as the tensor id on the wire: allocate tensors in the same order on every rank.
 *
 * Link: cc prog.c -I client/include -L target/release -ldlcp_client -Wl,-rpath,<dir>
 *   or  cc prog.c -I client/include target/release/libdlcp_client.a -lpthread -ldl -lm -lgcc_s
 */
#ifndef DLCP_H
#define DLCP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Error codes: every failing call returns one of these (negative) values. */
enum dlcp_error {
    DLCP_OK = 0,
    DLCP_ERR_NULL_ARG = -1,     /* a required pointer argument is NULL */
    DLCP_ERR_BAD_HANDLE = -2,   /* not a live dlcp_client (detached or never attached) */
    DLCP_ERR_INVALID_ARG = -3,  /* unknown tensor, bad name, layer >= layers, unknown flags, ... */
    DLCP_ERR_CONNECT = -4,      /* cannot connect to the control socket (is dlcpd running?) */
    DLCP_ERR_REJECTED = -5,     /* the daemon refused the attachment (rank in use, world mismatch, policy) */
    DLCP_ERR_PROTOCOL = -6,     /* invalid handshake or segment (client/daemon version skew?) */
    DLCP_ERR_ARENA_FULL = -7,   /* no room in the shared arena */
    DLCP_ERR_NAME_IN_USE = -8,  /* a tensor of that name already exists */
    DLCP_ERR_BUSY = -9,         /* too many ops in flight / submission ring full: wait first */
    DLCP_ERR_TENSOR_BUSY = -10, /* the tensor has an op in flight: wait for its completion */
    DLCP_ERR_TIMEOUT = -11,     /* no completion within the timeout (the op may still complete) */
    DLCP_ERR_DAEMON_GONE = -12, /* the daemon closed the control socket: ops in flight are lost */
    DLCP_ERR_OP_FAILED = -13,   /* the op completed with a status other than DLCP_STATUS_OK */
    DLCP_ERR_IO = -14,          /* I/O error on a doorbell or the control socket */
    DLCP_ERR_CORRUPTED = -15,   /* the shared rings are corrupted */
    DLCP_ERR_INTERNAL = -16     /* a bug in the library (a panic was caught); detach and report */
};

/* Completion status (dlcp_completion.status). */
enum dlcp_status {
    DLCP_STATUS_OK = 0,                 /* the result is in the tensor */
    DLCP_STATUS_INVALID_DESCRIPTOR = 1, /* the daemon rejected the submission; detail = rule violated */
    DLCP_STATUS_TIMEOUT = 2,            /* a peer stayed silent past the hard timeout; tensor unchanged */
    DLCP_STATUS_PEER_DOWN = 3,          /* a peer (or a local trainer of the job) is gone */
    DLCP_STATUS_SHUTDOWN = 4            /* the daemon is shutting down */
};

/* Submission flags (dlcp_submit / dlcp_allreduce `flags`). */
#define DLCP_FLAG_RESCALE 0x1u    /* after a partial delivery, rescale by the delivered count */
#define DLCP_FLAG_FILL_LOCAL 0x2u /* fill what is missing with the local value instead of zero */

/* Element type of a tensor (dlcp_alloc_dtype). f16 and bf16 tensors are
 * reduced with f32 accumulation at each owner and one rounding (to nearest,
 * ties to even) to the tensor's type; every rank gets the same bytes.
 * dlcp_tensor_data then points at 2-byte elements: cast it to uint16_t *. */
enum dlcp_dtype {
    DLCP_F32 = 1,  /* IEEE 754 binary32 (dlcp_alloc's) */
    DLCP_F16 = 2,  /* IEEE 754 binary16 */
    DLCP_BF16 = 3  /* bfloat16 */
};

/* The reduction (dlcp_submit_op / dlcp_allreduce_op `op`). dlcp_submit and
 * dlcp_allreduce sum. */
enum dlcp_op {
    DLCP_SUM = 0,     /* element-wise sum over every trainer of the job */
    DLCP_AVERAGE = 1  /* element-wise mean over every trainer of the job: the daemons divide once */
};

/* Opaque client handle. */
typedef struct dlcp_client dlcp_client;

/* Tensor handle, from dlcp_alloc. */
typedef uint32_t dlcp_tensor;

/* A completed operation (48 bytes). */
typedef struct dlcp_completion {
    uint64_t op_seq;        /* as returned by dlcp_submit */
    uint64_t cookie;        /* 0 for ops submitted through this API */
    uint64_t duration_ns;   /* time the daemon spent on the op */
    dlcp_tensor tensor;     /* the tensor */
    uint32_t status;        /* enum dlcp_status */
    uint32_t detail;        /* status detail (INVALID_DESCRIPTOR: which rule) */
    uint32_t delivered_ppm; /* fraction of the tensor delivered, parts per million */
    uint32_t repairs;       /* packets repaired */
    uint32_t reserved;      /* zero */
} dlcp_completion;

/* Where a trainer stands in its job (dlcp_get_world), 24 bytes. The daemon knows
 * its rank and the number of daemons; every host is taken to run local_world
 * trainers (as torchrun's --nproc-per-node): rank = node_rank * local_world +
 * local_rank, size = nodes * local_world. */
typedef struct dlcp_world {
    uint32_t rank;        /* this trainer's global rank */
    uint32_t size;        /* the job's trainers on all hosts */
    uint32_t node_rank;   /* the daemon's rank among the job's daemons (node.rank) */
    uint32_t nodes;       /* the job's number of daemons (hosts) */
    uint32_t local_rank;  /* this trainer's rank on this host */
    uint32_t local_world; /* the job's trainers on this host */
} dlcp_world;

/* dlcp_attach_env: take this argument from the environment. */
#define DLCP_FROM_ENV UINT32_MAX         /* local_rank / local_world */
#define DLCP_JOB_FROM_ENV UINT64_MAX     /* job_id */

/* Attach as local rank `local_rank` of `local_world` trainers of job `job_id`.
 * On success *out is a new handle; on failure *out is NULL (if out is not NULL)
 * and dlcp_last_error(NULL) says why. Waits at most 5 s for the daemon. */
int dlcp_attach(const char *socket_path, uint64_t job_id, uint32_t local_rank, uint32_t local_world,
                dlcp_client **out);

/* dlcp_attach with defaults from the environment, as the Python client's attach():
 * socket_path NULL -> $DLCP_SOCKET (else /run/dlcp/dlcpd.sock), job_id
 * DLCP_JOB_FROM_ENV -> $DLCP_JOB (decimal or 0x hex, else 0), local_rank
 * DLCP_FROM_ENV -> $LOCAL_RANK (else 0), local_world DLCP_FROM_ENV ->
 * $LOCAL_WORLD_SIZE (else 1). Any other value is used as given (it wins).
 * A variable that is not a number gives DLCP_ERR_INVALID_ARG naming it. */
int dlcp_attach_env(const char *socket_path, uint64_t job_id, uint32_t local_rank, uint32_t local_world,
                    dlcp_client **out);

/* Where this trainer stands in its job: global rank, world size, the daemon's
 * rank and number of daemons. DLCP_ERR_PROTOCOL from a daemon too old to say. */
int dlcp_get_world(dlcp_client *c, dlcp_world *out);

/* Detach: the daemon reclaims the segment and every dlcp_tensor_data pointer
 * becomes invalid. NULL is a no-op (DLCP_OK); a dead handle gives DLCP_ERR_BAD_HANDLE. */
int dlcp_detach(dlcp_client *c);

/* Allocate a named f32 tensor of len_elems elements in the shared arena. */
int dlcp_alloc(dlcp_client *c, const char *name, uint64_t len_elems, dlcp_tensor *out_tensor);

/* Allocate a named tensor of len_elems elements of `dtype` (enum dlcp_dtype);
 * DLCP_ERR_INVALID_ARG for an unknown dtype. */
int dlcp_alloc_dtype(dlcp_client *c, const char *name, uint64_t len_elems, uint32_t dtype,
                     dlcp_tensor *out_tensor);

/* The tensor's element type (enum dlcp_dtype). */
int dlcp_tensor_dtype(dlcp_client *c, dlcp_tensor tensor, uint32_t *out_dtype);

/* Length of a tensor in elements. */
int dlcp_tensor_len(dlcp_client *c, dlcp_tensor tensor, uint64_t *out_len);

/* The tensor's elements, in the shared arena: the one place a trainer writes its
 * gradient (in place, no copy). NULL on error (see dlcp_last_error(c)).
 * Valid until dlcp_detach(c). Do NOT read or write it between dlcp_submit of this
 * tensor and the receipt of its completion: the daemon owns it then. */
float *dlcp_tensor_data(dlcp_client *c, dlcp_tensor tensor);

/* Submit an allreduce (sum) of `tensor`: layer < layers, loss budget in ppm
 * (0 = reliable), DLCP_FLAG_* bits. *out_op_seq (optional, may be NULL) gets the
 * op's sequence number. The result replaces the tensor when the op completes. */
int dlcp_submit(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers, uint32_t budget_ppm,
                uint32_t flags, uint64_t *out_op_seq);

/* dlcp_submit with a reduction `op` (enum dlcp_op); DLCP_ERR_INVALID_ARG for an unknown op. */
int dlcp_submit_op(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers, uint32_t budget_ppm,
                   uint32_t flags, uint32_t op, uint64_t *out_op_seq);

/* Wait for the next completion of any op. timeout_ms < 0: no limit; 0: poll.
 * DLCP_OK means *out holds a completion: check out->status. A completion whose
 * status is not DLCP_STATUS_OK also sets dlcp_last_error(c) to why it failed.
 * Other threads' calls on the handle go on while this one sleeps; a handle
 * detached by another thread meanwhile ends the wait within a second with
 * DLCP_ERR_BAD_HANDLE. */
int dlcp_wait(dlcp_client *c, int64_t timeout_ms, dlcp_completion *out);

/* What a completion waiter polls (dlcp_wait_fds). */
typedef struct dlcp_fds {
    int completion; /* the completion doorbell (eventfd): readable once a completion was posted */
    int control;    /* the control socket: readable when the daemon wrote to it or closed it */
} dlcp_fds;

/* Stores in *out the descriptors a completion waiter may poll() for POLLIN
 * itself, beside descriptors of its own (an event loop; dlcp_wait does the same
 * internally and does not hold the handle while it sleeps). When either is readable,
 * call dlcp_wait with timeout 0 until it gives DLCP_ERR_TIMEOUT (with only
 * `control` readable, a timeout of a few ms: that is how a daemon that closed
 * it is noticed), then poll again; no completion is missed. The descriptors
 * belong to the handle until dlcp_detach: never read, write or close them. */
int dlcp_wait_fds(dlcp_client *c, dlcp_fds *out);

/* Wait for the completion of op `op_seq`; completions of other ops that arrive
 * meanwhile are kept for dlcp_wait. */
int dlcp_wait_op(dlcp_client *c, uint64_t op_seq, int64_t timeout_ms, dlcp_completion *out);

/* Submit + wait. DLCP_OK only if the op completed with DLCP_STATUS_OK;
 * DLCP_ERR_OP_FAILED if it completed otherwise, dlcp_last_error(c) then giving
 * the daemon's reason (the ranks a timeout waited on, the descriptor field it
 * rejected, ...). *out (optional) gets the completion. */
int dlcp_allreduce(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers, uint32_t budget_ppm,
                   uint32_t flags, int64_t timeout_ms, dlcp_completion *out);

/* dlcp_allreduce with a reduction `op` (enum dlcp_op). */
int dlcp_allreduce_op(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers, uint32_t budget_ppm,
                      uint32_t flags, uint32_t op, int64_t timeout_ms, dlcp_completion *out);

/* The other collectives: submit + wait, returning as dlcp_allreduce does.
 * A host's shard is the element range r*len/nodes .. (r+1)*len/nodes (rounded
 * down) of its daemon's rank r of nodes (dlcp_world.node_rank, .nodes); the
 * shard out-params are optional (NULL) and set only on DLCP_OK. With several
 * trainers on a host, what the host contributes to an allgather is the sum of
 * its trainers' tensors over its shard (with one trainer: exactly its own). */

/* Reduce-scatter: this host's shard of `tensor` is replaced by the reduced
 * values (reduction `op`, enum dlcp_op; budget and flags as for dlcp_allreduce);
 * the rest of the tensor is left as it was. */
int dlcp_reduce_scatter(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers,
                        uint32_t budget_ppm, uint32_t flags, uint32_t op, int64_t timeout_ms,
                        dlcp_completion *out, uint64_t *out_shard_offset, uint64_t *out_shard_len);

/* Allgather: this host contributes its shard of `tensor`; the whole tensor is
 * replaced by every host's shard. budget_ppm is the loss budget of its one
 * (gather) phase. */
int dlcp_allgather(dlcp_client *c, dlcp_tensor tensor, uint32_t layer, uint32_t layers, uint32_t budget_ppm,
                   int64_t timeout_ms, dlcp_completion *out, uint64_t *out_shard_offset,
                   uint64_t *out_shard_len);

/* Broadcast: every trainer's `tensor` is replaced by the tensor of local rank 0
 * on the host of daemon rank `root` (< nodes, else DLCP_ERR_OP_FAILED naming
 * the root). Exact with budget_ppm 0. */
int dlcp_broadcast(dlcp_client *c, dlcp_tensor tensor, uint32_t root, uint32_t layer, uint32_t layers,
                   uint32_t budget_ppm, int64_t timeout_ms, dlcp_completion *out);

/* Barrier: returns once every trainer of the job has entered it. No tensor
 * (out->tensor is 0). */
int dlcp_barrier(dlcp_client *c, int64_t timeout_ms, dlcp_completion *out);

/* The op sequence number the next dlcp_submit will use (1 after attach). The
 * daemon matches an op across trainers by (op_seq, tensor): every trainer of a job
 * must submit the same sequence of ops. */
int dlcp_next_op_seq(dlcp_client *c, uint64_t *out_seq);

/* Set the op sequence number the next dlcp_submit uses: after a failed op, or when
 * a replacement trainer joins a running job, the trainers agree where to continue.
 * DLCP_ERR_INVALID_ARG if an op in flight has a sequence number >= seq. */
int dlcp_set_next_op_seq(dlcp_client *c, uint64_t seq);

/* Static description of an error code (never NULL). */
const char *dlcp_strerror(int code);

/* Static name of a completion status: "ok", "timeout", ... (never NULL). */
const char *dlcp_status_str(uint32_t status);

/* Message of the last failed call on handle c, or for c == NULL of the last
 * failed call on this thread (e.g. dlcp_attach). "" if none. Never NULL; valid
 * until the next dlcp_* call on this thread — copy it if you need it longer. */
const char *dlcp_last_error(dlcp_client *c);

/* Library version, e.g. "0.1.0" (static). */
const char *dlcp_version(void);

#ifdef __cplusplus
}
#endif

#endif /* DLCP_H */
