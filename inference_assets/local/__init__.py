"""Local harnesses: the real SageMaker PyTorch toolkit + TorchServe on 127.0.0.1 (single model and multi-model)."""
