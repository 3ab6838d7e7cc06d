"""Entry points run from the checkout beside app.py: the post-synth gates (``template_gates``, ``iam_analysers``) and
the settings reference generator (``settings_reference``). They import the stacks and facts, never the proving
ground."""
