"""Load shapes: fixed concurrency, a stepped concurrency sweep, Poisson arrivals at a target rate.

Each is a `LoadTestShape` with class-attribute parameters and a `tick()`; `shape_from_options()`
builds the one the command line asks for. Poisson arrivals are open-loop: the shape only keeps a
pool of `users` (the maximum concurrency) alive, and every user waits for the next arrival of its
tenant's seeded exponential schedule before sending (`users.ArrivalSchedule`); how late requests
leave against that schedule is recorded per request (`sched_lag`) and reported.
"""

from __future__ import annotations

from locust import LoadTestShape

from loadtest.run import parse_duration


class FixedShape(LoadTestShape):
    """`users` users for `run_time` seconds, started at `spawn_rate` per second."""

    users = 4
    use_common_options = True  # reads -u, -r, -t itself
    spawn_rate = 0.0  # 0: all at once
    run_time = 30.0

    def tick(self):
        if self.get_run_time() >= self.run_time:
            return None
        return self.users, self.spawn_rate or float(self.users)

    def plan(self) -> dict:
        return {"shape": "fixed", "users": self.users, "run_time_s": self.run_time,
                "stages": [{"start_s": 0.0, "end_s": self.run_time, "users": self.users}]}


class StepShape(LoadTestShape):
    """Concurrency sweep: `steps` users in turn, each held for `step_time` seconds."""

    use_common_options = True
    steps: tuple[int, ...] = (1, 2, 4)
    step_time = 20.0
    spawn_rate = 0.0

    def tick(self):
        i = int(self.get_run_time() // self.step_time)
        if i >= len(self.steps):
            return None
        return self.steps[i], self.spawn_rate or float(max(self.steps))

    def plan(self) -> dict:
        return {"shape": "steps", "users": max(self.steps), "run_time_s": self.step_time * len(self.steps),
                "stages": [{"start_s": i * self.step_time, "end_s": (i + 1) * self.step_time, "users": u}
                           for i, u in enumerate(self.steps)]}


class PoissonShape(FixedShape):
    """Keeps a pool of `users` for `run_time`; requests leave at Poisson arrivals of `rate` per second."""

    rate = 1.0

    def plan(self) -> dict:
        return {**super().plan(), "shape": "poisson", "rate": self.rate}


SHAPES = {"fixed": FixedShape, "steps": StepShape, "poisson": PoissonShape}


def shape_from_options(opts) -> LoadTestShape:
    """Instance of the shape named by `opts.shape`, parameters from the parsed command line."""
    if opts.shape not in SHAPES:
        raise ValueError(f"unknown shape {opts.shape!r} (one of {sorted(SHAPES)})")
    shape = SHAPES[opts.shape]()
    spawn_rate = float(opts.spawn_rate or 0.0)
    shape.spawn_rate = spawn_rate
    if isinstance(shape, StepShape):
        shape.steps = tuple(int(s) for s in str(opts.steps).split(",") if s.strip())
        if not shape.steps or min(shape.steps) < 1:
            raise ValueError(f"--steps needs positive user counts, got {opts.steps!r}")
        shape.step_time = parse_duration(opts.step_time)
    else:
        shape.users = int(opts.num_users or 1)
        shape.run_time = parse_duration(opts.run_time or 30)
    if isinstance(shape, PoissonShape):
        shape.rate = float(opts.rate)
        if shape.rate <= 0:
            raise ValueError("--shape poisson needs --rate > 0")
    return shape
