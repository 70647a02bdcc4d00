#!/usr/bin/python3
"""The encoder instance of the Python 1E1PD example (producer role).

For each image (regenerated from --seed + i), computes its mm_hash and
embedding and saves it through the EC connector (save_caches: the bytes go
to pinned staging memory at once, the put runs in the background), then
wait_for_save: failed saves are printed and make the exit code 1 (the
consumer would recompute them; nothing hangs).

  /usr/bin/python3 examples/python/producer.py --config ec.json --images 8
"""

import argparse
import json
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "ec_connector" / "python"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import ecstore  # noqa: E402
import ec_model  # noqa: E402


def args_common(ap):
    ap.add_argument("--config", required=True, help="connector config: a JSON file or a JSON string")
    ap.add_argument("--images", type=int, default=8)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--size", default="700x728", help="WxH of every image")
    ap.add_argument("--hidden", type=int, default=ec_model.HIDDEN)


def load_config(s):
    return json.loads(s) if s.lstrip().startswith("{") else json.loads(pathlib.Path(s).read_text())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args_common(ap)
    args = ap.parse_args()
    w, h = (int(v) for v in args.size.split("x"))
    t0 = time.monotonic()
    nbytes = 0
    with ecstore.ECConnector(load_config(args.config)) as conn:
        for i in range(args.images):
            img = ec_model.image(args.seed + i, w, h)
            key = ec_model.mm_hash(img)
            cache = {key: ec_model.encode(img, args.hidden)}
            conn.save_caches(cache, key)  # vLLM's producer call
            nbytes += cache[key].numel() * 2
            print("saved %s %s %s" % (key[:16], tuple(cache[key].shape), cache[key].dtype), flush=True)
        failed = conn.wait_for_save()
        for f in failed:
            print("FAILED %s: %s" % (f.mm_hash[:16], f.error), file=sys.stderr)
        st = conn.stats()
        path = conn.describe()
    el = time.monotonic() - t0
    print("producer (%s): %d images, %d stored, %d failed, %.1f MB in %.2fs"
          % (path, args.images, st["saves_stored"], len(failed), nbytes / 1e6, el))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
