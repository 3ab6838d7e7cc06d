"""Local harnesses on 127.0.0.1: the single-model server on Ray Serve (as the Graviton endpoint serves), and the
real SageMaker toolkit + TorchServe in multi-model mode."""
