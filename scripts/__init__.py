"""Entry points run from the checkout: the synth gates, the settings reference, the rehearsal and its shims."""
