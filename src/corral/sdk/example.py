"""A small training loop that survives preemption: it checkpoints when corral asks it to
stop, and resumes from its latest checkpoint when it runs again.

    corral submit train -p team-a -g 1 -- python -m corral.sdk.example --steps 200

It fits y = 3x + 2 by gradient descent in plain Python; no GPU needed. Each step sleeps a
little to stand for real work. The log shows where each run started, so a resumed run is
easy to tell from a restarted one.
"""

from __future__ import annotations

import argparse
import random
import sys
import time

from corral.sdk import preemption


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    args = parser.parse_args()

    preemption.install()
    state = preemption.load_latest()
    if state is None:
        state = {"step": 0, "w": 0.0, "b": 0.0, "runs": 0}
        print("starting from scratch", flush=True)
    else:
        print(f"resuming from step {state['step']}", flush=True)
    state["runs"] += 1
    rng = random.Random(state["step"])
    while state["step"] < args.steps:
        x = rng.uniform(-1, 1)
        error = state["w"] * x + state["b"] - (3 * x + 2)
        state["w"] -= 0.1 * error * x
        state["b"] -= 0.1 * error
        state["step"] += 1
        time.sleep(args.step_seconds)
        if state["step"] % args.checkpoint_every == 0:
            preemption.save(state)
        if preemption.requested():
            preemption.save(state)
            print(f"preempted at step {state['step']}; checkpoint saved", flush=True)
            return 0
    preemption.save(state)
    print(
        f"done: step {state['step']}, w={state['w']:.3f}, b={state['b']:.3f}, runs {state['runs']}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
