"""ecstore.pending.PendingMarks against a real redis-server: a call waits
at most the link's timeout for the link itself.

One PendingMarks is shared by threads (the saver's unmark and the step's
mark on the producer; the prefetch thread and ensure_cache_available on
the consumer).  A thread that holds the link through a slow (re)connect of
several round trips must not make a vLLM hook wait it out: the hook's call
gives up after timeout_s and says so (ConnectionError, which every caller
treats as "Redis unavailable").
"""

import threading
import time

from conftest import start_redis

from ecstore.pending import PendingMarks


def test_marks_round_trip_and_expire():
    redis = start_redis()
    try:
        marks = PendingMarks("127.0.0.1:%d" % redis.port, "pend-t", 300, timeout_s=0.5)
        marks.mark(["a", "b"])
        assert marks.pending(["a", "b", "c"]) == [True, True, False]
        marks.unmark(["a"])
        assert marks.pending(["a", "b"]) == [False, True]
        time.sleep(0.5)  # b's TTL (300 ms) is over
        assert marks.pending(["b"]) == [False]
        marks.close()
    finally:
        redis.stop()


def test_a_call_waits_for_the_link_at_most_timeout():
    redis = start_redis()
    try:
        marks = PendingMarks("127.0.0.1:%d" % redis.port, "pend-t", 10000, timeout_s=0.3)
        assert marks.pending(["k"]) == [False]
        # Another thread holds the link for 3 s, as a reconnect through
        # slow sentinels would.
        held = threading.Event()

        def holder():
            with marks.lock:
                held.set()
                time.sleep(3.0)

        t = threading.Thread(target=holder)
        t.start()
        held.wait(5)
        t0 = time.monotonic()
        try:
            marks.pending(["k"])
            raised = False
        except ConnectionError as e:
            raised = "busy" in str(e)
        waited = time.monotonic() - t0
        t.join()
        assert raised
        assert waited < 1.0, "waited %.2f s for a link another thread held" % waited
        # Once the link is free again, calls go through.
        assert marks.pending(["k"]) == [False]
        marks.close()
    finally:
        redis.stop()
