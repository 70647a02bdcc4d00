#!/usr/bin/python3
"""The prefill/decode instance of the Python 1E1PD example (scheduler and
consumer roles).

Regenerates the same images (it knows them from the request, as vLLM
does), asks the scheduler question has_caches for their mm_hashes (Redis
only), allocates each embedding's buffer from the token count the image
size gives, start_load_caches into those buffers and waits.  Every hit is
checked bit for bit against a local recomputation; a miss is recomputed
(as the engine would).  Exit code 1 on any wrong byte, or with
--expect-all on any miss.

  /usr/bin/python3 examples/python/consumer.py --config ec.json --images 8 --expect-all
"""

import argparse
import sys
import time

import torch

from producer import args_common, ec_model, ecstore, load_config


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args_common(ap)
    ap.add_argument("--expect-all", action="store_true", help="fail when an embedding is missing")
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    imgs = [ec_model.image(args.seed + i, w, h) for i in range(args.images)]
    keys = [ec_model.mm_hash(img) for img in imgs]
    ntok = ec_model.tokens(w, h)
    with ecstore.ECConnector(load_config(args.config)) as conn:
        t0 = time.monotonic()
        have = conn.has_caches(keys)  # the scheduler's question
        t1 = time.monotonic()
        outs = [torch.empty(ntok, args.hidden, dtype=torch.bfloat16) for _ in keys]
        with conn.start_load_caches(list(zip(keys, outs))) as ld:
            got = ld.wait()
            statuses = list(ld.statuses)
        t2 = time.monotonic()
    wrong = misses = 0
    for i, (key, emb) in enumerate(zip(keys, got)):
        ref = ec_model.encode(imgs[i], args.hidden)
        if emb is None:
            misses += 1
            print("miss %s (%s): recomputed" % (key[:16], ecstore.err_name(statuses[i])))
        elif emb.shape != ref.shape or emb.dtype != ref.dtype or not torch.equal(emb, ref):
            wrong += 1
            print("WRONG %s: %s %s" % (key[:16], tuple(emb.shape), emb.dtype), file=sys.stderr)
        else:
            print("hit  %s %s %s" % (key[:16], tuple(emb.shape), emb.dtype))
    mb = sum(o.numel() * 2 for o, g in zip(outs, got) if g is not None) / 1e6
    print("consumer: %d images, has=%d, hits=%d, misses=%d, wrong=%d; has_caches %.1f ms, load %.1f MB in %.1f ms"
          % (len(keys), sum(have), len(keys) - misses - wrong, misses, wrong, (t1 - t0) * 1e3, mb, (t2 - t1) * 1e3))
    return 1 if wrong or (args.expect_all and misses) else 0


if __name__ == "__main__":
    sys.exit(main())
