"""Training assets: the operator side (``remote_train``, ``tiny_model``, ``sample_data/``) and, in ``instance/``,
only what a training instance or job runs (the Training stack uploads that folder alone)."""
