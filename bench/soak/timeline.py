#!/usr/bin/env python3
"""The soak bench's record of a job as its dashboard shows it: every --every seconds, GET
/api/jobs/JOB from the head's dashboard (Authorization: Bearer, the token from --token-file) and
append to --out each log line and timeline entry not seen before, as JSON lines
{"unix_ms", "source": "log"|"timeline", "kind", "round", "text"}. The dashboard keeps the last
few hundred of each; polling often keeps them all. A head that is down is skipped over (its
successor rebuilds the history from Redis). Stops once the job has ended and one more poll
found nothing new.

  bench/soak/timeline.py --url http://127.0.0.1:PORT --token-file F --job JOB --out F.jsonl
"""
import argparse
import json
import time
import urllib.error
import urllib.parse
import urllib.request

ENDED = ("succeeded", "failed", "cancelled")


def poll(url, token):
    req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--token-file", required=True)
    ap.add_argument("--job", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--every", type=float, default=5.0)
    a = ap.parse_args()
    seen = set()
    ended = False
    cursor = ""
    with open(a.out, "a") as out:
        while True:
            try:
                token = open(a.token_file).read().strip()
                # Only what came after the last answer (the dashboard's cursor), as its page
                # polls: a whole history each time would cost the head's dashboard that much.
                since = f"?since={urllib.parse.quote(cursor)}" if cursor else ""
                j = poll(f"{a.url}/api/jobs/{a.job}{since}", token)
                cursor = j.get("cursor", "")
            except (OSError, urllib.error.URLError, ValueError):
                time.sleep(a.every)
                continue
            new = 0
            rows = [{"unix_ms": l["unix_ms"], "source": "log", "kind": "log", "round": None,
                     "text": l["line"]} for l in j.get("log", [])]
            rows += [{"unix_ms": t["unix_ms"], "source": "timeline", "kind": t["kind"],
                      "round": t["round"], "text": t["text"]} for t in j.get("timeline", [])]
            for r in rows:
                key = (r["unix_ms"], r["source"], r["kind"], r["text"])
                if key not in seen:
                    seen.add(key)
                    out.write(json.dumps(r) + "\n")
                    new += 1
            out.flush()
            if ended and new == 0:
                return
            ended = j.get("state") in ENDED
            time.sleep(a.every)


if __name__ == "__main__":
    main()
