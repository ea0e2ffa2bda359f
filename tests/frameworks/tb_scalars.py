"""Write TensorBoard scalars the way Sample Factory (tensorboardX) or ML-Agents (torch's
SummaryWriter) does, for the byte-for-byte check of zero-code scalar recording:

    python tb_scalars.py {tensorboardX|torch} LOGDIR

Every value and step is fixed; only the event files' wall times differ between runs. At the
end it prints the scalars otel_rl recorded in this process (none when run plain).
"""

from __future__ import annotations

import json
import sys

kind, logdir = sys.argv[1], sys.argv[2]
if kind == "tensorboardX":
    from tensorboardX import SummaryWriter
else:
    from torch.utils.tensorboard import SummaryWriter

writer = SummaryWriter(logdir)
for step in range(0, 5000, 500):
    writer.add_scalar("reward/reward", step / 1000.0, step)
    writer.add_scalar("perf/_fps", 1234.5 + step, step, walltime=1_700_000_000.0 + step)
writer.add_text("note", "unchanged", 0)
writer.close()
metrics = sys.modules.get("otel_rl._internal.metrics")
rows = metrics.scalar_state() if metrics is not None else []
print(json.dumps(sorted([r[0], r[1], r[2], r[3]] for r in rows)))
