"""ecstore.vllm.ECStoreConnector against the installed vLLM's own classes:
its connector factory (by module path), VllmConfig / ECTransferConfig,
Request with multimodal features, SchedulerOutput, and the model runner's
EC connector mixin; with a real redis-server and ecstore-server.

An encoder (producer) runs in its own process (vllm_roles.py produce);
the prefill/decode instance's scheduler and worker run here.
"""

import json
import logging
import os
import subprocess
import sys

import pytest

import torch  # noqa: E402
import vllm  # noqa: E402

from conftest import REPO, start_redis, start_server  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import vllm_roles as roles  # noqa: E402

from vllm.distributed.ec_transfer.ec_connector.base import (  # noqa: E402
    ECConnectorBase,
    ECConnectorRole,
)
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory  # noqa: E402

import ecstore  # noqa: E402
from ecstore import vllm as ev  # noqa: E402


def produce(cluster_cfg, seed, specs, model_dir):
    """Runs an encoder-only vLLM instance (ec_producer) in a new process;
    returns its stdout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "ec_connector" / "python"), HERE, env.get("PYTHONPATH", "")])
    r = subprocess.run([sys.executable, os.path.join(HERE, "vllm_roles.py"), "produce", json.dumps(cluster_cfg),
                        str(model_dir), str(seed)] + list(specs), env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, "producer failed (%d):\n%s\n%s" % (r.returncode, r.stdout, r.stderr[-4000:])
    return r.stdout


def bits(t):
    """The tensor's bytes, for bit-for-bit comparisons of any dtype."""
    return t.contiguous().view(torch.uint8).reshape(-1)


@pytest.fixture
def extra(private_cluster):
    # A Redis and a server of its own per test: no test sees another's objects.
    c = private_cluster
    return {"servers": c.servers, "redis_url": c.redis_url, "namespace": "pytest", "protocol": "tcp",
            "timeout_ms": 5000}


# ---- loading by vLLM -------------------------------------------------------


def test_vllm_finds_the_class_by_module_path(extra):
    cfg = roles.vllm_config("ec_consumer", extra)
    cls = ECConnectorFactory.get_connector_class(cfg.ec_transfer_config)
    assert cls is ev.ECStoreConnector
    assert issubclass(cls, ECConnectorBase)
    assert not getattr(cls, "__abstractmethods__", None), "abstract methods left: %s" % cls.__abstractmethods__
    for role in (ECConnectorRole.SCHEDULER, ECConnectorRole.WORKER):
        conn = ECConnectorFactory.create_connector(cfg, role)
        try:
            assert isinstance(conn, ECConnectorBase)
            assert conn.role == role and conn.is_consumer and not conn.is_producer
            assert conn.describe().startswith("ecstore/")
        finally:
            conn.shutdown()
            conn.shutdown()  # idempotent


def test_unknown_extra_key_is_an_error_naming_it(extra):
    extra["stagin_bytes"] = "64M"
    cfg = roles.vllm_config("ec_both", extra)
    with pytest.raises(ecstore.InvalidArgumentError, match="stagin_bytes"):
        ECConnectorFactory.create_connector(cfg, ECConnectorRole.WORKER)


def test_bad_python_key_value_is_an_error_naming_it(extra):
    extra["warn_interval_s"] = "often"
    with pytest.raises(ecstore.InvalidArgumentError, match="warn_interval_s"):
        ev.ECStoreConnector(roles.vllm_config("ec_consumer", extra), ECConnectorRole.SCHEDULER)


# ---- encode -> schedule -> load ---------------------------------------------


def consumer_step(extra, reqs, encoder_cache=None, finished=()):
    """The prefill/decode instance's side of one step: the scheduler checks
    and allocates each request's items, builds the metadata, and the worker
    runs it through vLLM's mixin.  Returns (scheduler, hits per request,
    metadata, connector output, encoder_cache)."""
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = roles.scheduler(cfg)
    hits = {}
    for r in reqs:
        hits[r.request_id] = []
        for i, f in enumerate(r.mm_features):
            if sched.has_cache_item(f.identifier):
                hits[r.request_id].append(f.identifier)
                sched.update_state_after_alloc(r, i)
            # else: vLLM schedules the encoder for it (recompute)
    meta = sched.build_connector_meta(roles.scheduler_output(None))
    roles.init_worker(cfg)
    cache = {} if encoder_cache is None else encoder_cache
    out = roles.run_worker_step(roles.scheduler_output(meta, finished), cache)
    sched.update_connector_output(out)
    return sched, hits, meta, out, cache


def save(extra, seed, specs):
    """Saves in this process through an ec_both worker (the mixin's save
    path); the two-process test covers an encoder-only instance."""
    assert roles.save_all(roles.vllm_config("ec_both", extra), seed, specs) == []


def test_encode_schedule_load_bit_identical(extra, tmp_path):
    specs = ["img-a", "img-b:1000:2048", "img-c:97:3584:f16", "img-d:3:8:f32"]
    assert produce(extra, 7, specs, tmp_path / "model").strip().endswith("saved 4")
    items = [roles.parse_item(s) for s in specs]
    reqs = [roles.request("r1", [(items[0][0], items[0][1]), (items[1][0], items[1][1])]),
            roles.request("r2", [(items[2][0], items[2][1]), ("img-never-encoded", 40), (items[3][0], items[3][1])])]
    sched, hits, meta, out, cache = consumer_step(extra, reqs)
    try:
        assert hits == {"r1": ["img-a", "img-b"], "r2": ["img-c", "img-d"]}
        assert sorted(s.mm_hash for s in meta.loads) == ["img-a", "img-b", "img-c", "img-d"]
        assert sorted(cache) == ["img-a", "img-b", "img-c", "img-d"]  # the miss goes to the encoder
        for mm_hash, tokens, width, dtype in items:
            got, want = cache[mm_hash], roles.embedding(7, mm_hash, tokens, width, dtype)
            assert got.dtype == dtype and tuple(got.shape) == (tokens, width) and got.device.type == "cpu"
            assert torch.equal(bits(got), bits(want)), mm_hash
        assert out.finished_recving == {"img-a", "img-b", "img-c", "img-d"}
        assert out.ec_connector_worker_meta is None
        assert sched.take_unavailable_requests() == set()
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_items_already_in_encoder_cache_are_not_loaded(extra):
    save(extra, 3, ["img-x:16:64", "img-y:16:64"])
    mine = torch.zeros(16, 64, dtype=torch.bfloat16)
    reqs = [roles.request("r", [("img-x", 16), ("img-y", 16)])]
    sched, _, meta, out, cache = consumer_step(extra, reqs, encoder_cache={"img-x": mine})
    try:
        assert cache["img-x"] is mine  # untouched
        assert torch.equal(bits(cache["img-y"]), bits(roles.embedding(3, "img-y", 16, 64, torch.bfloat16)))
        assert out.finished_recving == {"img-y"}
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_one_batched_load_per_step_and_shared_items_once(extra):
    save(extra, 5, ["s-%d:32:128" % i for i in range(13)])
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = roles.scheduler(cfg)
    worker = roles.init_worker(cfg)
    try:
        # Step 1: a worker whose config names no model learns the width
        # from its first load (one more round trip, that step only).
        sched.update_state_after_alloc(roles.request("w", [("s-12", 32)]), 0)
        cache = {}
        roles.run_worker_step(roles.scheduler_output(sched.build_connector_meta(roles.scheduler_output(None))), cache)
        assert list(cache) == ["s-12"]
        before = worker._open().stats()
        # Step 2: two requests share s-0: one load spec, both waiting on it.
        reqs = [roles.request("a", [("s-%d" % i, 32) for i in range(6)]),
                roles.request("b", [("s-0", 32)] + [("s-%d" % i, 32) for i in range(6, 12)])]
        for r in reqs:
            for i in range(len(r.mm_features)):
                sched.update_state_after_alloc(r, i)
        meta = sched.build_connector_meta(roles.scheduler_output(None))
        assert len(meta.loads) == 12
        shared = [s for s in meta.loads if s.mm_hash == "s-0"][0]
        assert shared.req_ids == ["a", "b"] and shared.num_embeds == 32
        out = roles.run_worker_step(roles.scheduler_output(meta), cache)
        after = worker._open().stats()
        assert after["loads"] - before["loads"] == 12  # one batched load, no retries
        assert after["load_hits"] - before["load_hits"] == 12
        assert len(cache) == 13 and len(out.finished_recving) == 12
        # The loads landed in the worker's pinned pool, and go back to it
        # when vLLM drops them from its encoder cache.
        assert worker.worker.host.stats()["live_allocs"] == 13
        cache.clear()
        import gc
        gc.collect()
        assert worker.worker.host.stats()["live_allocs"] == 0
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_loads_without_room_in_the_pool_use_torch_memory(extra):
    save(extra, 6, ["q-%d:100:512" % i for i in range(4)])
    cfg = roles.vllm_config("ec_consumer", dict(extra, load_pool_bytes="128K"))
    sched = roles.scheduler(cfg)
    worker = roles.init_worker(cfg)
    try:
        for i in range(4):
            sched.update_state_after_alloc(roles.request("r%d" % i, [("q-%d" % i, 100)]), 0)
        cache = {}
        roles.run_worker_step(roles.scheduler_output(sched.build_connector_meta(roles.scheduler_output(None))), cache)
        assert sorted(cache) == ["q-%d" % i for i in range(4)]
        for i in range(4):
            assert torch.equal(bits(cache["q-%d" % i]), bits(roles.embedding(6, "q-%d" % i, 100, 512, torch.bfloat16)))
        assert worker.worker.host.stats()["live_allocs"] <= 1  # 100 KB of 128 KB: at most one fits
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_model_config_sizes_the_first_load(extra, tmp_path):
    # The tiny model's hidden size is 64 and its dtype bf16: a consumer of
    # it sizes even its first load right, in one round trip.
    save(extra, 4, ["m-%d:10:64" % i for i in range(3)])
    cfg = roles.vllm_config("ec_consumer", extra, tmp_path / "model")
    sched = roles.scheduler(cfg)
    worker = roles.init_worker(cfg)
    try:
        for i in range(3):
            sched.update_state_after_alloc(roles.request("r%d" % i, [("m-%d" % i, 10)]), 0)
        cache = {}
        roles.run_worker_step(roles.scheduler_output(sched.build_connector_meta(roles.scheduler_output(None))), cache)
        assert worker._open().stats()["loads"] == 3
        for i in range(3):
            want = roles.embedding(4, "m-%d" % i, 10, 64, torch.bfloat16)
            assert torch.equal(bits(cache["m-%d" % i]), bits(want))
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_build_connector_meta_resets_and_producer_never_loads(extra, tmp_path):
    save(extra, 1, ["p-1:8:8"])
    cfg = roles.vllm_config("ec_producer", extra, tmp_path / "model")
    sched = roles.scheduler(cfg)
    try:
        r = roles.request("r", [("p-1", 8)])
        assert sched.has_cache_item("p-1")
        sched.update_state_after_alloc(r, 0)  # a producer loads nothing
        assert sched.build_connector_meta(roles.scheduler_output(None)).loads == []
        delay, params = sched.request_finished(r)
        # per mm_hash: where it is stored and what it is (the tiny model: bf16, width 64)
        assert delay is False and params == {"p-1": {
            "modality": "image", "item_indices": [0], "holder": extra["servers"], "namespace": "pytest",
            "dtype": "bfloat16", "shape": [8, 64], "nbytes": 8 * 64 * 2}}
    finally:
        sched.shutdown()
    cons = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    try:
        cons.update_state_after_alloc(roles.request("r", [("p-1", 8)]), 0)
        assert [s.mm_hash for s in cons.build_connector_meta(roles.scheduler_output(None)).loads] == ["p-1"]
        assert cons.build_connector_meta(roles.scheduler_output(None)).loads == []  # reset
    finally:
        cons.shutdown()


def test_consumer_save_is_a_no_op(extra):
    cfg = roles.vllm_config("ec_consumer", extra)
    conn = roles.init_worker(cfg)
    try:
        conn.save_caches({"c-1": torch.ones(4, 4)}, "c-1")
        sched = roles.scheduler(cfg)
        assert not sched.has_cache_item("c-1")
        sched.shutdown()
    finally:
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_producer_get_finished_reports_saves(extra):
    cfg = roles.vllm_config("ec_both", extra)
    conn = roles.init_worker(cfg)
    try:
        cache = {"f-%d" % i: roles.embedding(9, "f-%d" % i, 64, 256, torch.bfloat16) for i in range(3)}
        for h in cache:
            conn.save_caches(cache, h)
        assert conn.wait_for_save() == []
        saved, loaded = conn.get_finished(set())
        assert saved == set(cache) and loaded is None
        assert conn.get_finished(set()) == (None, None)  # reported once
    finally:
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


def test_item_gone_between_check_and_load_fails_its_requests(extra):
    save(extra, 2, ["g-1:8:8", "g-2:8:8"])
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = roles.scheduler(cfg)
    try:
        r1, r2 = roles.request("r1", [("g-1", 8)]), roles.request("r2", [("g-2", 8)])
        for r in (r1, r2):
            sched.update_state_after_alloc(r, 0)
        meta = sched.build_connector_meta(roles.scheduler_output(None))
        with ecstore.connect(servers=extra["servers"], namespace=extra["namespace"]) as s:
            assert s.remove("g-2") == 0  # evicted after the scheduler's check
        roles.init_worker(cfg)
        cache = {}
        out = roles.run_worker_step(roles.scheduler_output(meta), cache)
        assert sorted(cache) == ["g-1"]
        assert out.finished_recving == {"g-1"}
        sched.update_connector_output(out)
        assert sched.take_unavailable_requests() == {"r2"}
        assert sched.take_unavailable_requests() == set()
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()


# ---- a store that is down ---------------------------------------------------


def test_stopped_store_has_cache_item_false_and_one_warning(caplog):
    redis = start_redis()
    server = start_server(redis.port)
    extra = {"servers": "127.0.0.1:%d" % server.port, "redis_url": "redis://127.0.0.1:%d" % redis.port,
             "namespace": "pytest", "timeout_ms": 1000, "connect_timeout_ms": 500, "warn_interval_s": 60}
    cfg = roles.vllm_config("ec_consumer", extra)
    sched = roles.scheduler(cfg)
    try:
        assert sched.has_cache_item("nothing") is False
        server.stop()
        redis.stop()
        vllm_logger = logging.getLogger("ecstore.vllm")
        vllm_logger.propagate = True
        with caplog.at_level(logging.WARNING, logger="ecstore.vllm"):
            results = [sched.has_cache_item("k-%d" % i) for i in range(5)]
        assert results == [False] * 5
        warnings = [r for r in caplog.records if r.name == "ecstore.vllm" and r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        # The worker side: a load against the stopped store is a miss, not an exception.
        r = roles.request("r", [("k-0", 8)])
        sched.scheduler.loads["k-0"] = ev.ECStoreLoadSpec("k-0", 8, ["r"])  # scheduled before the store died
        meta = sched.build_connector_meta(roles.scheduler_output(None))
        roles.init_worker(cfg)
        cache = {}
        out = roles.run_worker_step(roles.scheduler_output(meta), cache)
        assert cache == {} and out.ec_connector_worker_meta.failed_req_ids == {r.request_id}
    finally:
        sched.shutdown()
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()
        server.stop()
        redis.stop()


def test_store_that_comes_back_misconfigured_is_still_no_exception():
    # A namespace mismatch at vLLM's start is a configuration error (it
    # raises, see above); the same answer from a server restarted later,
    # on a reconnect from inside the scheduler, must stay a miss.
    from conftest import Proc

    redis = start_redis()
    server = start_server(redis.port)
    extra = {"servers": "127.0.0.1:%d" % server.port, "redis_url": "redis://127.0.0.1:%d" % redis.port,
             "namespace": "pytest", "timeout_ms": 1000, "connect_timeout_ms": 500, "reopen_interval_s": 0}
    sched = roles.scheduler(roles.vllm_config("ec_consumer", extra))
    other = None
    try:
        assert sched.has_cache_item("a") is False
        argv = list(server.argv)
        server.stop()
        redis.stop()  # so that has() fails and the connector reconnects
        argv[argv.index("--redis") + 1] = "none"
        argv[argv.index("--ns") + 1] = "another-model"
        other = Proc(argv, "ecstore", server.port)
        assert [sched.has_cache_item("k-%d" % i) for i in range(3)] == [False] * 3
    finally:
        sched.shutdown()
        if other is not None:
            other.stop()
        server.stop()
        redis.stop()


def test_store_down_at_start_then_up():
    redis = start_redis()
    port = redis.port
    redis.stop()  # nothing listens there now
    extra = {"servers": "127.0.0.1:1", "redis_url": "redis://127.0.0.1:%d" % port, "namespace": "late",
             "timeout_ms": 1000, "connect_timeout_ms": 300, "reopen_interval_s": 0}
    sched = roles.scheduler(roles.vllm_config("ec_consumer", extra))  # no exception: vLLM starts
    try:
        assert sched.has_cache_item("x") is False
        assert sched.describe() == "unavailable"
    finally:
        sched.shutdown()


# ---- CUDA (runs where a GPU is present) -----------------------------------


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the GPU path runs on a GPU machine only")
def test_cuda_save_and_load_bit_identical(extra):
    extra = dict(extra, load_device="cuda")
    cfg = roles.vllm_config("ec_both", extra)
    conn = roles.init_worker(cfg)
    try:
        src = {"cu-%d" % i: roles.embedding(11, "cu-%d" % i, 650, 2048, torch.bfloat16).cuda() for i in range(8)}
        for h in src:
            conn.save_caches(src, h)
        assert conn.wait_for_save() == []
        sched = roles.scheduler(roles.vllm_config("ec_consumer", extra))
        for i, h in enumerate(src):
            sched.update_state_after_alloc(roles.request("r%d" % i, [(h, 650)]), 0)
        meta = sched.build_connector_meta(roles.scheduler_output(None))
        sched.shutdown()
        cache = {}
        roles.run_worker_step(roles.scheduler_output(meta), cache)
        torch.cuda.synchronize()
        for h, t in src.items():
            assert cache[h].is_cuda and torch.equal(bits(cache[h]), bits(t))
    finally:
        vllm.distributed.ec_transfer.ensure_ec_transfer_shutdown()
