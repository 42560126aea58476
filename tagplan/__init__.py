"""tagplan: deployment planning for distributed DNN training on heterogeneous GPUs."""
