#!/usr/bin/python3
"""The asynchronous ``dlcp.torch`` hook against a scripted client (no daemon):
futures returned at once and completed by the waiter thread in whatever order
the completions come, reports in hook order, a full ring waiting for a
completion, and the failure paths (an op past its timeout, a failed
completion, the daemon gone): every future fails, none hangs, and every later
hook call fails at once. Run by tests/client_python_ddp.rs:

    /usr/bin/python3 tests/python/test_hook_waiter.py -v
"""

import os
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "client", "python"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import dlcp  # noqa: E402
import dlcp.torch  # noqa: E402


class ScriptedClient:
    """Stands in for dlcp.Client: ``ring`` ops in flight at most (BusyError
    beyond), completions released by the test (``release``), each doubling the
    tensor (the sum of two identical ranks; halved again for an average, as
    the daemons divide) or with the given status. Like the library, it rings a
    completion doorbell (an eventfd, ``wait_fds``) for every completion, and a
    ``wait`` that finds none drains it before its last look; ``go`` makes the
    daemon gone and makes the control descriptor readable. ``waits`` counts
    the ``wait`` calls."""

    def __init__(self, ring=8):
        self.bell = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.control = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.waits = 0
        self.ring = ring
        self.arrays, self.ids = {}, {}
        self.in_flight = {}  # op_seq -> tensor name
        self.ops = {}  # op_seq -> reduction asked for
        self.ready = []  # completions to hand out
        self.gone = False
        self.next = 1
        self.cv = threading.Condition()

    def tensor(self, name, n, dtype="float32"):
        if name not in self.arrays:
            self.arrays[name] = np.zeros(n, dtype=dlcp.DTYPES[dtype][1])
            self.ids[name] = len(self.ids)
        return self.arrays[name]

    def tensor_id(self, name):
        return self.ids[name]

    def submit(self, name, layer, layers, budget, flags, op="sum"):
        with self.cv:
            if len(self.in_flight) >= self.ring:
                raise dlcp.BusyError("submit", -9, "too many operations in flight; wait for a completion first")
            seq, self.next = self.next, self.next + 1
            self.in_flight[seq] = name
            self.ops[seq] = op
            return seq

    def release(self, seq, status="ok", reason=""):
        with self.cv:
            name = self.in_flight.pop(seq)
            if status == "ok":
                a = self.arrays[name]
                x = dlcp.bf16_to_float32(a) if a.dtype == np.uint16 else a.astype(np.float32)
                x = x * 2
                if self.ops[seq] == "average":
                    x = x / 2
                a[:] = dlcp.bf16_from_float32(x) if a.dtype == np.uint16 else x.astype(a.dtype)
            self.ready.append(dlcp.Completion(seq, name, status, 0, 1_000_000, 0, 0.001, reason))
            os.eventfd_write(self.bell, 1)
            self.cv.notify_all()

    def go(self):
        with self.cv:
            self.gone = True
            os.eventfd_write(self.control, 1)
            self.cv.notify_all()

    def wait_fds(self):
        return self.bell, self.control

    def wait(self, op_seq=None, timeout=60.0):
        assert op_seq is None
        with self.cv:
            self.waits += 1
            if not self.ready and not self.gone:
                try:
                    os.eventfd_read(self.bell)
                except BlockingIOError:
                    pass
                self.cv.wait(timeout)
            if self.gone:
                raise dlcp.DaemonGoneError("wait", -12, "the daemon closed the control socket")
            if not self.ready:
                raise dlcp.DlcpTimeoutError("wait", -11, "no completion")
            return self.ready.pop(0)

    def close(self):
        pass


class Bucket:
    """Stands in for dist.GradBucket."""

    def __init__(self, index, last, values, params):
        self._i, self._last, self._buf, self._params = index, last, torch.tensor(values), params

    def index(self):
        return self._i

    def is_last(self):
        return self._last

    def buffer(self):
        return self._buf

    def parameters(self):
        return self._params


def until(pred, what, limit=5.0):
    t0 = time.monotonic()
    while not pred():
        if time.monotonic() - t0 > limit:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


class HookTest(unittest.TestCase):
    def setUp(self):
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False), torch.nn.Linear(2, 2, bias=False))
        front, back = list(self.net.parameters())
        self.front, self.back = [front], [back]

    def state(self, client, timeout=5.0):
        s = dlcp.torch.DlcpState(self.net, client, world_size=2, budget=0, timeout=timeout)
        self.addCleanup(s.close)
        return s

    def step(self, state, values=((1.0, 2.0), (3.0, 4.0))):
        """One step's two hook calls (back layer's bucket 0 first); their futures."""
        f0 = dlcp.torch.allreduce_hook(state, Bucket(0, False, values[0], self.back))
        f1 = dlcp.torch.allreduce_hook(state, Bucket(1, True, values[1], self.front))
        return f0, f1

    def assert_fails(self, fut, *texts):
        t0 = time.monotonic()
        with self.assertRaises(Exception) as cm:
            fut.wait()
        msg = str(cm.exception)
        self.assertLess(time.monotonic() - t0, 5.0)
        for t in ("DlcpHookError: dlcp allreduce of DDP bucket",) + texts:
            self.assertIn(t, msg)
        return msg

    def test_futures_return_at_once_and_complete_in_any_order_reports_in_hook_order(self):
        c = ScriptedClient()
        s = self.state(c)
        f0, f1 = self.step(s)
        self.assertFalse(f0.done() or f1.done(), "the hook waited for the ops")
        self.assertEqual(sorted(c.in_flight), [1, 2], "both buckets in flight at once")
        c.release(2)  # the front layer's op completes first
        self.assertEqual(f1.wait().tolist(), [3.0, 4.0])  # (x + x) / 2
        self.assertFalse(f0.done())
        self.assertEqual(list(s.reports), [], "a report waits for the earlier buckets'")
        c.release(1)
        self.assertEqual(f0.wait().tolist(), [1.0, 2.0])
        self.assertEqual(set(c.ops.values()), {"average"}, "the hook asks the daemons to average")
        self.assertEqual([(r.bucket, r.op_seq, r.layer) for r in s.reports], [(0, 1, 1), (1, 2, 0)])
        self.assertEqual(s.step, 1)
        self.assertIsNone(s.failed)

    def test_bf16_and_f16_buckets_are_reduced_in_their_own_type(self):
        c = ScriptedClient()
        s = self.state(c)
        for dtype, kind in ((torch.bfloat16, "bfloat16"), (torch.float16, "float16")):
            b0, b1 = Bucket(0, False, (1.5, -2.0), self.back), Bucket(1, True, (0.25, 3.0), self.front)
            b0._buf, b1._buf = b0._buf.to(dtype), b1._buf.to(dtype)
            f0 = dlcp.torch.allreduce_hook(s, b0)
            f1 = dlcp.torch.allreduce_hook(s, b1)
            seqs = sorted(c.in_flight)
            self.assertTrue(all(c.in_flight[q].endswith("." + kind) for q in seqs), c.in_flight)
            self.assertTrue(all(c.arrays[c.in_flight[q]].dtype == dlcp.DTYPES[kind][1] for q in seqs))
            for q in seqs:
                c.release(q)
            self.assertEqual((f0.wait().dtype, f0.wait().tolist()), (dtype, [1.5, -2.0]))
            self.assertEqual((f1.wait().dtype, f1.wait().tolist()), (dtype, [0.25, 3.0]))
        # float64 is not reduced: refused, naming what is.
        with self.assertRaises(dlcp.torch.DlcpHookError) as cm:
            b = Bucket(0, False, (1.0, 2.0), self.back)
            b._buf = b._buf.to(torch.float64)
            dlcp.torch.allreduce_hook(s, b)
        self.assertIn("float32, float16, bfloat16", str(cm.exception))

    def test_a_full_ring_waits_for_a_completion(self):
        c = ScriptedClient(ring=1)
        s = self.state(c)
        f0 = dlcp.torch.allreduce_hook(s, Bucket(0, False, (1.0, 2.0), self.back))
        threading.Timer(0.2, c.release, (1,)).start()
        t0 = time.monotonic()
        f1 = dlcp.torch.allreduce_hook(s, Bucket(1, True, (3.0, 4.0), self.front))
        self.assertGreater(time.monotonic() - t0, 0.15, "the second submit did not wait for room")
        self.assertEqual(sorted(c.in_flight), [2], "submitted after op 1's completion")
        c.release(2)
        self.assertEqual((f0.wait().tolist(), f1.wait().tolist()), ([1.0, 2.0], [3.0, 4.0]))

    def test_an_op_past_its_timeout_fails_every_op_in_flight_and_later_calls_at_once(self):
        c = ScriptedClient()
        s = self.state(c, timeout=0.3)
        f0, f1 = self.step(s)
        t0 = time.monotonic()
        self.assert_fails(f0, "(step 0, op 1)", "no completion within 0.3 s", "DLCP_ERR_TIMEOUT")
        self.assert_fails(f1, "(step 0, op 2)", "DLCP_ERR_TIMEOUT")
        self.assertLess(time.monotonic() - t0, 1.5)
        with self.assertRaises(dlcp.torch.DlcpHookError) as cm:
            self.step(s)
        self.assertIn("an earlier op failed, the ranks are out of step", str(cm.exception))
        self.assertIn("DLCP_ERR_TIMEOUT", str(cm.exception))

    def test_a_failed_completion_fails_the_other_op_in_flight(self):
        c = ScriptedClient()
        s = self.state(c)
        f0, f1 = self.step(s)
        c.release(2, "peer_down", "rank 1 is down")
        self.assert_fails(f1, "(step 0, op 2)", "the op completed with status 'peer_down': rank 1 is down")
        self.assert_fails(f0, "(step 0, op 1)", "in flight when op 2 failed", "status 'peer_down'")
        self.assertEqual(s.failed.op_seq, 2)
        self.assertRaises(dlcp.torch.DlcpHookError, self.step, s)

    def test_the_daemon_gone_fails_every_op_in_flight(self):
        c = ScriptedClient()
        s = self.state(c)
        f0, f1 = self.step(s)
        c.go()
        for f in (f0, f1):
            self.assert_fails(f, "DLCP_ERR_DAEMON_GONE")
        until(lambda: s.failed is not None, "the state to fail")
        self.assertRaises(dlcp.torch.DlcpHookError, self.step, s)

    def test_the_waiter_sleeps_outside_the_client_while_ops_are_in_flight(self):
        # Two ops in flight and no completion for half a second: the waiter
        # sleeps in poll, not in the client's wait (which holds the library's
        # per-handle lock, so a submit would wait for it), and is not woken
        # over and over (2 ms slices made 250 calls here).
        c = ScriptedClient()
        s = self.state(c)
        f0, f1 = self.step(s)
        until(lambda: c.waits >= 1, "the waiter's first look")
        time.sleep(0.5)
        self.assertLessEqual(c.waits, 3, "the waiter kept calling wait while nothing completed")
        self.assertFalse(f0.done() or f1.done())
        c.release(1)
        c.release(2)
        self.assertEqual((f0.wait().tolist(), f1.wait().tolist()), ([1.0, 2.0], [3.0, 4.0]))
        self.assertIsNone(s.failed)

    def test_close_fails_the_ops_in_flight_and_stops_the_waiter(self):
        c = ScriptedClient()
        s = self.state(c)
        f0, _ = self.step(s)
        s.close()
        self.assert_fails(f0, "closed with the op in flight")
        self.assertFalse(s._waiter.thread.is_alive())


if __name__ == "__main__":
    unittest.main()
