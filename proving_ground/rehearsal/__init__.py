"""The README's journey played against one moto server (``python -m proving_ground.rehearsal.rehearse``, `make
rehearse`): the rehearsal itself, the call server that records and gates every AWS call (``aws_calls``), the EC2
host's shims (``ec2_host``) and the player of ``@remote`` jobs (``remote_job_player``)."""
