"""``python -m tests.fork_probe CODE [SECONDS]``: what a service started through tests/service_forks.py sees (its
argv, working directory, one variable of its environment, its session, its stdin), on stdout; then it sleeps SECONDS
and exits with CODE."""

import json
import os
import sys
import time

if __name__ == "__main__":
    seen = {"argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"), "session": os.getsid(0) == os.getpid(),
            "stdin": sys.stdin.read()}
    sys.stdout.write(json.dumps(seen) + "\n")
    sys.stdout.flush()
    time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)
    sys.exit(int(sys.argv[1]))
