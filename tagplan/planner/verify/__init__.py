"""Proof by execution (docs/verification.md): a compiled distributed GraphDef, run in
TensorFlow, computes the training step of the original single-device graph.

``check`` runs both and compares them; ``reference`` runs the original; ``lowering``
makes the distributed graph runnable on one CPU; ``batchnorm`` handles the per-replica
statistics of batch norms; ``compare`` holds the tolerances; ``values`` keeps values on
disk; ``memory`` estimates what a verification needs before it starts."""
