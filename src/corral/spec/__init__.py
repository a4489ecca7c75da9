"""What a workload, a queue or a node may be, written once for every way in: the API's
schemas, scenario files (`corral plan`, `corral simulate`) and the CLI. Issue 40 moves
the input models here; the limits come first (`corral.spec.limits`)."""
