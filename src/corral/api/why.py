"""Why a workload waits (`corral why`), as the API answers it: the control plane's
explanation (`corral.control.explain`) as its body."""

from __future__ import annotations

from dataclasses import asdict

from corral.api.schemas.workloads import WhyOut
from corral.control.explain import Why


def why_out(why: Why) -> WhyOut:
    """The body of `GET /workloads/NAME/why`: the same fields, holders and queues too."""
    return WhyOut.model_validate(asdict(why))
