"""Running a plan on TensorFlow's distributed runtime (docs/run-a-plan.md): one
``tf.distribute.Server`` per task of the plan, task 0 driving the training steps.

:mod:`.plan_dir` reads and checks a plan directory and splits batches over the replica
placeholders; :mod:`.cpu` turns a plan's GPUs into CPU devices for a trial on one
machine; :mod:`.captured` binds, initializes, saves and restores a TF2 function's
captured variables; :mod:`.runtime` starts the servers and runs the steps."""
