"""Tests of the dlcp Python package, run as a real trainer process.

Needs a server on $DLCP_TEST_SOCKET that behaves like the Rust tests' fake
reducer (client/tests/common/mod.rs): every op doubles the tensor and reports
999000 ppm delivered and 3 repairs; budget 99_999 ppm is never completed;
budget 99_998 ppm completes with status peer_down; and one on
$DLCP_TEST_JOB7_SOCKET that serves job 7 only. Run by client/tests/python.rs:

    DLCP_LIB=.../libdlcp_client.so DLCP_TEST_SOCKET=... DLCP_TEST_JOB7_SOCKET=... \\
        PYTHONPATH=client/python /usr/bin/python3 client/python/tests/test_client.py -v
"""

import ctypes
import itertools
import os
import unittest

import numpy as np

import dlcp

SOCKET = os.environ["DLCP_TEST_SOCKET"]
JOB7_SOCKET = os.environ["DLCP_TEST_JOB7_SOCKET"]
ATTACH_ENV = ("DLCP_SOCKET", "DLCP_JOB", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
HOLD = 0.099999  # budget the fake reducer never completes
PEER_DOWN = 0.099998  # budget the fake reducer completes with peer_down
_jobs = itertools.count(1000)


def fresh(**kw):
    """A client on its own job id (ranks of finished tests may still be held)."""
    return dlcp.attach(SOCKET, job=next(_jobs), **kw)


def data(n, seed):
    rng = np.random.default_rng(seed)
    # Multiples of 1/1024: non-integer, and doubling is exact.
    return (rng.integers(-(1 << 20), 1 << 20, n) / 1024.0 + 1 / 2048).astype(np.float32)


class ViewTest(unittest.TestCase):
    def test_tensor_is_a_view_of_the_shared_arena_and_allreduce_writes_in_place(self):
        with fresh() as c:
            g = c.tensor("grad", 1000)
            self.assertEqual((g.dtype, g.shape), (np.float32, (1000,)))
            self.assertFalse(g.flags.owndata, "a view, not a copy")
            self.assertTrue(g.flags.writeable and g.flags.c_contiguous)
            addr = g.__array_interface__["data"][0]
            self.assertEqual(addr, c._by_name["grad"].addr, "points at dlcp_tensor_data")
            self.assertEqual(addr % 64, 0)
            x = data(1000, 1)
            g[:] = x  # written once, straight into shared memory
            # The same bytes seen through a raw pointer: no hidden buffer in between.
            self.assertEqual(ctypes.c_float.from_address(addr + 4 * 7).value, x[7])
            r = c.allreduce(g, layer=1, layers=2, budget=0.01)
            np.testing.assert_array_equal(g, 2 * x)  # the result, in the same array
            self.assertEqual((r.tensor, r.delivered_ppm, r.repairs), ("grad", 999000, 3))
            self.assertAlmostEqual(r.delivered, 0.999)
            self.assertGreater(r.duration, 0)
            # Asking again gives another view of the same memory.
            g2 = c.tensor("grad", 1000)
            self.assertTrue(np.shares_memory(g, g2))
            g2[3] = 42.5
            self.assertEqual(g[3], 42.5)
            c.allreduce("grad")  # by name
            self.assertEqual(g[3], 85.0)

    def test_shapes_and_several_tensors_pipelined(self):
        with fresh() as c:
            ws = [c.tensor(f"w{i}", (4, 8 + i)) for i in range(3)]
            for i, w in enumerate(ws):
                self.assertEqual(w.shape, (4, 8 + i))
                w[...] = data(w.size, i).reshape(w.shape)
            xs = [w.copy() for w in ws]
            seqs = [c.submit(w, layer=i, layers=3, budget=0) for i, w in enumerate(ws)]
            self.assertEqual(len(set(seqs)), 3)
            done = c.wait(seqs[2])
            self.assertEqual((done.op_seq, done.tensor, done.status, done.ok), (seqs[2], "w2", "ok", True))
            others = sorted(c.wait().op_seq for _ in range(2))
            self.assertEqual(others, seqs[:2])
            for w, x in zip(ws, xs):
                np.testing.assert_array_equal(w, 2 * x)
            with self.assertRaises(dlcp.DlcpTimeoutError):
                c.wait(timeout=0)

    def test_views_outlive_close_and_detach_follows_the_last_view(self):
        c = fresh()
        g = c.tensor("g", 16)
        g[:] = 1.5
        c.close()
        self.assertTrue(c.closed)
        c.close()  # idempotent
        g[0] = 2.5  # still mapped: the detach waits for the last view
        self.assertEqual(float(g.sum()), 2.5 + 15 * 1.5)
        with self.assertRaises(dlcp.ClosedError):
            c.tensor("h", 4)
        with self.assertRaises(dlcp.ClosedError):
            c.allreduce(g)
        del g  # now the handle goes and the daemon sees the detach


class CollectiveTest(unittest.TestCase):
    """The fake doubles each tensor and reports the shard n//4 .. n//4 + n//2
    for a reduce-scatter or an allgather (client/tests/common/mod.rs)."""

    def test_each_collective_runs_and_reports_its_shard(self):
        with fresh() as c:
            for dtype in ("float32", "float16", "bfloat16"):
                g = c.tensor(f"g-{dtype}", (10, 10), dtype=dtype)
                g[...] = 1
                r = c.reduce_scatter(g, budget=0, op="average")
                self.assertEqual((r.tensor, r.shard), (f"g-{dtype}", slice(25, 75)))
                self.assertEqual(len(g.reshape(-1)[r.shard]), 50)
                r = c.allgather(g)
                self.assertEqual(r.shard, slice(25, 75))
                r = c.broadcast(g, root=0)
                self.assertEqual((r.shard_offset, r.shard_len, r.shard), (0, 0, slice(0, 0)))
                if dtype == "float32":  # (the fake doubles 4-byte elements only)
                    np.testing.assert_array_equal(g, 8)  # doubled three times
            r = c.barrier()
            self.assertEqual((r.tensor, r.shard_len), ("", 0))
            self.assertGreater(r.op_seq, 0)
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.reduce_scatter(g, op="max")
            with self.assertRaises(dlcp.OpFailedError) as e:
                c.reduce_scatter(g, budget=PEER_DOWN)
            self.assertEqual(e.exception.completion.status, "peer_down")
        with self.assertRaises(dlcp.ClosedError):
            c.barrier()


class AttachEnvTest(unittest.TestCase):
    """attach() takes DLCP_SOCKET, DLCP_JOB, LOCAL_RANK, LOCAL_WORLD_SIZE as
    defaults, like the PyTorch hook; explicit arguments win."""

    def setUp(self):
        self.saved = {k: os.environ.get(k) for k in ATTACH_ENV}

    def tearDown(self):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v

    def test_attach_reads_the_environment(self):
        job = next(_jobs)
        os.environ.update(DLCP_SOCKET=SOCKET, DLCP_JOB=hex(job), LOCAL_RANK="1", LOCAL_WORLD_SIZE="2")
        with dlcp.attach() as c:
            self.assertEqual((c.socket, c.job, c.local_rank, c.local_world), (SOCKET, job, 1, 2))
            # Explicit arguments win over the environment (rank 1 of this job is taken).
            with dlcp.attach(job=job, local_rank=0) as d:
                self.assertEqual((d.socket, d.job, d.local_rank, d.local_world), (SOCKET, job, 0, 2))
            other = next(_jobs)
            with dlcp.attach(SOCKET, other, 0, 1) as e:
                self.assertEqual((e.job, e.local_rank, e.local_world), (other, 0, 1))
        os.environ["DLCP_SOCKET"] = "/nonexistent/dlcpd.sock"
        with self.assertRaises(dlcp.ConnectError):  # $DLCP_SOCKET was used
            dlcp.attach(job=job)
        os.environ.update(DLCP_SOCKET=JOB7_SOCKET, DLCP_JOB="999", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
        with self.assertRaises(dlcp.RejectedError) as e:
            dlcp.attach()
        self.assertIn("registered for job 999 but this daemon serves job 7", e.exception.reason)
        os.environ["LOCAL_RANK"] = "one"
        with self.assertRaises(dlcp.InvalidArgumentError) as e:
            dlcp.attach()
        self.assertIn("$LOCAL_RANK is 'one'", e.exception.reason)


class WorldTest(unittest.TestCase):
    def test_world_size_and_global_rank_come_from_the_daemon(self):
        # The fake reducer is rank 0 of 1 daemon.
        with fresh(local_rank=1, local_world=3) as c:
            want = dlcp.World(rank=1, size=3, node_rank=0, nodes=1, local_rank=1, local_world=3)
            self.assertEqual(c.world, want)
            self.assertEqual((c.rank, c.world_size), (1, 3))
        with self.assertRaises(dlcp.ClosedError):
            c.world


class ErrorTest(unittest.TestCase):
    def test_attach_errors(self):
        with self.assertRaises(dlcp.ConnectError) as e:
            dlcp.attach("/nonexistent/dlcpd.sock")
        self.assertIsInstance(e.exception, ConnectionError)
        self.assertEqual(e.exception.op, "attach")
        self.assertEqual(e.exception.name, "DLCP_ERR_CONNECT")
        self.assertIn("is dlcpd running?", str(e.exception))
        job = next(_jobs)
        with dlcp.attach(SOCKET, job, 0, 2):
            with self.assertRaises(dlcp.RejectedError) as e:
                dlcp.attach(SOCKET, job, 0, 2)
            self.assertIn("already attached", e.exception.reason)
            self.assertIn("local rank 0", e.exception.reason)
            # Another local world size than the job's trainers on this host: both named.
            with self.assertRaises(dlcp.RejectedError) as e:
                dlcp.attach(SOCKET, job, 1, 3)
            self.assertIn("local world size of 3 but this job's other trainers on this host registered 2", str(e.exception))
        with self.assertRaises(dlcp.InvalidArgumentError):
            dlcp.attach(SOCKET, job, 3, 2)

    def test_argument_errors(self):
        with fresh() as c:
            g = c.tensor("g", 8)
            with self.assertRaises(dlcp.NameInUseError):
                c.tensor("g", 9)
            with self.assertRaises(dlcp.ArenaFullError) as e:
                c.tensor("huge", 1 << 30)
            self.assertIsInstance(e.exception, MemoryError)
            self.assertIn("largest free", e.exception.reason)
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.tensor("empty", 0)
            with self.assertRaises(dlcp.InvalidArgumentError) as e:
                c.allreduce(np.zeros(8, np.float32))  # not a view of the arena
            self.assertIsInstance(e.exception, ValueError)
            self.assertIn("Client.tensor", str(e.exception))
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.allreduce(g[:4])  # part of a tensor
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.allreduce("nope")
            with self.assertRaises(dlcp.InvalidArgumentError) as e:
                c.allreduce(g, layer=5, layers=5)
            self.assertIn("layer 5 is not below the layer count 5", str(e.exception))
            self.assertEqual(e.exception.op, "allreduce")
            with self.assertRaises(ValueError):
                c.allreduce(g, budget=1.5)
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.allreduce(g, flags=0x100)

    def test_failed_and_timed_out_ops(self):
        with fresh() as c:
            g = c.tensor("g", 32)
            x = data(32, 9)
            g[:] = x
            with self.assertRaises(dlcp.OpFailedError) as e:
                c.allreduce(g, budget=PEER_DOWN)
            self.assertEqual(e.exception.status, "peer_down")
            self.assertEqual(e.exception.completion.tensor, "g")
            self.assertIn("peer_down", str(e.exception))
            np.testing.assert_array_equal(g, x)  # untouched
            # The daemon rejects a descriptor the client cannot judge, saying
            # which field and why; the completion carries the same text.
            with self.assertRaises(dlcp.OpFailedError) as e:
                c.allreduce(g, layers=1 << 20)
            self.assertEqual(e.exception.status, "invalid_descriptor")
            self.assertIn("field layers: layer count 1048576 is not in 1..=65536", str(e.exception))
            self.assertEqual(e.exception.completion.reason, e.exception.reason)
            done = c.wait(c.submit(g, layers=1 << 17))
            self.assertFalse(done.ok)
            self.assertIn("field layers: layer count 131072", done.reason)
            with self.assertRaises(dlcp.DlcpTimeoutError) as e:
                c.allreduce(g, budget=HOLD, timeout=0.05)
            self.assertIsInstance(e.exception, TimeoutError)
            with self.assertRaises(dlcp.TensorBusyError) as e:
                c.allreduce(g)
            self.assertIn("in flight", e.exception.reason)
            # The held op keeps its number: the sequence may only move past it.
            held = c.next_op_seq - 1
            with self.assertRaises(dlcp.InvalidArgumentError) as e:
                c.next_op_seq = held
            self.assertIn(f"op {held} is still in flight", e.exception.reason)
            c.next_op_seq = held + 100
            h = c.tensor("h", 4)
            self.assertEqual(c.allreduce(h).op_seq, held + 100)

    def test_a_wrong_job_is_rejected_at_attach_naming_both_jobs(self):
        with self.assertRaises(dlcp.RejectedError) as e:
            dlcp.attach(JOB7_SOCKET, job=999)
        self.assertIsInstance(e.exception, dlcp.AttachError)
        self.assertEqual((e.exception.op, e.exception.name), ("attach", "DLCP_ERR_REJECTED"))
        self.assertIn("registered for job 999 but this daemon serves job 7", e.exception.reason)
        self.assertIn("job 999", str(e.exception))
        with dlcp.attach(JOB7_SOCKET, job=7) as c:  # the right job is admitted
            self.assertEqual(c.job, 7)

    def test_float16_and_bfloat16_tensors_and_the_op_argument(self):
        with fresh() as c:
            h = c.tensor("h", 10, dtype="float16")
            self.assertEqual(h.dtype, np.float16)
            b = c.tensor("b", 10, dtype="bf16")
            self.assertEqual(b.dtype, np.uint16, "numpy has no bfloat16: raw bits")
            f = c.tensor("f", 10, dtype=np.float32)
            self.assertEqual(f.dtype, np.float32)
            self.assertEqual(c._by_name["b"].dtype, "bfloat16")
            # Element size: the next tensor starts after 10 * 2 bytes (64-aligned).
            self.assertEqual(c._by_name["b"].addr - c._by_name["h"].addr, 64)
            with self.assertRaises(dlcp.NameInUseError) as cm:
                c.tensor("h", 10, dtype="bfloat16")
            self.assertIn("10 float16 elements, not 10 bfloat16", str(cm.exception))
            with self.assertRaises(dlcp.InvalidArgumentError) as cm:
                c.tensor("x", 10, dtype=np.float64)
            self.assertIn("numpy has no bfloat16", str(cm.exception))
            with self.assertRaises(dlcp.InvalidArgumentError):
                c.allreduce(h.astype(np.float32), budget=0)  # not the view
            with self.assertRaises(dlcp.InvalidArgumentError) as cm:
                c.submit(h, op="max")
            self.assertIn("'sum' or 'average'", str(cm.exception))
        # bfloat16 conversions: round to nearest even, exact back, NaN kept.
        x = np.array([1.0, -2.5, 1 + 2 ** -8, 1 + 3 * 2 ** -8, np.inf], dtype=np.float32)
        bits = dlcp.bf16_from_float32(x)
        self.assertEqual(bits.tolist(), [0x3F80, 0xC020, 0x3F80, 0x3F82, 0x7F80])
        np.testing.assert_array_equal(dlcp.bf16_to_float32(bits), [1.0, -2.5, 1.0, 1 + 2 ** -6, np.inf])
        self.assertTrue(np.isnan(dlcp.bf16_to_float32(dlcp.bf16_from_float32(np.float32("nan")))))

    def test_budgets_are_fractions_or_percentages(self):
        self.assertEqual(dlcp.parse_budget("1%"), 0.01)
        self.assertEqual(dlcp.parse_budget(" 2.5 % "), 0.025)
        self.assertEqual(dlcp.parse_budget("0.01"), 0.01)
        self.assertEqual((dlcp.parse_budget(0), dlcp.parse_budget(0.1)), (0.0, 0.1))
        for bad in (1, "1", 0.5, "20%", -0.01, "-1%", "1 percent", float("nan"), None):
            with self.assertRaises(dlcp.InvalidArgumentError, msg=repr(bad)) as e:
                dlcp.parse_budget(bad)
            self.assertIsInstance(e.exception, ValueError)
            self.assertIn('write 0.01 or "1%" for 1%', e.exception.reason)
        with fresh() as c:
            g = c.tensor("g", 8)
            g[:] = 1.0
            self.assertEqual(c.allreduce(g, budget="1%").delivered_ppm, 999000)
            np.testing.assert_array_equal(g, 2.0)
            with self.assertRaises(dlcp.InvalidArgumentError) as e:
                c.allreduce(g, budget=1)  # 100%, not 1%
            self.assertIn("hard cap", e.exception.reason)

    def test_library_is_loaded_from_dlcp_lib(self):
        self.assertTrue(dlcp.version())
        self.assertEqual(os.path.realpath(dlcp._lib._name), os.path.realpath(os.environ["DLCP_LIB"]))


if __name__ == "__main__":
    unittest.main()
