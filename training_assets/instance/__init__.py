"""What the EC2 training instance and the training container run: ``train_sentiment`` and its dataset reader, the
Dockerfile, the launcher and run scripts, the log shipper. The Training stack uploads exactly this folder."""
