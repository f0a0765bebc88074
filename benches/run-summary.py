#!/usr/bin/env python3
"""One line (and a profile line) from `gpufeed run --json` on stdin.

usage: gpufeed run DIR --json ... | python3 benches/run-summary.py LABEL [SECONDS_START_TO_EXIT]
"""
import json
import sys

label = sys.argv[1]
lines = sys.stdin.read().strip().splitlines()
if not lines:
    print(f"{label}: no output")
    sys.exit(1)
j = json.loads(lines[-1])
def gpu_part(e):
    by = e.get("decoded_by")
    return f" gpu {by['gpu'] / max(by['cpu'] + by['gpu'], 1):.2f}" if by else ""


# A pipeline of views reports its epochs as a count, without a list of them.
per_epoch = j["epochs"] if isinstance(j.get("epochs"), list) else []
epochs = ", ".join(f"{e['images'] / max(e['seconds'], 1e-9):.0f}{gpu_part(e)}" for e in per_epoch)
cold = ""
if len(sys.argv) > 2:
    s = float(sys.argv[2])
    cold = f"{s:.2f} s start to exit ({j['images'] / s:.0f} img/s); "
first = j.get("first_batch_seconds")
if first is not None:
    cold += f"first batch {first:.2f} s; "
print(f"{label}: {cold}{j['images_per_s']:.0f} img/s (epochs {epochs}), by {j.get('decoded_by')}, "
      f"share {j.get('gpu_share')}, setup {j.get('setup_seconds', 0):.2f} s; {j.get('decode', '')}")
profile = j.get("profile")
if profile:
    print("    " + ", ".join(f"{k} {v['seconds']:.2f}s/{v['count']}"
                             for k, v in profile.items() if v["count"]))
