"""The README's journey played against one moto server (``python -m proving_ground.rehearsal.rehearse``, `make
rehearse`).

- ``rehearse``: the ``Rehearsal`` (its steps in order, the report) and the moto patches; the steps by concern in
  ``platform_steps`` (synth, gate, preflight, deploy, destroy and clean up), ``training_steps`` (the EC2 run,
  ``@remote``) and ``serving_steps`` (package, check-model, publish, serve, the endpoint and its smoke test), over
  ``journey`` (principals, keys, the report, the plumbing every step acts through) and ``deployment`` (CloudFormation,
  played in moto);
- ``aws_calls``: the call server that records and gates every AWS call; ``ec2_host``: the EC2 host's shims;
  ``remote_job_player``: the player of ``@remote`` jobs.
"""
