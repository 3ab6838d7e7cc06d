"""The local server on 127.0.0.1 that serves model.tar.gz on Ray Serve as the Graviton endpoint does (`pytorch-platform
serve`, `make demo`), and the process manager and signal handling it shares with the proving ground's TorchServe
multi-model harness (proving_ground/torchserve_mme/)."""
