"""The source's cats-vs-dogs program in Python: Kaggle's train/ folder (cat.1.jpg, dog.2.jpg, ...)
decoded, resized and held out for validation by dtrain's loader (--data as for dtrain train), the
source's CNN (models/catdog.model), alone or one task of a cluster.

    python3 examples/catdog.py FOLDER [dtrain train flags]
    dtrain launch --ps 1 --workers 2 -- python3 examples/catdog.py FOLDER
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import dtrain  # noqa: E402  (the checkout's package; an installed one needs no path)

# 1. The cluster from the same flags as `dtrain train` (dtrain launch passes them after ARGS).
flags, args = dtrain.parse_args()
if not args:
    sys.exit("usage: catdog.py FOLDER [dtrain train flags]")
model = dtrain.Model(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "models", "catdog.model"),
                     **dict(dict(batch_size=32, epochs=10, logdir="catdog_ckpt", summary_dir="catdog_log"), **flags))
# 2. A ps serves until the chief ends training; 3. workers push to it (sync with --issync=1). The
# chief checkpoints to --logdir and resumes from it when started again.
result = model.fit(data=args[0], every=100, callback=lambda step, loss, acc: print(f"step {step}: loss {loss:.3f}"))
if flags.get("job_name", "worker") == "worker" and flags.get("task_index", "0") == "0":
    print(f"test accuracy {result['test_accuracy']:.4f} after {result['steps']} steps")
