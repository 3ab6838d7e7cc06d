"""The local TorchServe multi-model harness: TorchServe 0.12 + the SageMaker PyTorch toolkit in multi-model mode on
localhost (``local_mme``), the archives it serves (``archive``) and the handler they carry (``inference``).

No endpoint of the platform runs TorchServe (the Graviton endpoint runs Ray Serve, the multi-model endpoint DJL
Serving, and the TorchServe DLCs ended patching on 2026-06-30, docs/images.md). The harness stays because it is a real
multi-model server that runs on this machine: the model-cost measurement, the load test and the validation of the
sizing model run against it. Part of the proving ground: it may import the product; the product never imports it.
"""
