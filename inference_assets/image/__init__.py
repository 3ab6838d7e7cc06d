"""The Graviton serving image: its Dockerfile, its locked Python packages (``lock``) and the promotion's
vulnerability gate on it (``scan_gate``)."""
