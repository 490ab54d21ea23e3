"""A passive probe for tests/test_openclip.py, loaded by every process of an OpenCLIP run when this
folder is on PYTHONPATH (Python imports `sitecustomize` at startup). It changes nothing that OpenCLIP
or shardstream run; it only watches, through torch's global hooks, and after every optimizer step
rewrites $OPENCLIP_PROBE_DIR/rank<RANK>.json with the rank's step count, the loss of each step and
the token ids of each step's captions (so a test can tell which samples a rank trained on).

One adaptation, to torch and not to OpenCLIP: open_clip_train.main passes device_ids=[device] to
DistributedDataParallel, which torch refuses for a CPU module ("device_ids ... only work with ... GPU
modules"). For a CPU module device_ids must be None, and that is what the probe passes; DDP then
works exactly as it would without them. Without a GPU there is no other way to run OpenCLIP's main
under torchrun.
"""

import json
import math
import os

_OUT = os.environ.get("OPENCLIP_PROBE_DIR")
_RANK = os.environ.get("RANK")


def _install() -> None:
    import torch
    from torch.nn.modules.module import register_module_forward_hook
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook

    ddp_init = DistributedDataParallel.__init__

    def cpu_ddp_init(self, module, device_ids=None, *args, **kwargs):
        if device_ids and all(torch.device(d).type == "cpu" for d in device_ids):
            device_ids = None
        ddp_init(self, module, device_ids, *args, **kwargs)

    DistributedDataParallel.__init__ = cpu_ddp_init

    pid = os.getpid()
    record = {"rank": int(_RANK), "steps": 0, "losses": [], "texts": []}
    step = {}

    def on_forward(module, args, output):
        kind = (type(module).__module__, type(module).__name__)
        if kind == ("open_clip.model", "CLIP") and len(args) >= 2:  # model(images, texts)
            step["texts"] = [" ".join(str(t) for t in row if t) for row in args[1].tolist()]
        elif kind[0] == "open_clip.loss" and isinstance(output, dict):  # loss(..., output_dict=True)
            step["loss"] = float(sum(v.detach() for v in output.values()))

    def on_step(optimizer, args, kwargs):
        if os.getpid() != pid:  # DataLoader workers are forked from the rank; only the rank steps
            return
        record["steps"] += 1
        record["losses"].append(step.get("loss", math.nan))
        record["texts"].append(step.get("texts", []))
        step.clear()
        path = os.path.join(_OUT, f"rank{_RANK}.json")
        with open(path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(path + ".tmp", path)

    register_module_forward_hook(on_forward)
    register_optimizer_step_post_hook(on_step)


if _OUT and _RANK is not None:
    _install()
