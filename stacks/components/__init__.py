"""The constructs layer: one construct, one job; stacks only compose them. Each is tested on a bare ``cdk.Stack``."""
