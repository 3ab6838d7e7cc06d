"""Facts the whole platform shares (the layer beneath stacks, constructs and assets): checked data with sources."""
