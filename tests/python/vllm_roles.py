"""The vLLM side of tests/python/test_vllm.py: builds real vLLM configs,
requests and scheduler outputs, and drives ECStoreConnector through vLLM's
own factory and model-runner mixin, as an engine instance does.

Run as a script it is an encoder (producer) instance in its own process:

    python vllm_roles.py produce CONFIG_JSON MODEL_DIR SEED HASH[:TOKENS[:WIDTH[:DTYPE]]]...

saves each item's deterministic tensor through
``ECConnectorModelRunnerMixin.maybe_save_ec_to_connector`` and prints
``saved N`` when every save is stored;

    python vllm_roles.py stall CONFIG_JSON MODEL_DIR SEED HASH[:TOKENS[:WIDTH[:DTYPE]]]...

runs one encoder step through the mixin (``start_save_caches`` marks the
items pending, ``save_caches`` queues them), prints ``queued N`` and sleeps,
for a test to kill it mid-save;

    python vllm_roles.py consume CONFIG_JSON SEED TIMEOUT_S HASH[:TOKENS[:WIDTH[:DTYPE]]]...

is a prefill instance: its scheduler asks ensure_cache_available for one
request per item until all are ready (or fail), then its worker loads them
through the mixin; prints ``loaded N local L deferred D objects O`` (L
items prefetched into its own server, D steps deferred, O objects in that
server) when every byte matches, else why not.
"""

import json
import os
import sys
import zlib

import torch
from vllm.config import DeviceConfig, ECTransferConfig, ModelConfig, VllmConfig
from vllm.distributed import ec_transfer
from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorRole
from vllm.distributed.ec_transfer.ec_connector.factory import ECConnectorFactory
from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.request import Request
from vllm.v1.worker.ec_connector_model_runner_mixin import ECConnectorModelRunnerMixin

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


# A tiny multimodal model's config (Qwen2.5-VL's architecture, toy sizes):
# vLLM accepts an encoder-only (ec_producer) instance only for a multimodal
# model, and reads this file from a local directory, offline.  No weights.
TINY_VL = {
    "architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
    "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_hidden_layers": 2,
    "num_key_value_heads": 2, "vocab_size": 1000, "max_position_embeddings": 4096, "rope_theta": 10000.0,
    "torch_dtype": "bfloat16", "bos_token_id": 1, "eos_token_id": 2, "image_token_id": 900,
    "video_token_id": 901, "vision_start_token_id": 902,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                      "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                      "temporal_patch_size": 2, "in_channels": 3, "window_size": 112,
                      "fullatt_block_indexes": [1]},
}


def vllm_config(role, extra, model_dir=None):
    """A real VllmConfig naming ECStoreConnector by module path; with
    model_dir, for the tiny multimodal model written there."""
    tc = ECTransferConfig(ec_connector="ECStoreConnector", ec_connector_module_path="ecstore.vllm",
                          ec_role=role, ec_connector_extra_config=dict(extra))
    kw = {}
    if model_dir is not None:
        os.makedirs(model_dir, exist_ok=True)
        with open(os.path.join(model_dir, "config.json"), "w") as f:
            json.dump(TINY_VL, f)
        kw["model_config"] = ModelConfig(model=str(model_dir), skip_tokenizer_init=True)
    return VllmConfig(ec_transfer_config=tc, device_config=DeviceConfig(device="cpu"), **kw)


def parse_item(spec):
    """"hash[:tokens[:width[:dtype]]]" -> (hash, tokens, width, torch dtype)."""
    parts = spec.split(":")
    tokens = int(parts[1]) if len(parts) > 1 else 650
    width = int(parts[2]) if len(parts) > 2 else 2048
    dtype = DTYPES[parts[3]] if len(parts) > 3 else torch.bfloat16
    return parts[0], tokens, width, dtype


def embedding(seed, mm_hash, tokens, width, dtype):
    """The encoder output for one image: deterministic from seed and hash,
    with every bit pattern of the dtype likely (random bits, not values)."""
    g = torch.Generator().manual_seed(zlib.crc32(("%d/%s" % (seed, mm_hash)).encode()))
    nbytes = tokens * width * torch.empty((), dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(tokens, width)


def request(req_id, items):
    """A real vLLM Request with one image feature per (hash, tokens)."""
    feats, offset = [], 5
    for mm_hash, tokens in items:
        feats.append(MultiModalFeatureSpec(data=None, modality="image", identifier=mm_hash,
                                           mm_position=PlaceholderRange(offset=offset, length=tokens)))
        offset += tokens + 3
    prompt = list(range(offset + 4))
    return Request(request_id=req_id, prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=1),
                   pooling_params=None, mm_features=feats)


def scheduler_output(meta, finished=()):
    out = SchedulerOutput.make_empty()
    out.ec_connector_metadata = meta
    out.finished_req_ids = set(finished)
    return out


def scheduler(cfg):
    """The scheduler-side connector, as vLLM's Scheduler makes it."""
    return ECConnectorFactory.create_connector(cfg, ECConnectorRole.SCHEDULER)


def init_worker(cfg):
    """The worker-side connector, as vLLM's worker makes it (a process-wide
    agent that the model runner's mixin uses)."""
    ec_transfer.ensure_ec_transfer_shutdown()
    ec_transfer.ensure_ec_transfer_initialized(cfg)
    return ec_transfer.get_ec_transfer()


def run_worker_step(sched_out, encoder_cache):
    """One model-runner step of the worker: the mixin binds the metadata,
    starts the loads, and collects the connector's output."""
    with ECConnectorModelRunnerMixin.maybe_get_ec_connector_output(sched_out, encoder_cache) as out:
        pass
    return out


def save_all(cfg, seed, specs):
    """Saves each spec's tensor through vLLM's model-runner mixin, as an
    encoder's model runner does after encoding; returns the failures."""
    conn = init_worker(cfg)
    encoder_cache = {}
    for spec in specs:
        mm_hash, tokens, width, dtype = parse_item(spec)
        encoder_cache[mm_hash] = embedding(seed, mm_hash, tokens, width, dtype)
        ECConnectorModelRunnerMixin.maybe_save_ec_to_connector(encoder_cache, mm_hash)
    failures = conn.wait_for_save()
    ec_transfer.ensure_ec_transfer_shutdown()
    return failures


def produce(config_json, model_dir, seed, specs):
    """An encoder-only instance (ec_producer) of the tiny multimodal model."""
    failures = save_all(vllm_config("ec_producer", json.loads(config_json), model_dir), seed, specs)
    if failures:
        print("failed %r" % (failures,), flush=True)
        return 1
    print("saved %d" % len(specs), flush=True)
    return 0


def encoder_step(conn, seed, specs, encoder_cache=None):
    """One encoder step of a producer worker through vLLM's mixin: the
    scheduler's metadata names the items to encode (``saves``), the mixin
    calls start_save_caches, the "encoder" fills encoder_cache and the
    model runner saves each item.  Returns the encoder_cache."""
    from ecstore.vllm import ECStoreConnectorMetadata
    from vllm.distributed.ec_transfer import ec_transfer_state

    ec_transfer_state._EC_CONNECTOR_AGENT = conn  # the agent the mixin calls
    cache = {} if encoder_cache is None else encoder_cache
    items = [parse_item(s) for s in specs]
    out = scheduler_output(ECStoreConnectorMetadata(saves=[h for h, _, _, _ in items]))
    with ECConnectorModelRunnerMixin.maybe_get_ec_connector_output(out, cache):
        for mm_hash, tokens, width, dtype in items:
            cache[mm_hash] = embedding(seed, mm_hash, tokens, width, dtype)
            ECConnectorModelRunnerMixin.maybe_save_ec_to_connector(cache, mm_hash)
    return cache


def stall(config_json, model_dir, seed, specs):
    conn = init_worker(vllm_config("ec_producer", json.loads(config_json), model_dir))
    encoder_step(conn, seed, specs)
    print("queued %d" % len(specs), flush=True)
    import time

    while True:
        time.sleep(1)


def consume(config_json, seed, timeout_s, specs):
    import time

    import ecstore

    extra = json.loads(config_json)
    cfg = vllm_config("ec_consumer", extra)
    sched = scheduler(cfg)
    init_worker(cfg)
    items = [parse_item(s) for s in specs]
    reqs = [request("r-%s" % h, [(h, tokens)]) for h, tokens, _, _ in items]
    end = time.monotonic() + timeout_s
    deferred = 0
    while True:
        pending = [r for r in reqs if not sched.ensure_cache_available(r, 0)]
        gone = sched.take_unavailable_requests()
        if gone:
            print("unavailable %s" % sorted(gone), flush=True)
            return 1
        if not pending:
            break
        if time.monotonic() > end:
            print("not ready after %.0fs" % timeout_s, flush=True)
            return 1
        deferred += 1
        time.sleep(0.005)
    for r in reqs:
        sched.has_cache_item(r.mm_features[0].identifier)
        sched.update_state_after_alloc(r, 0)
    meta = sched.build_connector_meta(scheduler_output(None))
    cache = {}
    run_worker_step(scheduler_output(meta), cache)
    for h, tokens, width, dtype in items:
        want = embedding(seed, h, tokens, width, dtype)
        got = cache.get(h)
        if got is None or not torch.equal(got.contiguous().view(torch.uint8), want.view(torch.uint8)):
            print("wrong or missing bytes for %s" % h, flush=True)
            return 1
    with ecstore.connect(servers=extra["servers"], namespace=extra.get("namespace", "default")) as s:
        objects = s.stat(0)["objects"]
    print("loaded %d local %d deferred %d objects %d" % (len(items), sum(1 for s in meta.loads if s.local), deferred,
                                                        objects), flush=True)
    sched.shutdown()
    ec_transfer.ensure_ec_transfer_shutdown()
    return 0


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "consume":
        sys.exit(consume(sys.argv[2], int(sys.argv[3]), float(sys.argv[4]), sys.argv[5:]))
    if len(sys.argv) >= 5 and sys.argv[1] == "stall":
        sys.exit(stall(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]))
    if len(sys.argv) < 5 or sys.argv[1] != "produce":
        sys.exit(__doc__)
    sys.exit(produce(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5:]))
