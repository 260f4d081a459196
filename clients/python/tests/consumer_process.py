"""A consumer process for test_consume: `python consumer_process.py DSN SUBSCRIPTION`.

Its handler inserts one row per event into `effects`, in the consume
transaction, and fails (raises) on the first attempt of every tenth
position. It runs until SIGTERM, then prints how many events it handled.
"""

import sys
import time

import litebase_streams as lbs


def handle(event: lbs.Event, delivery: lbs.Delivery) -> None:
    delivery.conn.execute(
        "INSERT INTO effects (position, attempt, pid) VALUES (%s, %s, pg_backend_pid())",
        (event.position, delivery.attempt))
    time.sleep(0.003)  # some work, so that a SIGKILL lands mid-transaction
    if event.position % 10 == 0 and delivery.attempt == 1:
        raise RuntimeError(f"planned failure of {event.position}")


if __name__ == "__main__":
    handled = lbs.consume(sys.argv[1], sys.argv[2], handle, max_events=20, wait="1s")
    print(handled, flush=True)
